"""EC2 capacity: per (instance type, zone) launch limits and On-Demand Capacity Reservations.

Quota is permission; capacity is whether the zone has the machines. moto launches anything;
here a zone can run out.

Limits: `limits[(instance type, zone)] = N` caps the instances of that type holding the
zone's open (On-Demand) capacity: pending, running, stopping or shutting down, and not
inside an active Capacity Reservation. A stopped instance gives its capacity back, so
StartInstances is a new launch that can fail. Unlimited where no limit is set. Set at start
(`poolctl sandbox start --capacity TYPE@ZONE=N`, the server's --capacity) or at run time
(POST /_poolctl/capacity, admin.py); moto's reset returns to the start-up limits.

Beyond a limit a launch fails as AWS fails it (the EC2 API error codes page lists it as a
server error; the message as RunInstances returns it, quoted in github.com
commonwarexyz/monorepo#2859 and red-hat-storage/ocs-ci#9263, "status code: 500" in
sourcegraph's #46617): HTTP 500 `InsufficientInstanceCapacity`, "We currently do not
have sufficient p5.48xlarge capacity in the Availability Zone you requested (us-east-1a). Our
system will be working on provisioning additional capacity. You can currently get
p5.48xlarge capacity by not specifying an Availability Zone in your request or choosing
us-east-1b, us-east-1c." (the zones of the region that offer the type and have room; the
last sentence is left out when none has). RunInstances and StartInstances launch all or
nothing.

Capacity Reservations (EC2 API reference, CapacityReservation): the reservations and their
matching are here; their API actions (Create, Describe, Modify, Cancel, in EC2's wire
format: moto 5.2 has none of them) are capacity_reservations.py's, the resource groups a
launch may target capacity_groups.py's. AvailableInstanceCount is TotalInstanceCount minus
the instances holding a slot;
State is computed: cancelled, expired (EndDate passed), scheduled (StartDate ahead), else
active. An instance runs in a reservation per its CapacityReservationSpecification (from
RunInstances, else its launch template's; a group's own specification, see launches.py):
`open` (the default) fills matching open reservations first, then On-Demand; `none` never;
a target (CapacityReservationId) or `capacity-reservations-only` uses reservations only,
else fails with HTTP 400 `ReservationCapacityExceeded` "The requested reservation does not
have sufficient compatible and available capacity for this request." (as
hashicorp/terraform-provider-aws#35745 and scylladb/scylla-cluster-tests#8839 quote it).
Matching: same instance type, same zone, active; `targeted` reservations and Capacity Blocks
only by target. Terminating or
stopping gives the slot back. Capacity Blocks (ReservationType capacity-block, targeted,
ending at their EndDate) are made by the admin endpoint, since they are bought, not created.
DescribeInstances reports CapacityReservationId and CapacityReservationSpecification.
Capacity Reservation groups: a target may name a resource group (CreateGroup, moto's) whose
members GroupResources / UngroupResources / ListGroupResources keep (moto has none of them).
Auto Scaling groups: Create/UpdateAutoScalingGroup keep CapacityReservationSpecification
(capacity-reservations-only | -first | none | default, target ids or resource group ARNs) and
AvailabilityZoneDistribution, checked as the API reference says, and DescribeAutoScalingGroups
returns them as given (moto drops both). Validation messages are the sandbox's wording, but
for InstanceCount's (boto/boto3#2962).

Capacity Blocks run on the sandbox clock (schedules.py), so a test moves into and out of
one in seconds: a block is scheduled, active or expired by that clock. A launch into a block
must carry market type capacity-block (RunInstances' InstanceMarketOptions, else its launch
template's), otherwise HTTP 400 `InvalidParameterValue` "The market type (purchasing) option
is not valid. ..." (EC2's answer as terraform-aws-modules/terraform-aws-ec2-instance#404
quotes it); a launch of that market type must target a block, otherwise
`InvalidParameterCombination` (the sandbox's wording; AWS documents no code for it). A launch
into a block that is not active, or in its last 30 minutes, fails as a targeted launch that
does not fit (`ReservationCapacityExceeded`; an assumption: AWS documents no code for a block
not yet active). When the clock passes a block's end minus 30
minutes, its instances are terminated, as EC2 begins to terminate them then (EC2 user
guide, Capacity Blocks); a group replacing them cannot launch into the block again.

Not emulated: a reservation taking capacity from its zone (creating one never fails for
capacity, and the zone limit counts On-Demand use only), a resource group's configuration
and query (membership only), and instance platform and tenancy matching (every
reservation is treated as the instance's).
"""

