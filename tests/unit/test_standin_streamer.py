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


def test_credentials_come_from_the_environment_then_the_shared_file_it_names(tmp_path):
    """boto3's chain as the streamer meets it in the container: the variables win; else the
    file AWS_SHARED_CREDENTIALS_FILE names, read at each call (a renewed file is used at
    the next load); never `~/.aws/credentials` (here `~` would be the host's)."""
    from poolctl.sandbox.vllm.streamer import credentials

    f = tmp_path / "credentials"
    f.write_text("[default]\naws_access_key_id = AKID1\naws_secret_access_key = S1\n"
                 "aws_session_token = T1\n[other]\naws_access_key_id = AKID2\n"
                 "aws_secret_access_key = S2\n")
    named = {"AWS_SHARED_CREDENTIALS_FILE": str(f)}
    assert credentials(named) == ("AKID1", "S1", "T1")
    assert credentials({**named, "AWS_PROFILE": "other"}) == ("AKID2", "S2", None)
    assert credentials({**named, "AWS_ACCESS_KEY_ID": "E", "AWS_SECRET_ACCESS_KEY": "F"}) == (
        "E", "F", None)
    f.write_text("[default]\naws_access_key_id = AKID3\naws_secret_access_key = S3\n")
    assert credentials(named) == ("AKID3", "S3", None)  # renewed: read again
    for env, says in [({"HOME": str(tmp_path)}, "none named has no [default] keys"),
                      ({"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "gone")},
                       "gone has no [default] keys"),
                      ({**named, "AWS_PROFILE": "missing"}, "has no [missing] keys")]:
        with pytest.raises(StreamError, match="Unable to locate credentials") as e:
            credentials(env)
        assert says in str(e.value), str(e.value)


def test_the_docker_stand_in_gives_the_engine_a_mounted_file_at_its_host_path():
    """The engine stand-in runs on the host: an environment value naming a file in a folder
    `-v HOST:INSIDE` mounts (the weights' credentials file) is that file's host path."""
    from poolctl.sandbox.standins import host_path

    mounts = {"/run/poolctl-weights": "/n/state/weights-aws", "/root/.cache": "/n/cache"}
    assert host_path("/run/poolctl-weights/credentials", mounts) == (
        "/n/state/weights-aws/credentials")
    assert host_path("/root/.cache", mounts) == "/n/cache"
    assert host_path("/run/poolctl-weightsX/c", mounts) == "/run/poolctl-weightsX/c"
    assert host_path("us-east-1", mounts) == "us-east-1"
