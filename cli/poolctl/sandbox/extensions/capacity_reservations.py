"""The Capacity Reservation API in the sandbox, in EC2's wire format (moto 5.2 has none of
it): CreateCapacityReservation, DescribeCapacityReservations (ids, filters, paging),
ModifyCapacityReservation, CancelCapacityReservation, and the reservation an instance runs
in as DescribeInstances reports it. The reservations themselves, their matching and the
launches into them are `capacity.py`'s."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from poolctl.sandbox.extensions.capacity import (
    DEFAULT_SPEC,
    END_DATE_TYPES,
    MATCH_CRITERIA,
    CapacitySpec,
    Reservation,
    ec2_error,
    holds,
    in_use,
    not_found,
    reservation_of,
    reservations,
)
from poolctl.sandbox.extensions.common import locked, now, stored

NAMES = ("ec2.capacity-reservations",)


def _tags(self: Any) -> list[dict[str, str]]:
    tags = self._parse_tag_specification().get("capacity-reservation", {})
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def _int_param(self: Any, name: str, low: int, high: int) -> int:
    raw = self._get_param(name)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = low - 1
    if not low <= value <= high:
        raise ec2_error("InvalidParameterValue",
                        f"{raw} is an invalid value for {name}. {name} must be between "
                        f"{low} and {high}.")
    return value


def _end(self: Any, current_type: str | None = None) -> tuple[str, datetime | None]:
    end_type = self._get_param("EndDateType") or current_type or "unlimited"
    end_date = self._get_param("EndDate")
    if end_type not in END_DATE_TYPES:
        raise ec2_error("InvalidParameterValue",
                        f"Value ({end_type}) for parameter EndDateType is invalid.")
    if end_type == "limited" and end_date is None:
        raise ec2_error("InvalidParameterCombination",
                        "EndDate is required when EndDateType is limited.")
    if end_type == "unlimited" and end_date is not None:
        raise ec2_error("InvalidParameterCombination",
                        "EndDate cannot be specified when EndDateType is unlimited.")
    return end_type, moment_of(end_date)


def moment_of(raw: Any) -> datetime | None:
    """A request's timestamp as an aware datetime (moto hands over naive UTC ones)."""
    if raw is None:
        return None
    value = raw if isinstance(raw, datetime) else datetime.fromisoformat(
        str(raw).replace("Z", "+00:00"))
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _find(self: Any, cr_id: str | None) -> Reservation:
    r = reservations(self.ec2_backend).get(cr_id or "")
    if r is None:
        raise not_found(str(cr_id))
    return r


def _create_capacity_reservation(self: Any) -> Any:
    from moto.core.responses import ActionResult

    ec2 = self.ec2_backend
    token = self._get_param("ClientToken")
    done: dict[str, str] = stored(ec2, "_poolctl_capacity_tokens", dict)
    if token and token in done:
        r = reservations(ec2)[done[token]]
        return ActionResult({"CapacityReservation": r.to_api(in_use(ec2, r))})
    itype = self._get_param("InstanceType")
    platform = self._get_param("InstancePlatform")
    if not itype or not platform:
        raise ec2_error("MissingParameter", "The request must contain the parameter "
                        + ("InstanceType" if not itype else "InstancePlatform"))
    zones = {z.name: z.zone_id for z in ec2.describe_availability_zones()}
    zone = self._get_param("AvailabilityZone")
    zone_id = self._get_param("AvailabilityZoneId")
    if zone is None and zone_id is not None:
        zone = next((n for n, i in zones.items() if i == zone_id), None)
    if zone not in zones:
        raise ec2_error("InvalidParameterValue",
                        f"Invalid availability zone: [{zone or zone_id}]")
    count = _int_param(self, "InstanceCount", 1, 1000)
    criteria = self._get_param("InstanceMatchCriteria") or "open"
    if criteria not in MATCH_CRITERIA:
        raise ec2_error("InvalidParameterValue",
                        f"Value ({criteria}) for parameter InstanceMatchCriteria is invalid.")
    end_type, end_date = _end(self)
    start = moment_of(self._get_param("StartDate"))
    self.error_on_dryrun()
    created = now()
    r = Reservation(
        id=f"cr-{uuid.uuid4().hex[:17]}", owner_id=ec2.account_id, region=ec2.region_name,
        instance_type=itype, platform=platform, zone=zone, zone_id=zones[zone],
        tenancy=self._get_param("Tenancy") or "default", total=count,
        match_criteria=criteria, end_date_type=end_type, end_date=end_date,
        start_date=start or created, create_date=created,
        ebs_optimized=bool(self._get_param("EbsOptimized")), tags=_tags(self))
    reservations(ec2)[r.id] = r
    if token:
        done[token] = r.id
    return ActionResult({"CapacityReservation": r.to_api(0)})


