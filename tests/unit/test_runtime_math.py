"""Runtime arithmetic and the in-place config edit; every expected number worked out by hand.

No cloud here: `FakeOps` is an in-memory CloudOps that records what it was asked to change.
"""

from __future__ import annotations

import os
import stat
from dataclasses import replace

import pytest

from poolctl import runtime
from poolctl.cloud import Cloud
from poolctl.clouds.aws.quota import quota_code
from poolctl.clouds.base import Group, NodeState, QuotaLine, QuotaRequest, RequestsQuota
from poolctl.config import parse_config
from poolctl.contract.aws import refresh_api_preferences, refresh_percentages
from poolctl.endpoints import REAL_CLOUDS
from poolctl.errors import OperationFailed, UsageError
from poolctl.runtime.warm import GroupSizes
from poolctl.sizing import plan_pool
from tests.configs import pool_yaml
from tests.fakes import stack

P5_VCPUS = 192


def llama():
    cfg = parse_config(pool_yaml())
    return cfg, cfg.pools[0]


@pytest.fixture(autouse=True)
def own_home(monkeypatch, tmp_path):
    """`warm` records the sizes it sets under POOLCTL_HOME: not in the session's home, where
    the sandbox tests' deploys of the same stack name would read them."""
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))


# -- QuotaLine ---------------------------------------------------------------------------


def test_shortfall_counts_needed_beside_what_others_use():
    # needed 1344, granted 1000, nothing else running: 1344 - 1000 = 344 short
    assert QuotaLine("L-417A185B", "vCPU", "us-east-1", 1344, 1000.0).shortfall == 344
    # another team runs one p5 (192 vCPU): 1344 + 192 - 1000 = 536 short
    line = QuotaLine("L-417A185B", "vCPU", "us-east-1", 1344, 1000.0, in_use=192)
    assert line.shortfall == 536
    assert line.available == 808  # 1000 - 192
    # the 192 in use is the pool's own node, already inside `needed`: 344 again
    mine = replace(line, pool_in_use=192)
    assert mine.shortfall == 344
    assert mine.to_json()["ok"] is False
    # enough: 2000 granted
    assert replace(mine, granted=2000.0).shortfall == 0
    # unknown grant: nothing to compare
    assert replace(mine, granted=None).shortfall == 0


def test_peak_needs_scale_to_nodes_running_at_once():
    _, pool = llama()
    aws = plan_pool(pool, "aws")
    # peak: 6 max + 1 surge + 0 running warm = 7 nodes x 192 = 1344 vCPU
    assert aws.quotas[0].needed == 7 * P5_VCPUS == 1344
    assert runtime.scaled_needs(aws, 2)[0].needed == 384  # 2 x 192
    gcp = plan_pool(pool, "gcp")
    # GCP peak: 6 max + 3 surge (whole nodes per zone) = 9 nodes: 72 GPUs, 1872 vCPU,
    # 54,000 GB SSD -> per node 8 GPUs, 208 vCPU, 6,000 GB; for 2 nodes:
    got = {q.name: q.needed for q in runtime.scaled_needs(gcp, 2)}
    assert got == {"NVIDIA_H100_GPUS": 16, "CPUS": 416, "LOCAL_SSD_TOTAL_GB": 12000,
                   "GPUS_ALL_REGIONS": 16}


def test_running_warm_nodes_count_stopped_do_not():
    running = plan_pool(parse_config(pool_yaml(warm_state="running")).pools[0], "aws")
    stopped = plan_pool(parse_config(pool_yaml(warm_state="stopped")).pools[0], "aws")
    # running warm: 6 + 1 + 2 = 9 nodes x 192 = 1728; stopped: 7 x 192 = 1344
    assert running.quotas[0].needed == 1728
    assert stopped.quotas[0].needed == 1344
    assert runtime.running_nodes(1, 1, 2, True) == 3
    assert runtime.running_nodes(1, 1, 2, False) == 1
    assert runtime.running_nodes(4, 2, 0, False) == 4  # desired never below the minimum


@pytest.mark.parametrize("itype,code", [
    ("p5.48xlarge", "L-417A185B"), ("p4d.24xlarge", "L-417A185B"),
    ("g6e.48xlarge", "L-DB2E81BA"), ("vt1.24xlarge", "L-DB2E81BA"),
    ("m5.large", "L-1216C47A"), ("t3.micro", "L-1216C47A"), ("c7i.48xlarge", "L-1216C47A"),
    ("trn1.32xlarge", None), ("inf2.48xlarge", None), ("x2idn.32xlarge", None),
    ("dl1.24xlarge", None), ("f1.16xlarge", None),
])
def test_quota_family_of_instance_types(itype, code):
    assert quota_code(itype) == code


