"""Every named check: one config that trips it, with the key and hint it must name."""

from __future__ import annotations

import base64
import random

import pytest

from poolctl.cloud import Cloud
from poolctl.config import parse_config
from poolctl.rules import CHECKS, errors, run_checks
from tests.configs import pool_yaml


def findings(text: str, cloud: Cloud | None = Cloud.aws):
    cfg = parse_config(text)
    return run_checks(cfg, cfg.targets(None, cloud))


def by_check(fs, check, severity=None):
    return [f for f in fs if f.check == check and (severity is None or f.severity == severity)]


def test_the_contract_example_has_no_errors():
    fs = findings(pool_yaml(), cloud=None)
    assert errors(fs) == []


@pytest.mark.parametrize(
    ("kwargs", "check", "key"),
    [
        ({"instance_type": "g6e.48xlarge"}, "nvlink-8gpu", "pools[0].aws.instance_type"),
        ({"instance_type": "p9.96xlarge"}, "nvlink-8gpu", "pools[0].aws.instance_type"),
        ({"extra_aws": "      efa_interfaces: 4\n"}, "no-rdma-nics", "pools[0].aws.efa_interfaces"),
        ({"extra_aws": "      placement_group_strategy: cluster\n"}, "no-cluster-placement",
         "pools[0].aws.placement_group_strategy"),
        ({"tp": 3}, "tensor-parallel", "pools[0].serving.tensor_parallel"),
        ({"tp": 1}, "fits-hbm", "pools[0].serving.tensor_parallel"),
        ({"warm": 25}, "warm-within-max", "pools[0].warm_pool.replicas"),
        ({"min_replicas": 30}, "replica-bounds", "pools[0].scaling.min_replicas"),
        ({"down_s": 60, "up_s": 60}, "scale-down-slower",
         "pools[0].scaling.scale_down_stabilization_s"),
        ({"checkpoints": "[50, 25]"}, "rollout-checkpoints", "pools[0].rollout.checkpoints"),
        ({"checkpoints": "[25, 50]"}, "rollout-checkpoints", "pools[0].rollout.checkpoints"),
        ({"region": "ap-north-9"}, "region-offered", "pools[0].aws.region"),
        ({"extra_aws": ""}, "no-secrets-in-args", "pools[0].serving.extra_args[1]"),
    ],
)
def test_rule_errors(kwargs, check, key):
    text = pool_yaml(**kwargs)
    if check == "no-secrets-in-args":
        text = with_extra_args(text, ["--trust-remote-code", "--api-key=hunter2"])
    fs = findings(text)
    hits = by_check(fs, check, "error")
    assert hits, f"{check} did not fire: {[f.line() for f in fs]}"
    assert hits[0].key == key
    assert hits[0].hint  # every finding says how to fix it


def test_non_nvlink_error_says_why():
    (f,) = by_check(findings(pool_yaml(instance_type="g6e.48xlarge")), "nvlink-8gpu")
    assert "without NVLink" in f.message
    assert "p5.48xlarge" in f.hint


def test_fits_hbm_numbers():
    # TP 1: 141.2 GB of weights on one 85.9 GB GPU can never fit.
    (f,) = by_check(findings(pool_yaml(tp=1)), "fits-hbm")
    assert "weights 141.2" in f.message and "79.0 GB" in f.message


def test_nvme_too_small():
    # a 400B model in bf16 = 800 GB; p4d has 8 x 1000 GB = 8,000 GB: fits. 3,400B = 6.8 TB
    # x 1.2 headroom = 8.16 TB > 8 TB: does not.
    fs = findings(pool_yaml(instance_type="p4d.24xlarge", params_b=3400, tp=8))
    (f,) = by_check(fs, "nvme-holds-weights")
    assert "8000 GB" in f.message and "8160 GB" in f.message


