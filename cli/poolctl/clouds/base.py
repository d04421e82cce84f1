"""The runtime interface every cloud implements, and the records it returns.

Runtime commands (quota, warm, rollout, status) talk to the cloud APIs directly, find
resources by the contract's tags/labels, and never import cdktn. Cloud-neutral logic
(rounding replicas to nodes, quota arithmetic, recording versions) lives in
`poolctl.runtime`; what differs per cloud sits behind `CloudOps`, one implementation per
cloud. What only some clouds do is a capability class below (dstack's `Compute` mixins are
the model): a cloud's class inherits the ones it offers, and the runtime asks
`isinstance(ops, Capability)` before using one, never a string set or a `getattr` probe.

Each cloud's class (`poolctl.clouds.aws.ops.AwsOps`, `poolctl.clouds.gcp.ops.GcpOps`) is
made by its `make_ops(endpoints)` (where its calls go, resolved at the CLI edge), which
`poolctl.clouds.registry` maps each `Cloud` to.
"""

from __future__ import annotations

import ipaddress
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, Literal

from poolctl.bootlog import BootRecord
from poolctl.cloud import Cloud

# The records the capabilities below return, named here too (`X as X`: re-exported).
from poolctl.clouds.records import BlockOffering as BlockOffering
from poolctl.clouds.records import BlockWindow as BlockWindow
from poolctl.clouds.records import BoughtBlock as BoughtBlock
from poolctl.clouds.records import CapacityReport as CapacityReport
from poolctl.clouds.records import ForecastHour as ForecastHour
from poolctl.clouds.records import ForgottenTemplate as ForgottenTemplate
from poolctl.clouds.records import Found as Found
from poolctl.clouds.records import ImageRow as ImageRow
from poolctl.clouds.records import LoadForecast as LoadForecast
from poolctl.clouds.records import Purchase as Purchase
from poolctl.clouds.records import ReservationRow as ReservationRow
from poolctl.clouds.records import ServingPrediction as ServingPrediction
from poolctl.clouds.records import ServingWindow as ServingWindow
from poolctl.clouds.records import TemplatesDeleted as TemplatesDeleted
from poolctl.clouds.records import ZoneCapacity as ZoneCapacity
from poolctl.config import Config, Pool
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints
from poolctl.inventory import Endpoint, LogEvent, PoolRow
from poolctl.sizing import HeldCapacity, PoolPlan, QuotaNeed, held_capacity, hourly_cost
from poolctl.starts import KindStarts
from poolctl.terraform import Terraform
from poolctl.windows import Window


def address_order(address: str) -> tuple[int, int, str]:
    """Sort key of node addresses: IPv4 before IPv6, numerically; anything else last."""
    try:
        addr = ipaddress.ip_address(address)
    except ValueError:
        return (9, 0, address)
    return (addr.version, int(addr), address)


@dataclass
class QuotaLine:
    """One quota in one scope: what the pool needs against what is granted and used."""

    name: str
    unit: str
    scope: str  # region, or "global"
    needed: int
    granted: float | None
    in_use: float = 0  # everything running against the quota in its scope, the pool included
    description: str = ""
    # The pool's own share of `in_use` (its running nodes). `needed` already counts them, so
    # they are not counted twice; 0 when unknown (the shortfall is then conservative).
    pool_in_use: float = 0
    # Every pool of the file that draws on this quota (same cloud, project, scope and name)
    # with its own need; `needed` and `pool_in_use` are then their sums.
    needed_by_pool: dict[str, int] = field(default_factory=dict)
    # A quota only a fallback type draws on: the type. Its shortfall limits how far the pool
    # grows on that type; it fails no check.
    fallback: str = ""

    @property
    def pools(self) -> list[str]:
        return list(self.needed_by_pool)

    @property
    def available(self) -> float | None:
        return None if self.granted is None else self.granted - self.in_use

    @property
    def shortfall(self) -> float:
        """How much more must be granted for `needed` to fit beside what others use."""
        if self.granted is None:
            return 0
        return max(0, self.needed + self.in_use - self.pool_in_use - self.granted)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(available=self.available, shortfall=self.shortfall, ok=self.shortfall == 0,
                 pools=self.pools)
        return d