from __future__ import annotations

import contextvars
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from werkzeug.exceptions import HTTPException

from poolctl.sandbox.extensions import activities, schedules
from poolctl.sandbox.extensions.capacity_groups import group_members
from poolctl.sandbox.extensions.common import (
    LOCK,
    all_backends,
    now,
    stored,
    validation_error,
)
from poolctl.sandbox.extensions.schedules import clock_now

NAMES = ("ec2.capacity-limits",)

# What holds capacity: an instance that runs, or is about to or still does.
HOLDING = ("pending", "running", "stopping", "shutting-down")
RESERVATION_EXCEEDED = ("The requested reservation does not have sufficient compatible and "
                        "available capacity for this request.")
MATCH_CRITERIA = ("open", "targeted")
BLOCK = "capacity-block"  # a Capacity Block's ReservationType and its launches' MarketType
# EC2 begins terminating a block's instances 30 minutes before its end (EC2 user guide).
BLOCK_END_MARGIN = timedelta(minutes=30)
END_DATE_TYPES = ("unlimited", "limited")

# (instance type, zone) -> how many instances of the type the zone's open capacity holds.
# Changed in place only (snapshots.py copies and restores it).
limits: dict[tuple[str, str], int] = {}
# The limits the server started with (its --capacity); moto's reset returns to them.
startup_limits: dict[tuple[str, str], int] = {}


class CapacityError(HTTPException):
    """An EC2 error answered with its own HTTP status (InsufficientInstanceCapacity is a 500,
    a server error on the EC2 error codes page), in EC2's error body."""

    def __init__(self, error_code: str, message: str, status: int) -> None:
        super().__init__()
        self.code = status
        self.error_code = error_code
        self.message = message
        self.description = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
            f"<Code>{error_code}</Code><Message>{_xml(message)}</Message></Error></Errors>"
            f"<RequestID>{uuid.uuid4()}</RequestID></Response>"
        )

    def get_headers(self, *args: Any, **kwargs: Any) -> list[tuple[str, str]]:
        return [("Content-Type", "text/xml")]

    def get_body(self, *args: Any, **kwargs: Any) -> str:
        return self.description or ""


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def ec2_error(code: str, message: str) -> Exception:
    from moto.ec2.exceptions import EC2ClientError

    return EC2ClientError(code, message)


def not_found(cr_id: str) -> Exception:
    return ec2_error("InvalidCapacityReservationId.NotFound",
                     f"The capacity reservation ID '{cr_id}' does not exist")


@dataclass(frozen=True)
class CapacitySpec:
    """Where an instance may run: `mode` prefer (reservations first, then On-Demand), only
    (reservations or fail) or none (On-Demand); `ids` the targeted reservations (none: any
    matching open one). `reported` is the instance's CapacityReservationSpecification as
    DescribeInstances shows it."""

    mode: str = "prefer"
    ids: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    reported: dict[str, Any] = field(
        default_factory=lambda: {"CapacityReservationPreference": "open"}, compare=False)


DEFAULT_SPEC = CapacitySpec()
# The group name and capacity settings of the Create/UpdateAutoScalingGroup being answered.
_pending_group: contextvars.ContextVar[tuple[str, dict[str, Any]] | None] = \
    contextvars.ContextVar("poolctl_capacity_pending_group", default=None)
# The CapacityReservationSpecification of the RunInstances request being answered.
_request_spec: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "poolctl_capacity_request_spec", default=None)


