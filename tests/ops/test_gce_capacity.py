"""Capacity in the Compute Engine fake (tests/fakes/gce.py): zones that run out of a machine
type, regional MIG target shapes around them, and reservations, driven over HTTP with the real
google-cloud-compute client.

The pool is a regional MIG of a3-highgpu-8g over us-central1-a, -b, -c, seeded with no VM;
every count below is worked out from the target shape's rule in the fake's docstring.
"""

from __future__ import annotations

from collections import Counter

import pytest

compute_v1 = pytest.importorskip(
    "google.cloud.compute_v1",
    reason="google-cloud-compute is not installed (pip install -e .[gcp])")

from google.api_core import exceptions as gexc  # noqa: E402
from google.auth.credentials import AnonymousCredentials  # noqa: E402

from poolctl import naming, runtime  # noqa: E402
from poolctl.cloud import Cloud  # noqa: E402
from poolctl.clouds.base import capacity_needs, failures_line  # noqa: E402
from poolctl.clouds.gcp.ops import GcpOps  # noqa: E402
from poolctl.commands.capacity import capacity_problem  # noqa: E402
from poolctl.config import parse_config  # noqa: E402
from poolctl.errors import UsageError  # noqa: E402
from poolctl.runtime.common import stalled_launches  # noqa: E402
from poolctl.sizing import plan_pool  # noqa: E402
from tests.configs import pool_yaml  # noqa: E402
from tests.fakes.gce import FakeGce, seed_pool  # noqa: E402

PROJECT, REGION, MIG = "acme-prod", "us-central1", "acme-chat-70b"
A, B, C = "us-central1-a", "us-central1-b", "us-central1-c"
MACHINE = "a3-highgpu-8g"
TEMPLATE = "acme-chat-70b-20260105090000000000000001"


def exhausted(zone: str) -> str:
    return (f"The zone 'projects/{PROJECT}/zones/{zone}' does not have enough resources "
            "available to fulfill the request.  Try a different zone, or try again later.")


@pytest.fixture
def fake():
    f = FakeGce().start()
    yield f
    f.stop()
    assert f.errors == []  # every answer parsed as its compute_v1 message, unknown fields refused


def _client(fake, name: str):
    return getattr(compute_v1, name)(
        credentials=AnonymousCredentials(), transport="rest",
        client_options={"api_endpoint": fake.endpoint})


@pytest.fixture
def migs(fake):
    return _client(fake, "RegionInstanceGroupManagersClient")


@pytest.fixture
def reservations(fake):
    return _client(fake, "ReservationsClient")


def _deploy(fake, shape: str = "BALANCED", running: int = 0, stopped: int = 0) -> None:
    fake.deploy_pool(project=PROJECT, region=REGION, name=MIG, labels={}, zones=[A, B, C],
                     template=TEMPLATE, running=running, stopped=stopped, autoscaler=None)
    fake.migs[(PROJECT, REGION, MIG)]["distributionPolicy"]["targetShape"] = shape


def _done(fake, op) -> None:
    """Poll a region or zone operation to DONE with the operations client on the fake (an
    ExtendedOperation's own polling goes to compute.googleapis.com); raise its error."""
    if op.zone:
        ops, where = _client(fake, "ZoneOperationsClient"), {"zone": op.zone.rsplit("/", 1)[1]}
    else:
        ops, where = _client(fake, "RegionOperationsClient"), {"region": REGION}
    for _ in range(10):
        op = ops.get(project=PROJECT, operation=op.name, **where)
        if op.status == compute_v1.Operation.Status.DONE:
            assert not op.error.errors, op.error
            return
    raise AssertionError(f"{op.name} not DONE")


def _resize(fake, migs, size: int) -> None:
    _done(fake, migs.resize_unary(project=PROJECT, region=REGION, instance_group_manager=MIG,
                                  size=size))


def _managed(migs) -> list:
    return list(migs.list_managed_instances(project=PROJECT, region=REGION,
                                            instance_group_manager=MIG))


