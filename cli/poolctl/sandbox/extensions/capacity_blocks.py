"""Capacity Blocks for ML bought for a future window (`warm --from --until --reserve`).

DescribeCapacityBlockOfferings and PurchaseCapacityBlock in EC2's wire format (moto 5.2 has
neither). As the EC2 user guide documents them: a duration (CapacityDurationHours) in 1-day
increments up to 14 days, then 7-day increments up to 182 days; an InstanceCount of 1, 2, 4,
8, 16, 32 or 64; every block ends at 11:30 UTC; up to 6 offerings per search, in the first
zone of the region that offers the type, starting on the first days of StartDateRange (the
sandbox clock's now when not given or past: nothing is offered to start in the past) whose
block ends by EndDateRange. A search from now first gets blocks from the next 5-minute
mark to an 11:30 (CapacityBlockDurationHours and -Minutes: `_spans`). A purchase creates
the Capacity Reservation (capacity.py: ReservationType capacity-block, targeted, limited,
with the offering's StartDate and EndDate); an offering bought once is gone.

Prices: UpfrontFee is the catalog's On-Demand price of the type x instances x hours (the
sandbox's stand-in; real block prices move with supply and are usually below On-Demand).
Errors: InvalidParameterValue for a duration or count AWS does not sell, MissingParameter,
and InvalidCapacityBlockOfferingId.NotFound for an unknown offering (the sandbox's wording).
The terminations AWS begins 30 minutes before a block's end, and the market type a launch
into a block needs: capacity.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, time, timedelta
from typing import Any

from poolctl.catalog import load_catalog
from poolctl.cloud import Cloud
from poolctl.sandbox.extensions.capacity import (
    Reservation,
    ec2_error,
    offered_zones,
    reservations,
)
from poolctl.sandbox.extensions.capacity_reservations import moment_of
from poolctl.sandbox.extensions.common import locked, now, stored
from poolctl.sandbox.extensions.schedules import clock_now

NAMES = ("ec2.capacity-block-offerings",)

COUNTS = (1, 2, 4, 8, 16, 32, 64)
BLOCK_END = time(11, 30, tzinfo=UTC)  # "All Capacity Blocks end at 11:30AM UTC"
OFFERINGS_PER_SEARCH = 6  # "we provide the details of up to 6 available blocks" (find and purchase)


def valid_hours(hours: int) -> bool:
    """1-day increments up to 14 days, 7-day increments up to 182 days."""
    return (hours % 24 == 0 and 24 <= hours <= 14 * 24) or (
        hours % (7 * 24) == 0 and 14 * 24 < hours <= 182 * 24)


def _offers(ec2: Any) -> dict[str, dict[str, Any]]:
    return stored(ec2, "_poolctl_block_offerings", dict)


def _price(itype: str) -> float:
    row = load_catalog().get(Cloud.aws, itype)
    if row is None:
        raise ec2_error("InvalidParameterValue",
                        f"Capacity Blocks are not offered for instance type {itype}")
    return float(row.price.usd_per_hour)


def _describe_capacity_block_offerings(self: Any) -> Any:
    from moto.core.responses import ActionResult

    ec2 = self.ec2_backend
    itype = self._get_param("InstanceType")
    for name in ("InstanceType", "InstanceCount", "CapacityDurationHours"):
        if self._get_param(name) in (None, ""):
            raise ec2_error("MissingParameter",
                            f"The request must contain the parameter {name}")
    count, hours = int(self._get_param("InstanceCount")), int(
        self._get_param("CapacityDurationHours"))
    if count not in COUNTS:
        raise ec2_error("InvalidParameterValue",
                        f"{count} is an invalid value for InstanceCount; valid values: "
                        + ", ".join(map(str, COUNTS)))
    if not valid_hours(hours):
        raise ec2_error("InvalidParameterValue",
                        f"{hours} is an invalid value for CapacityDurationHours: 24 to 336 "
                        "in steps of 24, or up to 4368 in steps of 168")
    # Nothing starts in the past: the sandbox clock's now, or later.
    asked, moment = moment_of(self._get_param("StartDateRange")), clock_now()
    earliest = moment if asked is None or asked < moment else asked
    latest = moment_of(self._get_param("EndDateRange"))
    zone = offered_zones(ec2, itype)[0]
    out: list[dict[str, Any]] = []
    for start, end in _spans(earliest, hours, today=earliest == moment):
        if len(out) == OFFERINGS_PER_SEARCH or start >= earliest + timedelta(days=60):
            break
        if latest is not None and end > latest:
            continue
        minutes = round((end - start).total_seconds() / 60)
        offer = {"CapacityBlockOfferingId": f"cb-{uuid.uuid4().hex[:17]}",
                 "InstanceType": itype, "AvailabilityZone": zone, "InstanceCount": count,
                 "StartDate": start, "EndDate": end,
                 "CapacityBlockDurationHours": minutes // 60,
                 "CapacityBlockDurationMinutes": minutes % 60,
                 "UpfrontFee": f"{_price(itype) * count * minutes / 60:.2f}",
                 "CurrencyCode": "USD", "Tenancy": "default"}
        _offers(ec2)[offer["CapacityBlockOfferingId"]] = offer
        out.append(offer)
    return ActionResult({"CapacityBlockOfferings": out})


def _spans(earliest: datetime, hours: int, today: bool) -> Iterator[tuple[datetime, datetime]]:
    """(start, end) of the blocks offered from `earliest` on, every end at 11:30 UTC. A
    search from now (`today`) first gets blocks from the next 5-minute mark (EC2's example:
    "if a Capacity Block starts at 08:55 and ends at 11:30, the minutes field would be 35")
    to the 11:30 just short of the duration asked and to the one past it ("the closest match
    to your desired duration"); then one a day from 11:30, of the duration asked."""
    day = datetime.combine(earliest.date(), BLOCK_END)
    if today and day != earliest:
        start = earliest.replace(second=0, microsecond=0)
        if start < earliest:
            start += timedelta(minutes=1)
        start += timedelta(minutes=-start.minute % 5)
        want = start + timedelta(hours=hours)
        short = datetime.combine(want.date(), BLOCK_END)
        if short > want:
            short -= timedelta(days=1)
        for end in (short, short + timedelta(days=1)):
            if end > start:
                yield start, end
    if day < earliest:
        day += timedelta(days=1)
    while True:
        yield day, day + timedelta(hours=hours)
        day += timedelta(days=1)


def _purchase_capacity_block(self: Any) -> Any:
    from moto.core.responses import ActionResult

    ec2 = self.ec2_backend
    offer_id = self._get_param("CapacityBlockOfferingId")
    platform = self._get_param("InstancePlatform")
    if not offer_id or not platform:
        raise ec2_error("MissingParameter", "The request must contain the parameter "
                        + ("CapacityBlockOfferingId" if not offer_id else "InstancePlatform"))
    offer = _offers(ec2).pop(offer_id, None)
    if offer is None:
        raise ec2_error("InvalidCapacityBlockOfferingId.NotFound",
                        f"The Capacity Block offering ID '{offer_id}' does not exist")
    self.error_on_dryrun()
    zones = {z.name: z.zone_id for z in ec2.describe_availability_zones()}
    tags = self._parse_tag_specification().get("capacity-reservation", {})
    r = Reservation(
        id=f"cr-{uuid.uuid4().hex[:17]}", owner_id=ec2.account_id, region=ec2.region_name,
        instance_type=offer["InstanceType"], platform=platform, zone=offer["AvailabilityZone"],
        zone_id=zones.get(offer["AvailabilityZone"]), tenancy="default",
        total=offer["InstanceCount"], match_criteria="targeted", end_date_type="limited",
        end_date=offer["EndDate"], start_date=offer["StartDate"], create_date=now(),
        reservation_type="capacity-block",
        tags=[{"Key": k, "Value": v} for k, v in tags.items()])
    reservations(ec2)[r.id] = r
    return ActionResult({"CapacityReservation": r.to_api(0)})


def install() -> None:
    from moto.ec2.responses import EC2Response

    EC2Response.describe_capacity_block_offerings = locked(  # type: ignore[attr-defined]  # moto extension: new action
        _describe_capacity_block_offerings)
    EC2Response.purchase_capacity_block = locked(  # type: ignore[attr-defined]  # moto extension: new action
        _purchase_capacity_block)


def reset() -> None:
    """Offerings live on moto's EC2 backends."""