# -- refresh percentages -------------------------------------------------------------------


def test_refresh_percentages_give_exactly_the_surge():
    # 1 node, surge 1: 100..200 % -> floor(1 x 2.00) - 1 = 1 extra node
    assert refresh_percentages(1, 1, False) == (100, 200)
    # 4 nodes, surge 1: 100 + ceil(25) = 125 -> floor(4 x 1.25) - 4 = 1
    assert refresh_percentages(4, 1, False) == (100, 125)
    # 3 nodes, surge 1: 100 + ceil(33.3) = 134 -> floor(4.02) - 3 = 1 (133 would give 0)
    assert refresh_percentages(3, 1, False) == (100, 134)
    # no surge, 4 nodes: min floor(300 / 4) = 75 -> 4 - ceil(3) = 1 node out at a time
    assert refresh_percentages(4, 1, True) == (75, 100)
    assert refresh_percentages(1, 0, False) == (0, 100)
    import math

    for d in range(1, 60):
        for s in range(1, 6):
            lo, hi = refresh_percentages(d, s, False)
            if hi < 200:
                assert math.floor(d * hi / 100) - d == s, (d, s, hi)
            lo, hi = refresh_percentages(d, s, True)
            assert d - math.ceil(d * lo / 100) == 1, (d, lo)


def test_rollout_preferences_are_the_stacks_sized_for_now():
    """StartInstanceRefresh gets what the stack declares (one function writes both), with
    the healthy percentages of the live desired size: 4 nodes, 1 surge node -> 100/125."""
    pool = parse_config(pool_yaml()).pools[0]
    plan = plan_pool(pool, "aws")  # 4 replicas per node: surge 4 replicas = 1 node, cold 440 s
    assert refresh_api_preferences(pool, plan, desired=4, no_surge=False) == {
        "CheckpointPercentages": [25, 50, 100], "CheckpointDelay": 300,
        "InstanceWarmup": int(plan.start_seconds["cold"]), "AutoRollback": True,
        "SkipMatching": True, "ScaleInProtectedInstances": "Refresh",
        "StandbyInstances": "Terminate", "MinHealthyPercentage": 100,
        "MaxHealthyPercentage": 125,
    }
    # One batch to 100 %: no checkpoint to pause at, no delay.
    one = parse_config(pool_yaml(checkpoints="[100]")).pools[0]
    prefs = refresh_api_preferences(one, plan_pool(one, "aws"), desired=4, no_surge=True)
    assert "CheckpointPercentages" not in prefs and "CheckpointDelay" not in prefs
    assert (prefs["MinHealthyPercentage"], prefs["MaxHealthyPercentage"]) == (75, 100)


# -- warm ---------------------------------------------------------------------------------


class FakeOps(RequestsQuota):
    """In-memory CloudOps: a group, a granted quota, and a log of changes; it files quota
    requests (the capability), as both clouds do."""

    cloud = "aws"
    endpoints = REAL_CLOUDS

    def __init__(self, group: Group, granted: float, others: float = 0) -> None:
        self.group, self.granted, self.others = group, granted, others
        self.changes: list[dict] = []

    def find_group(self, cfg, pool):
        return self.group

    def nodes(self, group):
        return []

    def quota_lines(self, cfg, pool, needs):
        mine = self.group.desired_nodes * P5_VCPUS
        return [QuotaLine(n.name, n.unit, n.scope, n.needed, self.granted,
                          in_use=self.others + mine, pool_in_use=mine) for n in needs]

    def request_quota(self, line, desired):
        return QuotaRequest(line.name, line.scope, desired, "req-1", "PENDING")

    def set_capacity(self, group, *, min_nodes, warm_nodes, warm_running, desired_nodes=None):
        self.changes.append({"min": min_nodes, "warm": warm_nodes, "desired": desired_nodes})
        self.group = replace(group, min_nodes=min_nodes, warm_min_nodes=warm_nodes,
                             desired_nodes=desired_nodes or max(group.desired_nodes, min_nodes))


def group(**kw) -> Group:
    base = dict(cloud="aws", name="acme-chat-70b", region="us-east-1", min_nodes=1,
                max_nodes=7, desired_nodes=1, warm_min_nodes=2, warm_state="stopped",
                version="1")
    return Group(**{**base, **kw})