_FILTERS: dict[str, Callable[[Reservation], str]] = {
    "instance-type": lambda r: r.instance_type,
    "availability-zone": lambda r: r.zone,
    "state": lambda r: r.state(),
    "instance-match-criteria": lambda r: r.match_criteria,
    "tenancy": lambda r: r.tenancy,
    "instance-platform": lambda r: r.platform,
    "end-date-type": lambda r: r.end_date_type,
    "owner-id": lambda r: r.owner_id,
    "reservation-type": lambda r: r.reservation_type,
}


def _matches(r: Reservation, name: str, values: list[str]) -> bool:
    tags = {t["Key"]: t["Value"] for t in r.tags}
    if name.startswith("tag:"):
        return tags.get(name[4:]) in values
    if name == "tag-key":
        return any(k in values for k in tags)
    getter = _FILTERS.get(name)
    if getter is None:
        raise ec2_error("InvalidParameterValue", f"The filter '{name}' is invalid")
    return getter(r) in values


def _describe_capacity_reservations(self: Any) -> Any:
    from moto.core.responses import ActionResult

    ec2 = self.ec2_backend
    mine = reservations(ec2)
    ids = self._get_param("CapacityReservationIds") or []
    for cr in ids:
        if cr not in mine:
            raise not_found(cr)
    listed = [mine[i] for i in ids] if ids else list(mine.values())
    for name, values in self._filters_from_querystring().items():
        listed = [r for r in listed if _matches(r, name, list(values))]
    start = int(self._get_param("NextToken") or 0)
    size = int(self._get_param("MaxResults") or 1000)
    page = listed[start:start + size]
    out: dict[str, Any] = {"CapacityReservations": [r.to_api(in_use(ec2, r)) for r in page]}
    if start + size < len(listed):
        out["NextToken"] = str(start + size)
    return ActionResult(out)


def _cancel_capacity_reservation(self: Any) -> Any:
    from moto.core.responses import ActionResult

    r = _find(self, self._get_param("CapacityReservationId"))
    if r.reservation_type == "capacity-block":
        raise ec2_error("UnsupportedOperation", "A Capacity Block cannot be cancelled.")
    if r.state() in ("cancelled", "expired"):
        raise ec2_error("IncorrectState", f"The Capacity Reservation {r.id} is {r.state()}.")
    self.error_on_dryrun()
    r.cancelled = True
    return ActionResult({"Return": True})


def _modify_capacity_reservation(self: Any) -> Any:
    from moto.core.responses import ActionResult

    r = _find(self, self._get_param("CapacityReservationId"))
    if r.state() != "active":
        raise ec2_error("IncorrectState", f"The Capacity Reservation {r.id} is {r.state()}.")
    count = r.total
    if self._get_param("InstanceCount") is not None:
        count = _int_param(self, "InstanceCount", 0, 1000)
        used = in_use(self.ec2_backend, r)
        if count < used:
            raise ec2_error("InvalidParameterValue",
                            f"InstanceCount {count} is below the {used} instance(s) running "
                            f"in {r.id}.")
    criteria = self._get_param("InstanceMatchCriteria") or r.match_criteria
    if criteria not in MATCH_CRITERIA:
        raise ec2_error("InvalidParameterValue",
                        f"Value ({criteria}) for parameter InstanceMatchCriteria is invalid.")
    if self._get_param("EndDateType") is not None or self._get_param("EndDate") is not None:
        r.end_date_type, r.end_date = _end(self, r.end_date_type)
    self.error_on_dryrun()
    r.total, r.match_criteria = count, criteria
    return ActionResult({"Return": True})


def _instance_reservation_id(self: Any) -> str | None:
    r = reservation_of(self.ec2_backend, self) if holds(self) else None
    return r.id if r is not None else None


def _instance_spec(self: Any) -> dict[str, Any]:
    spec: CapacitySpec = self.__dict__.get("_poolctl_spec") or DEFAULT_SPEC
    return copy.deepcopy(spec.reported)




def install() -> None:
    from moto.ec2.models.instances import Instance
    from moto.ec2.responses import EC2Response

    for name, fn in {
        "create_capacity_reservation": _create_capacity_reservation,
        "describe_capacity_reservations": _describe_capacity_reservations,
        "cancel_capacity_reservation": _cancel_capacity_reservation,
        "modify_capacity_reservation": _modify_capacity_reservation,
    }.items():
        setattr(EC2Response, name, locked(fn))
    Instance.capacity_reservation_id = property(  # type: ignore[attr-defined]  # moto extension: new attribute
        _instance_reservation_id)
    Instance.capacity_reservation_specification = property(  # type: ignore[attr-defined]  # moto extension: new attribute
        _instance_spec)


def reset() -> None:
    """Reservations live on moto's EC2 backends, which moto's reset empties."""
