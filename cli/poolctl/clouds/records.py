"""Records of what a cloud sold or holds for a pool, shared by the clouds' code and the
cloud-neutral runtime: Capacity Block offers and bought blocks, the purchase ledger's
steps, windows on blocks, node images, resources an interrupted apply left behind, the
reservations a placement's zones hold, a predictive policy's forecast.
`poolctl.clouds.base` names them with the capabilities that return them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from poolctl.cloud import Cloud
from poolctl.contract.aws import CAPACITY_BLOCK
from poolctl.windows import Window


@dataclass(frozen=True)
class BlockOffering:
    """A Capacity Block the cloud offers: `count` nodes in `zone` from `start` to `end`."""

    id: str
    instance_type: str
    zone: str
    count: int
    start: datetime
    end: datetime
    hours: int
    upfront_usd: float
    minutes: int = 0  # beyond `hours`: a block that starts between two 11:30s (EC2's field)

    @property
    def duration(self) -> str:
        return f"{self.hours} h" + (f" {self.minutes} min" if self.minutes else "")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "start": self.start.isoformat(timespec="seconds"),
                "end": self.end.isoformat(timespec="seconds")}


@dataclass(frozen=True)
class BlockWindow:
    """A window on a bought Capacity Block: its own group in the block's zone, at the
    window's size from its start to its end, then empty; the pool's group is untouched."""

    window: Window
    block: str  # the Capacity Reservation id
    group: str  # the window's own group
    zone: str
    in_service: int  # its nodes in service now
    block_state: str = ""  # scheduled | active | expired ... as the cloud says it

    def to_json(self) -> dict[str, Any]:
        w = self.window
        return {"id": w.id, "nodes": w.nodes, "end": w.end.isoformat(timespec="seconds"),
                "start": None if w.start is None else w.start.isoformat(timespec="seconds"),
                "capacity_block": self.block, "group": self.group, "zone": self.zone,
                "in_service": self.in_service, "block_state": self.block_state}


@dataclass(frozen=True)
class BoughtBlock:
    """A Capacity Block bought for the pool, as the cloud lists it with the tags poolctl
    gave it at purchase: the window it was bought for, when and by whom."""

    id: str
    instance_type: str
    zone: str
    count: int
    start: datetime
    end: datetime
    state: str  # payment-pending | scheduled | active | expired ...
    window: str | None = None  # the window's id (tag poolctl:window)
    span: str | None = None  # the window it was bought for: FROM/UNTIL/NODES (its tag)
    bought_by: str | None = None
    bought_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "start": self.start.isoformat(timespec="minutes"),
                "end": self.end.isoformat(timespec="minutes")}

    def offering(self) -> BlockOffering:
        """The block as an offer of what is already paid for (upfront 0)."""
        return BlockOffering(id=self.id, instance_type=self.instance_type, zone=self.zone,
                             count=self.count, start=self.start, end=self.end,
                             hours=round((self.end - self.start).total_seconds() / 3600),
                             upfront_usd=0.0)


@dataclass(frozen=True)
class Purchase:
    """One step of one purchase of capacity (runtime/purchases.py keeps the ledger of
    them), as a ledger line."""

    at: str  # ISO 8601, UTC
    by: str  # user@host
    state: str  # buying | bought | failed
    project: str
    pool: str
    cloud: str
    region: str
    kind: str  # capacity-block | future-reservation
    window: str  # the window it was bought for
    offering: str  # the cloud's offering (or advice) id
    nodes: int
    start: str  # the capacity's, ISO
    end: str
    upfront_usd: float
    reservation: str | None = None  # the cloud's id, once bought
    error: str | None = None  # failed: the cloud's answer

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Found:
    """A resource an interrupted apply created but did not record, found in the cloud by the
    tags poolctl gave it: imported (`address`, `id`) instead of created again."""

    address: str
    id: str
    what: str


@dataclass
class ImageRow:
    """A node image built for the pool, and what uses it (the file, templates, instances)."""

    id: str
    name: str
    created: str
    serving_image: str | None
    in_use: list[str]
    snapshots: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ServingWindow:
    """What a pool's engines served over the last `window_s` seconds (`status`), read back
    from the histograms and counters its nodes publish (docs/metrics.md). Latencies are
    percentiles over the window's requests; None where no request finished."""

    window_s: float
    requests: float  # finished
    prompt_tokens: float
    output_tokens: float
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p90_s: float | None = None
    ttft_mean_s: float | None = None  # exact: the histograms' sums over their counts
    tpot_mean_s: float | None = None
    ttft_slo_s: float | None = None  # the pool's SLOs, which the shares below are within
    tpot_slo_s: float | None = None
    ttft_within: float | None = None  # share of requests within the TTFT SLO (0-1)
    tpot_within: float | None = None  # ... within the TPOT SLO (None: the pool sets none)
    kv_usage: float | None = None  # KV-cache usage, mean over the window (0-1)
    running: float | None = None  # requests running, mean over the window
    queue_per_replica: float | None = None  # requests waiting per replica, mean

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.window_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.window_s

    def usd_per_million_output_tokens(self, usd_per_hour: float) -> float | None:
        """What a million output tokens cost at the observed rate and `usd_per_hour`."""
        if self.output_tokens <= 0:
            return None
        return usd_per_hour * self.window_s / 3600 / self.output_tokens * 1e6

    def to_json(self, usd_per_hour: float) -> dict[str, Any]:
        return {**asdict(self), "requests_per_s": self.requests_per_s,
                "output_tokens_per_s": self.output_tokens_per_s,
                "usd_per_million_output_tokens": self.usd_per_million_output_tokens(
                    usd_per_hour)}