@dataclass
class QuotaRequest:
    name: str
    scope: str
    desired: float
    id: str
    state: str
    already_open: bool = False  # an earlier open request was found: nothing new was filed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


NodePhase = Literal["in_service", "warm", "pending", "unhealthy", "terminating"]


@dataclass
class NodeState:
    id: str
    state: str  # cloud's own word: InService, Warmed:Stopped, Pending:Wait, RUNNING, ...
    phase: NodePhase
    version: str = ""  # launch template version / instance template
    zone: str = ""
    since_s: float | None = None  # seconds since launch / last state change, when known


class RolloutStatus(StrEnum):
    """Where a rollout stands, in poolctl's words on every cloud (the JSON's `status`); the
    cloud's own word, where it has one, is `RolloutState.cloud_status`."""

    pending = "pending"
    in_progress = "in_progress"
    successful = "successful"
    failed = "failed"
    cancelling = "cancelling"
    cancelled = "cancelled"
    rolling_back = "rolling_back"
    rolled_back = "rolled_back"
    rollback_failed = "rollback_failed"

    @property
    def words(self) -> str:
        """As the commands say it: `in progress`, `rolled back` ..."""
        return self.value.replace("_", " ")

    @property
    def turned_back(self) -> bool:
        """Cancelled or rolling back (or done so): the forward percentage no longer says
        where the pool stands."""
        return self in _TURNED_BACK


_TURNED_BACK = frozenset({RolloutStatus.cancelling, RolloutStatus.cancelled,
                          RolloutStatus.rolling_back, RolloutStatus.rolled_back,
                          RolloutStatus.rollback_failed})


@dataclass(frozen=True)
class VersionRow:
    """One version of a group a rollout steps (GCP: a MIG version) and its nodes."""

    name: str
    template: str
    target: int | None  # the nodes the version is to have; None for "the rest"
    nodes: int
    healthy: int
    unhealthy: int
    pending: int


@dataclass
class RolloutState:
    id: str
    status: RolloutStatus
    done: bool
    percentage_complete: float
    checkpoints: list[int] = field(default_factory=list)
    checkpoint_reached: int | None = None
    instances_to_update: int | None = None
    from_version: str = ""
    to_version: str = ""
    reason: str = ""
    # Rollouts poolctl steps itself (GCP canaries): the checkpoint percentage the current step
    # heads for, and the group's nodes per version.
    step: int | None = None
    versions: list[VersionRow] = field(default_factory=list)
    cloud_status: str = ""  # the cloud's own word (AWS: the instance refresh's Status)

    def __post_init__(self) -> None:
        self.status = RolloutStatus(self.status)  # also from a record's or the JSON's string


@dataclass
class Group:
    """The pool's node group as found by tags/labels."""

    cloud: Cloud
    name: str
    region: str
    min_nodes: int
    max_nodes: int
    desired_nodes: int
    warm_min_nodes: int  # configured warm/standby size (0 when none)
    warm_state: str  # "stopped" | "running" | ""
    version: str  # current launch template version / instance template
    raw_id: str = ""  # ARN / self link
    template: str = ""  # launch template id / instance template name the versions belong to


@dataclass
class LaunchFailure:
    """A launch the cloud refused, from the group's own record of it."""

    zone: str
    instance_type: str
    code: str  # the cloud's code: InsufficientInstanceCapacity, ZONE_RESOURCE_POOL_EXHAUSTED
    at: str  # ISO time
    message: str = ""
    # The VM that waits to be created (GCE keeps it, CREATING, while it retries); empty on
    # AWS, where a failed launch leaves no instance.
    instance: str = ""


def is_stopped_warm(n: NodeState) -> bool:
    """A warm node that is not running (AWS Warmed:Stopped, a stopped GCE standby VM): it
    has given its capacity back."""
    return n.phase == "warm" and n.state != "Warmed:Running"


