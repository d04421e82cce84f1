"""Every named check: one config that trips it, with the key and hint it must name."""

from __future__ import annotations

import pytest

from poolctl.config import parse_config
from poolctl.rules import CHECKS, errors, run_checks
from tests.configs import pool_yaml


def findings(text: str, cloud: str | None = "aws"):
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
        ({"instance_type": "p4d.24xlarge", "tp": 1, "params_b": 7.0, "max_model_len": 4096,
          "warm_state": "hibernated"}, "warm-state", "pools[0].warm_pool.state"),
        ({"min_replicas": 30}, "replica-bounds", "pools[0].scaling.min_replicas"),
        ({"down_s": 60, "up_s": 60}, "scale-down-slower",
         "pools[0].scaling.scale_down_stabilization_s"),
        ({"checkpoints": "[50, 25]"}, "rollout-checkpoints", "pools[0].rollout.checkpoints"),
        ({"checkpoints": "[25, 50]"}, "rollout-checkpoints", "pools[0].rollout.checkpoints"),
        ({"region": "mars-north-1"}, "region-offered", "pools[0].aws.region"),
    ],
)
def test_rule_errors(kwargs, check, key):
    fs = findings(pool_yaml(**kwargs))
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
    (f,) = by_check(findings(pool_yaml()), "warm-state", "info")
    assert "lose their local NVMe" in f.message and "141 GB" in f.message


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


def test_every_check_has_a_test_above():
    tested = {"nvlink-8gpu", "no-rdma-nics", "no-cluster-placement", "tensor-parallel",
              "fits-hbm", "warm-state", "replica-bounds", "scale-down-slower",
              "rollout-checkpoints", "region-offered", "nvme-holds-weights", "whole-nodes",
              "utilization-target", "kv-concurrency", "weights-uri"}
    assert {c.id for c in CHECKS} <= tested


def test_weights_uri_scheme():
    text = pool_yaml().replace("s3://acme-models/llama-3.1-70b/", "gs://wrong/")
    (f,) = by_check(findings(text), "weights-uri")
    assert f.key == "pools[0].aws.weights_uri"


def test_kv_concurrency_warning_for_the_contract_example():
    (f,) = by_check(findings(pool_yaml()), "kv-concurrency")
    assert f.severity == "warning" and "only 2 sequences" in f.message