def test_whole_nodes_warning_names_the_rounding():
    fs = findings(pool_yaml(min_replicas=5))
    (f,) = by_check(fs, "whole-nodes", "warning")
    assert f.key == "pools[0].scaling.min_replicas"
    assert "rounded up to 2 nodes = 8 replicas" in f.message
    assert errors(fs) == []


def test_stopped_warm_pool_states_the_refill():
    refill, hoped = by_check(findings(pool_yaml()), "warm-state", "info")
    assert "lose their local NVMe" in refill.message and "141 GB" in refill.message
    assert "hoped for, not held" in hoped.message  # tests/unit/test_capacity_held.py


def test_running_warm_pool_has_no_refill_note():
    assert by_check(findings(pool_yaml(warm_state="running")), "warm-state") == []


def test_utilization_above_075_is_a_warning():
    (f,) = by_check(findings(pool_yaml(utilization=0.9)), "utilization-target")
    assert f.severity == "warning" and "9.0" in f.message  # 0.9 / 0.1


def test_gcp_zone_not_offered():
    text = pool_yaml(extra_gcp="      zones: [us-central1-z]\n")
    (f,) = by_check(findings(text, "gcp"), "region-offered")
    assert f.key == "pools[0].gcp.zones"


def test_gcp_gpudirect_and_suspend_refused():
    text = pool_yaml(extra_gcp="      gpudirect: true\n      standby_suspended: true\n")
    fs = findings(text, "gcp")
    assert by_check(fs, "no-rdma-nics", "error") and by_check(fs, "warm-state", "error")


def test_traffic_peak_warns_only_with_a_trace():
    from poolctl.rules import TrafficNeed

    cfg = parse_config(pool_yaml(with_gcp=False))
    tgts = cfg.targets(None, "aws")
    assert not by_check(run_checks(cfg, tgts), "traffic-peak")
    need = {("chat-70b", "aws"): TrafficNeed(40, "t.csv")}
    (f,) = by_check(run_checks(cfg, tgts, traffic=need), "traffic-peak")
    assert f.severity == "warning" and f.key == "pools[0].scaling.max_replicas"
    assert "24 cannot carry the peak of t.csv" in f.message and "40" in f.hint
    enough = {("chat-70b", "aws"): TrafficNeed(24, "t.csv")}
    assert not by_check(run_checks(cfg, tgts, traffic=enough), "traffic-peak")


def test_model_shape():
    # kv_heads above the attention heads the preset gives (64)
    text = pool_yaml().replace("kv_heads: 8", "kv_heads: 128")
    (f,) = by_check(findings(text), "model-shape", "error")[:1]
    assert f.key == "pools[0].model.kv_heads" and "128 KV heads cannot serve 64" in f.message
    # the file's line of the key, as schema errors give it
    line = text.splitlines().index("      kv_heads: 128") + 1
    assert f.line().startswith(f"poolctl.yaml:{line}: error: [model-shape] chat-70b: ")
    # head_dim 1024 instead of 128: 8x the preset's KV per token (80 x 8 x 128 x 2)
    fs = by_check(findings(pool_yaml().replace("head_dim: 128", "head_dim: 1024")),
                  "model-shape", "error")
    assert [f.key for f in fs] == ["pools[0].model.head_dim"]
    assert "8.0x the KV cache per token" in fs[0].message
    # 2x is still believable (a fine-tune would keep the shapes, but not a typo of 8x)
    assert not by_check(findings(pool_yaml().replace("kv_heads: 8", "kv_heads: 16")),
                        "model-shape", "error")
    # past the preset's max_position_embeddings (131072)
    (w,) = by_check(findings(pool_yaml(max_model_len=200_000)), "model-shape", "warning")
    assert w.key == "pools[0].serving.max_model_len" and "131072" in w.message


