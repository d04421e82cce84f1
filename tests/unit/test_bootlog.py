"""The phase ledger: a node's boots read back from its console (poolctl.bootlog) and the
start times kept from them (poolctl.starts). Logs written by hand in the boot script's
format (boot/_node_lib.sh.j2)."""

from __future__ import annotations

import json

import pytest

from poolctl import starts
from poolctl.bootlog import parse_boots
from poolctl.cloud import Cloud
from poolctl.config import parse_config
from tests.configs import pool_yaml

# A warm pool node: readied (stopped before the weights), then started to serve; kernel and
# cloud-init lines around, as an EC2 console has them.
WARM = """\
[    0.000000] Linux version 6.8.0-1015-aws
[   61.2] cloud-init[812]: running user data
poolctl: boot: acme-chat-70b serving meta-llama/Llama-3.1-70B-Instruct version 1, uptime 58.31s
poolctl: boot: lifecycle target Warmed:Stopped
poolctl: phase=gpus seconds=2
poolctl: phase=image seconds=121
poolctl: boot: warm pool (Warmed:Stopped), image ready; the cache fills on start
poolctl: phase=total seconds=121 uptime=180.02
[    0.000000] Linux version 6.8.0-1015-aws
poolctl: boot: acme-chat-70b serving meta-llama/Llama-3.1-70B-Instruct version 1, uptime 31.5s
poolctl: boot: lifecycle target InService
poolctl: image: vllm/vllm-openai:v0.11.0 is on the root volume already
poolctl: phase=hydrate seconds=4
poolctl: phase=image seconds=4
poolctl: phase=gpus seconds=2
poolctl: phase=nvme seconds=3
poolctl: phase=weights seconds=46
poolctl: phase=serving seconds=90
poolctl: phase=readiness seconds=38
poolctl: lifecycle=CONTINUE
poolctl: phase=total seconds=179 uptime=210.5
"""


def test_a_warm_nodes_two_boots():
    prep, start = parse_boots(WARM)
    assert (prep.kind, prep.served, prep.boot_s) == ("warm_prep", False, 58.31)
    assert prep.phases == {"gpus": 2, "image": 121}
    assert start.kind == "warm_stopped" and start.served
    assert start.phases == {"hydrate": 4, "image": 4, "gpus": 2, "nvme": 3, "weights": 46,
                            "serving": 90, "readiness": 38}
    assert (start.boot_s, start.script_s, start.uptime_s) == (31.5, 179, 210.5)
    assert start.image_on_disk and not start.weights_cached and start.failed_in is None


def test_a_cold_boot_a_running_warm_node_and_a_failure():
    cold = parse_boots(
        "poolctl: boot: p serving m version 1, uptime 120s\n"
        "poolctl: boot: lifecycle target InService\n"
        "poolctl: phase=gpus seconds=1\npoolctl: phase=nvme seconds=2\n"
        "poolctl: weights: m version 1 is in the cache already\n"
        "poolctl: phase=weights seconds=0\n"
        "poolctl: phase=total seconds=9 uptime=129\n")
    assert [(b.kind, b.weights_cached, b.uptime_s) for b in cold] == [("cold", True, 129)]
    assert not cold[0].weights_streamed
    streamed = parse_boots(  # aws.weights_load: stream: no weights phase, the engine reads them
        "poolctl: boot: p serving m version 1, uptime 120s\n"
        "poolctl: phase=nvme seconds=2\n"
        "poolctl: weights: streamed by the engine from s3://b/m/\n"
        "poolctl: phase=serving seconds=1\npoolctl: phase=readiness seconds=60\n"
        "poolctl: phase=total seconds=70 uptime=190\n")
    assert [(b.weights_streamed, b.weights_cached, "weights" in b.phases) for b in streamed] == [
        (True, False, False)]
    assert streamed[0].to_json()["weights_streamed"] is True
    running = parse_boots("poolctl: boot: p serving m version 1, uptime 60s\n"
                          "poolctl: boot: lifecycle target Warmed:Running\n"
                          "poolctl: phase=total seconds=200 uptime=260\n")
    assert running[0].kind == "warm_running" and running[0].served
    # A failure: the phase it was in (the engine's start, which reads the API key) and the
    # FAILED line; no uptime: it never served.
    failed = parse_boots("poolctl: boot: p serving m version 1, uptime 118s\n"
                         "poolctl: phase=weights seconds=45\n"
                         "poolctl: FAILED: api key: cannot read secret arn:x\n"
                         "poolctl: phase=failed seconds=51 in=serving\n")
    [b] = failed
    assert (b.failed_in, b.failure, b.served) == ("serving", "api key: cannot read secret arn:x",
                                                  False)
    # A console cut in the middle of a boot (EC2 keeps the last 64 KB): what came before the
    # first `boot:` line is no boot of its own.
    assert parse_boots("poolctl: phase=weights seconds=45\n") == []
    # Lines from outside are text: a control character in a failure is escaped.
    [b] = parse_boots("poolctl: boot: p serving m version 1, uptime 1s\n"
                      "poolctl: FAILED: bad \x1b[31mred\n")
    assert "\x1b" not in (b.failure or "")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path))
    return tmp_path