def ec2_spec(raw: dict[str, Any] | None) -> CapacitySpec:
    """The CapacitySpec of an EC2 CapacityReservationSpecification (RunInstances, a launch
    template): preference open | none | capacity-reservations-only, an optional target."""
    if not raw:
        return DEFAULT_SPEC
    pref = raw.get("CapacityReservationPreference")
    target = raw.get("CapacityReservationTarget") or {}
    ids = tuple(x for x in [target.get("CapacityReservationId")] if x)
    groups = tuple(x for x in [target.get("CapacityReservationResourceGroupArn")] if x)
    reported: dict[str, Any] = {}
    if pref:
        reported["CapacityReservationPreference"] = pref
    if target:
        reported["CapacityReservationTarget"] = dict(target)
    if pref == "none":
        return CapacitySpec("none", reported=reported)
    if ids or groups or pref == "capacity-reservations-only":
        return CapacitySpec("only", ids, groups, reported)
    return CapacitySpec("prefer", reported=reported or {"CapacityReservationPreference": "open"})


def group_spec(group: Any, version: Any | None) -> CapacitySpec:
    """The CapacitySpec of a group's launch: the group's CapacityReservationSpecification
    (Auto Scaling API reference), else ("default") its launch template's."""
    raw = group_setting(group, "capacity_reservation_specification") or {}
    pref = raw.get("CapacityReservationPreference") or "default"
    target = raw.get("CapacityReservationTarget") or {}
    ids = tuple(target.get("CapacityReservationIds") or ())
    groups = tuple(target.get("CapacityReservationResourceGroupArns") or ())
    if pref == "none":
        return CapacitySpec("none", reported={"CapacityReservationPreference": "none"})
    if pref in ("capacity-reservations-first", "capacity-reservations-only"):
        reported: dict[str, Any] = {
            "CapacityReservationPreference": "open" if pref.endswith("first") else pref}
        if len(ids) == 1:
            reported["CapacityReservationTarget"] = {"CapacityReservationId": ids[0]}
        return CapacitySpec("prefer" if pref.endswith("first") else "only", ids, groups,
                            reported)
    data = version.data if version is not None else {}
    return ec2_spec(data.get("CapacityReservationSpecification"))


@dataclass
class Reservation:
    """One Capacity Reservation, as the sandbox keeps it (its EC2 backend's)."""

    id: str
    owner_id: str
    region: str
    instance_type: str
    platform: str
    zone: str
    zone_id: str | None
    tenancy: str
    total: int
    match_criteria: str
    end_date_type: str
    end_date: datetime | None
    start_date: datetime
    create_date: datetime
    ebs_optimized: bool = False
    reservation_type: str = "default"
    tags: list[dict[str, str]] = field(default_factory=list)
    cancelled: bool = False

    @property
    def arn(self) -> str:
        return f"arn:aws:ec2:{self.region}:{self.owner_id}:capacity-reservation/{self.id}"

    def state(self, at: datetime | None = None) -> str:
        # Blocks are bought for launch windows, whose times the sandbox clock moves past.
        moment = at or (clock_now() if self.reservation_type == BLOCK else now())
        if self.cancelled:
            return "cancelled"
        if self.end_date is not None and moment >= self.end_date:
            return "expired"
        if self.start_date > moment:
            return "scheduled"
        return "active"

    def launchable(self) -> bool:
        """Active, and for a block not yet in the 30 minutes EC2 empties it in."""
        if self.state() != "active":
            return False
        return (self.reservation_type != BLOCK or self.end_date is None
                or clock_now() < self.end_date - BLOCK_END_MARGIN)

    def to_api(self, in_use: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "CapacityReservationId": self.id,
            "OwnerId": self.owner_id,
            "CapacityReservationArn": self.arn,
            "InstanceType": self.instance_type,
            "InstancePlatform": self.platform,
            "AvailabilityZone": self.zone,
            "Tenancy": self.tenancy,
            "TotalInstanceCount": self.total,
            "AvailableInstanceCount": max(self.total - in_use, 0)
            if self.state() == "active" else 0,
            "EbsOptimized": self.ebs_optimized,
            "EphemeralStorage": False,
            "State": self.state(),
            "StartDate": self.start_date,
            "EndDateType": self.end_date_type,
            "InstanceMatchCriteria": self.match_criteria,
            "CreateDate": self.create_date,
            "Tags": list(self.tags),
            "ReservationType": self.reservation_type,
            "DeliveryPreference": "fixed",
        }
        if self.zone_id:
            out["AvailabilityZoneId"] = self.zone_id
        if self.end_date is not None:
            out["EndDate"] = self.end_date
        if self.reservation_type == "capacity-block":
            out["CapacityBlockId"] = self.id.replace("cr-", "cb-", 1)
        return out


