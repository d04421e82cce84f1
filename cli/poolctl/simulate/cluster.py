"""A pool replayed: replicas behind a balancer (least outstanding requests, session affinity,
or a central queue), under a fixed count or the pool's own autoscaling and launch windows
(`simulate`).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from poolctl.servingmodel import ReplicaModel, Topology
from poolctl.simulate.engine import (
    INF,
    METRIC_PERIOD_S,
    DisaggEngine,
    Engine,
    PrefixCache,
    Replica,
    Requests,
)
from poolctl.sizing import billed_nodes
from poolctl.traces import Blocks, Trace


@dataclass(frozen=True)
class SimWindow:
    """A launch window in the replay (`simulate --warm-window`): `nodes` more from `start_s`
    to `end_s` (seconds from the trace's start). Running: the group's minimum raised (what
    `warm --from --running` schedules); at the end the minimum returns and the desired size
    with it (the nodes above it drain). Stopped: the warm pool raised by them at the start
    (prepared from cold, then stopped), trimmed back at the end; no cloud schedules that, so
    it stands for a `warm --replicas N` run by hand at the start."""

    start_s: float
    end_s: float
    nodes: int
    running: bool = True

    def open_at(self, t: float) -> bool:
        return self.start_s <= t < self.end_s


@dataclass
class Autoscale:
    """The pool's node group: bounds, queue target, warm pool and start times (seconds)."""

    replicas_per_node: int
    min_nodes: int
    max_nodes: int
    warm_nodes: int
    warm_start_s: float
    cold_start_s: float
    queue_target: float
    scale_down_stabilization_s: float
    scale_in_cooldown_s: float
    warm_running: bool
    windows: tuple[SimWindow, ...] = ()


@dataclass
class SimResult:
    req: Requests
    horizon_s: float
    in_system_integral: float
    busy_s: float
    occupied_s: float
    replica_s: float
    node_s: float
    fixed_node_s: float  # reservations and nodes that always run, over the horizon
    price_per_node_hour: float
    max_kv_tokens: int
    max_running: int
    preemptions: int
    timeline: list[tuple[float, int, int]]  # (t, serving nodes, starting nodes)
    cold_window: list[tuple[float, float]] = field(default_factory=list)
    replicas_fixed: int | None = None
    replicas_per_node: int = 1
    aborted: bool = False
    reserved_nodes: int = 0
    power_kw_per_node: float | None = None  # the catalog's max system power, for energy
    max_model_len: int | None = None
    prefix_cache: PrefixStats | None = None  # None: no cache simulated (off, or no block ids)
    topology: Topology | None = None
    kv_transfer_s_mean: float = 0.0  # disaggregated: from prefill done to KV on the decode side


@dataclass(frozen=True)
class PrefixStats:
    """The prefix cache over all replicas of a run."""

    block_tokens: int
    prompt_tokens: int  # prompt tokens admitted, recomputes after preemption included
    hit_tokens: int  # of them served from the cache (not prefilled)
    evicted_blocks: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


BALANCERS = ("lor", "queue", "sticky")


def simulate(trace: Trace, m: ReplicaModel, *, replicas: int | None = None,
             scale: Autoscale | None = None, price_per_node_hour: float = 0.0,
             replicas_per_node: int = 1, balancer: str = "lor",
             stop_if_p90_over: float | None = None,
             power_kw_per_node: float | None = None,
             prefix_caching: bool = True, topology: Topology | None = None,
             run_until_s: float = 0.0, reserved_nodes: int = 0) -> SimResult:
    """Replay `trace` through a fixed count of replicas, or through the autoscaled pool.

    balancer "lor": least outstanding requests at arrival, as the clouds' load balancers
    route (requests then queue inside the replica). "queue": a central queue dispatching to
    a replica with a free sequence slot (a gateway with flow control); with max_num_seqs 1
    this is the M/M/c system of queueing theory. "sticky": session affinity as a load
    balancer's cookie gives it (`session_key`): a session's first request goes to the node
    of the least-outstanding replica, later ones to the same node while it serves; inside
    the node vLLM's data-parallel balancer picks the least-loaded replica, knowing nothing of
    prefixes. A request without a session goes as "lor".

    prefix_caching: each replica keeps vLLM's automatic prefix cache (`PrefixCache`) over
    the trace's block ids; a trace without ids has no reuse to find.

    topology: each replica is a `DisaggEngine` (prefill and decode instances, the prefix cache
    on the prefill side); None: an `Engine` prefilling and decoding on the same GPUs.

    run_until_s: the autoscaled pool keeps running (and scaling in) until then at least, so
    that two replays are billed over the same span (a launch hour)."""
    if balancer not in BALANCERS:
        raise ValueError(f"balancer must be one of {BALANCERS}")
    central: deque[int] = deque()
    n_req = len(trace)
    nan = math.nan
    req = Requests(
        arrival=trace.arrivals, inputs=[max(1, x) for x in trace.inputs],
        outputs=[max(1, x) for x in trace.outputs], replica=[None] * n_req,
        admitted=[nan] * n_req, first=[nan] * n_req, finish=[nan] * n_req,
        refused=[False] * n_req, blocks=trace.blocks, cached=[0] * n_req,
    )
    use_cache = prefix_caching and trace.blocks is not None

    def new_engine() -> Replica:
        cache = PrefixCache(trace.block_tokens) if use_cache else None
        if topology is not None:
            return DisaggEngine(len(engines), topology, req, cache)
        return Engine(len(engines), m, req, cache)

    sessions: dict[int, int] = {}  # session key -> node
    aborted = False
    miss_limit = n_req + 1
    if stop_if_p90_over is not None:
        # More than 10 % of all requests late: the p90 of the completed ones is late too.
        req.slo_s, miss_limit = stop_if_p90_over, math.ceil(0.1 * n_req) + 1
    engines: list[Replica] = []
    serving: list[Replica] = []
    heap: list[tuple[float, int, int, int]] = []  # (time, kind, id, version)
    EV_ENGINE, EV_TICK, EV_READY, EV_WARM, EV_WINDOW = 0, 1, 2, 3, 4
    state = {"in": 0, "integral": 0.0, "last": 0.0}

    def on_finish(rid: int, now: float) -> None:
        state["integral"] += state["in"] * (now - state["last"])
        state["last"] = now
        state["in"] -= 1
        replica = req.replica[rid]
        assert replica is not None  # a request that finishes was dispatched to a replica
        freed.append(engines[replica])

    def dispatch(e: Replica, rid: int, now: float) -> None:
        req.replica[rid] = e.idx
        if e.submit(rid, now):
            heapq.heappush(heap, (e.end, EV_ENGINE, e.idx, e.version))

    def drain_central(now: float) -> None:
        for e in serving:
            while central and e.outstanding < m.max_num_seqs:
                dispatch(e, central.popleft(), now)
            if not central:
                return

    freed: list[Replica] = []

    def add_node() -> None:
        for _ in range(rpn):
            e = new_engine()
            engines.append(e)
            serving.append(e)
            nodes_of[e.idx] = node_id[0]
        node_id[0] += 1

    rpn = scale.replicas_per_node if scale else replicas_per_node
    nodes_of: dict[int, int] = {}
    node_id = [0]
    if scale is None:
        if not replicas or replicas < 1:
            raise ValueError("replicas must be >= 1")
        for k in range(replicas):
            e = new_engine()
            engines.append(e)
            serving.append(e)
            nodes_of[e.idx] = k // rpn
        fixed_nodes = math.ceil(replicas / rpn)
    else:
        for _ in range(scale.min_nodes):
            add_node()
        heapq.heappush(heap, (METRIC_PERIOD_S, EV_TICK, 0, 0))
        fixed_nodes = scale.min_nodes + (scale.warm_nodes if scale.warm_running else 0)
        for k, w in enumerate(scale.windows):
            if w.start_s > 0:
                heapq.heappush(heap, (w.start_s, EV_WINDOW, k, 0))
            heapq.heappush(heap, (w.end_s, EV_WINDOW, k, 1))
    fixed_nodes = billed_nodes(fixed_nodes, reserved_nodes)

    # Autoscaling state
    starting: list[float] = []  # ready times of nodes being started
    warm_free = scale.warm_nodes if scale else 0
    low_since: float | None = None
    last_scale_in = -INF
    node_s = 0.0
    last_t = 0.0
    timeline: list[tuple[float, int, int]] = []
    cold_window: list[tuple[float, float]] = []
    draining: list[Replica] = []

    def serving_nodes() -> int:
        return len(serving) // rpn

    def raised(now: float, running: bool) -> int:
        """Nodes the open windows of that kind add (overlaps: the larger, not the sum)."""
        assert scale is not None
        return max((w.nodes for w in scale.windows if w.running == running and w.open_at(now)),
                   default=0)

    def floor_nodes(now: float) -> int:
        assert scale is not None
        return scale.min_nodes + raised(now, True)

    def start_nodes(count: int, now: float) -> None:
        """Scale out by `count`: warm nodes first (the pool refills from cold), then cold."""
        nonlocal warm_free
        assert scale is not None
        for _ in range(count):
            if warm_free:
                warm_free -= 1
                ready = now + scale.warm_start_s
                heapq.heappush(heap, (now + scale.cold_start_s, EV_WARM, 0, 0))
            else:
                ready = now + scale.cold_start_s
            starting.append(ready)
            heapq.heappush(heap, (ready, EV_READY, 0, 0))
        cold_window.append((now, max(starting)))
        record(now)

    def begun_before(scale: Autoscale) -> None:
        """Windows that start at or before the trace's start: nodes launched at FROM serve
        FROM + their start time later (warm pool first), from 0 at the earliest; a stopped
        window's nodes are prepared from cold by FROM + the cold start."""
        nonlocal warm_free
        early = [w for w in scale.windows if w.start_s <= 0]
        at = min((w.start_s for w in early if w.running), default=0.0)
        for _ in range(max((w.nodes for w in early if w.running), default=0)):
            warm = warm_free > 0
            warm_free -= warm
            ready = at + (scale.warm_start_s if warm else scale.cold_start_s)
            if warm:
                heapq.heappush(heap, (max(0.0, at + scale.cold_start_s), EV_WARM, 0, 0))
            if ready <= 0:
                add_node()
            else:
                starting.append(ready)
                heapq.heappush(heap, (ready, EV_READY, 0, 0))
        for w in early:
            if not w.running:
                for _ in range(w.nodes):
                    heapq.heappush(heap, (max(0.0, w.start_s + scale.cold_start_s), EV_WARM,
                                          0, 0))

    def drain_to(nodes: int, now: float) -> None:
        """The newest nodes leave the balancer and drain their requests, down to `nodes`."""
        while serving_nodes() > nodes:
            leaving = serving[-rpn:]
            del serving[-rpn:]
            for e in leaving:
                e.draining = True
                if e.outstanding:
                    draining.append(e)
        record(now)

    def bill(now: float) -> None:
        nonlocal node_s, last_t
        if scale is not None:
            live = serving_nodes() + len(starting) + len({nodes_of[e.idx] for e in draining})
            warm_billed = warm_free if scale.warm_running else 0
            node_s += billed_nodes(live + warm_billed, reserved_nodes) * (now - last_t)
        last_t = now

    def record(now: float) -> None:
        if scale is not None:
            timeline.append((now, serving_nodes(), len(starting)))

    if scale is not None:
        begun_before(scale)
    record(0.0)
    i = 0
    rr = 0
    while True:
        t_arr = trace.arrivals[i] if i < n_req else INF
        t_ev = heap[0][0] if heap else INF
        if t_arr == INF and t_ev == INF:
            break
        if t_arr <= t_ev:
            now = t_arr
            rid = i
            i += 1
            if req.inputs[rid] + req.outputs[rid] > m.max_model_len:
                req.refused[rid] = True
                continue
            state["integral"] += state["in"] * (now - state["last"])
            state["last"] = now
            state["in"] += 1
            if balancer == "queue":
                central.append(rid)
                drain_central(now)
                continue
            if not serving:
                raise ValueError("no replica in service")
            key = session_key(req.blocks, rid) if balancer == "sticky" else None
            node = sessions.get(key) if key is not None else None
            pick = serving
            if node is not None:
                pick = [e for e in serving if nodes_of[e.idx] == node] or serving
            best = least_outstanding(pick, rr)
            rr += 1
            if key is not None:
                sessions[key] = nodes_of[best.idx]
            dispatch(best, rid, now)
            continue
        now, kind, ident, version = heapq.heappop(heap)
        if kind == EV_ENGINE:
            e = engines[ident]
            if version != e.version:
                continue
            e.handle(now, on_finish)
            if req.misses > miss_limit:
                aborted = True
                break
            if e.end != INF:
                heapq.heappush(heap, (e.end, EV_ENGINE, e.idx, e.version))
            if freed:
                freed.clear()
                if central:
                    drain_central(now)
            if e.end == INF and e.draining and not e.outstanding:
                bill(now)
                draining.remove(e)
            continue
        if kind == EV_READY:
            bill(now)
            starting.remove(now)
            add_node()
            if central:
                drain_central(now)
            record(now)
            continue
        if kind == EV_WARM:
            bill(now)
            assert scale is not None
            if warm_free < scale.warm_nodes + raised(now, False):  # else a window has ended
                warm_free += 1
            continue
        if kind == EV_WINDOW:
            bill(now)
            assert scale is not None
            w = scale.windows[ident]
            if w.running and version == 0:  # the minimum rises: nodes launch now
                short = floor_nodes(now) - serving_nodes() - len(starting)
                if short > 0:
                    start_nodes(short, now)
            elif w.running:  # the minimum and the desired size return (the queue policy
                drain_to(floor_nodes(now), now)  # grows the pool again if traffic needs it)
            elif version == 0:  # the warm pool rises: nodes prepared from cold
                for _ in range(w.nodes):
                    heapq.heappush(heap, (now + scale.cold_start_s, EV_WARM, 0, 0))
            else:  # the warm pool returns to its size
                warm_free = min(warm_free, scale.warm_nodes + raised(now, False))
            continue
        # EV_TICK: the metric sample and the policy.
        assert scale is not None
        bill(now)
        n_srv = max(1, len(serving))
        metric = (sum(len(e.waiting) for e in serving) + len(central)) / n_srv
        cur = serving_nodes() + len(starting)
        want = min(scale.max_nodes, math.ceil(serving_nodes() * metric / scale.queue_target))
        if want > cur:
            start_nodes(want - cur, now)
        if metric < scale.queue_target / 2:
            low_since = now if low_since is None else low_since
            if (now - low_since >= scale.scale_down_stabilization_s
                    and now - last_scale_in >= scale.scale_in_cooldown_s
                    and serving_nodes() > floor_nodes(now) and not starting):
                drain_to(serving_nodes() - 1, now)  # one node at a time
                last_scale_in = now
        else:
            low_since = None
        if i < n_req or any(e.outstanding for e in engines) or now < run_until_s:
            heapq.heappush(heap, (now + METRIC_PERIOD_S, EV_TICK, 0, 0))
    horizon = max(last_t, max((f for f in req.finish if f == f), default=0.0),
                  trace.arrivals[-1] if n_req else 0.0)
    bill(horizon)
    if scale is None:
        node_s = fixed_nodes * horizon
    record(horizon)
    if scale is not None:  # a running window's nodes are paid whatever the traffic
        fixed_window_s = sum(w.nodes * max(0.0, min(w.end_s, horizon) - max(0.0, w.start_s))
                             for w in scale.windows if w.running)
    else:
        fixed_window_s = 0.0
    return SimResult(
        req=req, horizon_s=horizon, in_system_integral=state["integral"],
        busy_s=sum(e.busy_s for e in engines),
        occupied_s=sum(e.occupied_s for e in engines),
        replica_s=replica_seconds(timeline, rpn, horizon) if scale else len(engines) * horizon,
        node_s=node_s, fixed_node_s=fixed_nodes * horizon + fixed_window_s,
        price_per_node_hour=price_per_node_hour,
        max_kv_tokens=max(e.max_kv for e in engines),
        max_running=max(e.max_running for e in engines),
        preemptions=sum(e.preemptions for e in engines),
        timeline=timeline, cold_window=cold_window,
        replicas_fixed=replicas, replicas_per_node=rpn, aborted=aborted,
        reserved_nodes=reserved_nodes,
        power_kw_per_node=power_kw_per_node, max_model_len=m.max_model_len,
        prefix_cache=PrefixStats(
            block_tokens=trace.block_tokens,
            prompt_tokens=sum(e.prompt_tokens for e in engines),
            hit_tokens=sum(e.hit_tokens for e in engines),
            evicted_blocks=sum(e.cache.evicted for e in engines if e.cache is not None),
        ) if use_cache else None,
        topology=topology,
        kv_transfer_s_mean=_transfer_mean(engines),
    )


def _transfer_mean(engines: list[Replica]) -> float:
    ds = [e for e in engines if isinstance(e, DisaggEngine)]
    n = sum(e.transfers for e in ds)
    return sum(e.transfer_s for e in ds) / n if n else 0.0


def session_key(blocks: list[Blocks] | None, rid: int) -> int | None:
    """The session a request belongs to, for sticky routing: its prompt's first block id. A
    conversation's turns share their first block (the system prompt and the first message),
    as a client's cookie would tie them; requests that share only a short common first block
    are tied too, which is what a cookie does not do (an upper bound on affinity's reach)."""
    if blocks is None or not blocks[rid]:
        return None
    return blocks[rid][0]


def least_outstanding(engines: list[Replica], rr: int) -> Replica:
    """The replica with the fewest requests waiting or running; ties go round-robin from
    `rr` (as a balancer spreads them)."""
    n = len(engines)
    best, best_o = engines[rr % n], INF
    for k in range(n):
        e = engines[(rr + k) % n]
        o = e.outstanding
        if o < best_o:
            best, best_o = e, o
            if o == 0:
                break
    return best


def replica_seconds(timeline: list[tuple[float, int, int]], rpn: int, horizon: float) -> float:
    total = 0.0
    for (t, n, _), (t2, _, _) in zip(timeline, timeline[1:] + [(horizon, 0, 0)], strict=True):
        total += n * rpn * (t2 - t)
    return total