def _zone(mi) -> str:
    return mi.instance.split("/zones/")[1].split("/")[0]


def _running_zones(migs) -> Counter:
    return Counter(_zone(mi) for mi in _managed(migs) if mi.instance_status == "RUNNING")


def _errors(migs) -> list:
    return list(migs.list_errors(project=PROJECT, region=REGION, instance_group_manager=MIG))


def _affinity(fake, kind: str, *names: str) -> None:
    props = fake.templates[(PROJECT, TEMPLATE)]["properties"]
    props["reservationAffinity"] = {"consumeReservationType": kind}
    if names:
        props["reservationAffinity"].update(key="compute.googleapis.com/reservation-name",
                                            values=list(names))


# -------------------------------------------------------------------------------------
# zone capacity and target shapes


def test_balanced_skips_a_stocked_out_zone(fake, migs):
    _deploy(fake, "BALANCED")
    fake.set_capacity(A, MACHINE, 0)
    _resize(fake, migs, 3)
    fake.settle()
    # Room in b and c only; fewest first, ties by zone order: b, c, b.
    assert _running_zones(migs) == Counter({B: 2, C: 1})
    assert _errors(migs) == []


def test_even_waits_in_the_stocked_out_zone_with_the_error_as_gce_shows_it(fake, migs):
    _deploy(fake, "EVEN")
    fake.set_capacity(A, MACHINE, 0)
    _resize(fake, migs, 3)
    # One VM per zone; a's cannot be created and stays CREATING, not yet a VM.
    held = [mi for mi in _managed(migs) if _zone(mi) == A]
    assert len(held) == 1 and held[0].current_action == "CREATING"
    assert held[0].instance_status == ""
    (err,) = held[0].last_attempt.errors.errors
    assert (err.code, err.message) == ("ZONE_RESOURCE_POOL_EXHAUSTED", exhausted(A))
    # listErrors: one entry per failed attempt, with the action, the VM and its version.
    (first,) = _errors(migs)
    assert (first.error.code, first.error.message) == (
        "ZONE_RESOURCE_POOL_EXHAUSTED", exhausted(A))
    assert first.instance_action_details.action == "CREATING"
    assert first.instance_action_details.instance == held[0].instance
    assert first.instance_action_details.version.instance_template.split("?")[0].endswith(
        f"/instanceTemplates/{TEMPLATE}")
    assert first.timestamp
    fake.settle()  # b and c come up; a tries again and fails again: a second entry
    assert _running_zones(migs) == Counter({B: 1, C: 1})
    group = migs.get(project=PROJECT, region=REGION, instance_group_manager=MIG)
    assert group.current_actions.creating == 1 and not group.status.is_stable
    again = _errors(migs)
    assert len(again) == 2 and again[0].timestamp > again[1].timestamp  # newest first
    fake.set_capacity(A, MACHINE, None)
    fake.settle()
    assert _running_zones(migs) == Counter({A: 1, B: 1, C: 1})


def test_every_zone_exhausted_names_each_zone(fake, migs):
    _deploy(fake, "BALANCED")
    for zone in (A, B, C):
        fake.set_capacity(zone, MACHINE, 0)
    _resize(fake, migs, 2)
    fake.settle()
    managed = _managed(migs)
    assert [mi.current_action for mi in managed] == ["CREATING", "CREATING"]
    # No zone has room: BALANCED falls back to the fewest VMs, a then b.
    assert {_zone(mi) for mi in managed} == {A, B}
    assert {e.error.message for e in _errors(migs)} == {exhausted(A), exhausted(B)}
    # Not VMs yet: instances.aggregatedList has none.
    listed = _client(fake, "InstancesClient").aggregated_list(project=PROJECT)
    assert [i for _zone_name, scoped in listed for i in scoped.instances] == []
    # Room in c: on retry both go there (BALANCED moves a VM not yet created).
    fake.set_capacity(C, MACHINE, 2)
    fake.settle()
    assert _running_zones(migs) == Counter({C: 2})


