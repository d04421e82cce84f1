"""aws.fallback_instance_types (issue 21, part 4): each fallback passes the primary's rules
and holds the model, one finding per problem naming its key; no warm pool beside them (AWS
refuses one next to a mixed instances policy); the instance refresh keeps the policy."""

from __future__ import annotations

import pytest

from poolctl import runtime
from poolctl.cloud import Cloud
from poolctl.clouds.aws.rollout import refresh_state
from poolctl.config import parse_config
from poolctl.contract.aws import launch_types, mixed_instances_policy
from poolctl.errors import UsageError
from tests.configs import pool_yaml
from tests.unit.test_rules import findings
from tests.unit.test_runtime_math import FakeOps, group, own_home  # noqa: F401


def fallback_yaml(types: str, warm: int = 0) -> str:
    return pool_yaml(warm=warm, with_gcp=False,
                     extra_aws=f"      fallback_instance_types: [{types}]\n")


def fallback_findings(text: str) -> list:
    return [f for f in findings(text) if f.check in ("fallback-types", "fallback-warm-pool")]


def gcp_fallback_yaml(types: str, warm: int = 0) -> str:
    return pool_yaml(warm=warm, extra_gcp=f"      fallback_machine_types: [{types}]\n")


def gcp_fallback_findings(text: str) -> list:
    return [f for f in findings(text, Cloud.gcp)
            if f.check in ("fallback-types", "fallback-warm-pool")]


def test_good_fallbacks_pass():
    # Llama 70B at TP 2 needs 75.4 GB per GPU; p5en (H200 141 GB) and p4de (A100 80 GB:
    # 85.9 GB x 0.92 = 79.0 GB usable) both hold it, and both are offered in us-east-1.
    assert fallback_findings(fallback_yaml("p5en.48xlarge, p4de.24xlarge")) == []


@pytest.mark.parametrize(("types", "key", "says"), [
    ("g5.48xlarge", "[0]", "g5.48xlarge has 8x A10G without NVLink"),
    ("p5en.48xlarge, p9.48xlarge", "[1]", "'p9.48xlarge' is not in the catalog"),
    ("p5.48xlarge", "[0]", "p5.48xlarge is listed already"),  # the primary
    ("p5en.48xlarge, p5en.48xlarge", "[1]", "p5en.48xlarge is listed already"),
    ("p5e.48xlarge", "[0]", "p5e.48xlarge is not offered in us-east-1 per the catalog"),
    # A100 40 GB: 42.9 GB x 0.92 = 39.5 GB usable < 75.4 GB needed per GPU
    ("p4d.24xlarge", "[0]", "cannot hold the model: needs 75.4 GB per GPU"),
])
def test_bad_fallback_is_one_error_naming_its_key(types, key, says):
    (f,) = fallback_findings(fallback_yaml(types))
    assert f.severity == "error" and f.key == f"pools[0].aws.fallback_instance_types{key}"
    assert says in f.message, f.message
    assert "\n" not in f.line()
    assert f.bad_input  # a type that can never serve the pool: exit 2 (rules.exit_code)


def test_good_gcp_fallbacks_pass():
    # a3-megagpu-8g and a3-edgegpu-8g: H100 80 GB and 16 bundled Local SSDs, as the
    # primary a3-highgpu-8g, all offered in us-central1.
    assert gcp_fallback_findings(gcp_fallback_yaml("a3-megagpu-8g, a3-edgegpu-8g")) == []


@pytest.mark.parametrize(("types", "says"), [
    ("g2-standard-96", "g2-standard-96 has 8x L4 without NVLink"),
    ("a3-ultragpu-8g", "a3-ultragpu-8g has 32 Local SSD(s) (bundled), the instance template "
                       "16 (bundled) for a3-highgpu-8g"),
    ("a9-highgpu-8g", "'a9-highgpu-8g' is not in the catalog"),
])
def test_bad_gcp_fallback_is_one_error_naming_its_key(types, says):
    (f,) = gcp_fallback_findings(gcp_fallback_yaml(types))
    assert f.key == "pools[0].gcp.fallback_machine_types[0]" and says in f.message, f.message
    assert f.bad_input


