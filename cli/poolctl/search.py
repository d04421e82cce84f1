"""The configuration search behind `plan --search`: which instance type, tensor parallelism
and batching limits serve a trace within the SLOs at the lowest cost.

For one placement (pool, cloud) a *configuration* is an instance type of that cloud's
catalog, a TP in {1, 2, 4, 8} and a (max_num_seqs, max_num_batched_tokens) pair from a small
grid; configurations a rule refuses (not 8 GPUs with NVLink, RDMA NICs, not offered in the
region, weights + one max_model_len sequence over usable HBM, TP not dividing the KV heads,
...) are dropped before anything is simulated. For each configuration the search finds the
smallest whole number of nodes meeting the SLOs at the utilization target, as `plan --traffic`
does for the file's own configuration; every node count it simulated to the end is a
*candidate* (a point of cost, TTFT and TPOT). The Pareto front is taken over the candidates
(cost per hour vs TTFT p90 and TPOT p90); the choice is the cheapest candidate meeting the
SLOs, so the next cheaper one on the front does not.

A candidate names its `topology` ("aggregated": every replica prefills and decodes); a
disaggregated prefill/decode configuration is another topology evaluated by its own
function (`EVALUATORS`), and the front, the choice and the output take it as they come.

Configurations are independent, so they are evaluated in worker processes (fork) when asked
for; results are put back in the configurations' order, so the outcome does not depend on
how many workers ran nor in which order they finished.
"""

from __future__ import annotations

import math
import multiprocessing
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from poolctl.capacity import (
    Recommendation,
    judge,
    recommend,
    run_pool,
    smallest_count,
    too_long,
    tpot_floor_s,
    ttft_floor,
)
from poolctl.catalog import load_catalog
from poolctl.cloud import Cloud
from poolctl.config import Config, Pool, Target
from poolctl.errors import OperationFailed, UsageError
from poolctl.rules import errors, run_checks
from poolctl.servingmodel import fitted, replica_model, topology
from poolctl.simulate import SimSummary, json_safe, summary
from poolctl.sizing import nodes_for, plan_pool
from poolctl.traces import Trace

TENSOR_PARALLEL = (1, 2, 4, 8)
# A small grid around vLLM's defaults (256 sequences, 8,192 tokens a step): a smaller batch
# cap trades throughput for TPOT, a smaller step budget trades long prompts' TTFT for the
# decode stalls prefill chunks cause. The file's own values are always added.
MAX_NUM_SEQS = (64, 256)
MAX_NUM_BATCHED_TOKENS = (2048, 8192)
# Longer max_model_len values tried when the trace holds requests over the file's.
LONGER_LENS = 3
AGGREGATED = "aggregated"
DISAGG_NODE, DISAGG_CROSS = "disagg-node", "disagg-cross"
# A disaggregated replica splits P:D GPUs, each side a TP degree (1, 2, 4, 8) and P + D
# dividing the node's 8: only even splits (1:1, 2:2, 4:4) qualify, so 2:6 and 6:2 cannot.
# Disaggregated configurations keep the file's batching limits (the grid would double the
# search's time for a topology poolctl does not deploy yet).
SPLITS = (1, 2, 4)
STICKY, LOR = "sticky", "lor"
# A configuration needing more nodes than this for the trace is left out (a TPOT target
# that only near-empty replicas meet would otherwise gallop to thousands).
MAX_NODES = 64


@dataclass(frozen=True)
class Configuration:
    """What the search varies for one placement (the replica count aside)."""

    topology: str
    instance_type: str
    tensor_parallel: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    base_len: int = 0  # the file's max_model_len (a label names a different one)
    balancer: str = LOR  # serving.balancer
    # Disaggregated: GPUs of each side (prefill = decode = tensor_parallel); 0: aggregated.
    split: int = 0

    @property
    def shape(self) -> str:
        """TP for an aggregated replica, P:D for a disaggregated one."""
        return f"{self.split}:{self.split}" if self.split else str(self.tensor_parallel)

    def label(self) -> str:
        how = (f"TP {self.tensor_parallel}" if not self.split
               else f"{self.topology} {self.shape}")
        return (f"{self.instance_type} {how}, seqs {self.max_num_seqs}, "
                f"step {self.max_num_batched_tokens}"
                + ("" if self.max_model_len == self.base_len else
                   f", max_model_len {self.max_model_len:,}")
                + (f", {self.balancer}" if self.balancer != LOR else ""))


