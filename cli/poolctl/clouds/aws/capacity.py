"""EC2 capacity for a pool: the zones that offer its type, the On-Demand Capacity
Reservations it launches into, and the launches its group could not make.

Scaling activities carry no error code (the Auto Scaling API reference's Activity has
StatusCode Failed and EC2's message), so the code is recognised from EC2's own wording,
as the EC2 API error codes page and RunInstances return it.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from poolctl import naming
from poolctl.cloud import Cloud
from poolctl.clouds.aws.api import AwsApi, error_code
from poolctl.clouds.base import (
    CapacityReport,
    ChecksCapacity,
    Group,
    LaunchFailure,
    ReportsLaunchFailures,
    ReservationRow,
    ZoneCapacity,
)
from poolctl.config import AwsPlacement, Config, Pool, format_loc
from poolctl.contract.aws import CAPACITY_BLOCK
from poolctl.errors import UsageError

# EC2's messages for the codes a launch fails with for capacity.
_CODES = (
    ("InsufficientInstanceCapacity", re.compile(
        r"We currently do not have sufficient (?P<type>\S+) capacity"
        r"(?: in the Availability Zone you requested \((?P<zone>[a-z0-9-]+)\))?")),
    ("ReservationCapacityExceeded", re.compile(
        r"The requested reservation does not have sufficient compatible")),
    ("InstanceLimitExceeded", re.compile(r"You have requested more instances")),
    ("VcpuLimitExceeded", re.compile(r"You have requested more vCPU capacity")),
)
HOLDING = ["pending", "running"]


def failure_code(message: str) -> tuple[str, str, str]:
    """(code, instance type, zone) a failed launch's message names; ("", "", "") when it is
    not one poolctl recognises (the activity is still reported, as `LaunchFailed`)."""
    for code, rx in _CODES:
        if m := rx.search(message):
            groups = m.groupdict()
            return code, groups.get("type") or "", groups.get("zone") or ""
    return "", "", ""


def _zone_of(details: str) -> str:
    try:
        parsed = json.loads(details or "{}")
    except ValueError:
        return ""
    return str(parsed.get("Availability Zone", "")) if isinstance(parsed, dict) else ""


def _iso(t: Any) -> str:
    return t.isoformat() if isinstance(t, datetime) else str(t or "")


class Ec2Capacity(AwsApi, ChecksCapacity, ReportsLaunchFailures):
    """`capacity check` and the failed launches of `status` / `warm --wait` (part of
    `AwsOps`)."""

    def _zones(self, aws: AwsPlacement) -> list[str]:
        """The placement's zone names: the given subnets', the given zone IDs', else the
        region's first ones (as the stack creates them)."""
        ec2, net = self.client("ec2", aws.region), aws.network
        if net.vpc_id is not None:
            with self.call("ec2:DescribeSubnets"):
                subnets = ec2.describe_subnets(SubnetIds=net.subnet_ids)["Subnets"]
            return sorted({s["AvailabilityZone"] for s in subnets})
        if net.availability_zone_ids:
            with self.call("ec2:DescribeAvailabilityZones"):
                zones = ec2.describe_availability_zones(
                    ZoneIds=net.availability_zone_ids)["AvailabilityZones"]
            return sorted(z["ZoneName"] for z in zones)
        return [f"{aws.region}{chr(ord('a') + i)}" for i in range(net.availability_zones)]

    def _offered(self, region: str, instance_type: str) -> set[str]:
        ec2 = self.client("ec2", region)
        return {o["Location"] for page in self.pages(
            ec2, "describe_instance_type_offerings", "ec2:DescribeInstanceTypeOfferings",
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [instance_type]}])
            for o in page["InstanceTypeOfferings"]}

    def _reservation_ids(self, aws: AwsPlacement) -> list[str]:
        arn = aws.capacity.group_arn
        if arn is None:
            return aws.capacity.reservation_ids
        rg = self.client("resource-groups", aws.region)
        ids = []
        for page in self.pages(rg, "list_group_resources", "resource-groups:ListGroupResources",
                               Group=arn):
            for item in page.get("Resources", []):
                rid = item.get("Identifier", {}).get("ResourceArn", "")
                ids.append(rid.rsplit("/", 1)[-1])
        return ids

    def _reservations(self, aws: AwsPlacement, loc: str) -> list[dict[str, Any]]:
        """The reservations the pool launches into: those named, else (EC2's default and
        reservations-first) the region's active open ones of its type; none under `none`."""
        ec2, cap = self.client("ec2", aws.region), aws.capacity
        if cap.mode == "none":
            return []
        if cap.reservations or cap.capacity_block:
            ids = [cap.capacity_block] if cap.capacity_block else self._reservation_ids(aws)
            if not ids:
                return []
            try:
                return [r for page in ec2.get_paginator("describe_capacity_reservations")
                        .paginate(CapacityReservationIds=ids)
                        for r in page["CapacityReservations"]]
            except Exception as e:
                if error_code(e).startswith("InvalidCapacityReservationId"):
                    raise UsageError(
                        f"{loc}: {', '.join(ids)}: not found in {aws.region} ({error_code(e)}); "
                        f"name reservations of the pool's region {aws.region}") from None
                with self.call("ec2:DescribeCapacityReservations"):
                    raise
        return [r for page in self.pages(
            ec2, "describe_capacity_reservations", "ec2:DescribeCapacityReservations",
            Filters=[{"Name": "instance-type", "Values": [aws.instance_type]},
                     {"Name": "state", "Values": ["active"]},
                     {"Name": "instance-match-criteria", "Values": ["open"]}])
            for r in page["CapacityReservations"]]

    def _pool_in(self, cfg: Config, pool: Pool, region: str) -> dict[str, int]:
        """{reservation id: the pool's own nodes holding a slot in it}."""
        ec2, out = self.client("ec2", region), dict[str, int]()
        for page in self.pages(ec2, "describe_instances", "ec2:DescribeInstances", Filters=[
                {"Name": f"tag:{naming.TAG_PROJECT}", "Values": [cfg.project]},
                {"Name": f"tag:{naming.TAG_POOL}", "Values": [pool.name]},
                {"Name": "instance-state-name", "Values": HOLDING}]):
            for res in page["Reservations"]:
                for inst in res["Instances"]:
                    if rid := inst.get("CapacityReservationId"):
                        out[rid] = out.get(rid, 0) + 1
        return out

    def capacity_report(self, cfg: Config, pool: Pool, needs: dict[str, int]
                        ) -> CapacityReport:
        aws = pool.aws
        assert aws is not None  # asked for the pool's aws placement (Config.targets)
        index, block = cfg.pools.index(pool), aws.capacity.capacity_block
        loc = format_loc(("pools", index, "aws", "capacity",
                          "capacity_block" if block else "reservations"))
        zones = self._zones(aws)
        offered = self._offered(aws.region, aws.instance_type)
        mine = self._pool_in(cfg, pool, aws.region)
        by_zone: dict[str, list[ReservationRow]] = {z: [] for z in zones}
        named = bool(aws.capacity.reservations) or block is not None
        for r in self._reservations(aws, loc):
            row = ReservationRow(
                id=r["CapacityReservationId"], instance_type=r["InstanceType"],
                zone=r["AvailabilityZone"], total=int(r["TotalInstanceCount"]),
                available=int(r["AvailableInstanceCount"]), state=r["State"],
                match_criteria=r.get("InstanceMatchCriteria", "open"),
                end=_iso(r.get("EndDate")) or None,
                kind=r.get("ReservationType", "default"),
                pool_in_use=mine.get(r["CapacityReservationId"], 0),
                start=_iso(r.get("StartDate")) or None)
            if not named:
                if row.zone in by_zone:
                    by_zone[row.zone].append(row)
                continue
            # A named reservation the pool cannot use is a mistake in the file.
            if row.instance_type != aws.instance_type:
                raise UsageError(f"{loc}: {row.id} reserves {row.instance_type}, the pool runs "
                                 f"{aws.instance_type}; name reservations of "
                                 f"{aws.instance_type}")
            if row.zone not in by_zone:
                raise UsageError(f"{loc}: {row.id} is in {row.zone}, outside the pool's zones "
                                 f"({', '.join(zones)}); name reservations of those zones")
            if row.state in ("cancelled", "expired", "failed", "payment-failed"):
                raise UsageError(f"{loc}: {row.id} is {row.state}; remove it or name an "
                                 + ("active or scheduled Capacity Block" if block
                                    else "active reservation"))
            if block and row.kind != CAPACITY_BLOCK:
                # Market type capacity-block launches only into a block (docs/cloud-facts.md).
                raise UsageError(f"{loc}: {row.id} is a {row.kind} Capacity Reservation, not a "
                                 "Capacity Block; name it under aws.capacity.reservations")
            by_zone[row.zone].append(row)
        return CapacityReport(
            pool=pool.name, cloud=Cloud.aws, region=aws.region,
            instance_type=aws.instance_type,
            preference=CAPACITY_BLOCK if block else aws.capacity.mode, needs=needs,
            zones=[ZoneCapacity(z, z in offered, by_zone[z]) for z in zones])

    def launch_failures(self, group: Group, instance_type: str, since_s: float = 3600
                        ) -> list[LaunchFailure]:
        asg = self.client("autoscaling", group.region)
        cutoff = datetime.now(UTC) - timedelta(seconds=since_s)
        out: list[LaunchFailure] = []
        for page in self.pages(asg, "describe_scaling_activities",
                               "autoscaling:DescribeScalingActivities",
                               AutoScalingGroupName=group.name):
            for act in page["Activities"]:  # newest first
                start = act.get("StartTime")
                if isinstance(start, datetime) and start < cutoff:
                    return out
                if not act.get("Description", "").startswith("Launching a new EC2 instance"):
                    continue
                if act.get("StatusCode") != "Failed":
                    return out  # a launch that worked after them: the group grows again
                message = act.get("StatusMessage", "")
                code, itype, zone = failure_code(message)
                out.append(LaunchFailure(
                    zone=zone or _zone_of(act.get("Details", "")),
                    instance_type=itype or instance_type, code=code or "LaunchFailed",
                    at=_iso(start), message=message))
        return out
