"""CloudOps on GCP: the pool's regional MIG, its standby pool, autoscaler, nodes and queue
metric, through the Compute Engine REST API (`google-cloud-compute`), with quotas
(`quota.py`: Cloud Quotas), rollouts (`rollout.py`: the canary state machine) and what
`status`, `ls` and `logs` read (`inventory.py`), on the MIG reads of `mig.py` and the
plumbing of `api.py`.

What the GCP stack leaves behind (stacks/gcp): a global instance template carrying the
contract's labels, a regional MIG using it (standby policy SCALE_OUT_POOL with
`target_stopped_size` for a stopped warm pool, PROACTIVE updates with surge) and a regional
autoscaler on the queue metric.

Capabilities (poolctl.clouds.base): quota requests, cancel, rollback, the queue metric, and
StepsRollouts (rollout.py). Warm nodes are stopped or running: a standby pool can hold
suspended VMs, but suspending GPU VMs is unsupported (docs/cloud-facts.md).
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from poolctl import naming
from poolctl.adaptors.gcp import compute_v1
from poolctl.bootlog import BootRecord, parse_boots
from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    CloudOps,
    Group,
    ImportsLoginKeys,
    NodeState,
    PublishesQueueMetric,
    ReadsLoadHistory,
    ReportsBootPhases,
    ReportsServing,
    ServingWindow,
    address_order,
)
from poolctl.clouds.gcp.api import link_name, link_zone
from poolctl.clouds.gcp.capacity import GcpReservations
from poolctl.clouds.gcp.images import GcpImages
from poolctl.clouds.gcp.inventory import GcpInventory
from poolctl.clouds.gcp.launches import MigCapacity
from poolctl.clouds.gcp.mig import mig_ref, node_phase
from poolctl.clouds.gcp.quota import GcpQuotas
from poolctl.clouds.gcp.reserve import CalendarReservations
from poolctl.clouds.gcp.rollout import CanaryRollouts
from poolctl.clouds.gcp.windows import ScalingSchedules
from poolctl.config import Config, Pool
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.errors import UsageError
from poolctl.histograms import percent_rank, spread, weighted_percentile

QUEUE_WINDOW_S = 600  # how far back `status` looks for the queue metric, as on AWS


def running_filter(cfg: Config, pool: Pool) -> str:
    """The aggregated-list filter of the pool's running VMs (the contract's labels)."""
    return (f'labels.{naming.LABEL_PROJECT} = "{cfg.project}" AND '
            f'labels.{naming.LABEL_POOL} = "{pool.name}" AND status = "RUNNING"')


def running_nodes(pages: Any, region: str) -> list[tuple[str, str, str | None]]:
    """(zone key, InstancesScopedList) pairs of an aggregated list -> (internal IP, instance
    name, zone) of the region's running nodes, by IP."""
    found = {}
    for zone_key, scoped in pages:
        zone = zone_key.rsplit("/", 1)[-1]
        if not zone.startswith(f"{region}-"):
            continue
        for inst in getattr(scoped, "instances", None) or []:
            if getattr(inst, "status", "RUNNING") != "RUNNING":
                continue
            for nic in inst.network_interfaces[:1]:
                if nic.network_i_p:
                    found[nic.network_i_p] = (inst.name, zone)
    return [(ip, *found[ip]) for ip in sorted(found, key=address_order)]