@dataclass(frozen=True)
class Candidate:
    """One configuration at one node count, simulated over the whole trace."""

    config: Configuration
    nodes: int
    replicas_per_node: int
    price_per_node_hour_usd: float
    summary: SimSummary
    meets: bool  # every SLO met at or below the utilization target
    # the GPU's factors were fitted to measurements (else: the literature's figures)
    fitted: bool = True

    @property
    def replicas(self) -> int:
        return self.nodes * self.replicas_per_node

    @property
    def cost_per_hour_usd(self) -> float:
        return round(self.nodes * self.price_per_node_hour_usd, 2)

    @property
    def hit_rate(self) -> float | None:
        """The share of prompt tokens the prefix cache served (None: not simulated)."""
        p = self.summary.prefix_cache
        return None if p is None else round(p.hit_rate, 4)

    def key(self) -> tuple[float, float, float, str, int]:
        """Order of preference: cheaper, then faster first token, then faster tokens."""
        s = self.summary
        return (self.cost_per_hour_usd, s.ttft_s.p90 if s.ttft_s.p90 is not None else math.inf,
                s.tpot_s.p90 if s.tpot_s.p90 is not None else math.inf,
                self.config.label(), self.nodes)

    def to_json(self) -> dict[str, Any]:
        s, c = self.summary, self.config
        out: dict[str, Any] = json_safe({
            "topology": c.topology,
            "split": None if not c.split else [c.split, c.split],
            "balancer": c.balancer,
            "prefix_cache_hit_rate": self.hit_rate,
            "instance_type": c.instance_type,
            "tensor_parallel": c.tensor_parallel,
            "max_num_seqs": c.max_num_seqs,
            "max_num_batched_tokens": c.max_num_batched_tokens,
            "max_model_len": c.max_model_len,
            "requests_over_max_model_len": s.requests_over_max_model_len,
            "replicas_per_node": self.replicas_per_node,
            "nodes": self.nodes,
            "replicas": self.replicas,
            "cost_per_hour_usd": self.cost_per_hour_usd,
            "usd_per_1m_output_tokens": s.cost.usd_per_1m_output_tokens,
            "ttft_s": {"p50": s.ttft_s.p50, "p90": s.ttft_s.p90},
            "tpot_s": {"p50": s.tpot_s.p50, "p90": s.tpot_s.p90},
            "goodput": s.slo.goodput,
            "utilization": s.utilization,
            "kwh_per_1m_output_tokens": s.energy.kwh_per_1m_output_tokens,
            "meets_slo": self.meets,
            "fitted": self.fitted,
        })
        return out


@dataclass(frozen=True)
class Outcome:
    """A configuration's evaluation: its candidates, and why it has no passing one."""

    config: Configuration
    candidates: tuple[Candidate, ...]
    ttft_p90_floor_s: float
    tpot_p90_floor_s: float
    p90_prompt_floor_s: float  # the p90 prompt's prefill alone on one idle replica
    reason: str | None = None  # set when no node count meets the SLOs
    served: int = 0  # requests within the configuration's max_model_len


@dataclass(frozen=True)
class Change:
    """One line of poolctl.yaml the choice changes."""

    key: str  # dotted, from the pool: serving.tensor_parallel
    old: str | None  # None: not written in the file (its default applies)
    new: str

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class Sizes:
    """The scaling sizes `--write` gives the choice: its minimum from the recommendation,
    the file's headroom above it (and its warm pool) kept, in nodes."""

    min_replicas: int
    max_replicas: int
    warm_replicas: int
    headroom_nodes: int  # max nodes - min nodes
    warm_nodes: int

    def to_json(self) -> dict[str, Any]:
        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "warm_replicas": self.warm_replicas, "headroom_nodes": self.headroom_nodes,
                "warm_nodes": self.warm_nodes}


