"""A discrete-event simulator of a pool: replicas behind a load balancer (least outstanding
requests, session affinity, or a central queue), each a vLLM-style continuous-batching
engine with automatic prefix caching, optionally under the pool's own autoscaling.

Speed comes from advancing time analytically: while a replica's batch only decodes, its
steps differ only by the KV cache growing one token per sequence per step, so the time of n
steps has a closed form (`DecodeRun.time`) and the replica wakes only when something changes
(a sequence finishes, the KV cache fills, a request arrives). Steps that prefill are taken one
at a time. Per-sequence token counts are kept relative to a per-replica step counter, so a
decode run costs O(log n) however many sequences it carries.

A replica is an `Engine` (submit, next event, handle event, outstanding), or a
`DisaggEngine`: a prefill `Engine` and a decode `Engine` joined by a KV-transfer link; the
balancer and the autoscaler see only that interface.
"""

from __future__ import annotations

import csv
import heapq
import math
import os
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from poolctl.servingmodel import ReplicaModel, Topology
from poolctl.sizing import billed_nodes
from poolctl.traces import Blocks, Trace

INF = math.inf

# The autoscaling policy as the stacks configure it (poolctl_stacks/aws/scaling.py,
# poolctl_stacks/gcp/scaling.py): one metric sample per period; scale out at once to
# ceil(nodes x waiting-per-replica / queue_target); scale in one node when the queue stayed
# below half the target for the whole stabilization window, then wait a cooldown.
METRIC_PERIOD_S = 60
AWS_SCALE_IN_COOLDOWN_S = 300  # = SCALE_IN_COOLDOWN_S in poolctl_stacks/aws/scaling.py (tested)


@dataclass
class Requests:
    """Per-request results, indexed like the trace."""

    arrival: list[float]
    inputs: list[int]
    outputs: list[int]
    replica: list[int | None]
    admitted: list[float]
    first: list[float]
    finish: list[float]
    refused: list[bool]
    # Prefix-cache block ids of each prompt (None: no reuse known) and the prompt tokens its
    # last admission found cached (and so did not prefill).
    blocks: list[Blocks] | None = None
    cached: list[int] = field(default_factory=list)
    # Early exit for searches: count first tokens later than `slo_s`; past `miss_limit` the
    # p90 cannot meet the SLO and the run stops (SimResult.aborted).
    slo_s: float = math.inf
    misses: int = 0


class DecodeRun:
    """n decode-only steps of b sequences whose KV grows by b tokens per step.

    Step k takes F + max(C, M0 + Ms k): fixed part (overhead, all-reduce), compute, memory."""

    __slots__ = ("F", "C", "M0", "Ms")

    def __init__(self, m: ReplicaModel, b: int, kv: int) -> None:
        self.F = m.overhead_s + m.per_seq_s * b + m.comm_s(b)
        self.C = m.compute_s(b)
        self.M0 = m.memory_s(kv)
        self.Ms = b * m.kv_bytes_per_token_per_gpu / (m.hbm_bytes_per_s * m.decode_mbu)

    def time(self, n: int) -> float:
        if n <= 0:
            return 0.0
        C, M0, Ms = self.C, self.M0, self.Ms
        if M0 >= C:
            kc = 0
        elif Ms <= 0:
            kc = n
        else:
            kc = min(n, math.ceil((C - M0) / Ms))
        m = n - kc  # steps where memory dominates: k = kc .. n-1
        mem = m * M0 + Ms * (n * (n - 1) - kc * (kc - 1)) / 2
        return n * self.F + kc * C + mem

    def steps_within(self, x: float, n_max: int) -> int:
        """Largest n <= n_max whose n steps end by time x."""
        lo, hi = 0, n_max
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.time(mid) <= x:
                lo = mid
            else:
                hi = mid - 1
        return lo