def test_warm_rounds_replicas_up_and_is_absolute():
    cfg, pool = llama()
    ops = FakeOps(group(), granted=10_000)
    # 10 replicas at 4 per node: ceil(2.5) = 3 nodes = 12 replicas
    r = runtime.warm(cfg, pool, "aws", ops, 10)
    assert (r.nodes, r.replicas, r.rounded_up, r.changed) == (3, 12, True, True)
    assert r.after == GroupSizes(min_nodes=1, warm_nodes=3, desired_nodes=1)
    assert ops.changes == [{"min": 1, "warm": 3, "desired": None}]
    again = runtime.warm(cfg, pool, "aws", ops, 10)
    assert again.changed is False and "nothing changed" in again.message
    assert len(ops.changes) == 1
    # 12 replicas is exactly 3 nodes: no rounding
    assert runtime.warm(cfg, pool, "aws", ops, 12).rounded_up is False


def test_warm_running_then_reset_gives_back_exactly_those_nodes():
    cfg, pool = llama()
    ops = FakeOps(group(), granted=10_000)
    r = runtime.warm(cfg, pool, "aws", ops, 12, running=True)
    # the file's minimum 1 + 3 nodes = 4, in service now
    assert r.after == GroupSizes(min_nodes=4, warm_nodes=2, desired_nodes=4)
    # the autoscaler then adds 2 more (desired 6): reset removes the 3 that warm added
    ops.group = replace(ops.group, desired_nodes=6)
    back = runtime.warm(cfg, pool, "aws", ops, None, reset=True)
    assert back.after == GroupSizes(min_nodes=1, warm_nodes=2, desired_nodes=3)
    assert ops.changes[-1] == {"min": 1, "warm": 2, "desired": 3}


def test_warm_running_beyond_the_group_maximum_is_refused():
    cfg, pool = llama()
    ops = FakeOps(group(), granted=10_000)
    with pytest.raises(UsageError, match=r"--replicas 100: 25 node\(s\).*at most 24 replicas"):
        runtime.warm(cfg, pool, "aws", ops, 100, running=True)
    assert ops.changes == []


def test_warm_short_of_quota_changes_nothing():
    cfg, pool = llama()
    # warm pool 2 -> 3: the new warm node runs while it launches: 1 in service + 1 = 2
    # nodes = 384 vCPU beside 0 used by others; granted 300 -> 84 short
    ops = FakeOps(group(), granted=300)
    with pytest.raises(OperationFailed, match=r"short by 84 vCPU.*nothing was changed"):
        runtime.warm(cfg, pool, "aws", ops, 12)
    assert ops.changes == []
    # --running 3 nodes: 4 in service = 768 vCPU; granted 700 -> 68 short
    ops.granted = 700
    with pytest.raises(OperationFailed, match=r"short by 68 vCPU"):
        runtime.warm(cfg, pool, "aws", ops, 12, running=True)
    assert ops.changes == []


def test_quota_request_asks_for_granted_plus_shortfall():
    cfg, pool = llama()
    ops = FakeOps(group(desired_nodes=0), granted=1000, others=192)
    lines = runtime.quota_check(cfg, pool, "aws", ops)
    # 1344 needed + 192 used by others - 1000 granted = 536 short -> ask for 1536
    assert lines[0].shortfall == 536
    (req,) = runtime.quota_request(cfg, pool, "aws", ops, lines)
    assert req.desired == 1536
    assert runtime.quota_request(cfg, pool, "aws", FakeOps(group(), granted=2000)) == []


def test_wait_warm_reports_each_node_once_and_times_out(capsys):
    cfg, pool = llama()
    states = iter([
        [NodeState("i-1", "Warmed:Pending:Wait", "pending")],
        [NodeState("i-1", "Warmed:Pending:Wait", "pending")],
        [NodeState("i-1", "Warmed:Stopped", "warm")],
    ])

    class Ops(FakeOps):
        def nodes(self, group):
            return next(states)

    ops = Ops(group(), granted=10_000)
    res = runtime.WarmResult(pool.name, "aws", "warm", 4, 4, 1, 4, False,
                             GroupSizes(0, 0, 0), GroupSizes(1, 1, 1), True, "")
    out = runtime.wait_warm(cfg, pool, "aws", ops, res, timeout=60, hint="poolctl status",
                            sleep=lambda s: None)
    assert out.ready == 1 and [n.id for n in out.nodes] == ["i-1"]
    assert capsys.readouterr().err.count("i-1 warm after") == 1

    class Never(FakeOps):
        def nodes(self, group):
            return [NodeState("i-2", "Warmed:Pending:Wait", "pending")]

    with pytest.raises(OperationFailed, match=r"--timeout 0 s: 0 of 1 node\(s\) warm.*"
                                              r"watch with `poolctl status`"):
        runtime.wait_warm(cfg, pool, "aws", Never(group(), 1), res, timeout=0,
                          hint="poolctl status", sleep=lambda s: None)


