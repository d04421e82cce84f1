"""Capacity for a launch window on GCP: future reservation requests in calendar mode.

`advice.calendarMode` (regions/{region}/advice/calendarMode) says when and in which zone the
cloud can hold the window's VMs; `futureReservations.insert` (zonal) submits the request,
which Google reviews (a request cannot be cancelled, deleted or modified once submitted).
At its start time Compute Engine creates reservations that matching VMs consume like
on-demand reservations: the window's scaling schedule raises the MIG, and its new VMs, whose
template's reservation affinity is `any`, land in them (docs/cloud-facts.md, calendar mode).
Calendar mode reserves 1 to 90 days of 1 to 80 GPU VMs, and shows availability up to 60
days ahead; it is billed while the reservation runs, at prices poolctl's catalog does not
hold.
"""

from __future__ import annotations

import math
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from poolctl import naming
from poolctl.adaptors.gcp import compute_v1
from poolctl.cloud import Cloud
from poolctl.clouds.base import BlockOffering, ReservesCalendarCapacity
from poolctl.clouds.gcp.api import link_name
from poolctl.clouds.gcp.mig import MigReader
from poolctl.config import Pool
from poolctl.errors import OperationFailed, UsageError
from poolctl.sizing import gcp_zones, instance_row

MAX_DAYS, MAX_VMS, AHEAD = 90, 80, timedelta(days=60)
SPEC = "window"  # the one spec of an advice request: its key in the answer too


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class CalendarReservations(MigReader, ReservesCalendarCapacity):
    """`warm --reserve` on GCP (part of `GcpOps`)."""

    def _sku(self, pool: Pool, nodes: int) -> tuple[str, list[dict[str, Any]]]:
        row = instance_row(pool, Cloud.gcp)
        ssds = [{"disk_size_gb": int(row.local_nvme.size_gb), "interface": "NVME"}
                for _ in range(row.local_nvme.count)]
        if not 1 <= nodes <= MAX_VMS:
            raise UsageError(f"--reserve: {nodes} VMs; a calendar-mode request holds 1 to "
                             f"{MAX_VMS} GPU VMs")
        return row.name, ssds

    def calendar_offers(self, pool: Pool, nodes: int, start: datetime, end: datetime
                        ) -> list[BlockOffering]:
        gcp = pool.gcp
        assert gcp is not None  # asked for the pool's gcp placement
        machine_type, ssds = self._sku(pool, nodes)
        # Whole days, from a start up to a day before the window's to its end.
        days = math.ceil((end - start) / timedelta(days=1)) + 1
        if days > MAX_DAYS:
            raise UsageError(f"--from/--until: a calendar-mode reservation lasts 1 to "
                             f"{MAX_DAYS} days; the window needs {days}")
        if start - datetime.now(UTC) > AHEAD:
            raise UsageError("--from: GCP shows calendar-mode availability up to 60 days "
                             "ahead; schedule the window closer to it")
        spec = {
            "target_resources": {"specific_sku_resources": {
                "machine_type": machine_type, "instance_count": nodes,
                "local_ssd_partitions": [{"disk_size_gb": d["disk_size_gb"],
                                          "disk_interface": "NVME"} for d in ssds]}},
            "time_range_spec": {
                "start_time_not_earlier_than": _rfc3339(start - timedelta(days=1)),
                "start_time_not_later_than": _rfc3339(start),
                "min_duration": f"{days * 86400}s", "max_duration": f"{days * 86400}s"},
            "location_policy": {"locations": {
                f"zones/{z}": {"preference": "ALLOW"} for z in gcp_zones(
                    pool, instance_row(pool, Cloud.gcp))}},
        }
        answer: Any = self.call(
            f"advice calendarMode for {nodes} x {machine_type} in {gcp.region}",
            self.client("AdviceClient").calendar_mode, project=gcp.project,
            region=gcp.region,
            calendar_mode_advice_request_resource={"future_resources_specs": {SPEC: spec}})
        out = []
        for rec in answer.recommendations:
            r = rec.recommendations_per_spec.get(SPEC)
            if r is None or r.recommendation_type != "FUTURE_RESERVATION":
                continue
            r_start, r_end = _time(r.start_time), _time(r.end_time)
            if r_start <= start and r_end >= end:
                out.append(BlockOffering(
                    id=r.recommendation_id, instance_type=machine_type,
                    zone=link_name(r.location), count=nodes, start=r_start, end=r_end,
                    hours=round((r_end - r_start) / timedelta(hours=1)), upfront_usd=0.0))
        return out

    def reserve_calendar(self, pool: Pool, offering: BlockOffering, window_id: str
                         ) -> tuple[str, str]:
        gcp = pool.gcp
        assert gcp is not None  # asked for the pool's gcp placement
        machine_type, ssds = self._sku(pool, offering.count)
        name = re.sub(r"[^a-z0-9-]", "-", f"{naming.short(pool.name, 40)}-{window_id}")
        body = {
            "name": name,
            "description": f"poolctl window {window_id} of pool {pool.name}",
            "reservation_mode": "CALENDAR", "planning_status": "SUBMITTED",
            "specific_sku_properties": {"total_count": offering.count, "instance_properties": {
                "machine_type": machine_type, "local_ssds": ssds}},
            "time_window": {"start_time": _rfc3339(offering.start),
                            "end_time": _rfc3339(offering.end)},
            # Consumed by any matching VM (the MIG's template: affinity `any`), deleted
            # with the reservation period's end.
            "specific_reservation_required": False,
            "auto_delete_auto_created_reservations": True,
        }
        client = self.client("FutureReservationsClient")
        # The name comes from the window's id (the same for the same window), and the request
        # id from the name: a retry of a request that went through is ignored by Compute
        # Engine, and a second run finds the request it made (409) instead of a second one.
        request_id = str(uuid.uuid5(uuid.NAMESPACE_URL,
                                    f"poolctl/{gcp.project}/{offering.zone}/{name}"))
        try:
            op = self.call(f"insert future reservation {name} in {offering.zone}",
                           client.insert_unary,
                           request=compute_v1.InsertFutureReservationRequest(
                               project=gcp.project, zone=offering.zone,
                               future_reservation_resource=body, request_id=request_id))
        except OperationFailed as e:
            if ": 409 " not in str(e):
                raise
        else:
            self.wait(op, gcp.project, None, f"insert future reservation {name}",
                      zone=offering.zone)
        got = self.call(f"get future reservation {name}", client.get, project=gcp.project,
                        zone=offering.zone, future_reservation=name)
        state = str(got.status.procurement_status or "")
        if state in ("DECLINED", "FAILED", "CANCELLED"):
            raise OperationFailed(f"GCP future reservation {name}: {state}; the window was not "
                                  "scheduled (schedule it without --reserve, On-Demand)")
        return name, state
