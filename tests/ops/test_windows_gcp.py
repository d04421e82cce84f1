"""Launch windows on GCP (`poolctl.clouds.gcp.windows`) against the Compute Engine fake
(tests/fakes/gce.py), with the real google-cloud-compute client over HTTP.

The pool is the contract's example on a3-highgpu-8g (tests/configs.pool_yaml): 4 replicas per
node, autoscaler 1..6, 2 stopped standby VMs, as `poolctl deploy` leaves it. A window of 8
replicas = 2 nodes: a scaling schedule of minRequiredReplicas 1 + 2 = 3.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

pytest.importorskip("google.cloud.compute_v1",
                    reason="google-cloud-compute is not installed (pip install -e .[gcp])")

from google.auth.credentials import AnonymousCredentials  # noqa: E402

from poolctl import naming, runtime  # noqa: E402
from poolctl.clouds.gcp.ops import GcpOps  # noqa: E402
from poolctl.config import parse_config  # noqa: E402
from poolctl.errors import OperationFailed, UsageError  # noqa: E402
from tests.configs import pool_yaml  # noqa: E402
from tests.fakes.gce import FakeGce  # noqa: E402

PROJECT, REGION, MIG = "acme-prod", "us-central1", "acme-chat-70b"
ZONES = ["us-central1-a", "us-central1-b", "us-central1-c"]
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def fake():
    f = FakeGce().start()
    yield f
    f.stop()
    assert f.errors == []  # every request and response in the real message shapes


@pytest.fixture
def setup(fake):
    cfg = parse_config(pool_yaml())
    pool = cfg.pools[0]
    # Room for the windows' 3 nodes at once: 24 H100, 624 vCPUs, 18,000 GB of local SSD.
    fake.add_region(PROJECT, REGION, ZONES, quotas={
        "NVIDIA_H100_GPUS": (64, 8), "CPUS": (2000, 208), "LOCAL_SSD_TOTAL_GB": (60000, 6000)})
    fake.set_project_quota(PROJECT, "GPUS_ALL_REGIONS", 64, 8)
    fake.deploy_pool(project=PROJECT, region=REGION, name=MIG,
                     labels=naming.gcp_labels(cfg, pool), zones=ZONES,
                     template="acme-chat-70b-20260105090000000000000001", running=1,
                     stopped=2, autoscaler=(1, 6), max_surge=3)
    ops = GcpOps(client_options={"api_endpoint": fake.endpoint},
                 credentials=AnonymousCredentials(), retry_initial_s=0.01,
                 retry_deadline_s=5)
    return cfg, pool, ops


def schedules(fake) -> dict:
    return fake.autoscalers[(PROJECT, REGION, MIG)]["autoscalingPolicy"].get(
        "scalingSchedules", {})


def test_a_window_is_a_scaling_schedule_in_the_autoscalers_real_shape(fake, setup):
    cfg, pool, ops = setup
    start = (NOW + timedelta(hours=2)).replace(second=0)
    end = start + timedelta(hours=1, seconds=30)
    res = runtime.schedule_window(cfg, pool, "gcp", ops, 8, start, end, running=True, now=NOW)
    name = f"poolctl-window-{res.window}"
    # durationSec: 1 h 30 s = 3630 s from the whole minute the cron names.
    assert schedules(fake) == {name: {
        "minRequiredReplicas": 3,
        "schedule": f"{start.minute} {start.hour} {start.day} {start.month} * {start.year}",
        "timeZone": "UTC", "durationSec": 3630, "disabled": False,
        "description": "poolctl window: +2 node(s) over a minimum of 1"}}
    # Written with regionAutoscalers.update, the rest of the policy unchanged.
    pol = fake.autoscalers[(PROJECT, REGION, MIG)]["autoscalingPolicy"]
    assert (pol["minNumReplicas"], pol["maxNumReplicas"]) == (1, 6)
    assert any(r["method"] == "PUT" and r["path"].endswith("/autoscalers")
               for r in fake.requests)

    listed = runtime.list_windows(cfg, pool, "gcp", ops, NOW)
    (row,) = listed.windows
    assert (row.id, row.nodes, row.replicas, row.state, row.min_nodes) == (
        res.window, 2, 8, "scheduled", 3)
    assert row.start == start.isoformat()

    # A second, overlapping window of 4 replicas (1 node): its own schedule at 1 + 1 = 2;
    # the autoscaler takes the larger of the two where they overlap.
    other = runtime.schedule_window(cfg, pool, "gcp", ops, 4, start + timedelta(minutes=30),
                                    end + timedelta(hours=1), running=True, now=NOW)
    assert sorted(s["minRequiredReplicas"] for s in schedules(fake).values()) == [2, 3]

    runtime.cancel_window(cfg, pool, "gcp", ops, res.window, NOW)
    assert list(schedules(fake)) == [f"poolctl-window-{other.window}"]
    runtime.cancel_window(cfg, pool, "gcp", ops, other.window, NOW)
    assert schedules(fake) == {}


def test_gcp_refuses_a_window_beyond_the_group_and_schedules_nothing(fake, setup):
    cfg, pool, ops = setup
    start = NOW + timedelta(hours=1)
    with pytest.raises(UsageError, match="--replicas 24"):  # 6 nodes over 1 > max 6
        runtime.schedule_window(cfg, pool, "gcp", ops, 24, start, start + timedelta(hours=1),
                                running=True, now=NOW)
    assert schedules(fake) == {}


def test_gcp_reserve_offers_calendar_mode_and_requests_only_with_yes(fake, setup):
    cfg, pool, ops = setup
    start = (NOW + timedelta(days=2)).replace(minute=0, second=0)
    end = start + timedelta(hours=2)
    # 8 replicas = 2 VMs; whole days from a day before the start to the end: 2 days.
    offered = runtime.schedule_window(cfg, pool, "gcp", ops, 8, start, end, running=True,
                                      now=NOW, reserve=True)
    (offer,) = offered.offerings
    assert (offered.action, offer.count, offer.zone, offer.instance_type) == (
        "offered", 2, "us-central1-a", "a3-highgpu-8g")
    assert (offer.start, offer.end) == (start - timedelta(days=1), start + timedelta(days=1))
    assert "nothing requested or scheduled" in offered.message
    assert fake.future_reservations == {} and schedules(fake) == {}
    (asked,) = [r for r in fake.requests if r["path"].endswith("/advice/calendarMode")]
    assert asked["method"] == "POST"

    made = runtime.schedule_window(cfg, pool, "gcp", ops, 8, start, end, running=True,
                                   now=NOW, reserve=True, yes=True)
    ((key, fr),) = fake.future_reservations.items()
    assert key == (PROJECT, "us-central1-a", f"chat-70b-{made.window}")
    assert (fr["reservationMode"], fr["planningStatus"]) == ("CALENDAR", "SUBMITTED")
    sku = fr["specificSkuProperties"]
    # 16 Local SSDs of 375 GB, NVMe: the VMs' own, so that they match the reservation.
    assert (int(sku["totalCount"]), sku["instanceProperties"]["machineType"],
            len(sku["instanceProperties"]["localSsds"])) == (2, "a3-highgpu-8g", 16)
    assert fr["timeWindow"] == {"startTime": offer.start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                "endTime": offer.end.strftime("%Y-%m-%dT%H:%M:%SZ")}
    assert fr["specificReservationRequired"] is False
    assert made.bought == key[2] and "PENDING_APPROVAL" in made.message
    # And the window itself, as without --reserve: a scaling schedule of 1 + 2 VMs.
    (sched,) = schedules(fake).values()
    assert sched["minRequiredReplicas"] == 3


def test_gcp_reserve_refusals_write_nothing(fake, setup):
    cfg, pool, ops = setup
    start = NOW + timedelta(days=2)
    with pytest.raises(UsageError, match="60 days ahead"):
        far = NOW + timedelta(days=70)
        runtime.schedule_window(cfg, pool, "gcp", ops, 8, far, far + timedelta(hours=2),
                                running=True, now=NOW, reserve=True, yes=True)
    for zone in ZONES:  # no room anywhere: no advice, one line, exit 1
        fake.set_capacity(zone, "a3-highgpu-8g", 1)
    with pytest.raises(OperationFailed, match="advises no calendar-mode reservation"):
        runtime.schedule_window(cfg, pool, "gcp", ops, 8, start, start + timedelta(hours=2),
                                running=True, now=NOW, reserve=True, yes=True)
    named = parse_config(pool_yaml(extra_gcp="      capacity: {reservations: none}\n"))
    with pytest.raises(UsageError, match="gcp.capacity.reservations"):
        runtime.schedule_window(named, named.pools[0], "gcp", ops, 8, start,
                                start + timedelta(hours=2), running=True, now=NOW,
                                reserve=True, yes=True)
    assert fake.future_reservations == {} and schedules(fake) == {}


def test_gcp_reserve_run_again_after_ctrl_c_finds_its_request_instead_of_a_second(
        fake, setup, tmp_path, monkeypatch):
    """Issue 31: Ctrl-C after the future reservation was submitted, before the window's
    schedule: the next run finds the request it made (same name from the window's id, the
    insert answered 409) and schedules the window; a third run says the window exists."""
    import json
    import os

    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path))
    cfg, pool, ops = setup
    start = (NOW + timedelta(days=2)).replace(minute=0, second=0)
    end = start + timedelta(hours=2)
    real = ops.write_windows

    def stop(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(ops, "write_windows", stop)
    with pytest.raises(KeyboardInterrupt):
        runtime.schedule_window(cfg, pool, "gcp", ops, 8, start, end, running=True, now=NOW,
                                reserve=True, yes=True)
    assert len(fake.future_reservations) == 1 and schedules(fake) == {}
    monkeypatch.setattr(ops, "write_windows", real)
    made = runtime.schedule_window(cfg, pool, "gcp", ops, 8, start, end, running=True,
                                   now=NOW, reserve=True, yes=True)
    assert made.action == "scheduled" and len(fake.future_reservations) == 1
    assert len(schedules(fake)) == 1
    again = runtime.schedule_window(cfg, pool, "gcp", ops, 8, start, end, running=True,
                                    now=NOW, reserve=True, yes=True)
    assert (again.action, again.window) == ("exists", made.window)
    assert len(fake.future_reservations) == 1
    steps = [json.loads(x) for x in (tmp_path / "purchases.jsonl").read_text().splitlines()]
    assert [s["state"] for s in steps] == ["buying", "bought", "buying", "bought"]
    assert {s["kind"] for s in steps} == {"future-reservation"}
    assert os.stat(tmp_path / "purchases.jsonl").st_mode & 0o777 == 0o600
