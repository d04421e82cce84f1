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

This module: the requests, the prefix cache and the engines (`Engine`, `DisaggEngine`).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from poolctl.servingmodel import ReplicaModel, Topology
from poolctl.traces import Blocks

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
    # When the balancer handed each request to a replica (a closed loop's send).
    sent: list[float] = field(default_factory=list)


class DecodeRun:
    """n decode-only steps of b sequences whose KV grows by b tokens per step.

    Step k takes F + max(C, M0 + Ms k): fixed part (overhead, all-reduce), compute, memory."""

    __slots__ = ("F", "C", "M0", "Ms")

    def __init__(self, m: ReplicaModel, b: int, kv: int) -> None:
        self.F = m.overhead_s + m.per_seq_s * b + m.comm_s(b)
        self.C = m.compute_s(b)
        self.M0 = m.memory_s(kv, b)
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
