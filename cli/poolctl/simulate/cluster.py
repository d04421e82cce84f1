"""A pool replayed: replicas behind a balancer (least outstanding requests, session affinity,
or a central queue), under a fixed count or the pool's own autoscaling and launch windows
(`simulate`).
"""

from __future__ import annotations

import heapq
import math
import random
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
    # False: at the end only the minimum returns, the nodes stay until the queue policy
    # scales in (predictive scaling raises the minimum capacity, and only that).
    drains: bool = True

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
             run_until_s: float = 0.0, reserved_nodes: int = 0,
             clients: int | None = None, send_jitter_s: float = 0.0,
             seed: int = 0) -> SimResult:
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
    that two replays are billed over the same span (a launch hour).

    clients: a closed loop of that many clients (as `vllm bench serve --max-concurrency`):
    with balancer "queue" a request is sent when fewer than `clients` are outstanding, and
    then waits inside the engine (for a sequence slot, KV room or the step's token budget)
    like any other; `Requests.sent` keeps when it was sent.

    send_jitter_s: a sent request reaches its replica after a delay drawn uniformly from 0
    to twice this (`seed` seeds it): the client, HTTP and the server's front end
    (tokenization) take their own time, which differs from request to request. Without it
    a closed loop of equal requests stays phase-locked: clients that finish in one step
    send in the same instant and are prefilled in one step again, for ever; real ones
    drift apart because the first to arrive at a replica starts a step alone."""
    if balancer not in BALANCERS:
        raise ValueError(f"balancer must be one of {BALANCERS}")
    return _Replay(trace, m, replicas=replicas, scale=scale,
                   price_per_node_hour=price_per_node_hour,
                   replicas_per_node=replicas_per_node, balancer=balancer,
                   stop_if_p90_over=stop_if_p90_over, power_kw_per_node=power_kw_per_node,
                   prefix_caching=prefix_caching, topology=topology, run_until_s=run_until_s,
                   reserved_nodes=reserved_nodes, clients=clients,
                   send_jitter_s=send_jitter_s, seed=seed).run()


# The events of a replay, in the heap as (time, kind, id, version).
EV_ENGINE, EV_TICK, EV_READY, EV_WARM, EV_WINDOW, EV_SUBMIT = 0, 1, 2, 3, 4, 5


class _Replay:
    """One replay (`simulate`): the replicas, the balancer, the event heap and the
    autoscaler's state; each event kind a method of its own."""

    def __init__(self, trace: Trace, m: ReplicaModel, *, replicas: int | None,
                 scale: Autoscale | None, price_per_node_hour: float, replicas_per_node: int,
                 balancer: str, stop_if_p90_over: float | None,
                 power_kw_per_node: float | None, prefix_caching: bool,
                 topology: Topology | None, run_until_s: float, reserved_nodes: int,
                 clients: int | None = None, send_jitter_s: float = 0.0,
                 seed: int = 0) -> None:
        self.trace, self.m, self.replicas, self.scale = trace, m, replicas, scale
        self.price_per_node_hour, self.balancer = price_per_node_hour, balancer
        self.power_kw_per_node, self.topology = power_kw_per_node, topology
        self.run_until_s, self.reserved_nodes = run_until_s, reserved_nodes
        self.central: deque[int] = deque()
        # What the central queue lets a replica hold: its sequence slots, or the clients of
        # a closed loop (the engine then queues what its slots cannot take).
        self.cap = clients if clients is not None else m.max_num_seqs
        self.jitter = send_jitter_s
        self.rng = random.Random(seed)
        self.in_flight: dict[int, int] = {}  # replica -> requests sent, not yet arrived
        self.n_req = n_req = len(trace)
        nan = math.nan
        self.req = req = Requests(
            arrival=trace.arrivals, inputs=[max(1, x) for x in trace.inputs],
            outputs=[max(1, x) for x in trace.outputs], replica=[None] * n_req,
            admitted=[nan] * n_req, first=[nan] * n_req, finish=[nan] * n_req,
            refused=[False] * n_req, blocks=trace.blocks, cached=[0] * n_req,
            sent=[nan] * n_req,
        )
        self.use_cache = prefix_caching and trace.blocks is not None
        self.sessions: dict[int, int] = {}  # session key -> node
        self.aborted = False
        self.miss_limit = n_req + 1
        if stop_if_p90_over is not None:
            # More than 10 % of all requests late: the p90 of the completed ones is late too.
            req.slo_s, self.miss_limit = stop_if_p90_over, math.ceil(0.1 * n_req) + 1
        self.engines: list[Replica] = []
        self.serving: list[Replica] = []
        self.heap: list[tuple[float, int, int, int]] = []  # (time, kind, id, version)
        # requests in the system, and its integral over time (Little's law)
        self.in_system, self.in_integral, self.in_last = 0, 0.0, 0.0
        self.freed: list[Replica] = []
        self.rpn = scale.replicas_per_node if scale else replicas_per_node
        self.nodes_of: dict[int, int] = {}
        self.node_id = 0
        # Autoscaling state
        self.starting: list[float] = []  # ready times of nodes being started
        self.warm_free = scale.warm_nodes if scale else 0
        self.low_since: float | None = None
        self.last_scale_in = -INF
        self.node_s = 0.0
        self.last_t = 0.0
        self.timeline: list[tuple[float, int, int]] = []
        self.cold_window: list[tuple[float, float]] = []
        self.draining: list[Replica] = []
        self.i = 0  # the next arrival
        self.rr = 0  # the balancer's round-robin among equals
        if scale is None:
            if not replicas or replicas < 1:
                raise ValueError("replicas must be >= 1")
            for k in range(replicas):
                e = self.new_engine()
                self.engines.append(e)
                self.serving.append(e)
                self.nodes_of[e.idx] = k // self.rpn
            fixed_nodes = math.ceil(replicas / self.rpn)
        else:
            for _ in range(scale.min_nodes):
                self.add_node()
            heapq.heappush(self.heap, (METRIC_PERIOD_S, EV_TICK, 0, 0))
            fixed_nodes = scale.min_nodes + (scale.warm_nodes if scale.warm_running else 0)
            for k, w in enumerate(scale.windows):
                if w.start_s > 0:
                    heapq.heappush(self.heap, (w.start_s, EV_WINDOW, k, 0))
                heapq.heappush(self.heap, (w.end_s, EV_WINDOW, k, 1))
        self.fixed_nodes = billed_nodes(fixed_nodes, reserved_nodes)
        if scale is not None:
            self.begun_before(scale)
        self.record(0.0)

    # -- replicas and the balancer -----------------------------------------------------

    def new_engine(self) -> Replica:
        cache = PrefixCache(self.trace.block_tokens) if self.use_cache else None
        if self.topology is not None:
            return DisaggEngine(len(self.engines), self.topology, self.req, cache)
        return Engine(len(self.engines), self.m, self.req, cache)

    def add_node(self) -> None:
        for _ in range(self.rpn):
            e = self.new_engine()
            self.engines.append(e)
            self.serving.append(e)
            self.nodes_of[e.idx] = self.node_id
        self.node_id += 1

    def on_finish(self, rid: int, now: float) -> None:
        self.in_integral += self.in_system * (now - self.in_last)
        self.in_last = now
        self.in_system -= 1
        replica = self.req.replica[rid]
        assert replica is not None  # a request that finishes was dispatched to a replica
        self.freed.append(self.engines[replica])

    def dispatch(self, e: Replica, rid: int, now: float) -> None:
        self.req.replica[rid] = e.idx
        self.req.sent[rid] = now
        if self.jitter > 0:
            self.in_flight[e.idx] = self.in_flight.get(e.idx, 0) + 1
            delay = self.rng.uniform(0, 2 * self.jitter)
            heapq.heappush(self.heap, (now + delay, EV_SUBMIT, rid, e.idx))
            return
        if e.submit(rid, now):
            heapq.heappush(self.heap, (e.end, EV_ENGINE, e.idx, e.version))

    def on_submit(self, now: float, rid: int, idx: int) -> None:
        """A sent request reaches replica `idx` (after its send jitter)."""
        self.in_flight[idx] -= 1
        e = self.engines[idx]
        if e.submit(rid, now):
            heapq.heappush(self.heap, (e.end, EV_ENGINE, e.idx, e.version))

    def drain_central(self, now: float) -> None:
        for e in self.serving:
            while self.central and e.outstanding + self.in_flight.get(e.idx, 0) < self.cap:
                self.dispatch(e, self.central.popleft(), now)
            if not self.central:
                return

    def arrive(self, now: float, rid: int) -> None:
        req = self.req
        if req.inputs[rid] + req.outputs[rid] > self.m.max_model_len:
            req.refused[rid] = True
            return
        self.in_integral += self.in_system * (now - self.in_last)
        self.in_last = now
        self.in_system += 1
        if self.balancer == "queue":
            self.central.append(rid)
            self.drain_central(now)
            return
        if not self.serving:
            raise ValueError("no replica in service")
        key = session_key(req.blocks, rid) if self.balancer == "sticky" else None
        node = self.sessions.get(key) if key is not None else None
        pick = self.serving
        if node is not None:
            pick = [e for e in self.serving if self.nodes_of[e.idx] == node] or self.serving
        best = least_outstanding(pick, self.rr)
        self.rr += 1
        if key is not None:
            self.sessions[key] = self.nodes_of[best.idx]
        self.dispatch(best, rid, now)

    # -- nodes: scaling out and in, windows, the bill ------------------------------------

    def serving_nodes(self) -> int:
        return len(self.serving) // self.rpn

    def raised(self, now: float, running: bool) -> int:
        """Nodes the open windows of that kind add (overlaps: the larger, not the sum)."""
        assert self.scale is not None
        return max((w.nodes for w in self.scale.windows
                    if w.running == running and w.open_at(now)), default=0)

    def floor_nodes(self, now: float) -> int:
        assert self.scale is not None
        return self.scale.min_nodes + self.raised(now, True)

    def start_nodes(self, count: int, now: float) -> None:
        """Scale out by `count`: warm nodes first (the pool refills from cold), then cold."""
        scale = self.scale
        assert scale is not None
        for _ in range(count):
            if self.warm_free:
                self.warm_free -= 1
                ready = now + scale.warm_start_s
                heapq.heappush(self.heap, (now + scale.cold_start_s, EV_WARM, 0, 0))
            else:
                ready = now + scale.cold_start_s
            self.starting.append(ready)
            heapq.heappush(self.heap, (ready, EV_READY, 0, 0))
        self.cold_window.append((now, max(self.starting)))
        self.record(now)

    def begun_before(self, scale: Autoscale) -> None:
        """Windows that start at or before the trace's start: nodes launched at FROM serve
        FROM + their start time later (warm pool first), from 0 at the earliest; a stopped
        window's nodes are prepared from cold by FROM + the cold start."""
        early = [w for w in scale.windows if w.start_s <= 0]
        at = min((w.start_s for w in early if w.running), default=0.0)
        for _ in range(max((w.nodes for w in early if w.running), default=0)):
            warm = self.warm_free > 0
            self.warm_free -= warm
            ready = at + (scale.warm_start_s if warm else scale.cold_start_s)
            if warm:
                heapq.heappush(self.heap, (max(0.0, at + scale.cold_start_s), EV_WARM, 0, 0))
            if ready <= 0:
                self.add_node()
            else:
                self.starting.append(ready)
                heapq.heappush(self.heap, (ready, EV_READY, 0, 0))
        for w in early:
            if not w.running:
                for _ in range(w.nodes):
                    heapq.heappush(self.heap, (max(0.0, w.start_s + scale.cold_start_s),
                                               EV_WARM, 0, 0))

    def drain_to(self, nodes: int, now: float) -> None:
        """The newest nodes leave the balancer and drain their requests, down to `nodes`."""
        rpn = self.rpn
        while self.serving_nodes() > nodes:
            leaving = self.serving[-rpn:]
            del self.serving[-rpn:]
            for e in leaving:
                e.draining = True
                if e.outstanding:
                    self.draining.append(e)
        self.record(now)

    def bill(self, now: float) -> None:
        scale = self.scale
        if scale is not None:
            live = (self.serving_nodes() + len(self.starting)
                    + len({self.nodes_of[e.idx] for e in self.draining}))
            warm_billed = self.warm_free if scale.warm_running else 0
            self.node_s += billed_nodes(live + warm_billed, self.reserved_nodes) * (
                now - self.last_t)
        self.last_t = now

    def record(self, now: float) -> None:
        if self.scale is not None:
            self.timeline.append((now, self.serving_nodes(), len(self.starting)))

    # -- the events ------------------------------------------------------------------------

    def on_engine(self, now: float, ident: int, version: int) -> bool:
        """A replica's next event; False: the replay stops (too many late requests)."""
        e = self.engines[ident]
        if version != e.version:
            return True
        e.handle(now, self.on_finish)
        if self.req.misses > self.miss_limit:
            self.aborted = True
            return False
        if e.end != INF:
            heapq.heappush(self.heap, (e.end, EV_ENGINE, e.idx, e.version))
        if self.freed:
            self.freed.clear()
            if self.central:
                self.drain_central(now)
        if e.end == INF and e.draining and not e.outstanding:
            self.bill(now)
            self.draining.remove(e)
        return True

    def on_ready(self, now: float) -> None:
        self.bill(now)
        self.starting.remove(now)
        self.add_node()
        if self.central:
            self.drain_central(now)
        self.record(now)

    def on_warm(self, now: float) -> None:
        self.bill(now)
        assert self.scale is not None
        if self.warm_free < self.scale.warm_nodes + self.raised(now, False):
            self.warm_free += 1  # (else a window has ended)

    def on_window(self, now: float, ident: int, version: int) -> None:
        self.bill(now)
        scale = self.scale
        assert scale is not None
        w = scale.windows[ident]
        if w.running and version == 0:  # the minimum rises: nodes launch now
            short = self.floor_nodes(now) - self.serving_nodes() - len(self.starting)
            if short > 0:
                self.start_nodes(short, now)
        elif w.running and w.drains:  # the minimum and the desired size return (the
            self.drain_to(self.floor_nodes(now), now)  # queue policy grows the pool again)
        elif w.running:  # the minimum alone returns: the queue policy scales in
            pass
        elif version == 0:  # the warm pool rises: nodes prepared from cold
            for _ in range(w.nodes):
                heapq.heappush(self.heap, (now + scale.cold_start_s, EV_WARM, 0, 0))
        else:  # the warm pool returns to its size
            self.warm_free = min(self.warm_free, scale.warm_nodes + self.raised(now, False))

    def on_tick(self, now: float) -> None:
        """The metric sample and the policy."""
        scale = self.scale
        assert scale is not None
        self.bill(now)
        serving = self.serving
        n_srv = max(1, len(serving))
        metric = (sum(len(e.waiting) for e in serving) + len(self.central)) / n_srv
        cur = self.serving_nodes() + len(self.starting)
        want = min(scale.max_nodes,
                   math.ceil(self.serving_nodes() * metric / scale.queue_target))
        if want > cur:
            self.start_nodes(want - cur, now)
        if metric < scale.queue_target / 2:
            self.low_since = now if self.low_since is None else self.low_since
            if (now - self.low_since >= scale.scale_down_stabilization_s
                    and now - self.last_scale_in >= scale.scale_in_cooldown_s
                    and self.serving_nodes() > self.floor_nodes(now) and not self.starting):
                self.drain_to(self.serving_nodes() - 1, now)  # one node at a time
                self.last_scale_in = now
        else:
            self.low_since = None
        if (self.i < self.n_req or any(e.outstanding for e in self.engines)
                or now < self.run_until_s):
            heapq.heappush(self.heap, (now + METRIC_PERIOD_S, EV_TICK, 0, 0))

    # -- the loop and the result -----------------------------------------------------------

    def run(self) -> SimResult:
        arrivals, n_req, heap = self.trace.arrivals, self.n_req, self.heap
        while True:
            t_arr = arrivals[self.i] if self.i < n_req else INF
            t_ev = heap[0][0] if heap else INF
            if t_arr == INF and t_ev == INF:
                break
            if t_arr <= t_ev:
                self.i += 1
                self.arrive(t_arr, self.i - 1)
                continue
            now, kind, ident, version = heapq.heappop(heap)
            if kind == EV_ENGINE:
                if not self.on_engine(now, ident, version):
                    break
            elif kind == EV_READY:
                self.on_ready(now)
            elif kind == EV_WARM:
                self.on_warm(now)
            elif kind == EV_WINDOW:
                self.on_window(now, ident, version)
            elif kind == EV_SUBMIT:
                self.on_submit(now, ident, version)
            else:
                self.on_tick(now)
        return self.result()

    def result(self) -> SimResult:
        req, engines, scale, n_req = self.req, self.engines, self.scale, self.n_req
        horizon = max(self.last_t, max((f for f in req.finish if f == f), default=0.0),
                      self.trace.arrivals[-1] if n_req else 0.0)
        self.bill(horizon)
        if scale is None:
            self.node_s = self.fixed_nodes * horizon
        self.record(horizon)
        if scale is not None:  # a running window's nodes are paid whatever the traffic
            fixed_window_s = sum(
                w.nodes * max(0.0, min(w.end_s, horizon) - max(0.0, w.start_s))
                for w in scale.windows if w.running)
        else:
            fixed_window_s = 0.0
        rpn = self.rpn
        return SimResult(
            req=req, horizon_s=horizon, in_system_integral=self.in_integral,
            busy_s=sum(e.busy_s for e in engines),
            occupied_s=sum(e.occupied_s for e in engines),
            replica_s=(replica_seconds(self.timeline, rpn, horizon) if scale
                       else len(engines) * horizon),
            node_s=self.node_s, fixed_node_s=self.fixed_nodes * horizon + fixed_window_s,
            price_per_node_hour=self.price_per_node_hour,
            max_kv_tokens=max(e.max_kv for e in engines),
            max_running=max(e.max_running for e in engines),
            preemptions=sum(e.preemptions for e in engines),
            timeline=self.timeline, cold_window=self.cold_window,
            replicas_fixed=self.replicas, replicas_per_node=rpn, aborted=self.aborted,
            reserved_nodes=self.reserved_nodes,
            power_kw_per_node=self.power_kw_per_node, max_model_len=self.m.max_model_len,
            prefix_cache=PrefixStats(
                block_tokens=self.trace.block_tokens,
                prompt_tokens=sum(e.prompt_tokens for e in engines),
                hit_tokens=sum(e.hit_tokens for e in engines),
                evicted_blocks=sum(e.cache.evicted for e in engines if e.cache is not None),
            ) if self.use_cache else None,
            topology=self.topology,
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