def reservations(ec2: Any) -> dict[str, Reservation]:
    """The Capacity Reservations of one EC2 backend (account and region), by id."""
    return stored(ec2, "_poolctl_capacity_reservations", dict)


def _region_backends(region: str) -> list[Any]:
    from moto.ec2.models import ec2_backends

    return [b for b in all_backends(ec2_backends) if b.region_name == region]


def _instances(ec2: Any) -> Iterable[Any]:
    for reservation in list(ec2.reservations.values()):
        yield from reservation.instances


def holds(instance: Any) -> bool:
    name: str = instance._state.name
    return name in HOLDING


def reservation_of(ec2: Any, instance: Any) -> Reservation | None:
    """The active reservation an instance runs in, or None (On-Demand)."""
    cr = instance.__dict__.get("_poolctl_cr")
    r = reservations(ec2).get(cr) if cr else None
    return r if r is not None and r.state() == "active" else None


def in_use(ec2: Any, r: Reservation) -> int:
    return sum(1 for i in _instances(ec2)
               if holds(i) and i.__dict__.get("_poolctl_cr") == r.id)


def open_use(region: str, instance_type: str, zone: str) -> int:
    """Instances of the type holding the zone's open capacity (every account's)."""
    return sum(1 for ec2 in _region_backends(region) for i in _instances(ec2)
               if i.instance_type == instance_type and i.placement.zone == zone and holds(i)
               and reservation_of(ec2, i) is None)


def open_room(region: str, instance_type: str, zone: str) -> int | None:
    """How many more instances the zone's open capacity takes; None: no limit."""
    limit = limits.get((instance_type, zone))
    if limit is None:
        return None
    return max(limit - open_use(region, instance_type, zone), 0)


def offered_zones(ec2: Any, instance_type: str) -> list[str]:
    """The region's zones that offer the type (moto's offerings), else all its zones."""
    from moto.ec2.models.instance_types import INSTANCE_TYPE_OFFERINGS

    offers = INSTANCE_TYPE_OFFERINGS["availability-zone"].get(ec2.region_name, [])
    zones = sorted({o["Location"] for o in offers if o["InstanceType"] == instance_type})
    return zones or sorted(z.name for z in ec2.describe_availability_zones())


def insufficient(ec2: Any, instance_type: str, zone: str) -> CapacityError:
    others = []
    for other in offered_zones(ec2, instance_type):
        room = open_room(ec2.region_name, instance_type, other)
        if other != zone and (room is None or room > 0):
            others.append(other)
    message = (f"We currently do not have sufficient {instance_type} capacity in the "
               f"Availability Zone you requested ({zone}). Our system will be working on "
               "provisioning additional capacity.")
    if others:
        message += (f" You can currently get {instance_type} capacity by not specifying an "
                    f"Availability Zone in your request or choosing {', '.join(others)}.")
    return CapacityError("InsufficientInstanceCapacity", message, 500)


def reservation_exceeded() -> CapacityError:
    return CapacityError("ReservationCapacityExceeded", RESERVATION_EXCEEDED, 400)


def eligible(ec2: Any, instance_type: str, zone: str | None, spec: CapacitySpec
             ) -> list[Reservation]:
    """The reservations a launch of the type in the zone may use, in the order it uses
    them: the targeted ones as named, else the matching open ones by age."""
    if spec.mode == "none":
        return []
    mine = reservations(ec2)
    if spec.ids or spec.groups:
        named = list(spec.ids) + [i for arn in spec.groups for i in group_members(arn)]
        pool = [mine[i] for i in dict.fromkeys(named) if i in mine]
    else:
        pool = [r for r in mine.values()
                if r.match_criteria == "open" and r.reservation_type == "default"]
    return [r for r in pool if r.launchable() and r.instance_type == instance_type
            and (zone is None or r.zone == zone)]