class GcpOps(GcpQuotas, CanaryRollouts, GcpInventory, ScalingSchedules, MigCapacity,
             GcpReservations, CalendarReservations, GcpImages, CloudOps,
             PublishesQueueMetric, ReportsServing, ReportsBootPhases, ReadsLoadHistory,
             ImportsLoginKeys):
    """The pool's MIG at runtime (quotas, rollouts, inventory and the MIG reads from the
    classes it builds on)."""

    cloud = Cloud.gcp

    def __init__(self, *, client_options: dict[str, Any] | Any | None = None,
                 credentials: Any = None, contact_email: str | None = None,
                 retry_initial_s: float = 1.0,
                 retry_deadline_s: float = 300.0, call_timeout_s: float = 60.0,
                 operation_timeout_s: float = 900.0) -> None:
        super().__init__(client_options=client_options, credentials=credentials,
                         contact_email=contact_email, retry_initial_s=retry_initial_s,
                         retry_deadline_s=retry_deadline_s, call_timeout_s=call_timeout_s,
                         operation_timeout_s=operation_timeout_s)

    def node_addresses(self, cfg: Config, pool: Pool) -> list[tuple[str, str, str | None]]:
        """By label, through the Compute Engine endpoint poolctl uses (POOLCTL_GCE_ENDPOINT
        honoured)."""
        if pool.gcp is None:
            raise UsageError(f"--cloud gcp: pool {pool.name!r} has no `gcp:` placement")
        pages = self.running_instances(pool.gcp.project, running_filter(cfg, pool))
        return running_nodes(pages, pool.gcp.region)

    def nodes(self, group: Group) -> list[NodeState]:
        project, region, name = mig_ref(group)
        out = []
        for mi in self.managed_instances(project, region, name):
            health = [h.detailed_health_state for h in mi.instance_health]
            state = "/".join(x for x in (mi.instance_status or "NONEXISTENT",
                                         mi.current_action or "NONE",
                                         *sorted(set(health))) if x)
            if mi.target_status and mi.target_status != mi.instance_status:
                state += f"->{mi.target_status}"
            out.append(NodeState(
                id=mi.name or link_name(mi.instance), state=state,
                phase=node_phase(mi.instance_status, mi.current_action, mi.target_status,
                                 health),
                version=link_name(mi.version.instance_template), zone=link_zone(mi.instance),
            ))
        return out

    def boot_ledger(self, group: Group, nodes: list[NodeState]) -> dict[str, list[BootRecord]]:
        """Each VM's serial port (instances.getSerialPortOutput, port 1), its boots parsed;
        a VM that does not exist (yet, or any more) has logged nothing."""
        project = mig_ref(group)[0]
        out: dict[str, list[BootRecord]] = {}
        for n in nodes:
            if not n.zone or n.state.startswith("NONEXISTENT"):
                out[n.id] = []
                continue
            out[n.id] = parse_boots(self.serial_output(project, n.zone, n.id))
        return out

    # ------------------------------------------------------------------ capacity

    def set_capacity(self, group: Group, *, min_nodes: int, warm_nodes: int,
                     warm_running: bool, desired_nodes: int | None = None) -> None:
        """Stopped warm nodes are the MIG's standby pool (`target_stopped_size`). A running
        warm node cannot stand aside on GCE: it serves, so the autoscaler's minimum becomes
        `min_nodes + warm_nodes` (its maximum is raised to that if below) and the stopped
        pool is emptied.

        With an autoscaler the target size is the autoscaler's: nodes above a lowered minimum
        are given back by it, one per scale-in window, and `desired_nodes` is not forced.
        Without one, the group is resized to `desired_nodes`, or raised to the minimum.
        """
        project, region, name = mig_ref(group)
        mig = self.get_mig(project, region, name)
        stopped = 0 if warm_running else warm_nodes
        serving_min = min_nodes + (warm_nodes if warm_running else 0)

        # Serving size first, then the standby pool: a running warm pool takes its nodes out
        # of standby (SCALE_OUT_POOL starts stopped VMs) before the pool is emptied, rather
        # than deleting them and creating new ones.
        a = self.autoscaler_of(mig)
        if a is not None:
            pol = a.autoscaling_policy
            new_max = max(pol.max_num_replicas, serving_min)
            if (pol.min_num_replicas, pol.max_num_replicas) != (serving_min, new_max):
                body = compute_v1.Autoscaler(
                    name=a.name, autoscaling_policy=compute_v1.AutoscalingPolicy(
                        min_num_replicas=serving_min, max_num_replicas=new_max))
                self.write_autoscaler(project, region, body, replace=False,
                                      what=f"patch autoscaler {a.name} (min {serving_min})")
        else:
            size = serving_min if desired_nodes is None else max(desired_nodes, serving_min)
            if mig.target_size < size or (desired_nodes is not None and mig.target_size != size):
                op = self.call(f"resize MIG {name}",
                               self.client("RegionInstanceGroupManagersClient").resize_unary,
                               request=compute_v1.ResizeRegionInstanceGroupManagerRequest(
                                   project=project, region=region, instance_group_manager=name,
                                   size=size, request_id=str(uuid.uuid4())))
                self.wait(op, project, region, f"resize MIG {name} to {size}")

        standby_mode = mig.standby_policy.mode
        if mig.target_stopped_size != stopped or (stopped and standby_mode != "SCALE_OUT_POOL"):
            patch = compute_v1.InstanceGroupManager(target_stopped_size=stopped)
            if stopped:
                # SCALE_OUT_POOL: scale-out starts standby VMs before creating new ones.
                patch.standby_policy = compute_v1.InstanceGroupManagerStandbyPolicy(
                    mode="SCALE_OUT_POOL")
            op = self.call(f"patch MIG {name}",
                           self.client("RegionInstanceGroupManagersClient").patch_unary,
                           request=compute_v1.PatchRegionInstanceGroupManagerRequest(
                               project=project, region=region, instance_group_manager=name,
                               instance_group_manager_resource=patch,
                               request_id=str(uuid.uuid4())))
            self.wait(op, project, region, f"patch MIG {name} (standby {stopped})")

    # ------------------------------------------------------------------ queue

    def queue_per_replica(self, group: Group) -> float | None:
        """The queue metric as the AWS side reads its CloudWatch one: the mean of the points
        in the newest minute that has any, over the pool's nodes. Each node writes its own
        series (resource gce_instance, its instance id; cli/poolctl/boot/node.sh.j2), so the
        series kept are those of the MIG's VMs. Cloud Monitoring's REST API
        (projects.timeSeries.list) through the session OS Login uses: no client library."""
        by_minute = self._queue_points(group, QUEUE_WINDOW_S)
        if not by_minute:
            return None
        newest = by_minute[max(by_minute)]  # RFC 3339 in UTC: text order is time order
        return sum(newest) / len(newest)

    def _queue_points(self, group: Group, window_s: float) -> dict[str, list[float]]:
        """The queue's points of the MIG's VMs over the last `window_s` seconds, by minute
        ("YYYY-MM-DDTHH:MM")."""
        project, region, name = mig_ref(group)
        ids = {str(mi.id) for mi in self.managed_instances(project, region, name) if mi.id}
        if not ids:
            return {}
        now = datetime.now(UTC)
        params = {
            "filter": f'metric.type = "{naming.GCP_METRIC_TYPE}" AND '
                      'resource.type = "gce_instance"',
            # A minute past now: this machine's clock may lag Google's.
            "interval.startTime": _stamp(now - timedelta(seconds=window_s)),
            "interval.endTime": _stamp(now + timedelta(minutes=1)),
            "view": "FULL",
        }
        by_minute: dict[str, list[float]] = {}
        while True:
            page = self.monitoring(f"projects/{project}/timeSeries", params,
                                   f"read {naming.GCP_METRIC_TYPE} of {name}")
            for ts in page.get("timeSeries", []):
                if ts.get("resource", {}).get("labels", {}).get("instance_id") not in ids:
                    continue
                for pt in ts.get("points", []):
                    value = pt.get("value", {}).get("doubleValue")
                    end = pt.get("interval", {}).get("endTime", "")
                    if value is not None and len(end) >= 16:
                        by_minute.setdefault(end[:16], []).append(float(value))
            if not page.get("nextPageToken"):
                break
            params["pageToken"] = page["nextPageToken"]
        return by_minute


    # ------------------------------------------------------------------ serving

    def serving_window(self, group: Group, window_s: float, ttft_slo_s: float,
                       tpot_slo_s: float | None) -> ServingWindow | None:
        """What the pool's engines served over the last `window_s` seconds, from the series
        its nodes write (labelled pool=<the MIG>): each metric in one timeSeries.list call
        aligned over one period covering the window and reduced across the nodes (the
        distributions' and counters' increase, ALIGN_DELTA + REDUCE_SUM; the gauges' mean,
        ALIGN_MEAN + REDUCE_MEAN). A distribution's percentiles and share within the SLO are
        taken as on AWS: its buckets spread as the node agent spreads vLLM's there
        (poolctl.histograms), so both clouds read the same instrument."""
        project, _, name = mig_ref(group)
        now = datetime.now(UTC)
        period = 60 * (math.ceil(window_s / 60) + 1)
        # a minute past now, as queue_per_replica: this machine's clock may lag Google's
        end = now + timedelta(minutes=1)

        def read(mtype: str, aligner: str, reducer: str) -> dict[str, Any] | None:
            params = {
                "filter": f'metric.type = "{mtype}" AND resource.type = "gce_instance" AND '
                          f'metric.labels.{naming.GCP_POOL_LABEL} = "{name}"',
                "interval.startTime": _stamp(end - timedelta(seconds=period)),
                "interval.endTime": _stamp(end),
                "aggregation.alignmentPeriod": f"{period}s",
                "aggregation.perSeriesAligner": aligner,
                "aggregation.crossSeriesReducer": reducer,
            }
            page = self.monitoring(f"projects/{project}/timeSeries", params,
                                   f"read {mtype} of {name}")
            for ts in page.get("timeSeries", []):
                for pt in ts.get("points", []):
                    value: dict[str, Any] = pt.get("value", {})
                    return value
            return None

        def number(v: dict[str, Any] | None) -> float | None:
            if v is None:
                return None
            raw = v.get("int64Value", v.get("doubleValue"))
            return None if raw is None else float(raw)

        dists = {key: _distribution((read(t, "ALIGN_DELTA", "REDUCE_SUM") or {}).get(
            "distributionValue")) for key, t in (("ttft", naming.GCP_TTFT_TYPE),
                                                 ("tpot", naming.GCP_TPOT_TYPE))}
        sums = {key: number(read(t, "ALIGN_DELTA", "REDUCE_SUM")) for key, t in (
            ("req", naming.GCP_REQUESTS_TYPE), ("prompt", naming.GCP_PROMPT_TOKENS_TYPE),
            ("output", naming.GCP_OUTPUT_TOKENS_TYPE))}
        means = {key: number(read(t, "ALIGN_MEAN", "REDUCE_MEAN")) for key, t in (
            ("kv", naming.GCP_KV_USAGE_TYPE), ("running", naming.GCP_RUNNING_TYPE))}
        if all(v is None for v in (*dists.values(), *sums.values(), *means.values())):
            return None
        # The queue's series carry no pool label (the autoscaler reads them per VM): the
        # mean of the MIG's VMs' points over the window, as CloudWatch's Average on AWS.
        points = [v for vs in self._queue_points(group, window_s).values() for v in vs]
        queue = sum(points) / len(points) if points else None
        ttft, tpot = dists["ttft"], dists["tpot"]
        return ServingWindow(
            window_s=float(window_s), requests=sums["req"] or 0.0,
            prompt_tokens=sums["prompt"] or 0.0, output_tokens=sums["output"] or 0.0,
            ttft_p50_s=ttft.quantile(0.5), ttft_p90_s=ttft.quantile(0.9),
            tpot_p50_s=tpot.quantile(0.5), tpot_p90_s=tpot.quantile(0.9),
            ttft_mean_s=ttft.mean, tpot_mean_s=tpot.mean,
            ttft_slo_s=ttft_slo_s, tpot_slo_s=tpot_slo_s,
            ttft_within=ttft.within(ttft_slo_s),
            tpot_within=tpot.within(tpot_slo_s) if tpot_slo_s is not None else None,
            kv_usage=means["kv"], running=means["running"], queue_per_replica=queue)


    def load_history(self, group: Group, days: int, replicas_per_node: int
                     ) -> dict[datetime, float]:
        """The nodes' running requests (labelled pool=<the MIG>), each VM's hourly mean summed
        over the VMs (ALIGN_MEAN + REDUCE_SUM, one-hour periods). The queue is not in it: its
        series carry no pool label (the autoscaler reads them per VM), and the VMs of past
        days are gone, so a saturated hour reads as the load the nodes could run."""
        project, _, name = mig_ref(group)
        end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        params = {
            "filter": f'metric.type = "{naming.GCP_RUNNING_TYPE}" AND resource.type = '
                      f'"gce_instance" AND metric.labels.{naming.GCP_POOL_LABEL} = "{name}"',
            "interval.startTime": _stamp(end - timedelta(days=days)),
            "interval.endTime": _stamp(end),
            "aggregation.alignmentPeriod": "3600s",
            "aggregation.perSeriesAligner": "ALIGN_MEAN",
            "aggregation.crossSeriesReducer": "REDUCE_SUM",
        }
        out: dict[datetime, float] = {}
        while True:
            page = self.monitoring(f"projects/{project}/timeSeries", params,
                                   f"read {naming.GCP_RUNNING_TYPE} of {name}")
            for ts in page.get("timeSeries", []):
                for pt in ts.get("points", []):
                    v = pt.get("value", {}).get("doubleValue")
                    start = pt.get("interval", {}).get("startTime")
                    if v is not None and start:
                        out[datetime.fromisoformat(start.replace("Z", "+00:00"))] = float(v)
            if not page.get("nextPageToken"):
                return out
            params["pageToken"] = page["nextPageToken"]