# -- the config file, edited in place ------------------------------------------------------

FILE = """\
# the team's pool file
project: acme   # tag prefix
pools:
  - name: chat-70b
    model:
      id: meta-llama/Llama-3.1-70B-Instruct
      version: v1           # weights label
      params_b: 70.6
      dtype: bfloat16
      layers: 80
      kv_heads: 8
      head_dim: 128
    serving:
      image: vllm/vllm-openai:v0.11.0   # pinned after the load test
      tensor_parallel: 2
      max_model_len: 16384
    scaling: {min_replicas: 4, max_replicas: 24}
    aws:
      region: us-east-1
      instance_type: p5.48xlarge
      weights_uri: s3://acme-models/llama-3.1-70b/
"""


def changed_lines(a: str, b: str) -> list[tuple[str, str]]:
    return [(x, y) for x, y in zip(a.splitlines(), b.splitlines(), strict=True) if x != y]


def test_edit_changes_one_scalar_and_keeps_comments():
    new, old, line = runtime.edit_scalar(FILE, ("pools", 0, "serving", "image"),
                                         "vllm/vllm-openai:v0.11.1")
    assert (old, line) == ("vllm/vllm-openai:v0.11.0", 14)
    assert changed_lines(FILE, new) == [(
        "      image: vllm/vllm-openai:v0.11.0   # pinned after the load test",
        "      image: vllm/vllm-openai:v0.11.1   # pinned after the load test",
    )]
    assert parse_config(new).pools[0].serving.image == "vllm/vllm-openai:v0.11.1"


def test_edit_quotes_a_version_that_would_read_as_a_number():
    new, old, line = runtime.edit_scalar(FILE, ("pools", 0, "model", "version"), "2")
    assert (old, line) == ("v1", 7)
    assert changed_lines(FILE, new) == [("      version: v1           # weights label",
                                         '      version: "2"           # weights label')]
    assert parse_config(new).pools[0].model.version == "2"
    # a label that stays a string as plain YAML is written plain
    new, _, _ = runtime.edit_scalar(FILE, ("pools", 0, "model", "version"), "2025-06-a")
    assert "      version: 2025-06-a           # weights label" in new


@pytest.mark.parametrize("quoted,expect", [
    ('"vllm/vllm-openai:v0.11.0"', '"vllm/vllm-openai:v0.12.0"'),
    ("'vllm/vllm-openai:v0.11.0'", "'vllm/vllm-openai:v0.12.0'"),
])
def test_edit_keeps_the_quote_style(quoted, expect):
    text = FILE.replace("vllm/vllm-openai:v0.11.0", quoted)
    new, _, _ = runtime.edit_scalar(text, ("pools", 0, "serving", "image"),
                                    "vllm/vllm-openai:v0.12.0")
    assert f"      image: {expect}   # pinned after the load test" in new


def test_edit_in_a_flow_mapping():
    text = "serving: {image: 'a:1', port: 8000}  # flow style\n"
    new, old, line = runtime.edit_scalar(text, ("serving", "image"), "a:2")
    assert (old, line) == ("a:1", 1)
    assert new == "serving: {image: 'a:2', port: 8000}  # flow style\n"


def test_edit_refuses_a_key_that_is_not_in_the_file():
    text = FILE.replace("      version: v1           # weights label\n", "")
    with pytest.raises(UsageError) as e:
        runtime.edit_scalar(text, ("pools", 0, "model", "version"), "2", source="p.yaml")
    assert e.value.exit_code == 2
    assert "p.yaml: pools[0].model.version is not written in the file" in str(e.value)


def test_edit_refuses_a_multi_line_value():
    text = FILE.replace("      image: vllm/vllm-openai:v0.11.0   # pinned after the load test",
                        "      image: >-\n        vllm/vllm-openai:v0.11.0")
    with pytest.raises(UsageError, match=r"p.yaml:14: pools\[0\].serving.image must be a "
                                         r"one-line scalar"):
        runtime.edit_scalar(text, ("pools", 0, "serving", "image"), "x:y", source="p.yaml")