def test_starts_are_kept_once_each_and_summed_by_kind(home):
    cfg = parse_config(pool_yaml())
    pool = cfg.pools[0]
    assert starts.measured_starts(cfg, pool, Cloud.aws) == {}
    starts.record(cfg, pool, Cloud.aws, [("i-1#0", "cold", 360.0), ("i-2#0", "cold", 380.0),
                                         ("i-3#1", "warm_stopped", 230.0)])
    # read again (the same consoles) and one more: i-1#0 is not counted twice
    starts.record(cfg, pool, Cloud.aws, [("i-1#0", "cold", 360.0), ("i-4#0", "cold", 420.0)])
    got = starts.measured_starts(cfg, pool, Cloud.aws)
    # cold: 360, 380, 420: p50 380; p90 at rank 0.9 x 2 = 1.8: 380 + 0.8 x 40 = 412
    assert (got["cold"].n, got["cold"].p50_s, got["cold"].p90_s) == (3, 380.0, 412.0)
    assert (got["warm_stopped"].n, got["warm_stopped"].p50_s) == (1, 230.0)
    assert "warm_running" not in got
    f = starts.path(cfg, pool, Cloud.aws)
    assert f.stat().st_mode & 0o777 == 0o600 and f.is_relative_to(home)
    # A hand-edited file: lines that are not samples are left out, never a traceback.
    data = json.loads(f.read_text())
    data["samples"] += [{"key": "x", "kind": "cold", "seconds": "soon"}, "junk",
                        {"key": "y", "kind": "lukewarm", "seconds": 1, "at": "now"}]
    f.write_text(json.dumps(data))
    assert starts.measured_starts(cfg, pool, Cloud.aws)["cold"].n == 3
    f.write_text("{not json")
    assert starts.measured_starts(cfg, pool, Cloud.aws) == {}


def test_plan_and_simulate_use_measured_starts_and_say_so(home, monkeypatch, capsys):
    from pathlib import Path

    from poolctl.capacity import autoscale_for, measured_start_times
    from poolctl.config import load_config
    from poolctl.sizing import plan_pool
    from tests.unit.test_simulate import one_line, poolctl_main

    example = Path(__file__).resolve().parents[2] / "examples" / "llama-70b-p5" / "poolctl.yaml"
    cfg = load_config(example)
    pool = cfg.pools[0]
    code, _, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(example), "--cloud",
                                "aws", "--measured")
    assert "--measured: no start of pool chat-70b on aws has been measured yet" in one_line(
        code, err)
    starts.record(cfg, pool, Cloud.aws, [("i-1#0", "cold", 400.0), ("i-2#0", "cold", 420.0),
                                         ("i-3#0", "cold", 440.0), ("i-4#1", "warm_stopped",
                                                                    150.0)])
    # p50 of the boots (power-on to serving) plus joining the load balancer (the plan's
    # register phase, 30 s): cold 420 + 30, warm stopped 150 + 30
    times = measured_start_times(pool, Cloud.aws, starts.measured_starts(cfg, pool, Cloud.aws))
    assert times == {"cold": 450.0, "warm_stopped": 180.0}
    sc = autoscale_for(pool, Cloud.aws, plan_pool(pool, Cloud.aws), None, times)
    assert (sc.cold_start_s, sc.warm_start_s) == (450.0, 180.0)
    code, out, err = poolctl_main(monkeypatch, capsys, "plan", "-f", str(example), "--cloud",
                                  "aws", "--measured", "--json")
    assert code == 0, err
    [entry] = json.loads(out)["pools"]
    assert entry["start_times"]["source"] == "measured"
    assert entry["start_times"]["seconds"] == {"cold": 450.0, "warm_stopped": 180.0}
    code, out, err = poolctl_main(monkeypatch, capsys, "simulate", "-f", str(example),
                                  "--cloud", "aws", "--rate", "1", "--duration", "120",
                                  "--json")
    assert code == 0, err
    assert json.loads(out)["start_times"]["seconds"]["cold"] == 450.0
    assert "chat-70b/aws: start times measured: cold 450 s (p50 of 3 boot(s)" in err


def test_what_the_shared_compile_cache_gave_each_boot():
    """`compile cache: hit|miss|on disk` (node.sh.j2's compile_cache_fetch) and its phase;
    `saved` after the total is no outcome of the boot; no line: no shared cache."""
    console = """\
poolctl: boot: acme-chat-70b serving meta-llama/Llama-3.1-70B-Instruct version 1, uptime 120.0s
poolctl: phase=weights seconds=45
poolctl: compile cache: miss s3://acme-models/compile-cache/m-tp2-0123456789abcdef.tar
poolctl: phase=compile_cache seconds=2
poolctl: phase=serving seconds=90
poolctl: phase=total seconds=300 uptime=420.0
poolctl: compile cache: saved s3://acme-models/compile-cache/m-tp2-0123456789abcdef.tar
poolctl: boot: acme-chat-70b serving meta-llama/Llama-3.1-70B-Instruct version 1, uptime 60.0s
poolctl: compile cache: on disk
poolctl: phase=compile_cache seconds=0
poolctl: phase=total seconds=150 uptime=210.0
"""
    first, second = parse_boots(console)
    assert (first.compile_cache, first.phases["compile_cache"]) == ("miss", 2)
    assert second.compile_cache == "on disk"
    assert first.to_json()["compile_cache"] == "miss"
    [plain] = parse_boots(WARM)[1:]
    assert plain.compile_cache is None