class PrefixCache:
    """vLLM's automatic prefix caching on one replica, at the trace's block granularity.

    A block is cached while a running request holds it (`pins`, shared) or, once no request
    holds it, in the free queue (`lru`, least recently freed first) until its KV slots are
    needed: vLLM V1's KVCacheManager evicts free cached blocks in that order. Only a prompt's
    full blocks are cached (as vLLM hashes only full blocks); the blocks a request decodes are
    not, having no ids in the trace. A request's KV allocation counts its hit blocks again
    (vLLM shares them): KV held is over-stated, never under-stated.
    """

    __slots__ = ("block", "lru", "pins", "evicted")

    def __init__(self, block_tokens: int) -> None:
        self.block = block_tokens
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.pins: dict[int, int] = {}  # block id -> running requests holding it
        self.evicted = 0

    @property
    def tokens(self) -> int:
        """KV slots the free cached blocks hold (evictable at once)."""
        return len(self.lru) * self.block

    def hits(self, blocks: Blocks) -> int:
        """Leading blocks of `blocks` already cached."""
        k = 0
        for b in blocks:
            if b not in self.pins and b not in self.lru:
                break
            k += 1
        return k

    def pin(self, blocks: Blocks) -> None:
        """A running request holds `blocks` (out of the free queue if there)."""
        pins, lru = self.pins, self.lru
        for b in blocks:
            pins[b] = pins.get(b, 0) + 1
            lru.pop(b, None)

    def release(self, blocks: Blocks) -> None:
        """The request holding `blocks` finished or was preempted: blocks no request holds
        any more join the free queue, last block first (evicted before the prefix it
        extends, as vLLM frees a request's blocks in reverse)."""
        pins, lru = self.pins, self.lru
        for b in reversed(blocks):
            n = pins[b] - 1
            if n:
                pins[b] = n
            else:
                del pins[b]
                lru[b] = None

    def evict(self, tokens: int) -> None:
        """Free at least `tokens` KV slots (or all free blocks), oldest first."""
        lru = self.lru
        while tokens > 0 and lru:
            lru.popitem(last=False)
            self.evicted += 1
            tokens -= self.block