def test_any_single_zone_puts_every_vm_where_there_is_room(fake, migs):
    _deploy(fake, "ANY_SINGLE_ZONE")
    fake.set_capacity(A, MACHINE, 0)
    _resize(fake, migs, 3)
    fake.settle()
    assert _running_zones(migs) == Counter({B: 3})


def test_starting_a_standby_vm_needs_capacity(fake, migs):
    _deploy(fake, "BALANCED", running=0, stopped=2)
    standby = {_zone(mi) for mi in _managed(migs)}
    for zone in (A, B, C):
        fake.set_capacity(zone, MACHINE, 0)  # a stopped VM holds none: still fine
    _resize(fake, migs, 1)
    fake.settle()
    starting = [mi for mi in _managed(migs) if mi.current_action == "STARTING"]
    assert len(starting) == 1 and starting[0].instance_status == "TERMINATED"
    assert _zone(starting[0]) in standby
    # The start failed (at the resize, again at settle), and so did the new standby VM
    # that refills the pool to its targetStoppedSize of 2 (creating needs room too).
    errors = _errors(migs)
    assert Counter(e.instance_action_details.action for e in errors) == Counter(
        {"STARTING": 2, "CREATING": 2})
    assert {e.error.code for e in errors} == {"ZONE_RESOURCE_POOL_EXHAUSTED"}
    fake.set_capacity(_zone(starting[0]), MACHINE, 1)
    fake.settle()
    assert sum(_running_zones(migs).values()) == 1


# -------------------------------------------------------------------------------------
# reservations


def test_reservations_insert_get_list_delete(fake, reservations):
    fake.add_region(PROJECT, REGION, [A, B, C])
    body = compute_v1.Reservation(
        name="h100-a", specific_reservation_required=True,
        specific_reservation=compute_v1.AllocationSpecificSKUReservation(
            count=2, instance_properties=compute_v1
            .AllocationSpecificSKUAllocationReservedInstanceProperties(machine_type=MACHINE)))
    _done(fake, reservations.insert_unary(project=PROJECT, zone=A, reservation_resource=body))
    got = reservations.get(project=PROJECT, zone=A, reservation="h100-a")
    assert (got.status, got.specific_reservation.count, got.specific_reservation.in_use_count,
            got.specific_reservation_required) == ("READY", 2, 0, True)
    assert got.specific_reservation.instance_properties.machine_type == MACHINE
    fake.add_reservation(PROJECT, A, "h100-a2", machine_type=MACHINE, count=1)
    fake.add_reservation(PROJECT, A, "h100-a3", machine_type=MACHINE, count=1)
    names = [r.name for r in reservations.list(project=PROJECT, zone=A)]  # pages of 2
    assert names == ["h100-a", "h100-a2", "h100-a3"]
    agg = {z: [r.name for r in scoped.reservations]
           for z, scoped in reservations.aggregated_list(project=PROJECT)}
    assert agg == {f"zones/{A}": ["h100-a", "h100-a2", "h100-a3"]}
    with pytest.raises(gexc.Conflict):
        reservations.insert_unary(project=PROJECT, zone=A, reservation_resource=body)
    with pytest.raises(gexc.BadRequest):
        reservations.insert_unary(project=PROJECT, zone=A, reservation_resource=compute_v1
                                  .Reservation(name="Bad_Name",
                                               specific_reservation=body.specific_reservation))
    _done(fake, reservations.delete_unary(project=PROJECT, zone=A, reservation="h100-a"))
    with pytest.raises(gexc.NotFound):
        reservations.get(project=PROJECT, zone=A, reservation="h100-a")


def test_any_reservation_is_consumed_first_and_any_shape_fills_it(fake, migs, reservations):
    _deploy(fake, "ANY")
    fake.add_reservation(PROJECT, C, "h100-c", machine_type=MACHINE, count=2)
    fake.set_capacity(C, MACHINE, 0)  # c runs only what its reservation holds
    _resize(fake, migs, 3)
    fake.settle()
    # Unused reservation first: 2 in c; the third where there is room, first zone: a.
    assert _running_zones(migs) == Counter({C: 2, A: 1})
    got = reservations.get(project=PROJECT, zone=C, reservation="h100-c")
    assert got.specific_reservation.in_use_count == 2
    _resize(fake, migs, 2)  # the last VM goes; the reservation keeps its two
    fake.settle()
    assert reservations.get(project=PROJECT, zone=C,
                            reservation="h100-c").specific_reservation.in_use_count == \
        sum(1 for mi in _managed(migs) if _zone(mi) == C)