@dataclass
class PoolStatus:
    pool: str
    cloud: Cloud
    group: Group
    replicas_per_node: int
    nodes: list[NodeState]
    rollout: RolloutState | None
    queue_per_replica: float | None
    # Launches the group could not make since its last successful one (capacity, mostly).
    capacity_failures: list[LaunchFailure] = field(default_factory=list)
    # What the reservations hold, from the file (capacity.reserved_nodes): status asks the
    # cloud for no reservation.
    reserved_nodes: int = 0
    capacity_block: str | None = None  # from the file too (aws.capacity.capacity_block)
    # The newest node that failed its boot, as its console says (ReportsBootFailures).
    boot_failure: str | None = None
    # What its engines served lately (ReportsServing); None: nothing published.
    serving: ServingWindow | None = None
    # What the serving model predicts for that load (None: no request finished).
    predicted: ServingPrediction | None = None
    starts: dict[str, KindStarts] = field(default_factory=dict)  # measured (ReportsBootPhases)

    def drift(self) -> dict[str, float]:
        """Measured p90 over predicted, less 1, by metric ("ttft", "tpot"), where both
        exist: 0.25 is 25 % slower than the model says."""
        w, p = self.serving, self.predicted
        if w is None or p is None:
            return {}
        pairs = {"ttft": (w.ttft_p90_s, p.ttft_p90_s), "tpot": (w.tpot_p90_s, p.tpot_p90_s)}
        return {k: m / q - 1 for k, (m, q) in pairs.items() if m is not None and q}

    def live(self) -> dict[str, Any] | None:
        """The contract's `live` block (`status --json`): what the engines served over the
        window, what the model predicts for that load, and the drift; None while no node
        publishes."""
        w, p = self.serving, self.predicted
        if w is None:
            return None
        return {
            "window_s": w.window_s,
            "ttft_s": {"p50": w.ttft_p50_s, "p90": w.ttft_p90_s, "mean": w.ttft_mean_s},
            "tpot_s": {"p50": w.tpot_p50_s, "p90": w.tpot_p90_s, "mean": w.tpot_mean_s},
            "requests_per_s": w.requests_per_s,
            "output_tokens_per_s": w.output_tokens_per_s,
            "usd_per_1m_output_tokens": w.usd_per_million_output_tokens(
                self.cost_per_hour_usd()),
            "predicted": None if p is None else {
                "replicas": p.replicas, "ttft_s": {"p90": p.ttft_p90_s},
                "tpot_s": {"p90": p.tpot_p90_s}},
            "drift": self.drift(),
        }

    def held(self) -> HeldCapacity:
        """Capacity held (every node up, and stopped ones in reserved room) vs hoped for
        (stopped warm nodes beyond it: their start is a new launch)."""
        stopped = sum(1 for n in self.nodes if is_stopped_warm(n))
        up = sum(1 for n in self.nodes if n.phase != "terminating" and not is_stopped_warm(n))
        return held_capacity(up, stopped, self.reserved_nodes, self.capacity_block)
    # Launch windows still to end (`warm --from`), over the minimum kept before them.
    windows: list[Window] = field(default_factory=list)
    windows_kept_min: int | None = None
    # Windows on bought Capacity Blocks, each run by a group of its own (RunsBlockWindows).
    block_windows: list[BlockWindow] = field(default_factory=list)
    # Windows of warm nodes still to end, over the warm pool kept before them.
    warm_windows: list[Window] = field(default_factory=list)
    warm_windows_kept: int | None = None
    # Capacity Blocks bought for the pool that no window uses, and purchases whose answer
    # never came (the ledger's; runtime/purchases.py).
    unused_blocks: list[BoughtBlock] = field(default_factory=list)
    pending_purchases: list[Purchase] = field(default_factory=list)
    price_per_node_hour_usd: float = 0.0  # the catalog's, as `plan` prices the pool
    # The predictive policy's forecast beside what happened (ForecastsLoad), and the lead
    # time it launches with (None: the file asks for no predictive scaling).
    forecast: LoadForecast | None = None
    forecast_buffer_s: int | None = None

    def cost_per_hour_usd(self) -> float:
        """What the pool costs per hour now: its nodes up (stopped warm ones are not
        billed), priced by the one cost rule (sizing.hourly_cost: reservations included)."""
        return hourly_cost(self.held().running_nodes, self.reserved_nodes,
                           self.price_per_node_hour_usd)

    def counts(self) -> dict[str, int]:
        c = {"in_service": 0, "warm": 0, "pending": 0, "unhealthy": 0, "terminating": 0}
        for n in self.nodes:
            c[n.phase] += 1
        return c

    def to_json(self) -> dict[str, Any]:
        counts = self.counts()
        return {
            "pool": self.pool,
            "cloud": self.cloud,
            "group": asdict(self.group),
            "nodes": counts,
            "replicas": {k: v * self.replicas_per_node for k, v in counts.items()},
            "replicas_per_node": self.replicas_per_node,
            "rollout": asdict(self.rollout) if self.rollout else None,
            "queue_per_replica": self.queue_per_replica,
            "serving": (self.serving.to_json(self.cost_per_hour_usd())
                        if self.serving else None),
            "predicted": self.predicted.to_json() if self.predicted else None,
            "drift": self.drift(),
            "live": self.live(),
            "starts": {k: asdict(v) for k, v in self.starts.items()},
            "boot_failure": self.boot_failure,
            "instances": [asdict(n) for n in self.nodes],
            "capacity_failures": [asdict(f) for f in self.capacity_failures],
            "capacity": asdict(self.held()),
            "cost_per_hour_usd": self.cost_per_hour_usd(),
            "windows": [self._window(w) for w in self.windows],
            "windows_kept_min_nodes": self.windows_kept_min,
            "block_windows": [bw.to_json() for bw in self.block_windows],
            "warm_windows": [self._window(w) for w in self.warm_windows],
            "warm_windows_kept_nodes": self.warm_windows_kept,
            "unused_blocks": [b.to_json() for b in self.unused_blocks],
            "pending_purchases": [p.to_json() for p in self.pending_purchases],
            "predictive": (None if self.forecast_buffer_s is None else {
                "buffer_s": self.forecast_buffer_s,
                "forecast": self.forecast.to_json() if self.forecast else None}),
        }

    def _window(self, w: Window) -> dict[str, Any]:
        return {"id": w.id, "nodes": w.nodes, "replicas": w.nodes * self.replicas_per_node,
                "start": w.start.isoformat(timespec="seconds") if w.start else None,
                "end": w.end.isoformat(timespec="seconds")}


