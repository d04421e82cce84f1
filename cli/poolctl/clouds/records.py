"""Records of what a cloud sold or holds for a pool, shared by the clouds' code and the
cloud-neutral runtime: Capacity Block offers and bought blocks, the purchase ledger's
steps, windows on blocks, node images, resources an interrupted apply left behind.
`poolctl.clouds.base` names them with the capabilities that return them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

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