def reservation_room(ec2: Any, instance_type: str, zone: str, spec: CapacitySpec) -> int:
    return sum(max(r.total - in_use(ec2, r), 0)
               for r in eligible(ec2, instance_type, zone, spec))


def plan(ec2: Any, instance_type: str, zone: str, count: int, spec: CapacitySpec
         ) -> list[str | None]:
    """The reservation (or None: open capacity) each of `count` instances launched in the
    zone runs in; raises the error AWS answers when they do not fit."""
    slots: list[str | None] = []
    for r in eligible(ec2, instance_type, zone, spec):
        free = max(r.total - in_use(ec2, r), 0)
        slots += [r.id] * min(free, count - len(slots))
    rest = count - len(slots)
    if rest == 0:
        return slots
    if spec.mode == "only":
        raise reservation_exceeded()
    room = open_room(ec2.region_name, instance_type, zone)
    if room is not None and room < rest:
        raise insufficient(ec2, instance_type, zone)
    return slots + [None] * rest


def _launch_type(ec2: Any, kwargs: dict[str, Any]) -> str:
    """The instance type moto will launch (a launch template's when none is given)."""
    itype: str = kwargs.get("instance_type") or "m1.small"
    if kwargs.get("launch_template") and kwargs.get("is_instance_type_default"):
        data = ec2._get_template_from_args(kwargs["launch_template"]).data
        itype = data.get("InstanceType") or itype
    return itype


def _launch_zone(ec2: Any, kwargs: dict[str, Any]) -> str | None:
    if kwargs.get("subnet_id"):
        zone: str = ec2.get_subnet(kwargs["subnet_id"]).availability_zone
        return zone
    for nic in kwargs.get("nics") or []:
        if nic.get("SubnetId"):
            zone = ec2.get_subnet(nic["SubnetId"]).availability_zone
            return zone
    placement: str | None = kwargs.get("placement")
    return placement


def _launch_spec(ec2: Any, kwargs: dict[str, Any]) -> CapacitySpec:
    given: CapacitySpec | None = kwargs.pop("poolctl_capacity", None)
    if given is not None:
        return given
    raw = _request_spec.get()
    if raw is None and kwargs.get("launch_template"):
        raw = ec2._get_template_from_args(kwargs["launch_template"]).data.get(
            "CapacityReservationSpecification")
    return ec2_spec(raw)


def _market_type(ec2: Any, kwargs: dict[str, Any]) -> str | None:
    """The launch's market type (RunInstances', else its launch template's); a
    capacity-block one is taken out of kwargs: moto would make the instance a Spot one."""
    market = kwargs.get("instance_market_options") or None
    if market == BLOCK:
        kwargs.pop("instance_market_options")
    if market is None and kwargs.get("launch_template"):
        data = ec2._get_template_from_args(kwargs["launch_template"]).data
        market = (data.get("InstanceMarketOptions") or {}).get("MarketType")
    return market if isinstance(market, str) else None


def check_market(ec2: Any, spec: CapacitySpec, market: str | None) -> None:
    """A block takes launches of its market type only, and that market needs a block."""
    mine = reservations(ec2)
    named = [mine[i] for i in spec.ids if i in mine]
    into_block = any(r.reservation_type == BLOCK for r in named)
    if into_block and market != BLOCK:
        # EC2's answer as a user quotes it (docs/cloud-facts.md, Capacity Blocks).
        raise ec2_error("InvalidParameterValue",
                        "The market type (purchasing) option is not valid. Choose a different "
                        "market type and try again.")
    if market == BLOCK and not into_block:
        raise ec2_error("InvalidParameterCombination",
                        "MarketType capacity-block needs a CapacityReservationTarget naming "
                        "a Capacity Block")


