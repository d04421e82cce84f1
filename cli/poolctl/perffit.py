"""Fit the serving model's factors to `vllm bench serve --save-result` files (`perf fit`).

A result file is one JSON object (or, with `--append-result`, one per line) as vLLM's
benchmarks/serve.py writes it: `num_prompts`, `request_rate` (a number or "inf"),
`burstiness`, `max_concurrency`, `completed`, `total_input_tokens`, `total_output_tokens`,
`mean_/median_/p<P>_{ttft,tpot}_ms`, `--metadata KEY=VALUE` pairs at the top level
(`tensor_parallel_size`), and with `--save-detailed` per-request `input_lens`,
`output_lens`. Each run is replayed through the simulator on one replica as the benchmark
drove it (a closed loop of `max_concurrency` clients, or arrivals at the request rate), and
least squares on the log ratio of the TTFT and TPOT statistics fits prefill_mfu, decode_mbu,
step_overhead_ms and decode_us_per_seq. A weak pull towards the starting factors keeps a
factor the runs cannot see (say, the per-sequence cost from one batch size) where it was.

A deployed pool is its own benchmark (`perf fit --pool`, runtime/livefit.py): what its
engines served over a window, read back from their histograms, becomes an open-loop run
(`open_loop`) fitted the same way.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from poolctl.errors import UsageError, shown
from poolctl.servingmodel import ReplicaModel
from poolctl.simulate import percentile, simulate
from poolctl.traces import Trace, synthetic

FIT = ("prefill_mfu", "decode_mbu", "step_overhead_ms", "decode_us_per_seq")
METRICS = ("ttft", "tpot")
STATS = ("mean", "median", "p90")  # fitted; p99 is too noisy to fit to
TP_KEYS = ("tensor_parallel_size", "tp", "tensor_parallel")
PRIOR = 1e-4  # weight of the pull towards the starting factors, per factor scale
# A run is replayed on its first 500 requests: a closed loop's statistics settle within a
# few hundred, and the fit replays each run some 500 times.
MAX_PROMPTS = 500
# Client and front-end time between a closed-loop client's send and the engine seeing the
# request, drawn per request (simulate's send_jitter_s): HTTP, the API server's
# tokenization and its hand-off to the engine core process.
SEND_JITTER_S = 0.005


@dataclass(frozen=True)
class Run:
    """One benchmark run: the workload as replayed, and its measured statistics (s)."""

    label: str
    tp: int
    model_id: str | None
    concurrency: int | None  # max_concurrency; None: open loop
    rate: float  # requests/s; inf: all at once
    burstiness: float
    inputs: list[int]
    outputs: list[int]
    measured: dict[str, float]  # "ttft_mean" -> seconds
    # vLLM's --ramp-up-strategy: (linear | exponential, start rps, end rps); None: `rate`
    ramp: tuple[str, float, float] | None = None
    failed: int = 0  # requests that failed (vLLM's statistics cover the completed ones)
    completed: int = 0  # as the result says (`inputs` holds at most MAX_PROMPTS of them)


# The bounds of a plausible benchmark (vLLM's benchmark writes nothing outside them): a
# count past them is a corrupt or hand-made file, which the fit would turn into factors.
MAX_REQUESTS = 10_000_000
MAX_TOKENS = 10_000_000  # per request
MAX_LATENCY_MS = 86_400_000.0  # a day
MIN_RATE, MAX_RATE = 1e-3, 1e6  # requests/s
MIN_BURST, MAX_BURST = 1e-2, 1e3
MAX_SPAN_S = 31 * 86_400  # as a trace (traces.MAX_SPAN_S)


def _num(obj: dict[str, object], key: str, where: str, lo: float = -math.inf,
         hi: float = math.inf, whole: bool = False) -> float:
    """obj[key] as a finite number from `lo` to `hi` (a whole one with `whole`); one line
    naming the key otherwise. Booleans are no numbers here (JSON's true is not 1)."""
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise UsageError(f"{where}: `{key}` missing or not a number (a `vllm bench serve "
                         "--save-result` file has it); give that file")
    if not lo <= v <= hi or (whole and v != int(v)):
        kind = "a whole number" if whole else "a number"
        raise UsageError(f"{where}: `{key}` is {v:g}; vLLM's benchmark writes {kind} from "
                         f"{lo:g} to {hi:g} there; give the file it wrote")
    return float(v)


def parse_results(text: str, source: str, default_tp: int | None = None) -> list[Run]:
    """The runs in a result file: one JSON object, or one per line (--append-result)."""
    try:
        objs = [json.loads(text)]
    except RecursionError:
        raise UsageError(f"{source}: JSON nested too deeply for a benchmark result; give the "
                         "file `vllm bench serve --save-result` wrote") from None
    except json.JSONDecodeError:
        objs = []  # one object a line (--append-result), each line parsed below
        for n, line in enumerate(text.splitlines(), 1):
            try:
                objs += [json.loads(line)] if line.strip() else []
            except (json.JSONDecodeError, RecursionError) as e:
                msg = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply"
                raise UsageError(f"{source}:{n}: not JSON ({msg}); give the file `vllm "
                                 "bench serve --save-result` wrote") from None
    if len(objs) == 1 and isinstance(objs[0], list):
        objs = objs[0] or [None]
    if not objs or not all(isinstance(o, dict) for o in objs):
        raise UsageError(f"{source}: no benchmark result object; give the file "
                         "`vllm bench serve --save-result` wrote")
    runs = [_run(o, f"{source} (run {i + 1})" if len(objs) > 1 else source, default_tp)
            for i, o in enumerate(objs)]
    # Labels key the errors: number them so that runs of one label stay apart.
    return [replace(r, label=f"{i + 1}: {r.label}") for i, r in enumerate(runs)]


def _run(o: dict[str, object], where: str, default_tp: int | None) -> Run:
    if o.get("completed") == 0:
        raise UsageError(f"{where}: `completed` is 0: no request finished to fit to")
    completed = int(_num(o, "completed", where, 1, MAX_REQUESTS, whole=True))
    if o.get("num_prompts") is not None:
        prompts = _num(o, "num_prompts", where, 1, MAX_REQUESTS, whole=True)
        if completed > prompts:
            raise UsageError(f"{where}: `completed` is {completed:,} of {prompts:,.0f} "
                             "`num_prompts`; a run completes at most the prompts it sent")
    tp_key = next((k for k in TP_KEYS if k in o), None)
    if tp_key is None and default_tp is None:
        raise UsageError(f"{where}: `tensor_parallel_size` unknown; benchmark with "
                         "`--metadata tensor_parallel_size=N` or pass --tp N")
    tp = float(default_tp or 1) if tp_key is None else (
        _int_str(o, tp_key, where) if isinstance(o[tp_key], str) else _num(o, tp_key, where))
    if tp not in (1, 2, 4, 8):
        raise UsageError(f"{where}: `{tp_key}` is {tp:g}; poolctl serves TP 1, 2, 4 or 8")
    rate_raw = o.get("request_rate", "inf")
    rate = math.inf if rate_raw in ("inf", None) else _num(o, "request_rate", where,
                                                             MIN_RATE, MAX_RATE)
    if min(completed, MAX_PROMPTS) / rate > MAX_SPAN_S:
        raise UsageError(f"{where}: `request_rate` {rate:g}/s sends the run's requests over "
                         f"more than {MAX_SPAN_S // 86_400} days; give the file the benchmark "
                         "wrote")
    ramp = None
    strategy = o.get("ramp_up_strategy")
    if strategy not in (None, ""):
        if strategy not in ("linear", "exponential"):
            raise UsageError(f"{where}: `ramp_up_strategy` is {shown(strategy)}; vLLM writes "
                             "linear or exponential")
        ramp = (str(strategy), _num(o, "ramp_up_start_rps", where, MIN_RATE, MAX_RATE),
                _num(o, "ramp_up_end_rps", where, MIN_RATE, MAX_RATE))
    failed = (int(_num(o, "failed", where, 0, MAX_REQUESTS, whole=True))
              if o.get("failed") is not None else 0)
    conc = o.get("max_concurrency")
    concurrency = None if conc is None else int(_num(o, "max_concurrency", where, 1,
                                                      MAX_REQUESTS, whole=True))
    burst = (_num(o, "burstiness", where, MIN_BURST, MAX_BURST)
             if o.get("burstiness") is not None else 1.0)
    if "input_lens" in o and "output_lens" in o:
        ins, outs = o["input_lens"], o["output_lens"]
        if (not isinstance(ins, list) or not isinstance(outs, list) or len(ins) != len(outs)
                or not all(isinstance(x, int) and not isinstance(x, bool)
                           and 0 <= x <= MAX_TOKENS for x in ins + outs)):
            raise UsageError(f"{where}: `input_lens`/`output_lens` must be lists of token "
                             f"counts (0 to {MAX_TOKENS:,}) of the same length")
        pairs = [(i, n) for i, n in zip(ins, outs, strict=True) if n > 0][:MAX_PROMPTS]
        if not pairs:
            raise UsageError(f"{where}: `output_lens` has no request with an output token; "
                             "nothing to fit to")
        inputs, outputs = [p[0] for p in pairs], [p[1] for p in pairs]
    else:
        n = min(completed, MAX_PROMPTS)
        i_mean = _num(o, "total_input_tokens", where, 0, MAX_TOKENS * completed,
                      whole=True) / completed
        o_mean = _num(o, "total_output_tokens", where, 1, MAX_TOKENS * completed,
                      whole=True) / completed
        inputs, outputs = [round(i_mean)] * n, [max(1, round(o_mean))] * n
    measured = {}
    for metric in METRICS:
        for stat in STATS:
            key = f"{stat}_{metric}_ms" if stat != "p90" else f"p90_{metric}_ms"
            if key in o:
                v = o[key]
                if v == 0 or (isinstance(v, int | float) and not isinstance(v, bool)
                              and v < 0):
                    raise UsageError(f"{where}: `{key}` is {v}; a measured latency is "
                                     "positive; give the file the benchmark wrote")
                measured[f"{metric}_{stat}"] = _num(o, key, where, 1e-6, MAX_LATENCY_MS) / 1000
    for need in ("ttft_mean", "tpot_mean"):
        if need not in measured:
            metric = need.split("_")[0]
            raise UsageError(f"{where}: `mean_{metric}_ms` missing; run the benchmark with "
                             "--percentile-metrics ttft,tpot")
    label = str(o.get("label") or o.get("date") or "")
    model_id = o.get("model_id")
    return Run(label, int(tp), model_id if isinstance(model_id, str) else None, concurrency,
               math.inf if ramp else rate, burst, inputs, outputs, measured, ramp, failed,
               completed)


def _int_str(o: dict[str, object], key: str, where: str) -> float:
    try:
        return float(int(str(o[key])))
    except ValueError:
        raise UsageError(f"{where}: `{key}` is {o[key]!r}, not a whole number") from None


def open_loop(label: str, tp: int, rate: float, prompt: float, output: float,
              measured: dict[str, float], seed: int = 0) -> Run:
    """A run of what one replica of a live pool served (`perf fit --pool`): Poisson arrivals
    at its share of the pool's rate, exponential lengths around the observed means (as
    status's prediction takes them), MAX_PROMPTS requests; `measured` its statistics: the
    means of TTFT and TPOT, which the histograms' sums give exactly (their percentiles are
    blurred by the buckets, and a replay read through them moves in steps that a least
    squares fit cannot follow)."""
    span = MAX_PROMPTS / rate
    t = synthetic(rate, span * 1.5, seed, prompt, output)  # a few more than MAX_PROMPTS
    n = min(MAX_PROMPTS, len(t.arrivals))
    return Run(label, tp, None, None, rate, 1.0, t.inputs[:n], t.outputs[:n], measured)


@dataclass(frozen=True)
class StepRatio:
    """How much longer (x) the fitted model's steps are than the current one's, at a load:
    one prompt of `prompt` tokens prefilled alone, one decode step of `batch` sequences of
    `context` tokens each."""

    prompt: int
    prefill: float
    batch: int
    context: int
    decode: float


def step_ratio(before: ReplicaModel, after: ReplicaModel, prompt: float, output: float,
               batch: float) -> StepRatio:
    p, b = max(1, round(prompt)), max(1, round(batch))
    ctx = max(1, round(prompt + output / 2))
    return StepRatio(p, after.ttft_floor_s(p) / before.ttft_floor_s(p), b, ctx,
                     after.decode_step_s(b, ctx) / before.decode_step_s(b, ctx))


# ---------------------------------------------------------------------- the forward model


def ramp_arrivals(ramp: tuple[str, float, float], n: int, burstiness: float, seed: int = 0
                  ) -> list[float]:
    """vLLM's sends under --ramp-up-strategy (benchmarks/serve.py, get_request): request i at
    the rate start + (end - start) x i / (n - 1) (linear) or start x (end / start) ^ (i /
    (n - 1)) (exponential), its interval gamma of shape `burstiness` and mean 1 / that rate;
    not rescaled afterwards (vLLM rescales only a run without a ramp)."""
    strategy, start, end = ramp
    rng, t, out = random.Random(seed), 0.0, []
    for i in range(n):
        progress = i / max(n - 1, 1)
        rate = (start + (end - start) * progress if strategy == "linear"
                else start * (end / start) ** progress)
        t += (1 / rate if math.isinf(burstiness)
              else rng.gammavariate(burstiness, 1 / (rate * burstiness)))
        out.append(t)
    return out


def replay(rm: ReplicaModel, run: Run, seed: int = 0) -> dict[str, float]:
    """The statistics `run` would measure on replica `rm` (seconds), as vLLM's benchmark
    computes them: TTFT from the request's send, TPOT = (latency - TTFT) / (output - 1)."""
    n = len(run.inputs)
    if run.ramp is not None:
        arrivals = ramp_arrivals(run.ramp, n, run.burstiness, seed)
    elif math.isinf(run.rate):
        arrivals = [0.0] * n
    else:
        # vLLM's arrivals: gamma intervals of shape `burstiness`, mean 1 / rate
        rng, t, arrivals = random.Random(seed), 0.0, []
        for _ in range(n):
            t += rng.gammavariate(run.burstiness, 1 / (run.rate * run.burstiness))
            arrivals.append(t)
        # ... rescaled, as vLLM does, so that the last is sent at n / rate
        if arrivals[-1] > 0:
            k = n / run.rate / arrivals[-1]
            arrivals = [a * k for a in arrivals]
        else:  # every interval drawn as 0 (a tiny shape): evenly spread instead
            arrivals = [(i + 1) / run.rate for i in range(n)]
    # The client's semaphore (--max-concurrency) as a closed loop: a request is sent when
    # one of the clients is free, and TTFT counts from that send, so the time it then waits
    # inside the engine (for KV room, a sequence slot or the step's token budget) is in it,
    # as in what the benchmark measured.
    trace = Trace(run.label, arrivals, run.inputs, run.outputs)
    r = simulate(trace, rm, replicas=1, balancer="queue", clients=run.concurrency,
                 send_jitter_s=SEND_JITTER_S if run.concurrency is not None else 0.0,
                 seed=seed).req
    sent = r.sent if run.concurrency is not None else r.arrival
    ttft, tpot = [], []
    for i in range(n):
        if r.first[i] != r.first[i]:  # NaN: never served (refused)
            continue
        ttft.append(r.first[i] - sent[i])
        if run.outputs[i] > 1:
            tpot.append((r.finish[i] - r.first[i]) / (run.outputs[i] - 1))
    if not ttft:
        raise UsageError(f"run {run.label}: every request is longer than the pool's "
                         f"serving.max_model_len {rm.max_model_len:,} (prompt + output) or its "
                         "KV cache; fit a pool that can serve them")
    out: dict[str, float] = {}
    for metric, xs in (("ttft", ttft), ("tpot", tpot)):
        if not xs:
            continue
        xs.sort()
        out[f"{metric}_mean"] = sum(xs) / len(xs)
        # numpy's default (linear) percentile, as vLLM's benchmark takes it; xs is not empty
        out[f"{metric}_median"] = percentile(xs, 0.5) or 0.0
        out[f"{metric}_p90"] = percentile(xs, 0.9) or 0.0
    return out


# ---------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class Fit:
    factors: dict[str, float]  # FIT's names, in the config's units (ms, us)
    errors: dict[str, dict[str, float]]  # run label -> "ttft_mean" -> model / measured - 1
    before: dict[str, dict[str, float]]  # the same with the starting factors


def with_fit(rm: ReplicaModel, factors: dict[str, float]) -> ReplicaModel:
    """`rm` with a Fit's factors."""
    return _apply(rm, [factors[k] for k in FIT])


def _apply(rm: ReplicaModel, x: list[float]) -> ReplicaModel:
    return replace(rm, prefill_mfu=x[0], decode_mbu=x[1], overhead_s=x[2] / 1000,
                   per_seq_s=x[3] / 1e6)


def _start(rm: ReplicaModel) -> list[float]:
    return [rm.prefill_mfu, rm.decode_mbu, rm.overhead_s * 1000, rm.per_seq_s * 1e6]


# The factors' ranges (the config's bounds, MFU and MBU at most 1) and their scales for the
# pull and the simplex: MFU/MBU in 0.1, overhead in ms, per-seq in 10 us.
LO, HI = (0.01, 0.01, 0.0, 0.0), (1.0, 1.0, 50.0, 1000.0)
SCALE = (0.1, 0.1, 1.0, 10.0)


def _errors(models: list[ReplicaModel], runs: list[Run]) -> dict[str, dict[str, float]]:
    out = {}
    for m, run in zip(models, runs, strict=True):
        got = replay(m, run)
        out[run.label] = {k: got[k] / v - 1 for k, v in run.measured.items() if k in got and v > 0}
    return out


def fit(replicas: list[ReplicaModel], runs: list[Run], evaluations: int = 300) -> Fit:
    """Least squares on log(model / measured) over every run's statistics, with the pull
    towards the start; `replicas[i]` is run i's replica (its TP) with the start factors.

    Nelder-Mead over the scaled factors first (an open-loop replay's statistics jump when a
    step boundary passes an arrival, which misleads derivatives, not a simplex), then
    Levenberg-Marquardt from its end: step overhead and MBU trade against each other in a
    long narrow valley that a simplex walks slowly."""
    x0 = _start(replicas[0])

    def factors(z: list[float]) -> list[float]:
        return [min(HI[j], max(LO[j], x0[j] + z[j] * SCALE[j])) for j in range(len(z))]

    def residuals(z: list[float]) -> list[float]:
        x = factors(z)
        res = [PRIOR * v for v in z]
        for rm, run in zip(replicas, runs, strict=True):
            got = replay(_apply(rm, x), run)
            for k, v in run.measured.items():
                if k in got and v > 0 and got[k] > 0:
                    res.append(math.log(got[k] / v))
        return res

    def cost(z: list[float]) -> float:
        return sum(v * v for v in residuals(z))

    z = _nelder_mead(cost, [0.0] * len(x0), step=1.0, evaluations=evaluations)
    z = _levenberg_marquardt(residuals, z)
    # four significant digits: what the file gets, and what the errors below are of
    x = [float(f"{v:.4g}") for v in factors(z)]
    fitted = [_apply(rm, x) for rm in replicas]
    names = dict(zip(FIT, x, strict=True))
    return Fit(names, _errors(fitted, runs), _errors(replicas, runs))


def _levenberg_marquardt(residuals: Callable[[list[float]], list[float]], z: list[float],
                         iterations: int = 40) -> list[float]:
    """Damped Gauss-Newton with forward differences; keeps a step only when it lowers the
    sum of squares."""
    n = len(z)
    r = residuals(z)
    cost, lam = sum(v * v for v in r), 1e-2
    for _ in range(iterations):
        jac = []
        for j in range(n):
            zp = list(z)
            zp[j] += 1e-4
            jac.append([(a - b) / 1e-4 for a, b in zip(residuals(zp), r, strict=True)])
        a = [[sum(x * y for x, y in zip(jac[i], jac[j], strict=True)) for j in range(n)]
             for i in range(n)]
        g = [sum(x * y for x, y in zip(jac[i], r, strict=True)) for i in range(n)]
        for _ in range(8):
            damped = [[a[i][j] + (lam * (a[i][i] + 1e-12) if i == j else 0.0)
                       for j in range(n)] for i in range(n)]
            dz = _solve(damped, [-v for v in g])
            zn = [z[j] + dz[j] for j in range(n)]
            rn = residuals(zn)
            cn = sum(v * v for v in rn)
            if cn < cost:
                z, r, lam = zn, rn, lam / 3
                done = cost - cn < 1e-16
                cost = cn
                break
            lam *= 4
        else:
            break
        if done:
            break
    return z


def _nelder_mead(f: Callable[[list[float]], float], x0: list[float], step: float,
                 evaluations: int) -> list[float]:
    """The textbook simplex (reflection 1, expansion 2, contraction 1/2, shrink 1/2),
    restarted twice from its best point, smaller, so that a collapsed simplex opens again."""
    best = x0
    for _ in range(3):
        n = len(best)
        pts = [best] + [[v + (step if i == j else 0.0) for j, v in enumerate(best)]
                        for i in range(n)]
        vals = [f(p) for p in pts]
        used = n + 1
        while used < evaluations // 3:
            order = sorted(range(n + 1), key=vals.__getitem__)
            pts, vals = [pts[i] for i in order], [vals[i] for i in order]
            if vals[-1] - vals[0] < 1e-14:
                break
            c = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
            r = [c[j] + (c[j] - pts[-1][j]) for j in range(n)]
            fr = f(r)
            used += 1
            if fr < vals[0]:
                e = [c[j] + 2 * (c[j] - pts[-1][j]) for j in range(n)]
                fe = f(e)
                used += 1
                pts[-1], vals[-1] = (e, fe) if fe < fr else (r, fr)
            elif fr < vals[-2]:
                pts[-1], vals[-1] = r, fr
            else:
                k = [c[j] + 0.5 * (pts[-1][j] - c[j]) for j in range(n)]
                fk = f(k)
                used += 1
                if fk < vals[-1]:
                    pts[-1], vals[-1] = k, fk
                else:
                    pts = [pts[0]] + [[pts[0][j] + 0.5 * (p[j] - pts[0][j]) for j in range(n)]
                                      for p in pts[1:]]
                    vals = [vals[0]] + [f(p) for p in pts[1:]]
                    used += n
        best = pts[min(range(n + 1), key=vals.__getitem__)]
        step *= 0.3
    return best


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda i: abs(m[i][c]))
        m[c], m[p] = m[p], m[c]
        if abs(m[c][c]) < 1e-300:
            return [0.0] * n
        for i in range(c + 1, n):
            f = m[i][c] / m[c][c]
            for j in range(c, n + 1):
                m[i][j] -= f * m[c][j]
    out = [0.0] * n
    for i in reversed(range(n)):
        out[i] = (m[i][n] - sum(m[i][j] * out[j] for j in range(i + 1, n))) / m[i][i]
    return out