def test_gcp_fallbacks_beside_a_standby_pool_are_a_failed_rule_not_bad_input():
    (f,) = gcp_fallback_findings(gcp_fallback_yaml("a3-megagpu-8g", warm=8))
    assert (f.check, f.key, f.bad_input) == (
        "fallback-warm-pool", "pools[0].gcp.fallback_machine_types", False)
    assert "warm_pool.replicas: 0" in f.hint and "gcp.capacity reservations" in f.hint


def test_fallbacks_beside_a_warm_pool_are_refused_saying_why_and_what_to_choose():
    (f,) = fallback_findings(fallback_yaml("p5en.48xlarge", warm=8))
    assert (f.check, f.key, f.bad_input) == (
        "fallback-warm-pool", "pools[0].aws.fallback_instance_types", False)
    assert "AWS refuses a warm pool on a group with a mixed instances policy" in f.message
    assert "aws.capacity reservations" in f.hint and "warm_pool.replicas: 0" in f.hint


def test_warm_without_running_is_refused_for_a_fallback_pool():
    cfg = parse_config(fallback_yaml("p5en.48xlarge"))
    ops = FakeOps(group(warm_min_nodes=0, warm_state=""), granted=10_000)
    with pytest.raises(UsageError) as e:
        runtime.warm(cfg, cfg.pools[0], "aws", ops, 4)
    assert "use --running" in str(e.value) and ops.changes == []  # nothing changed
    r = runtime.warm(cfg, cfg.pools[0], "aws", ops, 4, running=True)
    assert r.after.min_nodes == 2  # the file's 1 + 1 node of 4 replicas


def test_the_instance_refresh_keeps_the_mixed_instances_policy():
    pool = parse_config(fallback_yaml("p5en.48xlarge, p4de.24xlarge")).pools[0]
    assert launch_types(pool) == ["p5.48xlarge", "p5en.48xlarge", "p4de.24xlarge"]
    mip = mixed_instances_policy(pool, "lt-1", "7")
    assert mip["LaunchTemplate"]["Overrides"] == [
        {"InstanceType": "p5.48xlarge"}, {"InstanceType": "p5en.48xlarge"},
        {"InstanceType": "p4de.24xlarge"}]
    assert mip["InstancesDistribution"]["OnDemandAllocationStrategy"] == "prioritized"
    # A refresh to such a desired configuration names its version as the rollout's target.
    s = refresh_state({"InstanceRefreshId": "r-1", "Status": "InProgress",
                       "DesiredConfiguration": {"MixedInstancesPolicy": mip}}, "6")
    assert (s.from_version, s.to_version) == ("6", "7")


def test_a_fallback_with_a_quota_of_its_own_is_planned_for_the_pools_peak():
    from poolctl.sizing import plan_pool

    # GCP quotas GPUs per model: a3-megagpu-8g draws on NVIDIA_H100_MEGA_GPUS, the primary
    # a3-highgpu-8g on NVIDIA_H100_GPUS. The peak on the fallback alone: (6 max + 3 surge:
    # one VM per zone of 3) x 8 GPUs = 72.
    (gcp,) = plan_pool(parse_config(gcp_fallback_yaml("a3-megagpu-8g")).pools[0],
                       Cloud.gcp).fallback_quotas
    assert {k: gcp.to_json()[k] for k in ("name", "unit", "needed", "scope", "fallback")} == {
        "name": "NVIDIA_H100_MEGA_GPUS", "unit": "GPU", "needed": 72, "scope": "us-central1",
        "fallback": "a3-megagpu-8g"}
    # AWS counts every P instance in one vCPU quota (L-417A185B): a fallback adds none.
    aws = plan_pool(parse_config(fallback_yaml("p5en.48xlarge, p4de.24xlarge")).pools[0],
                    Cloud.aws)
    assert aws.fallback_quotas == [] and aws.quotas[0].name == "L-417A185B"