def end_capacity_blocks() -> None:
    """Terminate the instances of every block the clock has taken within 30 minutes of its
    end (the sandbox clock's tick: schedules.ON_TICK)."""
    from moto.ec2.models import ec2_backends

    moment = clock_now()
    for ec2 in all_backends(ec2_backends):
        ending = {r.id for r in reservations(ec2).values()
                  if r.reservation_type == BLOCK and r.end_date is not None
                  and moment >= r.end_date - BLOCK_END_MARGIN}
        doomed = [i.id for i in _instances(ec2)
                  if holds(i) and i.__dict__.get("_poolctl_cr") in ending]
        if doomed:
            ec2.terminate_instances(doomed)


def _wrap_run_instances(orig: Callable[..., Any]) -> Callable[..., Any]:
    def run_instances(self: Any, image_id: str, count: int, user_data: Any,
                      security_group_names: list[str], **kwargs: Any) -> Any:
        with LOCK:
            spec = _launch_spec(self, kwargs)
            check_market(self, spec, _market_type(self, kwargs))
            itype = _launch_type(self, kwargs)
            zone = _launch_zone(self, kwargs)
            if zone is not None:
                slots = plan(self, itype, zone, count, spec)
            else:
                # No zone asked for: EC2 picks one that fits (moto's default zone first,
                # so nothing changes where nothing is limited or reserved).
                default = self.region_name + "a"
                zones = [default] + [z for z in offered_zones(self, itype) if z != default]
                slots, error = [], None
                for candidate in zones:
                    try:
                        slots = plan(self, itype, candidate, count, spec)
                    except CapacityError as exc:
                        error = error or exc
                        continue
                    if candidate != default:
                        kwargs["placement"] = candidate
                    break
                else:
                    if error is not None and error.error_code == "InsufficientInstanceCapacity":
                        raise CapacityError("InsufficientInstanceCapacity",
                                            "Insufficient capacity.", 500)
                    raise error or reservation_exceeded()
            reservation = orig(self, image_id, count, user_data, security_group_names,
                               **kwargs)
            for instance, cr in zip(reservation.instances, slots, strict=True):
                instance._poolctl_cr = cr
                instance._poolctl_spec = spec
                if cr is not None and reservations(self)[cr].reservation_type == BLOCK:
                    # DescribeInstances' InstanceLifecycle of an instance in a block.
                    instance.lifecycle = BLOCK
            return reservation

    return run_instances


def _wrap_start_instances(orig: Callable[..., Any],
                          orig_stop: Callable[..., Any]) -> Callable[..., Any]:
    def start_instances(self: Any, instance_ids: list[str]) -> list[Any]:
        with LOCK:
            started: list[Any] = []
            for instance in self.get_multi_instances_by_id(instance_ids):
                if instance._state.name != "stopped":
                    started += orig(self, [instance.id])
                    continue
                spec = instance.__dict__.get("_poolctl_spec") or DEFAULT_SPEC
                try:
                    slots = plan(self, instance.instance_type, instance.placement.zone, 1,
                                 spec)
                except CapacityError:
                    # All or nothing: what this call started stops again.
                    back = [i.id for i, previous in started if previous.name == "stopped"]
                    if back:
                        orig_stop(self, back)
                    raise
                started += orig(self, [instance.id])
                instance._poolctl_cr = slots[0]
            return started

    return start_instances


def _wrap_stop_instances(orig: Callable[..., Any]) -> Callable[..., Any]:
    def stop_instances(self: Any, instance_ids: list[str]) -> list[Any]:
        with LOCK:
            out: list[Any] = orig(self, instance_ids)
            for instance, _previous in out:
                instance._poolctl_cr = None  # the slot goes back to its reservation
            return out

    return stop_instances


_PREFERENCES = ("capacity-reservations-only", "capacity-reservations-first", "none", "default")
_STRATEGIES = ("balanced-best-effort", "balanced-only")