def test_sticky_routing_says_when_a_node_holds_several_caches():
    sticky = pool_yaml().replace("      port: 8000\n", "      port: 8000\n      balancer: sticky\n")
    (f,) = by_check(findings(sticky), "sticky-per-node", "info")
    assert f.key == "pools[0].serving.balancer" and "node's 4 replicas" in f.message  # 8 / TP 2
    assert by_check(findings(sticky.replace("tensor_parallel: 2", "tensor_parallel: 8")),
                    "sticky-per-node") == []
    assert by_check(findings(pool_yaml()), "sticky-per-node") == []


def test_catalog_miss_suggests_a_type():
    (f,) = by_check(findings(pool_yaml(instance_type="p5.48xlarg")), "nvlink-8gpu")
    assert "(did you mean 'p5.48xlarge'?)" in f.message


def test_every_check_has_a_test_above():
    tested = {"model-shape", "nvlink-8gpu", "no-rdma-nics", "no-cluster-placement",
              "tensor-parallel", "fits-hbm", "warm-state", "replica-bounds", "scale-down-slower",
              "rollout-checkpoints", "region-offered", "nvme-holds-weights", "whole-nodes",
              "utilization-target", "kv-concurrency", "no-secrets-in-args",
              "boot-script-size", "tls", "traffic-peak", "warm-within-max", "batch-budget",
              "sticky-per-node",
              # tests/unit/test_vllm_releases.py:
              "vllm-release",
              # tests/unit/test_capacity_fallback.py and test_hostile_configs.py:
              "fallback-types", "fallback-warm-pool",
              # tests/unit/test_predictive.py:
              "predictive-where-offered",
              # tests/unit/test_sizing.py (streamed weights):
              "weights-load"}
    assert {c.id for c in CHECKS} <= tested


def with_extra_args(text: str, args: list[str]) -> str:
    import json

    return text.replace("      port: 8000\n",
                        f"      port: 8000\n      extra_args: {json.dumps(args)}\n")


# Secret-looking arguments: flags that take a secret and token shapes, anywhere in an arg.
# (Shapes of real tokens with made-up characters.)
SECRET_ARGS = [
    ["--api-key", "abc"], ["--api-key=abc"], ["--hf-token", "x"], ["--token=x"],
    ["--override", '{"k": "hf_' + "a1B2" * 8 + '"}'],
    ["--x=sk-" + "Q" * 40], ["--x", "sk-proj-" + "ab_-" * 10],
    ["AKIA" + "ABCDEFGHIJKLMNOP"], ["--creds=ASIA" + "0123456789ABCDEF"],
    ["--y", "ghp_" + "z" * 36],
]


@pytest.mark.parametrize("args", SECRET_ARGS)
def test_secret_looking_args_are_refused_without_echoing_them(args):
    fs = by_check(findings(with_extra_args(pool_yaml(), args)), "no-secrets-in-args", "error")
    assert fs, args
    for f in fs:
        assert f.key.startswith("pools[0].serving.extra_args[")
        assert "api_key_secret" in f.hint
        assert not [a for a in args if len(a) > 12 and a in f.line()]


@pytest.mark.parametrize("args", [
    ["--trust-remote-code"], ["--tokenizer-mode", "auto"], ["--served-model-name", "sk-small"],
    ["--task", "hf_transfer"], ["--disable-log-requests"], ["--max-num-seqs=64"],
])
def test_ordinary_args_are_not_secrets(args):
    assert by_check(findings(with_extra_args(pool_yaml(), args)), "no-secrets-in-args") == []


