"""`plan` sums each quota over the pools of the file that share it (same cloud, project,
scope and quota name), worked out by hand.

Pool chat-70b is the contract's example: TP 2 on 8 GPUs -> 4 replicas per node; max 24
replicas = 6 nodes, surge 4 replicas = 1 node (GCP: raised to 3, one per zone), warm 8
replicas kept stopped (count 0). Pool chat-b: max 8 replicas = 2 nodes, same surge, warm 4
replicas kept running = 1 node.
- AWS p5.48xlarge, 192 vCPU: chat-70b (6 + 1) x 192 = 1,344; chat-b (2 + 1 + 1) x 192 = 768;
  together 2,112 vCPU of L-417A185B in us-east-1.
- GCP a3-highgpu-8g, 8 H100, 208 vCPU, 16 x 375 GB local SSD: chat-70b 6 + 3 = 9 nodes ->
  72 GPU, 1,872 vCPU, 54,000 GB; chat-b 2 + 3 + 1 = 6 nodes -> 48 GPU, 1,248 vCPU,
  36,000 GB; together 120 NVIDIA_H100_GPUS, 3,120 CPUS, 90,000 LOCAL_SSD_TOTAL_GB in
  acme-prod/us-central1 and 120 GPUS_ALL_REGIONS (global).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests import inproc
from tests.configs import pool_yaml, with_second_pool

ROOT = Path(__file__).resolve().parents[2]


def plan_json(tmp_path: Path, text: str, *args: str) -> dict:
    f = tmp_path / "poolctl.yaml"
    f.write_text(text)
    r = inproc.run_argv([sys.executable, "-m", "poolctl", "plan", "-f", str(f), "--json",
                         *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def totals(out: dict) -> dict[tuple, tuple]:
    return {(t["cloud"], t["project"], t["region"], t["name"]):
            (t["unit"], t["needed"], t["pools"], t["needed_by_pool"])
            for t in out["quota_totals"]}


def test_shared_quotas_are_summed_per_cloud_project_and_region(tmp_path):
    out = plan_json(tmp_path, with_second_pool(pool_yaml()))
    both = ["chat-70b", "chat-b"]
    assert totals(out) == {
        ("aws", None, "us-east-1", "L-417A185B"):
            ("vCPU", 2112, both, {"chat-70b": 1344, "chat-b": 768}),
        ("gcp", "acme-prod", "us-central1", "NVIDIA_H100_GPUS"):
            ("GPU", 120, both, {"chat-70b": 72, "chat-b": 48}),
        ("gcp", "acme-prod", "us-central1", "CPUS"):
            ("vCPU", 3120, both, {"chat-70b": 1872, "chat-b": 1248}),
        ("gcp", "acme-prod", "us-central1", "LOCAL_SSD_TOTAL_GB"):
            ("GB", 90000, both, {"chat-70b": 54000, "chat-b": 36000}),
        ("gcp", "acme-prod", "global", "GPUS_ALL_REGIONS"):
            ("GPU", 120, both, {"chat-70b": 72, "chat-b": 48}),
    }
    # Each pool's own entry is unchanged: its need alone.
    own = {(p["pool"], p["cloud"]): p["quota"]["needed"] for p in out["pools"]}
    assert own == {("chat-70b", "aws"): 1344, ("chat-70b", "gcp"): 72,
                   ("chat-b", "aws"): 768, ("chat-b", "gcp"): 48}


def test_another_region_or_project_shares_nothing(tmp_path):
    out = plan_json(tmp_path, with_second_pool(pool_yaml(), aws_region="us-west-2",
                                               gcp_project="acme-other"), "--cloud", "aws")
    assert totals(out) == {
        ("aws", None, "us-east-1", "L-417A185B"): ("vCPU", 1344, ["chat-70b"],
                                                   {"chat-70b": 1344}),
        ("aws", None, "us-west-2", "L-417A185B"): ("vCPU", 768, ["chat-b"], {"chat-b": 768}),
    }
    gcp = totals(plan_json(tmp_path, with_second_pool(pool_yaml(), gcp_project="acme-other"),
                           "--cloud", "gcp"))
    assert gcp[("gcp", "acme-prod", "global", "GPUS_ALL_REGIONS")][1:3] == (72, ["chat-70b"])
    assert gcp[("gcp", "acme-other", "global", "GPUS_ALL_REGIONS")][1:3] == (48, ["chat-b"])


def test_one_pool_selected_still_counts_the_pools_sharing_its_quota(tmp_path):
    out = plan_json(tmp_path, with_second_pool(pool_yaml()), "--cloud", "aws",
                    "--pool", "chat-b")
    assert [p["pool"] for p in out["pools"]] == ["chat-b"]
    assert totals(out) == {("aws", None, "us-east-1", "L-417A185B"):
                           ("vCPU", 2112, ["chat-70b", "chat-b"],
                            {"chat-70b": 1344, "chat-b": 768})}


def test_plan_text_shows_the_region_total(tmp_path):
    f = tmp_path / "poolctl.yaml"
    f.write_text(with_second_pool(pool_yaml(with_gcp=False)))
    r = inproc.run_argv([sys.executable, "-m", "poolctl", "plan", "-f", str(f)],
                        capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    [row] = [ln for ln in r.stdout.splitlines() if "L-417A185B" in ln and "2,112" in ln]
    assert "us-east-1" in row and "chat-70b 1,344 + chat-b 768" in row