def _group_settings(self: Any) -> dict[str, Any]:
    """A Create/UpdateAutoScalingGroup's CapacityReservationSpecification and
    AvailabilityZoneDistribution, checked (Auto Scaling API reference); moto ignores both."""

    out: dict[str, Any] = {}
    spec = self._get_param("CapacityReservationSpecification")
    if spec is not None:
        pref = spec.get("CapacityReservationPreference")
        if pref not in _PREFERENCES:
            raise validation_error(
                f"CapacityReservationPreference must be one of {', '.join(_PREFERENCES)}")
        target = spec.get("CapacityReservationTarget") or {}
        if target and pref in ("none", "default"):
            raise validation_error(
                f"A CapacityReservationTarget cannot be given with the preference {pref}")
        kept: dict[str, Any] = {"CapacityReservationPreference": pref}
        ids = list(target.get("CapacityReservationIds") or [])
        arns = list(target.get("CapacityReservationResourceGroupArns") or [])
        if ids or arns:
            kept["CapacityReservationTarget"] = {
                k: v for k, v in (("CapacityReservationIds", ids),
                                  ("CapacityReservationResourceGroupArns", arns)) if v}
        out["capacity_reservation_specification"] = kept
    dist = self._get_param("AvailabilityZoneDistribution")
    if dist is not None:
        strategy = dist.get("CapacityDistributionStrategy") or "balanced-best-effort"
        if strategy not in _STRATEGIES:
            raise validation_error(
                f"CapacityDistributionStrategy must be one of {', '.join(_STRATEGIES)}")
        out["availability_zone_distribution"] = {"CapacityDistributionStrategy": strategy}
    return out


def _wrap_group_request(orig: Callable[..., Any]) -> Callable[..., Any]:
    def request(self: Any) -> Any:
        name = self._get_param("AutoScalingGroupName")
        settings = _group_settings(self)
        # moto's CreateAutoScalingGroup launches the first instances before it returns:
        # those launches read the settings from here (`group_setting`).
        token = _pending_group.set((name, settings))
        try:
            result = orig(self)
        finally:
            _pending_group.reset(token)
        group = self.autoscaling_backend.autoscaling_groups.get(name)
        if group is not None:
            group.__dict__.update(settings)
        return result

    return request


def group_setting(group: Any, attribute: str) -> Any:
    """A group's capacity_reservation_specification or availability_zone_distribution,
    also while its CreateAutoScalingGroup is being answered."""
    pending = _pending_group.get()
    if pending is not None and pending[0] == group.name and attribute in pending[1]:
        return pending[1][attribute]
    return group.__dict__.get(attribute)


# ------------------------------------------------------------------ admin

def _parse_key(key: str) -> tuple[str, str]:
    itype, sep, zone = str(key).partition("@")
    if not sep or not itype or not zone:
        raise ValueError(f"capacity key {key!r}: write TYPE@ZONE, e.g. p5.48xlarge@us-east-1a")
    return itype, zone


def parse_limits(values: dict[str, Any]) -> dict[tuple[str, str], int | None]:
    """{"TYPE@ZONE": N or None} as the admin endpoint and --capacity give them."""
    out: dict[tuple[str, str], int | None] = {}
    for key, value in values.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise ValueError(f"capacity {key}: give a whole number of instances >= 0 "
                             "(null removes the limit)")
        out[_parse_key(key)] = value
    return out


def set_limits(values: dict[str, Any]) -> None:
    """Set (N) or remove (None) limits; launches held back for capacity are retried."""
    parsed = parse_limits(values)
    with LOCK:
        for key, value in parsed.items():
            if value is None:
                limits.pop(key, None)
            else:
                limits[key] = value
        _capacity_changed()


def reset_limits() -> None:
    """Back to the start-up limits (DELETE /_poolctl/capacity); short groups retry."""
    with LOCK:
        reset()
        _capacity_changed()


def set_startup_limits(values: dict[str, Any]) -> None:
    parsed = parse_limits(values)
    startup_limits.clear()
    startup_limits.update({k: v for k, v in parsed.items() if v is not None})
    limits.clear()
    limits.update(startup_limits)


def _capacity_changed() -> None:
    # Auto Scaling retries launches that failed for capacity: now, as capacity changed.

    activities.retry_short_groups(force=True)


