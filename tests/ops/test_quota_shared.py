"""Quotas shared by the pools of one file: `quota check` / `quota request` and `warm` sum the
needs of every pool drawing on the same quota (same cloud, project, scope and quota name)
before deciding, and name them. Through the real CLI, against the AWS sandbox (moto over
HTTP) and the Compute Engine fake (tests/fakes/gce.py).

The pools, worked out by hand (tests/unit/test_quota_totals.py has the same arithmetic):
chat-70b is the contract's example, chat-b a smaller copy (max 8 replicas = 2 nodes, warm 4
replicas kept running = 1 node); 4 replicas per node.
- AWS p5.48xlarge (192 vCPU), L-417A185B at peak: chat-70b (6 max + 1 surge) x 192 = 1,344;
  chat-b (2 + 1 + 1) x 192 = 768; together 2,112 vCPU.
- GCP a3-highgpu-8g (8 H100), NVIDIA_H100_GPUS and GPUS_ALL_REGIONS at peak: chat-70b
  (6 + 3 surge, one per zone) x 8 = 72; chat-b (2 + 3 + 1) x 8 = 48; together 120 GPUs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.configs import pool_yaml, with_second_pool
from tests.plugins.sandbox import run_poolctl, sandbox_admin

QUOTA, REGION = "L-417A185B", "us-east-1"


def _files(tmp_path: Path, **kw) -> tuple[Path, Path]:
    """(the example pool alone, the example pool with chat-b beside it)."""
    alone, both = tmp_path / "alone.yaml", tmp_path / "both.yaml"
    alone.write_text(pool_yaml(**kw))
    both.write_text(with_second_pool(pool_yaml(**kw)))
    return alone, both


# -- AWS, against the sandbox -------------------------------------------------------------


@pytest.fixture
def aws_quota(sandbox):
    def set_to(value: float) -> None:
        sandbox_admin(sandbox, "POST", "/_poolctl/quotas",
                      {"quotas": {QUOTA: value}, "region": REGION})

    yield set_to
    sandbox_admin(sandbox, "DELETE", "/_poolctl/quotas")


def test_aws_two_pools_sharing_the_p5_quota_are_refused_together(sandbox, sandbox_home,
                                                                 tmp_path, aws_quota):
    alone, both = _files(tmp_path, with_gcp=False)

    def check(f: Path, *extra: str):
        return run_poolctl(sandbox_home, "quota", "check", "--cloud", "aws", "--json",
                           "--sandbox", "-f", str(f), *extra, timeout=300)

    # What the region runs beside these pools (other tests' instances may be there): read,
    # not guessed, so that the grant sits 100 vCPU above chat-70b's need alone.
    aws_quota(1_000_000)
    (probe,) = json.loads(check(alone).stdout)["quotas"]
    others = probe["in_use"] - probe["pool_in_use"]
    granted = 1344 + others + 100
    aws_quota(granted)

    r = check(alone)
    assert r.returncode == 0, r.stderr
    (q,) = json.loads(r.stdout)["quotas"]
    assert (q["needed"], q["pools"], q["needed_by_pool"], q["shortfall"]) == (
        1344, ["chat-70b"], {"chat-70b": 1344}, 0)

    for extra in ((), ("--pool", "chat-b")):  # chat-b alone needs 768, but shares the quota
        r = check(both, *extra)
        assert r.returncode == 1, r.stderr
        (q,) = json.loads(r.stdout)["quotas"]  # one line for the quota both pools draw on
        # 1,344 + 768 = 2,112 needed: short by 2,112 - 1,344 - 100 = 668.
        assert (q["name"], q["scope"], q["needed"], q["granted"]) == (QUOTA, REGION, 2112,
                                                                      granted)
        assert (q["pools"], q["needed_by_pool"]) == (["chat-70b", "chat-b"],
                                                     {"chat-70b": 1344, "chat-b": 768})
        assert (q["shortfall"], q["ok"]) == (668, False)
        last = r.stderr.strip().splitlines()[-1]
        assert last == (
            f"poolctl: quota {QUOTA} in {REGION}: short by 668 vCPU (needs 2112 for the pools "
            f"sharing it, chat-70b 1344 + chat-b 768, beside {others:g} in use by others, "
            f"granted {granted:g}); file an increase with `poolctl quota request --cloud aws`")

    # chat-b in another region draws on another quota: chat-70b fits again.
    (tmp_path / "apart.yaml").write_text(with_second_pool(pool_yaml(with_gcp=False),
                                                          aws_region="us-west-2"))
    r = check(tmp_path / "apart.yaml", "--pool", "chat-70b")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["quotas"][0]["pools"] == ["chat-70b"]


# -- GCP, against the Compute Engine fake -------------------------------------------------


@pytest.fixture
def gce():
    pytest.importorskip("google.cloud.compute_v1",
                        reason="google-cloud-compute is not installed (pip install -e .[gcp])")
    pytest.importorskip("google.cloud.cloudquotas_v1",
                        reason="google-cloud-quotas is not installed (pip install -e .[gcp])")
    from tests.fakes.gce import FakeGce

    with FakeGce() as fake:
        yield fake
    assert fake.errors == []  # a shape the real messages refuse would read as empty


@pytest.fixture
def a3(gce, tmp_path):
    """chat-70b deployed in the fake (1 serving VM, 2 stopped standby VMs, surge 3); chat-b
    not deployed. H100 and all-regions GPU quotas `limit` with 8 in use (chat-70b's VM); the
    CPU and local SSD quotas far above any need."""
    from poolctl import naming
    from poolctl.config import parse_config
    from tests.ops.test_runtime_gcp import MIG, PROJECT, ZONES
    from tests.ops.test_runtime_gcp import REGION as GCP_REGION

    cfg = parse_config(pool_yaml())
    gce.deploy_pool(project=PROJECT, region=GCP_REGION, name=MIG, zones=ZONES,
                    labels=naming.gcp_labels(cfg, cfg.pools[0]), running=1, stopped=2,
                    autoscaler=(1, 6), max_surge=3)

    def grant(limit: float) -> None:
        gce.add_region(PROJECT, GCP_REGION, ZONES, quotas={
            "NVIDIA_H100_GPUS": (limit, 8), "CPUS": (100_000, 208),
            "LOCAL_SSD_TOTAL_GB": (1_000_000, 6000)})
        gce.set_project_quota(PROJECT, "GPUS_ALL_REGIONS", limit, 8)

    grant(80)
    return grant


def _gcp(gce, tmp_path: Path, *args: str):
    from tests.ops.test_runtime_gcp import cli

    return cli(gce, tmp_path / "home", *args)


def _h100(out: dict) -> dict:
    return next(q for q in out["quotas"] if q["name"] == "NVIDIA_H100_GPUS")


def test_gcp_two_pools_sharing_the_a3_quota_are_refused_together(gce, a3, tmp_path):
    alone, both = _files(tmp_path)
    r = _gcp(gce, tmp_path, "quota", "check", "--cloud", "gcp", "--json", "-f", str(alone))
    assert r.returncode == 0, r.stderr
    # 72 needed + 8 in use - 8 of the pool's own VM - 80 granted = -8: fits.
    assert (_h100(json.loads(r.stdout))["needed"], _h100(json.loads(r.stdout))["ok"]) == (
        72, True)

    r = _gcp(gce, tmp_path, "quota", "check", "--cloud", "gcp", "--json", "-f", str(both))
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    # Both pools selected, each quota listed once: 4 quotas, not 8.
    assert sorted(q["name"] for q in out["quotas"]) == [
        "CPUS", "GPUS_ALL_REGIONS", "LOCAL_SSD_TOTAL_GB", "NVIDIA_H100_GPUS"]
    h100 = _h100(out)
    # 72 + 48 = 120 needed: 120 + 8 - 8 - 80 = 40 short.
    assert (h100["needed"], h100["needed_by_pool"], h100["shortfall"]) == (
        120, {"chat-70b": 72, "chat-b": 48}, 40)
    assert {q["name"]: q["shortfall"] for q in out["quotas"]} == {
        "NVIDIA_H100_GPUS": 40, "GPUS_ALL_REGIONS": 40, "CPUS": 0, "LOCAL_SSD_TOTAL_GB": 0}
    assert ("quota NVIDIA_H100_GPUS in us-central1: short by 40 GPU (needs 120 for the pools "
            "sharing it, chat-70b 72 + chat-b 48, beside 0 in use by others, granted 80)"
            ) in r.stderr

    # One increase per shared quota, to what both need: 80 + 40 = 120.
    r = _gcp(gce, tmp_path, "quota", "request", "--cloud", "gcp", "--yes", "--json",
             "--contact-email", "ops@acme.example", "-f", str(both))
    assert r.returncode == 0, r.stderr
    reqs = json.loads(r.stdout)["requests"]
    assert sorted((q["name"], q["desired"]) for q in reqs) == [
        ("GPUS_ALL_REGIONS", 120), ("NVIDIA_H100_GPUS", 120)]
    assert len(gce.preferences) == 2
    assert "(shared by chat-70b, chat-b)" in r.stderr

    # chat-b in another project shares no quota with chat-70b.
    (tmp_path / "apart.yaml").write_text(with_second_pool(pool_yaml(),
                                                          gcp_project="acme-other"))
    r = _gcp(gce, tmp_path, "quota", "check", "--cloud", "gcp", "--json", "--pool", "chat-70b",
             "-f", str(tmp_path / "apart.yaml"))
    assert r.returncode == 0, r.stderr
    assert _h100(json.loads(r.stdout))["pools"] == ["chat-70b"]


def test_gcp_warm_counts_the_pools_sharing_the_quota(gce, a3, tmp_path):
    from tests.ops.test_runtime_gcp import MIG, PROJECT
    from tests.ops.test_runtime_gcp import REGION as GCP_REGION

    alone, both = _files(tmp_path)
    a3(60)
    autoscaler = gce.autoscalers[(PROJECT, GCP_REGION, MIG)]["autoscalingPolicy"]
    # `warm --running --replicas 4`: 1 node above the minimum of 1 -> 2 nodes running at
    # once = 16 H100; with chat-b's peak of 48: 64 + 8 - 8 - 60 = 4 short.
    r = _gcp(gce, tmp_path, "warm", "--cloud", "gcp", "--running", "--replicas", "4",
             "--json", "--pool", "chat-70b", "-f", str(both))
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("poolctl: chat-70b: not enough quota for 2 node(s) running at once; "
                           "quota NVIDIA_H100_GPUS in us-central1: short by 4 GPU (needs 64 "
                           "for the pools sharing it, chat-70b 16 + chat-b 48,")
    assert "nothing was changed" in last
    assert autoscaler["minNumReplicas"] == 1
    # Alone: 16 + 8 - 8 - 60 < 0, the minimum goes to 2.
    r = _gcp(gce, tmp_path, "warm", "--cloud", "gcp", "--running", "--replicas", "4",
             "--json", "-f", str(alone))
    assert r.returncode == 0, r.stderr
    assert gce.autoscalers[(PROJECT, GCP_REGION, MIG)]["autoscalingPolicy"][
        "minNumReplicas"] == 2