def keep_headroom(file_nodes: tuple[int, int, int], rec_nodes: tuple[int, int, int],
                  replicas_per_node: int) -> Sizes:
    """Sizes from the recommendation's (min, max, warm) nodes that keep the file's: the
    recommendation sizes max and warm to this one trace, while a user's max and warm pool
    are for spikes the trace does not show. New min = the recommendation's; new max =
    max(its max, new min + the file's max - min); new warm = max(its warm, the file's)."""
    f_min, f_max, f_warm = file_nodes
    r_min, r_max, r_warm = rec_nodes
    top = max(r_max, r_min + max(0, f_max - f_min))
    warm = max(r_warm, f_warm)
    rpn = replicas_per_node
    return Sizes(r_min * rpn, top * rpn, warm * rpn, top - r_min, warm)


@dataclass(frozen=True)
class SearchResult:
    pool: str
    cloud: Cloud
    configurations: int  # passing the rules
    refused: int  # refused by a rule, not shown
    outcomes: tuple[Outcome, ...]
    front: tuple[Candidate, ...]
    chosen: Candidate | None
    file_config: Configuration
    # What --write applies: the choice, or when it is disaggregated (poolctl does not deploy
    # that yet) the cheapest aggregated candidate meeting the SLOs (None: none does).
    deployable: Candidate | None = None
    recommendation: Recommendation | None = None
    changes: tuple[Change, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
    sizes: Sizes | None = None  # what --write sets scaling and warm_pool to

    @property
    def candidates(self) -> list[Candidate]:
        return [c for o in self.outcomes for c in o.candidates]

    def file_candidate(self) -> Candidate | None:
        """The cheapest passing candidate of the file's own configuration."""
        ok = [c for c in self.candidates if c.config == self.file_config and c.meets]
        return min(ok, key=Candidate.key) if ok else None

    def to_json(self) -> dict[str, Any]:
        return {
            "configurations": self.configurations,
            "refused_by_rules": self.refused,
            "candidates": [c.to_json() for c in sorted(self.candidates, key=Candidate.key)],
            "front": [c.to_json() for c in self.front],
            "chosen": None if self.chosen is None else self.chosen.to_json(),
            "deployable": None if self.deployable is None else self.deployable.to_json(),
            "file": None if (f := self.file_candidate()) is None else f.to_json(),
            "recommendation": None if self.recommendation is None
            else self.recommendation.to_json(),
            "changes": [c.to_json() for c in self.changes],
            "sizes": None if self.sizes is None else self.sizes.to_json(),
            "notes": list(self.notes),
        }


# ------------------------------------------------------------------------ configurations


def file_configuration(pool: Pool, cloud: Cloud) -> Configuration:
    p = pool.placement(cloud)
    assert p is not None  # targets pair a pool with a cloud it has a placement on
    s = pool.serving
    return Configuration(AGGREGATED, p.type_name, s.tensor_parallel, s.max_num_seqs,
                         s.max_num_batched_tokens, s.max_model_len, s.max_model_len,
                         s.balancer)


def variant(pool: Pool, cloud: Cloud, c: Configuration) -> Pool:
    """The pool as `c` configures it (the file's other keys kept)."""
    p = pool.placement(cloud)
    assert p is not None  # targets pair a pool with a cloud it has a placement on
    type_key = "instance_type" if cloud == Cloud.aws else "machine_type"
    update: dict[str, Any] = {type_key: c.instance_type}
    if c.instance_type != p.type_name:
        update["price_per_hour_usd"] = None  # the file's price is its own type's
    serving = pool.serving.model_copy(update={
        "tensor_parallel": c.tensor_parallel, "max_num_seqs": c.max_num_seqs,
        "max_num_batched_tokens": c.max_num_batched_tokens, "max_model_len": c.max_model_len,
        "balancer": c.balancer})
    return pool.model_copy(update={"serving": serving, str(cloud): p.model_copy(update=update)})


def model_lens(base: int, trace: Trace | None) -> list[int]:
    """The file's max_model_len and, when the trace has longer requests, the powers of two
    above it up to the first holding the longest (at most LONGER_LENS of them); the rules
    then keep those the model and the HBM allow."""
    if trace is None or not len(trace):
        return [base]
    longest = max(max(1, i) + max(1, o) for i, o in zip(trace.inputs, trace.outputs,
                                                        strict=True))
    lens = [base]
    n = 1 << base.bit_length()  # the first power of two above base
    while longest > lens[-1] and len(lens) <= LONGER_LENS:
        lens.append(n)
        n *= 2
    return lens


def configurations(cfg: Config, pool: Pool, cloud: Cloud, trace: Trace | None = None
                   ) -> tuple[list[Configuration], int]:
    """Every configuration of the placement the rules accept, and how many they refused."""
    base = file_configuration(pool, cloud)
    seqs = sorted({*MAX_NUM_SEQS, base.max_num_seqs})
    budgets = sorted({*MAX_NUM_BATCHED_TOKENS, base.max_num_batched_tokens})
    names = [r.name for r in load_catalog().instance_types if r.cloud == cloud]
    ok: list[Configuration] = []
    refused = 0
    grid = [(tp, n, b, ln) for tp in TENSOR_PARALLEL for n in seqs for b in budgets
            for ln in model_lens(base.max_model_len, trace)]
    for name in names:
        for tp, n_seqs, budget, length in grid:
            c = Configuration(AGGREGATED, name, tp, n_seqs, budget, length,
                              base.max_model_len, base.balancer)
            v = variant(pool, cloud, c)
            trial = cfg.model_copy(update={"pools": [v if q is pool else q for q in cfg.pools]})
            if errors(run_checks(trial, [Target(v, cloud)])):
                refused += 1
                continue
            ok.append(c)
            if tp in SPLITS and (n_seqs, budget) == (base.max_num_seqs,
                                                     base.max_num_batched_tokens):
                # The rules passed at TP `tp`, so each side of a tp:tp split holds the
                # weights and one max_model_len sequence; topology() says what else refuses.
                # Across nodes only at 4:4: every split's KV crosses the same VPC link, and
                # the smaller splits would cost a configuration's time each.
                for kind in (DISAGG_NODE, DISAGG_CROSS)[:1 if tp != 4 else 2]:
                    d = replace(c, topology=kind, split=tp)
                    try:
                        topology(v, cloud, kind, tp, tp)
                    except UsageError:  # no sourced VPC figure, or a side too small
                        refused += 1
                        continue
                    ok.append(d)
    return ok, refused


# ---------------------------------------------------------------------------- evaluation


def evaluate(pool: Pool, cloud: Cloud, trace: Trace, c: Configuration,
             start_nodes: int = 1, max_usd_per_hour: float = math.inf) -> Outcome:
    """The smallest node count of `c` meeting the SLOs; every count simulated to the end is
    a candidate (counts stopped early, being sure failures, are not). A disaggregated `c`
    runs its split (servingmodel.topology): the floors are its prefill side's (plus the KV
    hand-off) and its decode side's, and fewer replicas share a node. No node count costing
    over `max_usd_per_hour` is tried."""
    v = variant(pool, cloud, c)
    plan = plan_pool(v, cloud)
    topo = None if not c.split else topology(v, cloud, c.topology, c.split, c.split)
    if topo is None:
        m = dec = replica_model(v, cloud)
        rpn = plan.replicas_per_node
        fl = ttft_floor(m, trace)
    else:
        m, dec = topo.prefill, topo.decode
        rpn = plan.gpus_per_node // topo.gpus
        fl = ttft_floor(m, trace, topo.transfer_s)
    tf = tpot_floor_s(dec, trace)
    slo = pool.slo
    price = plan.price_per_node_hour_usd
    is_fitted = fitted(v, cloud)
    seen: dict[int, Candidate] = {}

    def probe(nodes: int) -> SimSummary | None:
        res = run_pool(v, cloud, trace, replicas=nodes * rpn, stop_if_p90_over=slo.ttft_p90_s,
                       topology=topo)
        if res.aborted:
            return None
        s = summary(res, slo.ttft_p90_s, slo.tpot_p90_s)
        seen[nodes] = Candidate(c, nodes, rpn, price, s, judge(s, slo), is_fitted)
        fewer = [n for n in seen if n < nodes and not seen[n].summary.slo.tpot_met]
        if not s.slo.tpot_met and fewer:
            # TPOT is set by each replica's batch, not by the queue: once more nodes stop
            # bringing it down, none will (do not gallop on to MAX_NODES).
            before = seen[max(fewer)].summary.tpot_s.p90
            if before is not None and s.tpot_s.p90 is not None and \
                    s.tpot_s.p90 > 0.99 * before:
                raise _Flat(s.tpot_s.p90)
        return s

    def outcome(reason: str | None) -> Outcome:
        return Outcome(c, tuple(seen[n] for n in sorted(seen)), fl.ttft_p90_floor_s, tf,
                       fl.p90_prompt_floor_s, reason, fl.served)

    limit = MAX_NODES if math.isinf(max_usd_per_hour) else \
        min(MAX_NODES, math.floor(max_usd_per_hour / price + 1e-9))
    if not fl.served:
        return outcome(f"every request is longer than max_model_len {c.max_model_len:,}")
    if limit < 1:
        return outcome(f"one node costs over ${max_usd_per_hour:,.2f}/h, the search's cap "
                       "for it")
    if fl.ttft_p90_floor_s > slo.ttft_p90_s:
        return outcome(f"TTFT p90 floor {fl.ttft_p90_floor_s:.2f} s (the p90 prompt of "
                       f"{fl.p90_prompt:,.0f} tokens prefills in {fl.p90_prompt_floor_s:.2f} s "
                       "alone)")
    if slo.tpot_p90_s is not None and tf > slo.tpot_p90_s:
        return outcome(f"TPOT p90 floor {tf:.4f} s (one sequence decoding alone)")
    try:
        found = smallest_count(probe, lambda s: judge(s, slo), start=start_nodes,
                               limit=limit)
    except _Flat as e:
        return outcome(f"TPOT p90 stays at {e.tpot_s:.4f} s however many nodes serve")
    return outcome(None if found is not None else f"no node count up to {limit} meets "
                   "the SLOs" + ("" if limit == MAX_NODES else
                                f" (${max_usd_per_hour:,.2f}/h, the search's cap for it)"))


class _Flat(Exception):  # noqa: N818 - a signal inside evaluate, never raised out
    def __init__(self, tpot_s: float) -> None:
        self.tpot_s = tpot_s


Evaluator = Callable[[Pool, Cloud, Trace, Configuration, int, float], Outcome]
# One evaluator per topology (evaluate runs each through its Topology).
EVALUATORS: dict[str, Evaluator] = {AGGREGATED: evaluate, DISAGG_NODE: evaluate,
                                    DISAGG_CROSS: evaluate}


def evaluate_group(pool: Pool, cloud: Cloud, trace: Trace, group: list[Configuration],
                   max_usd_per_hour: float = math.inf) -> list[Outcome]:
    """Configurations sharing a type and TP, in order: each starts its node search at the
    previous one's answer (their answers are near), which saves most simulations."""
    out: list[Outcome] = []
    start = 1
    for c in group:
        o = EVALUATORS[c.topology](pool, cloud, trace, c, start, max_usd_per_hour)
        passing = [x.nodes for x in o.candidates if x.meets]
        if passing:
            start = min(passing)
        out.append(o)
    return out


# The worker's copy of what every task shares (set once per worker by the initializer, so a
# task does not pickle the trace again).
_SHARED: dict[str, Any] = {}


def _init_worker(pool: Pool, cloud: Cloud, trace: Trace) -> None:
    # Ctrl-C is the main process's to handle: it stops the workers (a terminal sends SIGINT
    # to the whole process group, and a worker would print its own traceback). The main
    # process blocked SIGINT around the fork; the worker ignores it, then unblocks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _SHARED.update(pool=pool, cloud=cloud, trace=trace)


def _run_group(task: tuple[int, list[Configuration], float]) -> tuple[int, list[Outcome]]:
    i, group, max_usd_per_hour = task
    return i, evaluate_group(_SHARED["pool"], _SHARED["cloud"], _SHARED["trace"], group,
                             max_usd_per_hour)


def _groups(configs: list[Configuration]) -> list[list[Configuration]]:
    groups: dict[tuple[str, str, int, str], list[Configuration]] = {}
    for c in configs:
        groups.setdefault((c.topology, c.instance_type, c.tensor_parallel, c.balancer),
                          []).append(c)
    return list(groups.values())


def evaluate_all(pool: Pool, cloud: Cloud, trace: Trace, configs: list[Configuration],
                 workers: int = 1, progress: Callable[[int, int, str], None] | None = None,
                 max_usd_per_hour: float = math.inf) -> list[Outcome]:
    groups = _groups(configs)
    results: list[list[Outcome] | None] = [None] * len(groups)

    def done(i: int, res: list[Outcome]) -> None:
        results[i] = res
        if progress is not None:
            n = sum(r is not None for r in results)
            g = groups[i][0]
            progress(n, len(groups), f"{g.instance_type} {g.topology} {g.shape} {g.balancer}")

    if workers <= 1 or len(groups) <= 1:
        for i, g in enumerate(groups):
            done(i, evaluate_group(pool, cloud, trace, g, max_usd_per_hour))
    else:
        ctx = multiprocessing.get_context("fork")
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            procs = ctx.Pool(workers, initializer=_init_worker, initargs=(pool, cloud, trace))
        finally:
            # A Ctrl-C meanwhile is delivered here, once the workers exist to be stopped.
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        try:
            # The biggest groups first, so that no worker is left with a long one at the end.
            order = sorted(range(len(groups)), key=lambda i: -len(groups[i]))
            for i, res in procs.imap_unordered(
                    _run_group, [(i, groups[i], max_usd_per_hour) for i in order]):
                done(i, res)
            procs.close()
        except BaseException:
            # Ctrl-C (or a worker's error): stop every worker now rather than wait for the
            # groups they are in; the interrupt goes on to the CLI (exit 130), nothing written.
            procs.terminate()
            raise
        finally:
            procs.join()
    return [o for r in results if r is not None for o in r]


# ------------------------------------------------------------------------ front, choice


def pareto_front(cands: list[Candidate]) -> list[Candidate]:
    """Candidates no other one beats on every count (cost per hour, TTFT p90, TPOT p90: lower
    is better) and strictly on one, cheapest first; a candidate refusing more requests (a
    shorter max_model_len) never beats one refusing fewer. Runs without a TTFT or TPOT figure
    are left out."""
    pts = [c for c in cands if c.summary.ttft_s.p90 is not None
           and c.summary.tpot_s.p90 is not None]

    def vec(c: Candidate) -> tuple[float, float, float, float]:
        s = c.summary
        assert s.ttft_s.p90 is not None and s.tpot_s.p90 is not None  # filtered above
        return (c.cost_per_hour_usd, s.ttft_s.p90, s.tpot_s.p90,
                float(s.requests_over_max_model_len))

    front = []
    for c in pts:
        a = vec(c)
        if not any(all(x <= y for x, y in zip(vec(d), a, strict=True)) and vec(d) != a
                   for d in pts):
            front.append(c)
    # Equal points (same figures): keep the first in preference order.
    uniq: dict[tuple[float, float, float, float], Candidate] = {}
    for c in sorted(front, key=Candidate.key):
        uniq.setdefault(vec(c), c)
    return list(uniq.values())


def choose(cands: list[Candidate], allow_unfitted: bool = False) -> Candidate | None:
    """The cheapest candidate meeting the SLOs, among those refusing the fewest requests for
    max_model_len (serving every request beats a cheaper pool that turns some away). A GPU
    whose factors no measurement fitted is chosen only if no fitted one meets the SLOs, or
    with `allow_unfitted`: its figures are the literature's, not checked against any run."""
    ok = [c for c in cands if c.meets]
    if not allow_unfitted and any(c.fitted for c in ok):
        ok = [c for c in ok if c.fitted]
    if not ok:
        return None
    fewest = min(c.summary.requests_over_max_model_len for c in ok)
    return min((c for c in ok if c.summary.requests_over_max_model_len == fewest),
               key=Candidate.key)


def sizes_for(pool: Pool, cloud: Cloud, chosen: Candidate, rec: Recommendation) -> Sizes:
    """keep_headroom with the file's node counts (its own configuration's replicas per
    node) and the recommendation's (the choice's)."""
    f = plan_pool(pool, cloud).nodes
    rpn = chosen.replicas_per_node
    rec_nodes = (nodes_for(rec.min_replicas, rpn), nodes_for(rec.max_replicas, rpn),
                 nodes_for(rec.warm_replicas, rpn))
    return keep_headroom((f.min, f.max, f.warm), rec_nodes, rpn)


def changes_for(pool: Pool, cloud: Cloud, chosen: Candidate, sizes: Sizes) -> list[Change]:
    """The pool's lines that differ from the choice (sizes: sizes_for's)."""
    p = pool.placement(cloud)
    assert p is not None  # targets pair a pool with a cloud it has a placement on
    c = chosen.config
    type_key = f"{cloud}.{'instance_type' if cloud == Cloud.aws else 'machine_type'}"
    fields = [
        (type_key, p.type_name, c.instance_type),
        ("serving.tensor_parallel", pool.serving.tensor_parallel, c.tensor_parallel),
        ("serving.max_num_seqs", pool.serving.max_num_seqs, c.max_num_seqs),
        ("serving.max_num_batched_tokens", pool.serving.max_num_batched_tokens,
         c.max_num_batched_tokens),
        ("serving.max_model_len", pool.serving.max_model_len, c.max_model_len),
        ("serving.balancer", pool.serving.balancer, c.balancer),
        ("scaling.min_replicas", pool.scaling.min_replicas, sizes.min_replicas),
        ("scaling.max_replicas", pool.scaling.max_replicas, sizes.max_replicas),
        ("warm_pool.replicas", pool.warm_pool.replicas, sizes.warm_replicas),
    ]
    return [Change(k, str(old), str(new)) for k, old, new in fields if old != new]


def infeasible(pool: Pool, cloud: Cloud, trace: Trace, outcomes: list[Outcome]) -> str:
    """The one line for a search where no candidate meets the SLOs: the binding floor with
    its numbers, and the nearest SLO some candidate meets, with its cost."""
    slo = pool.slo
    tpot = f", slo.tpot_p90_s {slo.tpot_p90_s:g} s" if slo.tpot_p90_s is not None else ""
    head = (f"{pool.name}/{cloud}: no configuration meets slo.ttft_p90_s {slo.ttft_p90_s:g} s"
            f"{tpot} on {trace.source} ({len(outcomes)} configurations searched)")
    if not outcomes:
        return head + "; every configuration was refused by a rule (run `poolctl validate`)"
    outcomes = [o for o in outcomes if o.served] or outcomes
    fast = min(outcomes, key=lambda o: (o.ttft_p90_floor_s, o.config.label()))
    served = ttft_floor(replica_model(variant(pool, cloud, fast.config), cloud), trace)
    parts = [f"its p90 prompt is {served.p90_prompt:,.0f} tokens and the fastest prefill of "
             f"any candidate ({fast.config.label()}) takes {fast.p90_prompt_floor_s:.2f} s "
             f"for it, so the lowest TTFT p90 possible is {fast.ttft_p90_floor_s:.2f} s"]
    if slo.tpot_p90_s is not None:
        dec = min(outcomes, key=lambda o: (o.tpot_p90_floor_s, o.config.label()))
        parts.append(f"the fastest decode ({dec.config.label()}) allows a TPOT p90 of "
                     f"{dec.tpot_p90_floor_s:.4f} s at best")
    near = nearest_met(pool, cloud, trace, fast, outcomes)
    if near is not None:
        ns = near.summary
        parts.append(f"the nearest SLO met is slo.ttft_p90_s {ns.slo.ttft_p90_s:g} s"
                     + (f", slo.tpot_p90_s {ns.slo.tpot_p90_s:g} s" if ns.slo.tpot_p90_s
                        is not None else "")
                     + f": {near.nodes} node(s) of {near.config.label()} at "
                     f"${near.cost_per_hour_usd:,.2f}/h (TTFT p90 {ns.ttft_s.p90} s)")
    if served.over_max_model_len:
        parts.append(f"{served.over_max_model_len:,} requests longer than max_model_len "
                     f"{fast.config.max_model_len:,} are refused")
    return head + ": " + "; ".join(parts)


def nearest_met(pool: Pool, cloud: Cloud, trace: Trace, fast: Outcome,
                outcomes: list[Outcome]) -> Candidate | None:
    """The fastest-prefilling configuration under SLOs loosened to a quarter above the
    floors (rounded up to 10 ms, 1 ms for TPOT): the nearest SLO that can be met, with the
    nodes it takes."""
    slo = pool.slo
    ttft = max(slo.ttft_p90_s, math.ceil(fast.ttft_p90_floor_s * 1.25 * 100) / 100)
    tpot = slo.tpot_p90_s
    if tpot is not None:
        floor = min(o.tpot_p90_floor_s for o in outcomes)
        tpot = max(tpot, math.ceil(max(floor, fast.tpot_p90_floor_s) * 1.25 * 1000) / 1000)
    loose = pool.model_copy(update={"slo": slo.model_copy(update={"ttft_p90_s": ttft,
                                                                  "tpot_p90_s": tpot})})
    o = EVALUATORS[fast.config.topology](loose, cloud, trace, fast.config, 1, math.inf)
    return choose(list(o.candidates))


def search(cfg: Config, pool: Pool, cloud: Cloud, trace: Trace, workers: int = 1,
           progress: Callable[[int, int, str], None] | None = None,
           allow_unfitted: bool = False) -> SearchResult:
    """Evaluate every configuration of the placement on `trace`; the front, the choice, and
    the file's lines it changes. No configuration meeting the SLOs: OperationFailed."""
    configs, refused = configurations(cfg, pool, cloud, trace)
    agg = [c for c in configs if c.topology == AGGREGATED]
    outcomes = evaluate_all(pool, cloud, trace, agg, workers, progress)
    cands = [c for o in outcomes for c in o.candidates]
    # Disaggregated configurations after the aggregated ones, at no more than the priciest
    # aggregated point on the front costs: above it they would be on the front only by being
    # faster than all (and the node counts they gallop through there dominate the time).
    cap = max((c.cost_per_hour_usd for c in pareto_front(cands)), default=math.inf)
    outcomes += evaluate_all(pool, cloud, trace, [c for c in configs if c not in agg],
                             workers, progress, cap)
    cands = [c for o in outcomes for c in o.candidates]
    if trace.blocks is not None and pool.serving.prefix_caching:
        # The other balancer for the front's configurations only: routing changes the
        # prefix-cache hits, not which configurations are worth it (and twice the grid
        # would double the search's time).
        other = LOR if pool.serving.balancer == STICKY else STICKY
        seen: set[Configuration] = set()
        alt = []
        for c in pareto_front(cands) + ([x] if (x := choose(cands, allow_unfitted)) else []):
            if c.config not in seen:
                seen.add(c.config)
                alt.append(replace(c.config, balancer=other))
        more = evaluate_all(pool, cloud, trace, alt, workers, progress)
        outcomes += more
        cands += [c for o in more for c in o.candidates]
    chosen = choose(cands, allow_unfitted)
    fl = ttft_floor(replica_model(pool, cloud), trace)
    if chosen is None and not fl.served and all(o.served == 0 for o in outcomes):
        raise too_long(pool, cloud, trace, fl, trace.source)
    if chosen is None:
        raise OperationFailed(infeasible(pool, cloud, trace, outcomes))
    deployable = (chosen if chosen.config.topology == AGGREGATED else
                  choose([c for c in cands if c.config.topology == AGGREGATED], allow_unfitted))
    front = tuple(pareto_front(cands))
    if deployable is None:
        return SearchResult(
            pool=pool.name, cloud=cloud, configurations=len(configs), refused=refused,
            outcomes=tuple(outcomes), front=front, chosen=chosen,
            file_config=file_configuration(pool, cloud))
    rec = recommend(variant(pool, cloud, deployable.config), cloud, trace,
                    start_replicas=deployable.replicas)
    sizes = sizes_for(pool, cloud, deployable, rec)
    return SearchResult(
        pool=pool.name, cloud=cloud, configurations=len(configs), refused=refused,
        outcomes=tuple(outcomes), front=front, chosen=chosen,
        file_config=file_configuration(pool, cloud), deployable=deployable,
        recommendation=rec, changes=tuple(changes_for(pool, cloud, deployable, sizes)),
        sizes=sizes,
    )