def add_capacity_block(body: dict[str, Any]) -> Reservation:
    """A Capacity Block bought for now: {"instance_type", "zone", "count", "hours",
    "region" (the zone's), "account" (the sandbox's)}."""
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends

    missing = [k for k in ("instance_type", "zone") if not body.get(k)]
    if missing:
        raise ValueError(f"a Capacity Block needs {' and '.join(missing)}")
    itype, zone = str(body["instance_type"]), str(body["zone"])
    count, hours = int(body.get("count", 1)), float(body.get("hours", 24))
    if count < 1 or hours <= 0:
        raise ValueError("a Capacity Block needs count >= 1 and hours > 0")
    region = str(body.get("region") or zone[:-1])
    ec2 = ec2_backends[str(body.get("account") or DEFAULT_ACCOUNT_ID)][region]
    zones = {z.name: z.zone_id for z in ec2.describe_availability_zones()}
    if zone not in zones:
        raise ValueError(f"zone {zone} is not a zone of {region}")
    start = clock_now()  # the sandbox clock: blocks run on it
    r = Reservation(
        id=f"cr-{uuid.uuid4().hex[:17]}", owner_id=ec2.account_id, region=region,
        instance_type=itype, platform="Linux/UNIX", zone=zone, zone_id=zones[zone],
        tenancy="default", total=count, match_criteria="targeted", end_date_type="limited",
        end_date=start + timedelta(hours=hours), start_date=start, create_date=start,
        reservation_type="capacity-block")
    with LOCK:
        reservations(ec2)[r.id] = r
    return r


def report() -> dict[str, Any]:
    """What GET /_poolctl/capacity answers: the limits with their use, the reservations."""
    from moto.ec2.models import ec2_backends

    with LOCK:
        rows = []
        for (itype, zone), limit in sorted(limits.items()):
            used = open_use(zone[:-1], itype, zone)
            rows.append({"instance_type": itype, "zone": zone, "limit": limit,
                         "in_use": used, "room": max(limit - used, 0)})
        held = []
        for ec2 in all_backends(ec2_backends):
            for r in reservations(ec2).values():
                api = r.to_api(in_use(ec2, r))
                held.append({k: api[k] for k in (
                    "CapacityReservationId", "InstanceType", "AvailabilityZone",
                    "TotalInstanceCount", "AvailableInstanceCount", "State",
                    "InstanceMatchCriteria", "ReservationType")})
        return {"limits": rows, "reservations": held}


def install() -> None:
    from moto.autoscaling.models import FakeAutoScalingGroup
    from moto.autoscaling.responses import AutoScalingResponse
    from moto.ec2.models import EC2Backend
    from moto.ec2.responses.instances import InstanceResponse

    if end_capacity_blocks not in schedules.ON_TICK:
        schedules.ON_TICK.append(end_capacity_blocks)
    orig_stop = EC2Backend.stop_instances
    EC2Backend.run_instances = _wrap_run_instances(  # type: ignore[method-assign]  # moto extension: capacity
        EC2Backend.run_instances)
    EC2Backend.start_instances = _wrap_start_instances(  # type: ignore[method-assign]  # moto extension: capacity
        EC2Backend.start_instances, orig_stop)
    EC2Backend.stop_instances = _wrap_stop_instances(  # type: ignore[method-assign]  # moto extension: slots given back
        orig_stop)

    orig_run = InstanceResponse.run_instances

    def run_instances(self: Any) -> Any:
        with LOCK:
            token = _request_spec.set(self._get_param("CapacityReservationSpecification"))
            try:
                return orig_run(self)
            finally:
                _request_spec.reset(token)

    InstanceResponse.run_instances = run_instances  # type: ignore[method-assign]  # moto extension: the request's reservation preference
    for action in ("create_auto_scaling_group", "update_auto_scaling_group"):
        setattr(AutoScalingResponse, action,
                _wrap_group_request(getattr(AutoScalingResponse, action)))
    # Read back by DescribeAutoScalingGroups; a group given none has none.
    FakeAutoScalingGroup.capacity_reservation_specification = None  # type: ignore[attr-defined]  # moto extension: new attribute
    FakeAutoScalingGroup.availability_zone_distribution = None  # type: ignore[attr-defined]  # moto extension: new attribute




def reset() -> None:
    """The limits the server started with; reservations live on moto's EC2 backends."""
    limits.clear()
    limits.update(startup_limits)