class Engine:
    """One replica: vLLM V1-style scheduling per step. Running sequences decode one token
    each; prefills continue in chunks within `max_num_batched_tokens`; waiting requests are
    admitted first-come first-served while fewer than `max_num_seqs` run and the KV cache has
    room for the whole prompt; when decoding would overflow the KV cache the newest sequence
    is preempted and recomputed later. With a prefix cache, an admitted prompt's leading
    blocks already cached skip prefill, and free cached blocks give way (LRU) to KV that
    running sequences need: `kv` (held by running sequences) plus `cache.tokens` never
    exceeds `kv_tokens`."""

    def __init__(self, idx: int, m: ReplicaModel, req: Requests,
                 cache: PrefixCache | None = None, preloaded: bool = False) -> None:
        self.idx, self.m, self.req = idx, m, req
        self.cache = cache
        # A decode instance: each request arrives with its prompt's KV cache (from a prefill
        # instance) and computes only its last prompt token (for the logits), as vLLM's
        # KV-transfer connectors do.
        self.preloaded = preloaded
        self.pinned: dict[int, Blocks] = {}  # rid -> the cached blocks it holds
        self.prompt_tokens = 0  # prompt tokens admitted (recomputes included) ...
        self.hit_tokens = 0  # ... and of them found in the prefix cache
        self.waiting: deque[int] = deque()
        self.running: list[int] = []  # admission order
        self.prefill: dict[int, list[int]] = {}  # rid -> [tokens left, tokens done]
        self.gen: dict[int, int] = {}  # tokens generated, relative to `steps` (see below)
        self.join: dict[int, int] = {}  # step counter when the sequence began to decode
        self.alloc: dict[int, int] = {}  # KV tokens at `join`
        self.fin: list[tuple[int, int]] = []  # (step counter at finish, rid), lazy deletion
        self.steps = 0  # decode steps taken: a decoding sequence gains one token per step
        self.kv = 0  # KV slots of the running sequences (what a step reads)
        self.held = 0  # KV slots of finished prefills still being sent (DisaggEngine)
        self.n_dec = 0
        self.busy_s = 0.0
        self.occupied_s = 0.0  # busy time weighted by the share of capacity in use
        self.max_kv = 0
        self.max_running = 0
        self.preemptions = 0
        self.draining = False
        # the step (or decode run) in flight
        self.t0 = 0.0
        self.end = INF
        self.version = 0
        self.run: DecodeRun | None = None
        self.run_n = 0
        self.chunks: list[tuple[int, int]] = []

    def _note_kv(self) -> None:
        held = self.kv + self.held + (self.cache.tokens if self.cache is not None else 0)
        if held > self.max_kv:
            self.max_kv = held

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def generated(self, rid: int) -> int:
        return self.gen[rid] + self.steps - self.join[rid]

    def _live(self, f: int, rid: int) -> bool:
        """A finish entry still holds: not preempted since (nor readmitted with a new one)."""
        j = self.join.get(rid)
        return j is not None and j + self.req.outputs[rid] - self.gen[rid] == f

    # ---- scheduling
    def submit(self, rid: int, now: float) -> bool:
        """Queue a request; True when the replica's next event time changed."""
        self.waiting.append(rid)
        if self.end == INF:
            self._start(now)
            return True
        if self.run is not None and self.run_n > 1:
            # Cut the decode run at the end of the step in flight: the request joins the next.
            n = self.run.steps_within(now - self.t0, self.run_n) + 1
            if n < self.run_n:
                self.run_n = n
                self.end = self.t0 + self.run.time(n)
                self.version += 1
                return True
        return False

    def _unpin(self, rid: int) -> None:
        if self.cache is not None and rid in self.pinned:
            self.cache.release(self.pinned.pop(rid))

    def _fit_cache(self, extra: int = 0) -> None:
        """Evict free cached blocks until they fit beside the running sequences' KV (and
        `extra` slots more)."""
        if self.cache is not None:
            self.cache.evict(self.kv + self.held + extra + self.cache.tokens
                             - self.m.kv_tokens)

    def _hit(self, rid: int, prompt: int) -> int:
        """Prompt tokens of `rid` cached on this replica (at most prompt - 1: vLLM computes
        the last one again for its logits); the blocks found are pinned."""
        cache, blocks = self.cache, self.req.blocks
        if cache is None or blocks is None:
            return 0
        full = blocks[rid][:self.req.inputs[rid] // cache.block]
        k = cache.hits(full)
        if k:
            cache.pin(full[:k])
            self.pinned[rid] = full[:k]
        return min(k * cache.block, prompt - 1)

    def _computed(self, rid: int) -> None:
        """Prefill done: the prompt's full blocks are cached (pinned while it runs)."""
        cache, blocks = self.cache, self.req.blocks
        if cache is None or blocks is None:
            return
        full = blocks[rid][:self.req.inputs[rid] // cache.block]
        held = self.pinned.get(rid, ())
        if len(full) > len(held):
            cache.pin(full[len(held):])
            self.pinned[rid] = full

    def resume(self, now: float) -> None:
        """KV was freed from outside (a finished transfer): an idle engine with requests
        waiting for room starts its next step."""
        if self.end == INF and self.waiting:
            self._start(now)

    def _preempt(self, rid: int) -> None:
        self.running.remove(rid)
        self.preemptions += 1
        self._unpin(rid)
        if rid in self.prefill:
            left, done = self.prefill.pop(rid)
            self.kv -= left + done + 1
            gen = self.gen.pop(rid, 0)
        else:
            gen = self.generated(rid)
            self.kv -= self.alloc.pop(rid) + self.steps - self.join.pop(rid)
            del self.gen[rid]
            self.n_dec -= 1
        self.gen[rid] = gen  # kept for the recompute; `join` absent marks it waiting
        self.waiting.appendleft(rid)

    def _start(self, now: float) -> None:
        m, req = self.m, self.req
        self.version += 1
        self.t0 = now
        # Decoding sequences need one KV slot each this step; make room by preemption.
        while self.n_dec and self.kv + self.held + self.n_dec > m.kv_tokens:
            self._preempt(self.running[-1])
        self._fit_cache(self.n_dec)
        budget = m.max_num_batched_tokens - self.n_dec
        chunks: list[tuple[int, int]] = []
        attn = 0.0
        for rid, st in self.prefill.items():
            if budget <= 0:
                break
            c = min(st[0], budget)
            chunks.append((rid, c))
            attn += m.attn_flops(c, st[1])
            budget -= c
        while self.waiting and budget > 0 and len(self.running) < m.max_num_seqs:
            rid = self.waiting[0]
            prompt = req.inputs[rid] + self.gen.get(rid, 0)
            # Room for the prompt, the token its prefill emits and this step's decode tokens.
            if self.kv + self.held + self.n_dec + prompt + 1 > m.kv_tokens:
                break
            self.waiting.popleft()
            if req.admitted[rid] != req.admitted[rid]:  # NaN: first admission
                req.admitted[rid] = now
            self.running.append(rid)
            if self.preloaded:  # a recompute after preemption has no KV to receive
                hit = prompt - 1 if rid not in self.gen else 0
            else:
                hit = self._hit(rid, prompt)
                self.prompt_tokens += prompt
                self.hit_tokens += hit
                req.cached[rid] = hit
            self.kv += prompt + 1
            self._fit_cache(self.n_dec)
            self.prefill[rid] = [prompt - hit, hit]
            c = min(prompt - hit, budget)
            chunks.append((rid, c))
            attn += m.attn_flops(c, hit)
            budget -= c
        if len(self.running) > self.max_running:
            self.max_running = len(self.running)
        self._note_kv()
        if not chunks and not self.n_dec:
            self.end, self.run = INF, None
            return
        if chunks:
            tokens = self.n_dec + sum(c for _, c in chunks)
            self.chunks, self.run, self.run_n = chunks, None, 1
            self.end = now + m.step_s(tokens, self.kv, attn, self.n_dec)
            return
        # Decode only: run until the first sequence finishes or the KV cache is full.
        while not self._live(*self.fin[0]):
            heapq.heappop(self.fin)
        n_fin = self.fin[0][0] - self.steps
        n_kv = (m.kv_tokens - self.kv - self.held) // self.n_dec
        self.chunks = []
        self.run = DecodeRun(m, self.n_dec, self.kv)
        self.run_n = max(1, min(n_fin, n_kv))
        self.end = now + self.run.time(self.run_n)

    def handle(self, now: float, on_finish: Callable[[int, float], None]) -> None:
        """The step or run in flight ended at `now`: account for it and start the next."""
        n = self.run_n
        m = self.m
        dt = now - self.t0
        self.busy_s += dt
        # Capacity in use: the binding one of the KV cache and the sequence slots (equal to
        # the busy fraction when max_num_seqs is 1); the KV grows through a decode run.
        kv_mean = self.kv + self.n_dec * (n - 1) / 2
        self.occupied_s += dt * max(kv_mean / m.kv_tokens, len(self.running) / m.max_num_seqs)
        self.steps += n if self.n_dec else 0
        self.kv += n * self.n_dec
        self._fit_cache()  # the run's new tokens took free cached blocks' slots
        self._note_kv()
        req = self.req
        for rid, c in self.chunks:
            st = self.prefill[rid]
            st[0] -= c
            st[1] += c
            if st[0] == 0:  # the last chunk emits a token
                del self.prefill[rid]
                if req.first[rid] != req.first[rid]:
                    req.first[rid] = now
                    if now - req.arrival[rid] > req.slo_s:
                        req.misses += 1
                gen = self.gen.get(rid, 0) + 1
                self.alloc[rid] = st[1] + 1
                self.gen[rid] = gen
                self.join[rid] = self.steps
                self.n_dec += 1
                heapq.heappush(self.fin, (self.steps + req.outputs[rid] - gen, rid))
                self._computed(rid)
        while self.fin and self.fin[0][0] <= self.steps:
            f, rid = heapq.heappop(self.fin)
            if not self._live(f, rid):
                continue  # preempted since
            self.kv -= self.alloc.pop(rid) + self.steps - self.join.pop(rid)
            del self.gen[rid]
            self.running.remove(rid)
            self.n_dec -= 1
            self._unpin(rid)
            req.finish[rid] = now
            on_finish(rid, now)
        self._start(now)


class DisaggEngine:
    """One disaggregated replica: a prefill instance and a decode instance (`Topology`).

    A request is prefilled on the prefill engine (its prefix cache there) as a one-token
    request; its KV cache then crosses the link, transfers one after another at the link's
    rate, and the decode engine admits it with the prompt's KV in place: its first token
    comes from the decode instance's first step, so TTFT = prefill + transfer + that step.
    Decode steps never carry prefill chunks. The balancer and the autoscaler see the same
    interface as `Engine`'s."""

    def __init__(self, idx: int, topo: Topology, req: Requests,
                 cache: PrefixCache | None) -> None:
        self.idx, self.topo, self.req = idx, topo, req
        # The prefill side's own view of the requests: one output token, its own times.
        n = len(req.arrival)
        nan = math.nan
        self.preq = Requests(arrival=req.arrival, inputs=req.inputs, outputs=[1] * n,
                             replica=req.replica, admitted=req.admitted, first=[nan] * n,
                             finish=[nan] * n, refused=req.refused, blocks=req.blocks,
                             cached=req.cached)
        self.p = Engine(idx, topo.prefill, self.preq, cache)
        self.d = Engine(idx, topo.decode, req, preloaded=True)
        self.xfer: list[tuple[float, int]] = []  # (KV in place on the decode side, rid)
        self.link_free = 0.0
        self.in_transfer = 0
        self.transfer_s = 0.0  # sum over requests, for the mean
        self.transfers = 0
        self.end = INF
        self.version = 0
        self.draining = False
        self.cache = cache

    # The interface simulate() reads.
    @property
    def waiting(self) -> deque[int]:
        return self.p.waiting

    @property
    def outstanding(self) -> int:
        return self.p.outstanding + self.in_transfer + self.d.outstanding

    @property
    def prompt_tokens(self) -> int:
        return self.p.prompt_tokens

    @property
    def hit_tokens(self) -> int:
        return self.p.hit_tokens

    @property
    def busy_s(self) -> float:  # GPU-weighted over the two sides
        g = self.topo.gpus
        return (self.p.busy_s * self.topo.prefill.tp + self.d.busy_s * self.topo.decode.tp) / g

    @property
    def occupied_s(self) -> float:
        g = self.topo.gpus
        return (self.p.occupied_s * self.topo.prefill.tp
                + self.d.occupied_s * self.topo.decode.tp) / g

    @property
    def max_kv(self) -> int:
        return max(self.p.max_kv, self.d.max_kv)

    @property
    def max_running(self) -> int:
        return max(self.p.max_running, self.d.max_running)

    @property
    def preemptions(self) -> int:
        return self.p.preemptions + self.d.preemptions

    def _next(self) -> bool:
        end = min(self.p.end, self.d.end, self.xfer[0][0] if self.xfer else INF)
        if end != self.end:
            self.end = end
            self.version += 1
            return True
        return False

    def submit(self, rid: int, now: float) -> bool:
        self.p.submit(rid, now)
        return self._next()

    def _prefilled(self, rid: int, now: float) -> None:
        # The prefill instance holds the request's KV until the decode side has it (as
        # vLLM's connectors free it once read): a slow link fills it and stalls admission.
        self.p.held += self.req.inputs[rid] + 1
        t = self.topo.transfer_s(self.req.inputs[rid])
        start = max(now, self.link_free)
        self.link_free = start + t
        self.transfer_s += self.link_free - now
        self.transfers += 1
        self.in_transfer += 1
        heapq.heappush(self.xfer, (self.link_free, rid))

    def handle(self, now: float, on_finish: Callable[[int, float], None]) -> None:
        while True:
            if self.d.end <= now:
                self.d.handle(now, on_finish)
            elif self.xfer and self.xfer[0][0] <= now:
                _, rid = heapq.heappop(self.xfer)
                self.in_transfer -= 1
                self.p.held -= self.req.inputs[rid] + 1
                self.p.resume(now)
                self.d.submit(rid, now)
            elif self.p.end <= now:
                self.p.handle(now, self._prefilled)
            else:
                break
        self._next()


Replica = Engine | DisaggEngine


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
        replica_s=_replica_seconds(timeline, rpn, horizon) if scale else len(engines) * horizon,
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


def _replica_seconds(timeline: list[tuple[float, int, int]], rpn: int, horizon: float) -> float:
    total = 0.0
    for (t, n, _), (t2, _, _) in zip(timeline, timeline[1:] + [(horizon, 0, 0)], strict=True):
        total += n * rpn * (t2 - t)
    return total


# --------------------------------------------------------------------------- reporting


def percentile(sorted_xs: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not sorted_xs:
        return None
    pos = (len(sorted_xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Quantiles:
    """Percentiles of one latency, in seconds (None: no request to measure)."""

    p50: float | None
    p90: float | None
    p99: float | None = None


@dataclass(frozen=True)
class SloResult:
    """The SLOs a run was judged by and how it did: `met` when every p90 target is met;
    goodput is the share of all requests meeting every target (TTFT and, if set, TPOT)."""

    ttft_p90_s: float
    tpot_p90_s: float | None
    met: bool
    goodput: float
    ttft_met: bool
    tpot_met: bool


@dataclass(frozen=True)
class CostResult:
    """The bill, fixed (reservations, paid whether used or not; nodes that always run) and
    marginal (On-Demand nodes beyond them, while they run)."""

    node_hours: float
    usd: float
    fixed_usd: float
    marginal_usd: float
    usd_per_1m_output_tokens: float | None
    usd_per_request: float | None
    reserved_nodes: int = 0
    fixed_usd_per_hour: float = 0.0
    marginal_usd_per_hour: float = 0.0
    fixed_usd_per_1m_output_tokens: float | None = None
    marginal_usd_per_1m_output_tokens: float | None = None


@dataclass(frozen=True)
class EnergyResult:
    """Energy at the nodes' maximum draw (an upper bound: the catalog's system power)."""

    power_kw_per_node: float | None
    kwh: float | None
    kwh_per_1m_output_tokens: float | None


@dataclass(frozen=True)
class AutoscaleResult:
    slo_misses: int
    slo_misses_during_cold_starts: int
    scale_outs: int
    nodes_over_time: tuple[tuple[float, int, int], ...]  # (t, serving, starting)


@dataclass(frozen=True)
class TopologyResult:
    """A disaggregated run's split and KV path (see servingmodel.Topology)."""

    kind: str
    prefill_gpus: int
    decode_gpus: int
    kv_link_gbytes_per_s: float
    kv_link: str
    kv_transfer_s_mean: float  # from prefill done to KV on the decode side, queueing included


@dataclass(frozen=True)
class SimSummary:
    """What a run reports (`simulate --json`, via `to_json`, in the contract's shape)."""

    requests: int
    completed: int
    rejected: int
    requests_over_max_model_len: int
    max_model_len: int | None
    duration_s: float
    horizon_s: float
    arrival_rate_per_s: float
    ttft_s: Quantiles
    tpot_s: Quantiles
    e2e_s: Quantiles
    queue_wait_mean_s: float | None
    mean_in_system: float | None
    mean_time_in_system_s: float | None
    utilization: float
    busy_fraction: float
    input_tokens_per_s: float
    output_tokens_per_s: float
    slo: SloResult
    cost: CostResult
    energy: EnergyResult
    replicas: tuple[float, float, float]  # min, max, mean
    kv_tokens_max: int
    running_max: int
    preemptions: int
    autoscale: AutoscaleResult | None = None
    prefix_cache: PrefixStats | None = None
    topology: TopologyResult | None = None  # None: aggregated

    def to_json(self) -> dict[str, Any]:
        lo, hi, mean = self.replicas
        out: dict[str, Any] = {
            "requests": self.requests,
            "completed": self.completed,
            "rejected": self.rejected,
            "duration_s": self.duration_s,
            "horizon_s": self.horizon_s,
            "arrival_rate_per_s": self.arrival_rate_per_s,
            "ttft_s": {"p50": self.ttft_s.p50, "p90": self.ttft_s.p90, "p99": self.ttft_s.p99},
            "tpot_s": {"p50": self.tpot_s.p50, "p90": self.tpot_s.p90},
            "e2e_s": {"p50": self.e2e_s.p50, "p90": self.e2e_s.p90},
            "queue_wait_s": {"mean": self.queue_wait_mean_s},
            "mean_in_system": self.mean_in_system,
            "mean_time_in_system_s": self.mean_time_in_system_s,
            "utilization": self.utilization,
            "busy_fraction": self.busy_fraction,
            "tokens_per_s": {"input": self.input_tokens_per_s,
                             "output": self.output_tokens_per_s},
            "slo": {"ttft_p90_s": self.slo.ttft_p90_s, "met": self.slo.met,
                    "goodput": self.slo.goodput, "tpot_p90_s": self.slo.tpot_p90_s,
                    "ttft_met": self.slo.ttft_met, "tpot_met": self.slo.tpot_met},
            "cost": {
                "node_hours": self.cost.node_hours,
                "usd": self.cost.usd,
                "fixed_usd": self.cost.fixed_usd,
                "marginal_usd": self.cost.marginal_usd,
                "usd_per_1m_output_tokens": self.cost.usd_per_1m_output_tokens,
                "usd_per_request": self.cost.usd_per_request,
                "reserved_nodes": self.cost.reserved_nodes,
                "fixed_usd_per_hour": self.cost.fixed_usd_per_hour,
                "marginal_usd_per_hour": self.cost.marginal_usd_per_hour,
                "fixed_usd_per_1m_output_tokens": self.cost.fixed_usd_per_1m_output_tokens,
                "marginal_usd_per_1m_output_tokens": self.cost.marginal_usd_per_1m_output_tokens,
            },
            "replicas": {"min": lo, "max": hi, "mean": mean},
            "kv_tokens_max": self.kv_tokens_max,
            "running_max": self.running_max,
            "preemptions": self.preemptions,
            "prefix_cache": prefix_cache_summary(self.prefix_cache),
            "topology": topology_summary(self.topology),
            "requests_over_max_model_len": self.requests_over_max_model_len,
            "max_model_len": self.max_model_len,
            "energy": {"power_kw_per_node": self.energy.power_kw_per_node,
                       "kwh": self.energy.kwh,
                       "kwh_per_1m_output_tokens": self.energy.kwh_per_1m_output_tokens},
        }
        if self.autoscale is not None:
            a = self.autoscale
            out["autoscale"] = {
                "slo_misses": a.slo_misses,
                "slo_misses_during_cold_starts": a.slo_misses_during_cold_starts,
                "scale_outs": a.scale_outs,
                "nodes_over_time": [{"t": t, "serving": s, "starting": p}
                                    for t, s, p in a.nodes_over_time],
            }
        return out


def _rnd(x: float | None, d: int = 4) -> float | None:
    return None if x is None else round(x, d)


def _tpot(q: Requests, i: int) -> float:
    """Time per output token after the first (0 for a one-token answer: it has none)."""
    return (q.finish[i] - q.first[i]) / (q.outputs[i] - 1) if q.outputs[i] > 1 else 0.0


def summary(r: SimResult, ttft_slo_s: float, tpot_slo_s: float | None = None) -> SimSummary:
    """A run's figures, judged by the TTFT p90 target and (when given) the TPOT p90 one."""
    q = r.req
    done = [i for i, f in enumerate(q.finish) if f == f]
    ttft = sorted(q.first[i] - q.arrival[i] for i in done)
    e2e = [q.finish[i] - q.arrival[i] for i in done]
    tpot = sorted(_tpot(q, i) for i in done if q.outputs[i] > 1)
    wait = [q.admitted[i] - q.arrival[i] for i in done]
    out_tokens = sum(q.outputs[i] for i in done)
    in_tokens = sum(q.inputs[i] for i in done)
    h = r.horizon_s or 1.0
    span = q.arrival[-1] - q.arrival[0] if q.arrival else 0.0
    tpot_ok = math.inf if tpot_slo_s is None else tpot_slo_s
    # A one-token answer has no TPOT: it meets any TPOT target.
    met = sum(1 for i in done if q.first[i] - q.arrival[i] <= ttft_slo_s
              and _tpot(q, i) <= tpot_ok)
    usd = r.node_s / 3600 * r.price_per_node_hour
    fixed_usd = min(r.fixed_node_s, r.node_s) / 3600 * r.price_per_node_hour
    p90 = percentile(ttft, 0.9)
    tpot90 = percentile(tpot, 0.9)
    ttft_met = p90 is not None and p90 <= ttft_slo_s
    tpot_met = tpot_slo_s is None or tpot90 is None or tpot90 <= tpot_slo_s
    kw = r.power_kw_per_node
    kwh = None if kw is None else r.node_s / 3600 * kw
    autoscale = None
    if r.replicas_fixed is None:
        windows = r.cold_window
        missed = [i for i in done if q.first[i] - q.arrival[i] > ttft_slo_s]
        cold = [i for i in missed if any(a <= q.arrival[i] <= b for a, b in windows)]
        autoscale = AutoscaleResult(
            slo_misses=len(missed), slo_misses_during_cold_starts=len(cold),
            scale_outs=len(windows),
            nodes_over_time=tuple((round(t, 1), s, p) for t, s, p in r.timeline))
    rnd = _rnd
    return SimSummary(
        requests=len(q.arrival),
        completed=len(done),
        rejected=sum(q.refused),
        requests_over_max_model_len=sum(q.refused),
        max_model_len=r.max_model_len,
        duration_s=round(span, 3),
        horizon_s=round(h, 3),
        arrival_rate_per_s=round(len(q.arrival) / span if span else 0.0, 4),
        ttft_s=Quantiles(rnd(percentile(ttft, 0.5)), rnd(p90), rnd(percentile(ttft, 0.99))),
        tpot_s=Quantiles(rnd(percentile(tpot, 0.5), 5), rnd(tpot90, 5)),
        e2e_s=Quantiles(rnd(percentile(sorted(e2e), 0.5)), rnd(percentile(sorted(e2e), 0.9))),
        queue_wait_mean_s=rnd(sum(wait) / len(wait) if wait else 0.0),
        mean_in_system=rnd(r.in_system_integral / h),
        mean_time_in_system_s=rnd(sum(e2e) / len(e2e) if e2e else 0.0),
        utilization=round(r.occupied_s / r.replica_s if r.replica_s else 0.0, 4),
        busy_fraction=round(r.busy_s / r.replica_s if r.replica_s else 0.0, 4),
        input_tokens_per_s=round(in_tokens / h, 1),
        output_tokens_per_s=round(out_tokens / h, 1),
        slo=SloResult(ttft_p90_s=ttft_slo_s, tpot_p90_s=tpot_slo_s,
                      met=ttft_met and tpot_met,
                      goodput=round(met / len(q.arrival) if q.arrival else 0.0, 4),
                      ttft_met=ttft_met, tpot_met=tpot_met),
        cost=CostResult(
            node_hours=round(r.node_s / 3600, 3),
            usd=round(usd, 2),
            fixed_usd=round(fixed_usd, 2),
            marginal_usd=round(usd - fixed_usd, 2),
            usd_per_1m_output_tokens=rnd(usd / out_tokens * 1e6 if out_tokens else None, 3),
            usd_per_request=rnd(usd / len(done) if done else None, 5),
            reserved_nodes=r.reserved_nodes,
            fixed_usd_per_hour=round(fixed_usd / h * 3600, 2),
            marginal_usd_per_hour=round((usd - fixed_usd) / h * 3600, 2),
            fixed_usd_per_1m_output_tokens=rnd(
                fixed_usd / out_tokens * 1e6 if out_tokens else None, 3),
            marginal_usd_per_1m_output_tokens=rnd(
                (usd - fixed_usd) / out_tokens * 1e6 if out_tokens else None, 3),
        ),
        energy=EnergyResult(
            power_kw_per_node=kw, kwh=rnd(kwh, 3),
            kwh_per_1m_output_tokens=rnd(kwh / out_tokens * 1e6
                                         if kwh is not None and out_tokens else None, 3)),
        replicas=_replica_stats(r),
        kv_tokens_max=r.max_kv_tokens,
        running_max=r.max_running,
        preemptions=r.preemptions,
        autoscale=autoscale,
        prefix_cache=r.prefix_cache,
        topology=None if r.topology is None else TopologyResult(
            kind=r.topology.kind, prefill_gpus=r.topology.prefill.tp,
            decode_gpus=r.topology.decode.tp,
            kv_link_gbytes_per_s=round(r.topology.link_bytes_per_s / 1e9, 3),
            kv_link=r.topology.link, kv_transfer_s_mean=round(r.kv_transfer_s_mean, 5)),
    )


def prefix_cache_summary(p: PrefixStats | None) -> dict[str, Any]:
    """`simulate --json`'s `prefix_cache`: hit_rate is the share of admitted prompt tokens
    found cached (so not prefilled); 0 with the cache off or a trace without block ids."""
    if p is None:
        return {"enabled": False, "hit_rate": 0.0, "hit_tokens": 0, "prompt_tokens": None,
                "block_tokens": None, "evicted_blocks": 0}
    return {"enabled": True, "hit_rate": round(p.hit_rate, 4), "hit_tokens": p.hit_tokens,
            "prompt_tokens": p.prompt_tokens, "block_tokens": p.block_tokens,
            "evicted_blocks": p.evicted_blocks}


def topology_summary(t: TopologyResult | None) -> dict[str, Any]:
    """`simulate --json`'s `topology`: where prefill and decode run and what the KV
    transfer cost (mean seconds per request, queueing on the link included)."""
    if t is None:
        return {"kind": "aggregated"}
    return {"kind": t.kind, "prefill_gpus": t.prefill_gpus, "decode_gpus": t.decode_gpus,
            "kv_link_gbytes_per_s": t.kv_link_gbytes_per_s, "kv_link": t.kv_link,
            "kv_transfer_s_mean": t.kv_transfer_s_mean}


def json_safe(obj: Any) -> Any:
    """`obj` with every float that is not finite (inf, NaN: JSON has neither) as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def _replica_stats(r: SimResult) -> tuple[float, float, float]:
    if r.replicas_fixed is not None:
        n = r.replicas_fixed
        return n, n, float(n)
    counts = [s * r.replicas_per_node for _, s, _ in r.timeline]
    mean = _replica_seconds(r.timeline, r.replicas_per_node, r.horizon_s) / (r.horizon_s or 1)
    return min(counts), max(counts), round(mean, 2)


def write_requests_csv(r: SimResult, path: str | os.PathLike[str]) -> None:

    q = r.req
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arrival_s", "replica", "input_tokens", "output_tokens", "first_token_s",
                    "finish_s"])

        def f(x: float) -> str:
            return "" if x != x else f"{x:.6f}"

        for i in range(len(q.arrival)):
            w.writerow([f"{q.arrival[i]:.6f}", "" if q.refused[i] else q.replica[i],
                        q.inputs[i], q.outputs[i], f(q.first[i]), f(q.finish[i])])