class CloudOps(ABC):
    """What every cloud does for the runtime commands. Capabilities beyond these are the
    classes below, inherited by the clouds that have them."""

    cloud: ClassVar[Cloud]
    # Where the calls go (the real cloud, or the sandbox's endpoint and credentials); waits
    # poll at its pace.
    endpoints: CloudEndpoints = REAL_CLOUDS

    @abstractmethod
    def find_group(self, cfg: Config, pool: Pool) -> Group:
        """The pool's group by the contract's tags/labels; OperationFailed if not deployed."""

    @abstractmethod
    def node_addresses(self, cfg: Config, pool: Pool) -> list[tuple[str, str, str | None]]:
        """(private address, instance id or name, zone or None) of the pool's running
        nodes, found by the contract's tags/labels, in address order (`nodes check`)."""

    @abstractmethod
    def nodes(self, group: Group) -> list[NodeState]:
        """In-service, warm, pending and unhealthy nodes (warm pool / standby included)."""

    @abstractmethod
    def quota_lines(self, cfg: Config, pool: Pool, needs: list[QuotaNeed]
                    ) -> list[QuotaLine]:
        """Granted and in-use for each need ({name, unit, needed, scope})."""

    @abstractmethod
    def set_capacity(self, group: Group, *, min_nodes: int, warm_nodes: int,
                     warm_running: bool, desired_nodes: int | None = None) -> None:
        """Make the group's minimum and warm (standby) size these absolute values.

        `desired_nodes` None leaves the target size to the cloud (raised to `min_nodes` when
        below it); `warm --reset` passes it to give back the nodes `warm --running` added.
        """

    @abstractmethod
    def rollout_apply_env(self, group: Group, plan: PoolPlan, *, no_surge: bool
                          ) -> dict[str, str]:
        """Environment (TF_VAR_...) for the Terraform apply that writes a new version.

        It keeps what runtime commands changed (warm capacity) and, on AWS, pins the group to
        its running launch template version so that `rollout_begin` starts the rollout with a
        desired configuration (auto rollback then returns to the pinned version). {} is fine.
        """

    @abstractmethod
    def rollout_begin(self, group: Group, cfg: Config, pool: Pool, plan: PoolPlan, *,
                      no_surge: bool, stack_dir: Path | None) -> RolloutState | None:
        """After that apply: start the rollout of the new version, or return the one the
        apply started (GCP: the MIG update). `group` is the group as found before the apply;
        `stack_dir` holds the synthesized cdk.tf.json. None: nothing to roll."""

    @abstractmethod
    def rollout_state(self, group: Group) -> RolloutState | None:
        """The newest rollout (instance refresh / MIG update), or None."""

    # What `status` (the endpoint), `ls` and `logs` read: poolctl.inventory's records.

    @abstractmethod
    def endpoint(self, cfg: Config, pool: Pool) -> Endpoint | None:
        """The pool's load balancer as clients reach it; None when none carries the pool's
        tags/labels."""

    @abstractmethod
    def list_pools(self, region: str, project: str | None) -> list[PoolRow]:
        """The pools deployed in `region` (GCP: of `project`), by the contract's tags/labels
        alone (`ls` reads no file)."""

    @abstractmethod
    def log_events(self, cfg: Config, pool: Pool, start_ms: int) -> list[LogEvent]:
        """The pool's log lines from `start_ms` (epoch ms) on, oldest first."""


