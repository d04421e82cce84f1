"""The stand-in engine's Run:ai streamer checks, as vLLM v0.34.0's RunaiModelStreamerLoader
makes them (vllm/model_executor/model_loader/runai_streamer_loader.py), and what it refuses
before any request: credentials it does not have, an endpoint off loopback."""

from __future__ import annotations

import pytest

from poolctl.sandbox.vllm.streamer import StreamError, check_extra_config, stream


def test_the_three_keys_vllm_accepts_and_their_types():
    assert check_extra_config(None) == {}
    assert check_extra_config('{"distributed": true, "concurrency": 16, "memory_limit": -1}') == {
        "distributed": True, "concurrency": 16, "memory_limit": -1}
    for raw, says in [
        ('{"chunk": 1}', "Unexpected extra config keys for runai_streamer: {'chunk'}"),
        ('{"distributed": "yes"}', "distributed must be a bool, got 'yes'"),
        ('{"concurrency": 0}', "concurrency must be a positive integer, got 0"),
        ('{"concurrency": true}', "concurrency must be a positive integer, got True"),
        ('{"memory_limit": -2}', "memory_limit must be an integer >= -1, got -2"),
        ("[1]", "invalid loads value"),
        ("{x", "invalid loads value"),
    ]:
        with pytest.raises(StreamError) as e:
            check_extra_config(raw)
        assert says in str(e.value), (raw, str(e.value))


@pytest.mark.parametrize("env, says", [
    ({"AWS_ENDPOINT_URL": "http://127.0.0.1:1"}, "Unable to locate credentials"),
    ({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}, "127.0.0.0/8 only"),
    ({"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b",
      "AWS_ENDPOINT_URL": "https://s3.us-east-1.amazonaws.com"}, "127.0.0.0/8 only"),
])
def test_no_credentials_of_its_own_or_an_endpoint_off_loopback_is_refused(env, says):
    with pytest.raises(StreamError) as e:
        stream("s3://acme-models/llama/", env)
    assert says in str(e.value)


def test_only_s3_in_the_sandbox():
    with pytest.raises(StreamError, match="S3 only"):
        stream("gs://acme-models/llama/", {})