def test_specific_reservation_affinity_or_the_creation_fails(fake, migs, reservations):
    _deploy(fake, "BALANCED")
    fake.add_reservation(PROJECT, A, "h100", machine_type=MACHINE, count=1, specific=True)
    _affinity(fake, "SPECIFIC_RESERVATION", "h100")
    _resize(fake, migs, 2)
    fake.settle()
    # Only a has a reservation named h100 with room: the first VM runs there in it; the
    # second finds none (a's is full, b has no such reservation).
    assert _running_zones(migs) == Counter({A: 1})
    assert reservations.get(project=PROJECT, zone=A,
                            reservation="h100").specific_reservation.in_use_count == 1
    messages = {e.error.message for e in _errors(migs)}
    assert {e.error.code for e in _errors(migs)} == {"CONDITION_NOT_MET"}
    assert messages <= {
        "Reservation h100 does not have sufficient capacity for the requested resources.",
        "Could not find the given reservation with the following name: h100"}


def test_no_reservation_affinity_and_specific_reservation_required(fake, migs, reservations):
    _deploy(fake, "BALANCED")
    fake.add_reservation(PROJECT, A, "open-a", machine_type=MACHINE, count=2)
    fake.add_reservation(PROJECT, B, "named-b", machine_type=MACHINE, count=2, specific=True)
    for zone in (A, B, C):
        fake.set_capacity(zone, MACHINE, 0)
    _affinity(fake, "NO_RESERVATION")
    _resize(fake, migs, 1)
    fake.settle()
    assert _running_zones(migs) == Counter()  # reservations unused, no open capacity
    _affinity(fake, "ANY_RESERVATION")
    fake.settle()  # ANY_RESERVATION may take open-a, never named-b (specific required)
    assert _running_zones(migs) == Counter({A: 1})
    assert reservations.get(project=PROJECT, zone=B,
                            reservation="named-b").specific_reservation.in_use_count == 0


def test_a_reservation_for_another_machine_type_does_not_match(fake, migs):
    _deploy(fake, "BALANCED", running=0)
    fake.add_reservation(PROJECT, A, "a2", machine_type="a2-ultragpu-8g", count=4)
    for zone in (A, B, C):
        fake.set_capacity(zone, MACHINE, 0)
    _resize(fake, migs, 1)
    fake.settle()
    assert _running_zones(migs) == Counter()
    assert {e.error.code for e in _errors(migs)} == {"ZONE_RESOURCE_POOL_EXHAUSTED"}


# -------------------------------------------------------------------------------------
# poolctl on it: GcpOps.launch_failures, status and warm --wait's stop (issue 21, part 3)

def _pool_ops(fake):
    cfg = parse_config(pool_yaml())
    pool = cfg.pools[0]
    # As deploy leaves the contract's example: 1 serving VM in a, 2 stopped standby VMs.
    fake.deploy_pool(project=PROJECT, region=REGION, name=MIG,
                     labels=naming.gcp_labels(cfg, pool), zones=[A, B, C], template=TEMPLATE,
                     running=1, stopped=2, autoscaler=(1, 6))
    ops = GcpOps(client_options={"api_endpoint": fake.endpoint},
                 credentials=AnonymousCredentials(), retry_initial_s=0.01, retry_deadline_s=5)
    return cfg, pool, ops


def test_status_skips_an_exhausted_zone_without_a_failure(fake, migs):
    cfg, pool, ops = _pool_ops(fake)
    fake.set_capacity(A, MACHINE, 0)
    _resize(fake, migs, 3)
    fake.settle()
    s = runtime.status(cfg, pool, "gcp", ops)
    assert s.capacity_failures == []  # BALANCED created the 2 new VMs in b and c
    assert s.counts()["in_service"] == 3