def _noise(n: int) -> str:
    """n characters that gzip cannot shrink much (EC2 takes the script compressed)."""
    return base64.b64encode(random.Random(n).randbytes(n * 3 // 4)).decode()[:n]


@pytest.mark.parametrize(("cloud", "size", "limit"), [("aws", 24_000, 16_384),
                                                       ("gcp", 270_000, 262_144)])
def test_boot_script_size_limit_per_cloud(cloud, size, limit):
    """16 KB of EC2 user data (gzip-compressed), 256 KB of GCE metadata; `validate` finds it
    (not only synth)."""
    fs = findings(with_extra_args(pool_yaml(), ["--x=" + _noise(size)]), cloud)
    (f,) = by_check(fs, "boot-script-size")
    assert f.severity == "error" and f.key == "pools[0].serving.extra_args"
    assert f"limit of {limit}" in f.message
    # Under GCE's limit, a script too large for EC2 is fine on GCP.
    if cloud == "gcp":
        fs = findings(with_extra_args(pool_yaml(), ["--x=" + "y" * 17_000]), "gcp")
        assert by_check(fs, "boot-script-size") == []


def test_kv_concurrency_warning_for_the_contract_example():
    (f,) = by_check(findings(pool_yaml()), "kv-concurrency")
    assert f.severity == "warning" and "only 2 sequences" in f.message


def test_plain_http_warns_until_a_certificate_is_set():
    plain = by_check(findings(pool_yaml(), cloud=None), "tls")
    assert {(f.cloud, f.severity, f.key) for f in plain} == {
        ("aws", "warning", "pools[0].aws.certificate_arn"),
        ("gcp", "warning", "pools[0].gcp.certificate")}
    assert all("HTTPS" in f.hint for f in plain)
    tls = pool_yaml(extra_aws="      certificate_arn: arn:aws:acm:us-east-1:111122223333:"
                              "certificate/0a1b2c3d-4e5f-6789-abcd-ef0123456789\n",
                    extra_gcp="      certificate: chat-tls\n")
    assert by_check(findings(tls, cloud=None), "tls") == []


def test_gcp_region_without_catalog_zones_needs_zones():
    """The stack spreads the MIG over the catalog's zones or gcp.zones; with neither, synth
    would fail, so validate says so first."""
    from poolctl.catalog import load_catalog
    from poolctl.rules import Ctx, _region

    cfg = parse_config(pool_yaml())
    row = load_catalog().get("gcp", "a3-highgpu-8g")
    bare = row.model_copy(update={"regions": {**row.regions, "us-central1": []}})
    (f,) = _region(Ctx(cfg, cfg.pools[0], 0, "gcp", bare))
    # the finding takes its id from the check (`@check("region-offered")`), called directly too
    assert (f.check, f.severity, f.key) == ("region-offered", "error", "pools[0].gcp.zones")
    assert list(_region(Ctx(cfg, cfg.pools[0], 0, "gcp", row))) == []


def test_warm_pool_beyond_max_names_both_keys():
    """Issue 23: 10,000 warm replicas for a pool of at most 32 can never serve."""
    fs = findings(pool_yaml(warm=10_000, max_replicas=32, min_replicas=8))
    (f,) = by_check(fs, "warm-within-max", "error")
    assert f.key == "pools[0].warm_pool.replicas"
    assert "scaling.max_replicas 32" in f.message
    # 32 - 8 replicas can join by scaling out
    assert "at most 32" in f.hint and "= 24" in f.hint and "raise scaling.max_replicas" in f.hint
    assert by_check(findings(pool_yaml(warm=24, max_replicas=24)), "warm-within-max") == []


def test_batch_budget_below_max_num_seqs_is_what_vllm_refuses():
    """vLLM's SchedulerConfig: max_num_batched_tokens >= max_num_seqs, or no start."""
    low = pool_yaml().replace("max_num_batched_tokens: 8192", "max_num_batched_tokens: 1")
    (f,) = by_check(findings(low), "batch-budget", "error")
    assert f.key == "pools[0].serving.max_num_batched_tokens"
    assert "serving.max_num_seqs 256" in f.message and "at least 256" in f.hint
    equal = pool_yaml().replace("max_num_batched_tokens: 8192", "max_num_batched_tokens: 256")
    assert by_check(findings(equal), "batch-budget") == []


def test_check_ids_are_unique():
    # A finding's id is its check's: two checks under one id could not be told apart.
    ids = [c.id for c in CHECKS]
    assert len(ids) == len(set(ids))