# -- capabilities -------------------------------------------------------------------------


class RequestsQuota(ABC):
    """Files quota increases through an API (`quota request`)."""

    @abstractmethod
    def request_quota(self, line: QuotaLine, desired: float) -> QuotaRequest:
        """File an increase to `desired`, or return the open request already filed."""


class CancelsRollouts(ABC):
    """Stops a rollout where it stands (`rollout cancel`); replaced nodes keep the new
    version."""

    @abstractmethod
    def rollout_cancel(self, group: Group) -> RolloutState: ...


class RollsBackRollouts(ABC):
    """Reverses a rollout in progress (`rollout rollback`): replaced nodes return to the
    previous version."""

    @abstractmethod
    def rollout_rollback(self, group: Group) -> RolloutState: ...


class PublishesQueueMetric(ABC):
    """Reads the queue metric the pool scales on (`status`)."""

    @abstractmethod
    def queue_per_replica(self, group: Group) -> float | None:
        """Latest queue metric (waiting requests per replica), None when not published."""


class ReportsServing(ABC):
    """Reads back what the pool's engines served: latency percentiles, requests, tokens,
    KV-cache usage (`status`)."""

    @abstractmethod
    def serving_window(self, group: Group, window_s: float, ttft_slo_s: float,
                       tpot_slo_s: float | None) -> ServingWindow | None:
        """The last `window_s` seconds; None when the nodes published nothing in them."""


class ForecastsLoad(ABC):
    """The cloud forecasts the pool's load from its history (AWS predictive scaling)."""

    @abstractmethod
    def load_forecast(self, group: Group, policy: str, hours_back: int, hours_ahead: int
                      ) -> LoadForecast | None:
        """The policy's hourly forecast from `hours_back` hours ago to `hours_ahead` ahead,
        beside the load that happened; None when the group has no such policy."""


class ReadsLoadHistory(ABC):
    """The pool's load, hour by hour, from the metrics its nodes publish (`warm --suggest`)."""

    @abstractmethod
    def load_history(self, group: Group, days: int, replicas_per_node: int
                     ) -> dict[datetime, float]:
        """UTC hour start -> the mean requests in flight on the pool's nodes over that hour,
        for the last `days` days (hours without datapoints left out)."""


