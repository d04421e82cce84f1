"""How long a sandbox node boots by itself (the plan's start time over the boot speedup), and
docs/sandbox.md's list of the sandbox's admin endpoints.

No sandbox runs here (tests/ops/test_sandbox.py drives the server); the figures are worked
out by hand from poolctl/sizing.py's constants and the catalog's p5.48xlarge row.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from poolctl.app import main
from poolctl.config import load_config
from poolctl.envcheck import environment_problem
from poolctl.sandbox import manager
from poolctl.sandbox.extensions import admin
from poolctl.sandbox.extensions.self_boot import boot_delay_s

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama-70b-p5" / "poolctl.yaml"


def test_start_times_of_the_example_are_the_plans_phases_summed():
    pool = load_config(EXAMPLE).pools[0]
    # Llama-3.1-70B bf16: 70.6e9 x 2 B = 141.2 GB of weights, 70.6 GB per GPU at TP 2.
    # weights_to_nvme: NIC min(3200, 100) Gbit/s = 12.5 GB/s x 0.25 = 3.125 GB/s
    #   -> 141.2 / 3.125 = 45.184 -> 45.2 s
    # load_to_gpu: max(141.2 / (8 NVMe x 2 GB/s) = 8.825, 70.6 / 2 GB/s = 35.3) = 35.3 s
    # cold: boot 120 + image 12 GB / 0.1 GB/s = 120 + 45.2 + 35.3 + engine 90 + register 30
    # warm_stopped: boot 60 + image 0 + 45.2 + 35.3 + 90 + 30; warm_running: register 30
    assert manager.start_times(pool) == {"cold": 440.5, "warm_stopped": 260.5,
                                         "warm_running": 30.0}


def test_boot_delay_is_the_start_time_over_the_speedup():
    times = {"cold": 440.5, "warm_stopped": 260.5, "warm_running": 30.0}
    assert boot_delay_s(times, "cold", 100) == pytest.approx(4.405)
    assert boot_delay_s(times, "warm_stopped", 100) == pytest.approx(2.605)
    assert boot_delay_s(times, "warm_running", 100) == pytest.approx(0.3)
    assert boot_delay_s(times, "warm_stopped", 1) == pytest.approx(260.5)  # real time
    # A group known only by its DefaultInstanceWarmup (the plan's cold start): every kind.
    assert boot_delay_s({"cold": 440.0}, "warm_stopped", 200) == pytest.approx(2.2)
    # Speedup 0: nodes boot when told (boot-nodes), never by themselves.
    assert boot_delay_s(times, "cold", 0) is None


@pytest.mark.parametrize(("raw", "ok"), [("100", True), ("0", True), ("2.5", True),
                                         ("fast", False), ("-1", False), ("inf", False)])
def test_boot_speedup_variable_is_checked_before_any_command(raw, ok):
    problem = environment_problem({"POOLCTL_SANDBOX_BOOT_SPEEDUP": raw})
    assert (problem is None) is ok
    if not ok:
        assert problem.startswith(f"POOLCTL_SANDBOX_BOOT_SPEEDUP={raw}: ")


@pytest.mark.parametrize("argv", [["--manual-boot", "--boot-speedup", "5"],
                                  ["--boot-speedup", "-3"]])
def test_conflicting_or_negative_boot_flags_are_one_line_exit_2(argv, tmp_path, monkeypatch,
                                                                 capsys):
    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["poolctl", "sandbox", "start", "--port", "0", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err and "--boot-speedup" in err, err
    assert not (tmp_path / "sandbox" / "state.json").exists()  # nothing started


def test_docs_list_every_admin_endpoint_the_server_answers():
    import re

    source = Path(admin.__file__).read_text()
    # every path the admin middleware compares against (== or startswith)
    paths = set(re.findall(r'path(?: ==|\.startswith\()\s*"(/_poolctl/[a-z-]+)', source))
    assert {"/_poolctl/boot", "/_poolctl/start-times", "/_poolctl/health"} <= paths
    page = (Path(__file__).resolve().parents[2] / "docs" / "sandbox.md").read_text()
    assert [p for p in sorted(paths) if p not in page] == []


@pytest.mark.parametrize(("speed", "wall"), [
    (1.0, 15.0),  # real time: the script's timer, every 15 s
    (2.0, 7.5),  # 15 / 2, already past the 5-s floor
    (10.0, 5.0),  # 1.5 s would start 0.4 s of aws CLI per node every 1.5 s: the floor
    (20.0, 2.7),  # the floor would skip 60-s periods (100 s of pool): 0.9 x 60 / 20
])
def test_a_serving_nodes_queue_timer_spares_the_cpu_but_fills_every_period(speed, wall):
    from poolctl.sandbox.extensions.serving_nodes import queue_period_wall

    assert queue_period_wall(speed) == pytest.approx(wall)
    assert queue_period_wall(speed) * speed <= 60  # a datapoint in every metric period