def test_every_zone_exhausted_is_named_in_status_and_stops_the_wait(fake, migs):
    cfg, pool, ops = _pool_ops(fake)
    for zone in (A, B, C):
        fake.set_capacity(zone, MACHINE, 0)  # a's serving VM keeps running; no room for more
    _resize(fake, migs, 3)
    fake.settle()
    s = runtime.status(cfg, pool, "gcp", ops)
    # Every VM the MIG could not create or start (the standby VMs it starts first need
    # capacity too) is named once, with its zone and GCE's own code.
    waiting = {mi.instance.rsplit("/", 1)[1]: _zone(mi) for mi in _managed(migs)
               if mi.current_action in ("CREATING", "STARTING")}
    assert waiting and {f.instance: f.zone for f in s.capacity_failures} == waiting
    zones = sorted(set(waiting.values()))
    assert {f.code for f in s.capacity_failures} == {"ZONE_RESOURCE_POOL_EXHAUSTED"}
    assert failures_line(s.capacity_failures) == (
        f"ZONE_RESOURCE_POOL_EXHAUSTED: no {MACHINE} capacity in {', '.join(zones)}")
    assert s.to_json()["capacity_failures"][0]["message"].startswith("The zone 'projects/")
    # The waiting VMs are pending, but they are the failing ones: nothing else in flight,
    # so a wait stops now with that line.
    group = ops.find_group(cfg, pool)
    assert stalled_launches(ops, group, pool, "gcp", since_wall=0.0) == s.capacity_failures
    # Room again in c: what can go there is created; a stopped VM of a or b starts only in
    # its own zone and is still named. Room everywhere: none is left.
    fake.set_capacity(C, MACHINE, None)
    fake.settle()
    assert C not in {f.zone for f in runtime.status(cfg, pool, "gcp", ops).capacity_failures}
    for zone in (A, B):
        fake.set_capacity(zone, MACHINE, None)
    fake.settle()
    assert runtime.status(cfg, pool, "gcp", ops).capacity_failures == []


# -------------------------------------------------------------------------------------
# capacity check on GCP: the reservations the template's affinity consumes, per zone

def _report(fake, reservations_key: str | None = None):
    extra = f"      capacity: {{reservations: {reservations_key}}}\n" if reservations_key else ""
    cfg = parse_config(pool_yaml(extra_gcp=extra))
    pool = cfg.pools[0]
    ops = GcpOps(client_options={"api_endpoint": fake.endpoint},
                 credentials=AnonymousCredentials(), retry_initial_s=0.01, retry_deadline_s=5)
    return ops.capacity_report(cfg, pool, capacity_needs(plan_pool(pool, Cloud.gcp))), cfg


@pytest.fixture
def reserved(fake):
    fake.add_region(PROJECT, REGION, [A, B, C])
    fake.add_reservation(PROJECT, A, "a3-open", machine_type=MACHINE, count=2)
    fake.add_reservation(PROJECT, B, "a3-named", machine_type=MACHINE, count=3, specific=True)
    fake.add_reservation(PROJECT, C, "a2-open", machine_type="a2-highgpu-8g", count=4)


def test_any_counts_the_open_reservations_of_the_machine_type(fake, reserved):
    r, _ = _report(fake)
    # any: a3-open (2) only; a3-named requires naming, a2-open is another machine type.
    assert r.preference == "open" and r.held == 2 and r.ok
    assert [(z.zone, [x.id for x in z.reservations]) for z in r.zones] == [
        (A, ["a3-open"]), (B, []), (C, [])]