class ReportsBootPhases(ABC):
    @abstractmethod
    def boot_ledger(self, group: Group, nodes: list[NodeState]) -> dict[str, list[BootRecord]]:
        """Node id -> its boots, oldest first, from its console as its boot script logged
        them (the phase ledger: `poolctl nodes`, `status`)."""


class ReportsBootFailures(ABC):
    """Reads why the pool's last node failed its boot, from the node's own console
    (`status`)."""

    @abstractmethod
    def boot_failure(self, group: Group) -> str | None:
        """"INSTANCE: the FAILED line of its boot log" for the newest node of the group that
        ended with a failed boot; None when none did."""


class KeepsWarmSizes(ABC):
    """Runtime sizes (`warm`) live in the group and a `deploy` must pass them on: the
    TF_VAR_... that keep them (AWS)."""

    @abstractmethod
    def kept_sizes_env(self, group: Group, plan: PoolPlan) -> dict[str, str]: ...


class BoundsGroupMaximum(ABC):
    """A rollout's surge raises the group's maximum, which its end gives back (AWS; GCE's
    update surge sits outside the autoscaler's maximum)."""

    @abstractmethod
    def set_max_nodes(self, group: Group, max_nodes: int) -> None: ...


class StepsRollouts(ABC):
    """poolctl steps the rollout itself (GCP canaries: the cloud cannot pause at a
    checkpoint). Such a rollout holds at its step while nobody watches, a cancelled one holds
    its split (a rollback reverses it), and the versions are poolctl's to keep and delete."""

    @abstractmethod
    def rollout_before_apply(self, tf: Terraform) -> list[ForgottenTemplate]:
        """Before the apply that writes a new version: keep the running one (Terraform
        forgets it rather than deleting it); returns what it forgot."""

    @abstractmethod
    def rollout_advance(self, group: Group, state: RolloutState) -> str | None:
        """Move a rollout on to its next step when due; a line saying so, or None."""

    @abstractmethod
    def rollout_cleanup(self, group: Group) -> TemplatesDeleted:
        """Delete versions that are neither current nor previous."""

    @abstractmethod
    def delete_pool_templates(self, cfg: Config, pool: Pool) -> TemplatesDeleted:
        """After `destroy`: delete the versions kept outside Terraform's state (rollback
        targets)."""


def failures_line(failures: list[LaunchFailure]) -> str:
    """One line naming the failed launches: code, type and zones."""
    by_code: dict[tuple[str, str], list[str]] = {}
    for f in failures:
        zones = by_code.setdefault((f.code, f.instance_type), [])
        if f.zone and f.zone not in zones:
            zones.append(f.zone)
    out = []
    for (code, itype), zones in by_code.items():
        where = ", ".join(sorted(zones)) or "the region"
        what = ("the reservations have no {} left in {}" if code == "ReservationCapacityExceeded"
                else "no {} capacity in {}").format(itype, where)
        out.append(f"{code}: {what}")
    return "; ".join(out)


def capacity_needs(plan: PoolPlan) -> dict[str, int]:
    """Nodes the pool runs at once: at min and max (with its running warm nodes, which hold
    capacity; stopped ones give it back and launch again when started) and at peak (max +
    a rollout's surge); its warm and surge nodes alone."""
    n = plan.nodes
    running_warm = plan.warm_running_nodes
    return {"min": n.min + running_warm, "warm": n.warm, "surge": n.surge,
            "max": n.max + running_warm, "peak": n.max + n.surge + running_warm}


class ChecksCapacity(ABC):
    """Per zone of the placement: the type offered, the reservations that match the pool."""

    @abstractmethod
    def capacity_report(self, cfg: Config, pool: Pool, needs: dict[str, int]
                        ) -> CapacityReport: ...


class ReportsLaunchFailures(ABC):
    """The group's recent launches that failed (for capacity, or another cause)."""

    @abstractmethod
    def launch_failures(self, group: Group, instance_type: str, since_s: float = 3600
                        ) -> list[LaunchFailure]:
        """Failed launches of the last `since_s` seconds, newest first, after the group's
        newest successful launch (one since then means the group grows again).
        `instance_type`: the pool's, for a failure whose record does not name one."""


