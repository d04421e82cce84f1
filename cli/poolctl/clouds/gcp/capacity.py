"""GCE capacity for `capacity check`: per zone of the pool's MIG, the machine type offered
(machineTypes.get in that zone: GCE answers 404 where the zone lacks it) and the zonal
reservations its instance template's affinity consumes (reservations.aggregatedList)."""

from __future__ import annotations

from typing import Any

from poolctl.adaptors.gcp import api_exceptions
from poolctl.cloud import Cloud
from poolctl.clouds.base import CapacityReport, ChecksCapacity, ReservationRow, ZoneCapacity
from poolctl.clouds.gcp.api import link_name
from poolctl.clouds.gcp.mig import MigReader
from poolctl.config import Config, Pool, format_loc
from poolctl.errors import UsageError
from poolctl.sizing import gcp_zones, instance_row


class GcpReservations(MigReader, ChecksCapacity):
    """`capacity check` on GCP (part of `GcpOps`): per zone of the placement, whether GCE
    offers the machine type there, and the zonal reservations the instance template's
    affinity consumes."""

    def _offered(self, project: str, zone: str, machine_type: str) -> bool:
        try:
            self.lookup(f"get machine type {machine_type} in {zone}",
                        self.client("MachineTypesClient").get, project=project, zone=zone,
                        machine_type=machine_type)
        except api_exceptions.NotFound:
            return False
        return True

    def capacity_report(self, cfg: Config, pool: Pool, needs: dict[str, int]
                        ) -> CapacityReport:
        gcp = pool.gcp
        assert gcp is not None  # asked for the pool's gcp placement (Config.targets)
        loc = format_loc(("pools", cfg.pools.index(pool), "gcp", "capacity", "reservations"))
        zones = gcp_zones(pool, instance_row(pool, Cloud.gcp))
        offered = {z for z in zones if self._offered(gcp.project, z, gcp.machine_type)}
        by_zone: dict[str, list[ReservationRow]] = {z: [] for z in zones}
        cap = gcp.capacity
        found: dict[str, ReservationRow] = {}
        if cap.reservations != "none":
            pages: Any = self.call(f"list reservations of {gcp.project}",
                                   self.client("ReservationsClient").aggregated_list,
                                   project=gcp.project)
            for _scope, scoped in pages:
                for r in scoped.reservations:
                    spec = r.specific_reservation
                    found[r.name] = ReservationRow(
                        id=r.name, instance_type=link_name(spec.instance_properties.machine_type),
                        zone=link_name(r.zone), total=int(spec.count),
                        available=int(spec.count) - int(spec.in_use_count),
                        state="active" if r.status == "READY" else r.status.lower(),
                        match_criteria=("targeted" if r.specific_reservation_required
                                        else "open"), end=None)
        for name in cap.names:
            res = found.get(name)
            if res is None:
                raise UsageError(f"{loc}: reservation {name!r} not found in {gcp.project}; "
                                 "name reservations of the pool's project")
            if res.instance_type != gcp.machine_type:
                raise UsageError(f"{loc}: {name} reserves {res.instance_type}, the pool runs "
                                 f"{gcp.machine_type}; name reservations of {gcp.machine_type}")
            if res.zone not in by_zone:
                raise UsageError(f"{loc}: {name} is in {res.zone}, outside the pool's zones "
                                 f"({', '.join(zones)}); name reservations of those zones")
            by_zone[res.zone].append(res)
        if cap.reservations == "any":  # GCE's default: a matching open one is consumed
            for res in found.values():
                if (res.match_criteria == "open" and res.instance_type == gcp.machine_type
                        and res.zone in by_zone):
                    by_zone[res.zone].append(res)
        # Specific reservations: a VM beyond them is not created (reservations-only).
        mode = ("reservations-only" if cap.names else "none" if cap.reservations == "none"
                else "open")
        return CapacityReport(
            pool=pool.name, cloud=Cloud.gcp, region=gcp.region, instance_type=gcp.machine_type,
            preference=mode, needs=needs,
            zones=[ZoneCapacity(z, z in offered, by_zone[z]) for z in zones])