def test_specific_reservations_short_of_the_peak_fail_the_check(fake, reserved):
    r, _ = _report(fake, "[a3-open, a3-named]")
    # Held 2 + 3 = 5; peak = max 6 + surge 3 (one VM per zone) = 9 nodes: 4 beyond, and a VM
    # beyond specific reservations is not created: reservations-only, not ok.
    assert (r.preference, r.held, r.needs["peak"], r.beyond["peak"]) == (
        "reservations-only", 5, 9, 4)
    assert not r.ok
    assert "set gcp.capacity.reservations: any" in capacity_problem(r)


@pytest.mark.parametrize(("names", "says"), [
    ("[a2-open]", "a2-open reserves a2-highgpu-8g, the pool runs a3-highgpu-8g"),
    ("[gone]", "reservation 'gone' not found in acme-prod"),
])
def test_a_named_reservation_the_pool_cannot_use_names_the_key(fake, reserved, names, says):
    with pytest.raises(UsageError) as e:
        _report(fake, names)
    assert str(e.value).startswith("pools[0].gcp.capacity.reservations: ") and says in str(
        e.value)


def test_offered_is_what_gce_answers_per_zone(fake, reserved):
    # Every zone offers the type until one does not: machineTypes.get answers 404 there.
    r, _ = _report(fake)
    assert [z.offered for z in r.zones] == [True, True, True]
    fake.withdraw_offer(B, MACHINE)
    r, _ = _report(fake)
    assert [(z.zone, z.offered) for z in r.zones] == [(A, True), (B, False), (C, True)]
    # The reservations of zones that offer the type still count (a3-open in A).
    assert r.held == 2
    asked = [q["path"] for q in fake.requests if "/machineTypes/" in q["path"]]
    assert asked[-3:] == [f"/compute/v1/projects/{PROJECT}/zones/{z}/machineTypes/{MACHINE}"
                          for z in (A, B, C)]
    assert fake.errors == []


# -------------------------------------------------------------------------------------
# gcp.fallback_machine_types: the MIG's instance flexibility policy

MEGA = "a3-megagpu-8g"  # H100 80 GB, 16 bundled Local SSDs, as a3-highgpu-8g


def test_the_pool_grows_on_the_fallback_type_when_the_primary_is_exhausted(fake, migs):
    cfg = parse_config(pool_yaml(warm=0, extra_gcp=f"      fallback_machine_types: [{MEGA}]\n"))
    pool = cfg.pools[0]
    # As deploy leaves it (quotas granted): 1 serving VM, no standby pool, the policy.
    assert seed_pool(fake, cfg, pool)["mig"] == MIG
    assert "standbyPolicy" not in fake.migs[(PROJECT, REGION, MIG)]
    ops = GcpOps(client_options={"api_endpoint": fake.endpoint},
                 credentials=AnonymousCredentials(), retry_initial_s=0.01, retry_deadline_s=5)
    for zone in (A, B, C):
        fake.set_capacity(zone, MACHINE, 0)  # the serving VM keeps running; no more H100s
    # 8 replicas at 4 a node: 2 more nodes in service, created as the fallback type.
    r = runtime.warm(cfg, pool, "gcp", ops, 8, running=True)
    assert r.after.min_nodes == 3
    fake.settle()
    s = runtime.status(cfg, pool, "gcp", ops)
    assert s.capacity_failures == [] and s.counts()["in_service"] == 3
    chosen = [mi.properties_from_flexibility_policy.machine_type for mi in _managed(migs)]
    # The first VM was created before the stock-out, as the primary type.
    assert sorted(chosen) == [MACHINE, MEGA, MEGA]
    kinds = Counter(vm["machineType"].rsplit("/", 1)[1] for _z, vm in fake.instance_list(PROJECT))
    assert kinds == {MACHINE: 1, MEGA: 2}
    # The fallback exhausted too: the next VM waits, named with the primary's failure.
    for zone in (A, B, C):
        fake.set_capacity(zone, MEGA, 0)  # those running keep running; no more
    _resize(fake, migs, 4)
    fake.settle()
    s = runtime.status(cfg, pool, "gcp", ops)
    assert {f.code for f in s.capacity_failures} == {"ZONE_RESOURCE_POOL_EXHAUSTED"}
    assert s.counts()["in_service"] == 3