class SchedulesWindows(ABC):
    """Launch windows the cloud applies itself at their times (`warm --from/--until
    --running`): AWS scheduled actions, GCP autoscaler scaling schedules. These windows raise
    the group's minimum (nodes in service); windows of warm nodes: SchedulesWarmWindows."""

    max_windows: ClassVar[int]
    # Whether an open window shows in the group's own minimum (AWS: its scheduled action set
    # MinSize) or beside it (GCP: a schedule the autoscaler weighs with its minimum).
    raises_group_minimum: ClassVar[bool]

    @abstractmethod
    def scheduled_windows(self, group: Group) -> tuple[list[Window], int | None]:
        """poolctl's windows still to end, and the minimum kept before them (None: no
        window, the group's own)."""

    def scheduled_edges(self, group: Group) -> dict[tuple[str, str], int] | None:
        """The group's minimum each edge sets as the cloud holds it, by (window id, from |
        until); None where every window carries its own size (GCP's schedules), so no two
        writers can leave an edge wrong."""
        return None

    @abstractmethod
    def write_windows(self, group: Group, windows: list[Window], base_min: int,
                      removed: list[Window]) -> None:
        """Make the cloud's schedule exactly `windows` over the kept minimum `base_min`,
        deleting what `removed` left behind; where the group's minimum holds an open
        window's raise (`raises_group_minimum`), it becomes `base_min` plus that raise."""


class SchedulesWarmWindows(ABC):
    """Launch windows of warm nodes (`warm --from/--until` without `--running`): the warm
    pool's size raised at a window's start and returned at its end, by the cloud with nobody
    watching (AWS: EventBridge Scheduler one-time schedules calling PutWarmPool)."""

    max_warm_windows: ClassVar[int]

    @abstractmethod
    def scheduled_warm_windows(self, group: Group) -> tuple[list[Window], int | None]:
        """poolctl's warm windows still to end, and the warm size kept before them (None: no
        window, the group's own)."""

    @abstractmethod
    def write_warm_windows(self, group: Group, windows: list[Window], base_warm: int,
                           removed: list[Window], *, kept_min: int, running: bool) -> None:
        """Make the schedules exactly `windows` over the kept warm size `base_warm` (the
        pool's state `running` or stopped, the group's kept minimum `kept_min`), deleting
        what `removed` left behind; an open window's raise is applied now."""


class BuysCapacityBlocks(ABC):
    """Capacity bought ahead for a window (AWS Capacity Blocks for ML)."""

    @abstractmethod
    def capacity_block_offerings(self, region: str, instance_type: str, count: int,
                                 hours: int, earliest: datetime, latest: datetime
                                 ) -> list[BlockOffering]: ...

    @abstractmethod
    def buy_capacity_block(self, region: str, offering: BlockOffering,
                           tags: dict[str, str]) -> str:
        """Buy it; the Capacity Reservation's id."""


class ReservesCalendarCapacity(ABC):
    """Capacity requested ahead for a window (GCP future reservations in calendar mode):
    the cloud advises when and where it can hold the nodes, and reviews a request; the
    window's nodes then consume the reservation it creates, as any matching VM does."""

    @abstractmethod
    def calendar_offers(self, pool: Pool, nodes: int, start: datetime, end: datetime
                        ) -> list[BlockOffering]:
        """What the cloud advises for `nodes` from `start` to `end`, each covering it
        (`upfront_usd` 0: the cloud bills it while it runs, at prices not in the catalog)."""

    @abstractmethod
    def reserve_calendar(self, pool: Pool, offering: BlockOffering, window_id: str
                         ) -> tuple[str, str]:
        """Submit the request; (its name, the state the cloud gives it)."""