@dataclass(frozen=True)
class ServingPrediction:
    """What the serving model predicts for a ServingWindow's load on the pool as it is now
    (`status`): its arrival rate and mean prompt and output lengths, Poisson arrivals,
    exponential lengths, on the replicas in service; p90s as vLLM's histograms read them
    back (poolctl.histograms), as the measured ones are."""

    replicas: int
    ttft_p90_s: float | None
    tpot_p90_s: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ReservationRow:
    """One capacity reservation as the cloud describes it."""

    id: str
    instance_type: str
    zone: str
    total: int
    available: int
    state: str  # active | expired | cancelled | scheduled | ...
    match_criteria: str  # open | targeted
    end: str | None  # ISO time it ends; None: unlimited
    kind: str = "default"  # default | capacity-block
    pool_in_use: int = 0  # the pool's own nodes running in it
    start: str | None = None  # ISO time it starts (a Capacity Block's, or a future one's)

    @property
    def in_use(self) -> int:
        """Instances running in it. Only an active reservation holds any: EC2 reports a
        scheduled (or expired, cancelled) one with AvailableInstanceCount 0, which is no
        instance in use."""
        return self.total - self.available if self.state == "active" else 0


@dataclass
class ZoneCapacity:
    zone: str
    offered: bool  # the zone offers the instance type
    reservations: list[ReservationRow] = field(default_factory=list)

    @property
    def held(self) -> int:
        """Nodes the pool can count on here: free slots and the slots it already fills."""
        return sum(r.available + r.pool_in_use for r in self.reservations
                   if r.state == "active")


@dataclass
class CapacityReport:
    """What the placement's zones offer the pool, and its peak beyond its reservations."""

    pool: str
    cloud: Cloud
    region: str
    instance_type: str
    preference: str
    needs: dict[str, int]  # nodes at min, warm, surge, max, peak (max + surge + running warm)
    zones: list[ZoneCapacity]

    @property
    def held(self) -> int:
        return sum(z.held for z in self.zones if z.offered)

    @property
    def beyond(self) -> dict[str, int]:
        """Per level of need, the nodes no reservation covers (On-Demand, or a failed
        launch under reservations-only)."""
        return {k: max(0, v - self.held) for k, v in self.needs.items()
                if k in ("min", "max", "peak")}

    @property
    def only_reserved(self) -> bool:
        """Whether a launch beyond the reservations fails (reservations-only, or a pool on a
        Capacity Block, whose every launch targets the block)."""
        return self.preference in ("reservations-only", CAPACITY_BLOCK)

    @property
    def ok(self) -> bool:
        return not self.only_reserved or self.beyond["peak"] == 0

    def to_json(self) -> dict[str, Any]:
        return {"pool": self.pool, "cloud": self.cloud, "region": self.region,
                "instance_type": self.instance_type, "preference": self.preference,
                "needs": self.needs, "held": self.held, "beyond": self.beyond, "ok": self.ok,
                "zones": [{"zone": z.zone, "offered": z.offered, "held": z.held,
                           "reservations": [{**asdict(r), "in_use": r.in_use}
                                            for r in z.reservations]} for z in self.zones]}


@dataclass(frozen=True)
class ForecastHour:
    """One UTC hour of a predictive policy's forecast, beside what happened in it."""

    start: datetime
    load: float | None  # forecast load, in the load metric's units (hourly Sum)
    capacity: float | None  # forecast nodes
    actual_load: float | None  # the load metric as it was (None: ahead, or no datapoint)

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start.isoformat(), "load": self.load, "capacity": self.capacity,
                "actual_load": self.actual_load}


@dataclass(frozen=True)
class LoadForecast:
    """A predictive scaling policy's forecast (AWS GetPredictiveScalingForecast) and the load
    metric's hourly values over the same hours (GetMetricData)."""

    policy: str
    mode: str  # ForecastOnly | ForecastAndScale
    hours: list[ForecastHour]
    updated: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "mode": self.mode,
                "updated": self.updated.isoformat() if self.updated else None,
                "hours": [h.to_json() for h in self.hours]}


@dataclass(frozen=True)
class ForgottenTemplate:
    """An instance template a rollout's apply replaces, removed from Terraform's state so
    that it stays (the rollback target) instead of being deleted."""

    address: str  # in Terraform's state
    name: str  # "" when the plan did not say


@dataclass
class TemplatesDeleted:
    """Instance templates a cleanup deleted, and one line per refused delete."""

    deleted: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, list[str]]:
        return {"deleted": list(self.deleted), "failed": list(self.failed)}
