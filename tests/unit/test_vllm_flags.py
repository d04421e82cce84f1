"""The stand-in engine's command line: vLLM's flags accepted, kept or refused as vLLM's parser
does (data/vllm_serve_flags.yaml)."""

from __future__ import annotations

import pytest

from poolctl.sandbox.vllm.flags import FlagError, known_flags, parse
from poolctl.vllm_releases import image_release, parse_release, releases

BOOT_LINE = [  # what node.sh.j2 passes (tests/golden/boot holds the rendered scripts)
    "--model", "/opt/cache/weights/llama", "--served-model-name", "meta-llama/Llama-3.1-70B",
    "--tensor-parallel-size", "2", "--data-parallel-size", "4", "--max-model-len", "16384",
    "--gpu-memory-utilization", "0.92", "--enable-chunked-prefill",
    "--max-num-batched-tokens", "8192", "--max-num-seqs", "256", "--no-enable-prefix-caching",
    "--port", "8000",
]


def test_the_boot_scripts_line_is_read_into_what_shapes_serving():
    a = parse(BOOT_LINE)
    assert a.model == "/opt/cache/weights/llama"
    assert a.model_name == "meta-llama/Llama-3.1-70B"
    assert (a.tensor_parallel_size, a.data_parallel_size) == (2, 4)
    assert (a.max_model_len, a.max_num_batched_tokens, a.max_num_seqs) == (16384, 8192, 256)
    assert a.gpu_memory_utilization == 0.92 and a.port == 8000
    assert a.enable_prefix_caching is False  # --no-enable-prefix-caching
    assert a.others == {"enable-chunked-prefill": True}


def test_defaults_are_vllms():
    a = parse(["--model", "m"])
    assert a.served_model_names == ("m",)  # the served name defaults to the model
    assert (a.port, a.tensor_parallel_size, a.data_parallel_size) == (8000, 1, 1)
    assert a.enable_prefix_caching is True and a.block_size == 16
    assert parse(["m2"]).model == "m2"  # `vllm serve MODEL`


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "m", "--enable-turbo-mode"], "unrecognized arguments: --enable-turbo-mode"),
    (["--model", "m", "--no-port"], "unrecognized arguments: --no-port"),  # not a boolean
    (["--model", "m", "--max-num-seqs", "many"], "argument --max-num-seqs: invalid int value"),
    (["--model", "m", "--gpu-memory-utilization", "1.5"], "argument --gpu-memory-utilization"),
    (["--model", "m", "--port"], "argument --port: expected one argument"),
    (["--model", "m", "--trust-remote-code=yes"], "ignored explicit argument 'yes'"),
    ([], "required: model"),
])
def test_a_line_vllm_would_refuse_is_refused_with_its_reason(argv, message):
    with pytest.raises(FlagError) as e:
        parse(argv)
    assert message in str(e.value)


def test_the_flag_list_names_its_vllm_version_and_holds_what_poolctl_passes():
    version, kinds = known_flags()
    # the release of the default image (data/vllm_releases.yaml), what the examples run
    assert image_release(releases().default_image) == parse_release(version)
    passed = {a[2:] for a in BOOT_LINE if a.startswith("--")} - {"no-enable-prefix-caching"}
    assert passed <= set(kinds)
    assert set(kinds.values()) <= {"value", "bool", "switch", "list"}


def test_custom_histogram_buckets_are_read_as_vllm_validates_them():
    a = parse(["--model", "m", "--custom-histogram-buckets",
               '{"inter_token_latency": [0.01, 0.02, 0.5], "request_latency": [1, 2]}'])
    assert a.histogram_buckets == {"inter_token_latency": (0.01, 0.02, 0.5),
                                   "request_latency": (1.0, 2.0)}
    assert parse(["--model", "m"]).histogram_buckets == {}  # vLLM's defaults


@pytest.mark.parametrize(("value", "message"), [
    ('{"tpot": [0.1]}', "unknown bucket family 'tpot'"),
    ('{"inter_token_latency": []}', "bucket list must not be empty"),
    ('{"inter_token_latency": [0.2, 0.1]}', "strictly increasing"),
    ('{"inter_token_latency": [0.1, 0.1]}', "strictly increasing"),
    ('{"inter_token_latency": [0, 0.1]}', "positive finite"),
    ('{"inter_token_latency": [true]}', "positive finite"),
    ('[0.1, 0.2]', "JSON mapping"),
    ("{inter_token_latency: [0.1]}", "invalid loads value"),
])
def test_custom_histogram_buckets_vllm_would_refuse_are_refused(value, message):
    with pytest.raises(FlagError) as e:
        parse(["--model", "m", "--custom-histogram-buckets", value])
    assert message in str(e.value)