class RunsBlockWindows(ABC):
    """A window's nodes in a bought Capacity Block, run by a group of their own that the
    cloud scales out at the window's start and in before the block ends (AWS's pattern for
    Auto Scaling and Capacity Blocks): nothing to undo afterwards."""

    @abstractmethod
    def block_zones(self, group: Group) -> list[str]:
        """The zones the pool's group has subnets in: a block elsewhere is of no use."""

    @abstractmethod
    def pool_blocks(self, cfg: Config, pool: Pool) -> list[BoughtBlock]:
        """The Capacity Blocks bought for the pool (found by its tags) that have not ended,
        used by a window or not."""

    @abstractmethod
    def open_block_window(self, group: Group, window: Window, block: str, zone: str,
                          tags: dict[str, str]) -> BlockWindow: ...

    @abstractmethod
    def block_windows(self, cfg: Config, pool: Pool) -> list[BlockWindow]: ...

    @abstractmethod
    def close_block_window(self, group: Group, bw: BlockWindow) -> None:
        """Delete the window's group and launch template (the block stays bought)."""


class DeployChecks(ABC):
    """What a deploy asks of the cloud beyond Terraform (AWS): the HTTPS listener's
    certificate, resources an interrupted apply left behind, and the node image a local
    endpoint (the sandbox) stands in with."""

    @abstractmethod
    def certificate_note(self, key: str, arn: str, region: str) -> str | None:
        """The certificate `key` names is the region's and issued (raises otherwise); a
        note when the caller may not look."""

    @abstractmethod
    def adoptable(self, region: str, config: dict[str, Any], state: dict[str, dict[str, Any]],
                  contract: dict[str, str], on_denied: Callable[[str, str], None]
                  ) -> list[Found]:
        """Resources of the synthesized `config` missing from `state` that exist with the
        `contract` tags (a lookup the caller may not make: `on_denied(address, code)`)."""

    @abstractmethod
    def stand_in_image(self, region: str) -> str:
        """The image a local endpoint offers in place of the node image."""


class SendsInstanceKeys(ABC):
    """A login key pushed to one instance for a minute (AWS EC2 Instance Connect)."""

    @abstractmethod
    def send_instance_key(self, region: str, instance_id: str, user: str,
                          public_key: str) -> None:
        """UsageError without credentials; OperationFailed when the cloud refuses."""


class ImportsLoginKeys(ABC):
    """Login keys in the caller's profile (GCP OS Login)."""

    @abstractmethod
    def caller_account(self) -> str: ...

    @abstractmethod
    def import_ssh_key(self, account: str, public_key: str, project: str,
                       ttl_s: float) -> tuple[str, str]: ...

    @abstractmethod
    def delete_ssh_key(self, account: str, fingerprint: str) -> None: ...


class KeepsNodeImages(ABC):
    """The node images `poolctl image build` made for the pool (`image list`, `prune`)."""

    @abstractmethod
    def node_images(self, cfg: Config, pool: Pool) -> list[ImageRow]: ...

    @abstractmethod
    def delete_node_image(self, pool: Pool, row: ImageRow) -> None:
        """The image and what only it holds (AWS: its snapshots)."""


class PreparesImageBuilds(ABC):
    """What an image build needs from the cloud before Packer runs (AWS): the base image a
    parameter names, and a subnet for the builder."""

    @abstractmethod
    def image_build_base(self, pool: Pool, key: str) -> str:
        """The base image `aws.ami_ssm_parameter` names now (`key` for the line)."""

    @abstractmethod
    def check_image_builder(self, pool: Pool, key: str, tags: dict[str, str]) -> None:
        """The subnet the builder launches in exists (raises before Packer would run)."""


# Every capability above, in the order `poolctl.clouds.registry` lists a cloud's.
CAPABILITIES: tuple[type[ABC], ...] = (
    RequestsQuota, CancelsRollouts, RollsBackRollouts, PublishesQueueMetric,
    ReportsBootFailures, ReportsBootPhases, ReportsServing, ForecastsLoad, ReadsLoadHistory,
    KeepsWarmSizes,
    BoundsGroupMaximum, StepsRollouts, ChecksCapacity, ReportsLaunchFailures, SchedulesWindows,
    SchedulesWarmWindows, BuysCapacityBlocks, RunsBlockWindows, ReservesCalendarCapacity,
    DeployChecks, SendsInstanceKeys, ImportsLoginKeys, KeepsNodeImages, PreparesImageBuilds)