class _Dist:
    """A Distribution value of Cloud Monitoring (explicit buckets) read as the node agent's
    value/count points (poolctl.histograms.spread); empty when absent or of no request."""

    def __init__(self, points: list[tuple[float, float]], mean: float | None) -> None:
        self.points, self.mean = points, mean

    def quantile(self, q: float) -> float | None:
        return weighted_percentile(self.points, q)

    def within(self, slo: float) -> float | None:
        share = percent_rank(self.points, None, slo)  # PR(:SLO), as read on AWS
        return None if share is None else share / 100


def _distribution(d: dict[str, Any] | None) -> _Dist:
    """Cloud Monitoring's bucket i of N bounds is [b(i-1), b(i)), the last [b(N-1), +inf):
    vLLM's le-buckets published as bounds; the overflow bucket sits at the last bound."""
    if not d:
        return _Dist([], None)
    try:
        bounds = [float(b) for b in d["bucketOptions"]["explicitBuckets"]["bounds"]]
        counts = [float(c) for c in d.get("bucketCounts", [])]
        n, mean = float(d.get("count", 0)), float(d.get("mean", 0.0))
    except (KeyError, TypeError, ValueError):
        return _Dist([], None)
    counts += [0.0] * (len(bounds) + 1 - len(counts))
    if n <= 0 or min(counts, default=0.0) < 0:
        return _Dist([], None)
    return _Dist(spread(counts[:len(bounds) + 1], bounds, mean * n), mean)


def _stamp(t: datetime) -> str:
    return t.isoformat(timespec="seconds").replace("+00:00", "Z")


def make_ops(endpoints: CloudEndpoints = REAL_CLOUDS, contact_email: str | None = None
             ) -> GcpOps:
    """The GCP runtime for commands, calling `endpoints.gce_url` (Google's when None). The
    sandbox emulates AWS only (refused here). `contact_email`: for Cloud Quotas increase
    requests (`quota request --contact-email`, else the POOLCTL_QUOTA_CONTACT_EMAIL
    environment variable)."""
    endpoints.require(Cloud.gcp)
    return GcpOps(client_options={"api_endpoint": endpoints.gce_url} if endpoints.gce_url
                  else None, contact_email=contact_email)