def test_record_in_file_writes_in_place_keeping_mode(tmp_path):
    f = tmp_path / "poolctl.yaml"
    f.write_text(FILE)
    os.chmod(f, 0o640)
    cfg = parse_config(FILE)
    new_cfg, old, changed, line = runtime.record_in_file(f, cfg, cfg.pools[0], "image",
                                                         "vllm/vllm-openai:v0.11.1")
    assert (old, changed, line) == ("vllm/vllm-openai:v0.11.0", True, 14)
    assert new_cfg.pools[0].serving.image == "vllm/vllm-openai:v0.11.1"
    assert len(changed_lines(FILE, f.read_text())) == 1
    assert stat.S_IMODE(f.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["poolctl.yaml"]  # no temp file left
    # the same value again: nothing written
    _, _, changed, _ = runtime.record_in_file(f, new_cfg, new_cfg.pools[0], "image",
                                              "vllm/vllm-openai:v0.11.1")
    assert changed is False


# -- the commands' help loads no cloud SDK -------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["quota", "check", "--help"], ["quota", "request", "--help"], ["warm", "--help"],
    ["status", "--help"], ["rollout", "start", "--help"], ["rollout", "status", "--help"],
    ["rollout", "rollback", "--help"], ["rollout", "cancel", "--help"],
])
def test_runtime_help_imports_no_cloud_sdk(argv):
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from poolctl.app import main\n"
        f"sys.argv = ['poolctl', *{argv!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code, file=sys.stderr)\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('boto3', 'botocore', 'google', 'cdktn', 'jsii')]\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "EXIT 0" in r.stderr and "HEAVY []" in r.stderr, r.stderr[-500:]
    assert "Usage:" in r.stdout


# -- rollback without the cloud's help -----------------------------------------------------


class RolloutOps(FakeOps):
    def __init__(self, state) -> None:
        super().__init__(group(), granted=10_000)
        self.state = state

    def rollout_state(self, group):
        return self.state


def _recorded(tmp_path, monkeypatch, status: str, rollout_id: str | None):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    f = tmp_path / "poolctl.yaml"
    f.write_text(FILE.replace("v0.11.0", "v0.12.0"))  # the file records the new version
    cfg = parse_config(f.read_text())
    runtime.save_record(cfg, cfg.pools[0], Cloud.aws, runtime.RolloutRecord(
        stack="acme-chat-70b-aws", pool="chat-70b", cloud=Cloud.aws, file=str(f),
        key="serving.image", from_value="vllm/vllm-openai:v0.11.0",
        to_value="vllm/vllm-openai:v0.12.0", status=status, rollout_id=rollout_id,
        action="start"), new=True)
    return f, cfg


def _no(q):
    raise AssertionError(f"asked {q!r}")


def rollback(cfg, f, ops) -> dict:
    """`rollout rollback` driven as the command drives it, with no question expected."""
    return stack.rollback(cfg, f, cfg.pools[0], Cloud.aws, ops, outdir=f.parent / "out",
                          confirm=_no)


def test_rollback_before_the_rollout_started_only_restores_the_file(tmp_path, monkeypatch):
    f, cfg = _recorded(tmp_path, monkeypatch, "applied", None)
    out = rollback(cfg, f, RolloutOps(None))
    assert (out["how"], out["to"]) == ("file", "vllm/vllm-openai:v0.11.0")
    assert changed_lines(FILE, f.read_text()) == []  # back to the original, comment kept
    assert runtime.load_record(cfg, cfg.pools[0], "aws").status == "rolled_back"


def test_rollback_after_an_automatic_rollback_only_restores_the_file(tmp_path, monkeypatch):
    from poolctl.clouds.base import RolloutState

    f, cfg = _recorded(tmp_path, monkeypatch, "started", "r-1")
    done = RolloutState("r-1", "rolled_back", True, 0.0)
    out = rollback(cfg, f, RolloutOps(done))
    assert out["how"] == "already_rolled_back"
    assert changed_lines(FILE, f.read_text()) == []


def test_rollback_refuses_a_file_edited_since(tmp_path, monkeypatch, capsys):
    from poolctl.clouds.base import RolloutState

    f, cfg = _recorded(tmp_path, monkeypatch, "started", "r-1")
    f.write_text(FILE.replace("v0.11.0", "v0.13.0"))  # someone moved on by hand
    done = RolloutState("r-1", "rolled_back", True, 0.0)
    rollback(cfg, f, RolloutOps(done))
    assert "v0.13.0" in f.read_text()
    assert "neither vllm/vllm-openai:v0.12.0 nor vllm/vllm-openai:v0.11.0; left as is" in (
        capsys.readouterr().err)
