"""`poolctl replay`: a trace's requests sent to a serving endpoint at their arrival times, and
what a client saw.

Open loop, as users arrive: request i is sent at its arrival time (divided by `speed`),
whatever the earlier ones are doing, concurrency unbounded unless capped. Each is a streamed
`/v1/completions` request whose prompt is a list of token ids of the trace's prompt length (so
a real vLLM server counts exactly the trace's tokens, with no tokenizer in between) and whose
`max_tokens` is the trace's output length with `ignore_eos` (so it generates all of them), as
`vllm bench serve` sends them. A trace with prefix-cache block ids (Mooncake) gives two
requests the same leading token ids where their blocks agree, so a prefix cache finds what the
trace says it would.

Measured per request: TTFT from the send to the first streamed token, end-to-end to the last,
TPOT = (end-to-end - TTFT) / (output tokens - 1) as vLLM's benchmark computes it, and the
error kind of a request that failed. Times are pool time: measured wall time x `speed`.

The overhead: a server that streams (vLLM, the sandbox's engine) sends the response headers
when it admits the request, before any token, so the time from the send to the headers is
one round trip through the client, the network and the load balancer with no engine time in
it; the first token pays that round trip once more. Its median, x `speed`, is the share of
the reported TTFT that is not the pool's: real overhead, magnified by the speed (at speed 10,
2 ms of HTTP reads as 20 ms of pool time). Each request's TTFT less its own round trip
(`server_ttft_s`) is the pool's part as the client timed it: what the engines' histograms,
and `status` from them, measure.
"""

from __future__ import annotations

import asyncio
import csv
import json
import signal
import ssl
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from poolctl.simulate import Quantiles, SloResult, percentile
from poolctl.traces import Trace

# Token ids the prompts are made of: well inside every vocabulary, clear of special tokens.
TOKEN_BASE = 1000
TOKEN_SPAN = 30000
PROGRESS_EVERY_S = 2.0


@dataclass
class Outcome:
    """One request as the client saw it; times in pool seconds from its send."""

    index: int
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    headers_s: float | None = None  # send -> the response's headers (one round trip)
    error: str | None = None  # its kind, e.g. "http 503", "connect", "timeout"
    # When the client sent it, pool s from the replay's start: its arrival, or later when
    # the client's loop was busy (a machine short of CPU sends in bursts).
    sent_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None

    @property
    def server_ttft_s(self) -> float | None:
        """TTFT less this request's own round trip to the response headers: the pool's part
        of it as the client timed it (what the engines' TTFT histograms measure, from their
        receipt of the request), with the path counted out instead of magnified by speed."""
        if not self.ok or self.ttft_s is None or self.headers_s is None:
            return None
        return max(0.0, self.ttft_s - self.headers_s)

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass
class ReplayRun:
    """Every request sent (and those not sent when interrupted), and the run's wall time."""

    url: str
    model: str
    speed: float
    trace_s: float  # the slice's length, pool seconds
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0
    interrupted: bool = False
    not_sent: int = 0


@dataclass(frozen=True)
class ReplayReport:
    """What `replay` prints (`--json`: `to_json`)."""

    requests: int
    completed: int
    errors: dict[str, int]
    not_sent: int
    interrupted: bool
    ttft_s: Quantiles
    tpot_s: Quantiles
    e2e_s: Quantiles
    goodput: float | None  # share of sent requests meeting the SLOs (None: no SLO given)
    output_tokens_per_s: float
    speed: float
    wall_s: float
    # the median round trip to the response headers (pool s), and its share of TTFT p90
    overhead_s: float | None = None
    overhead_share: float | None = None
    # how late the client sent its requests (p90 of sent - arrival, pool s): a busy client
    send_lag_s: float | None = None
    # TTFT less each request's round trip to its headers (Outcome.server_ttft_s)
    server_ttft_s: Quantiles | None = None
    # the pool's SLOs judged on what the client saw, as simulate judges its own (None: none)
    slo: SloResult | None = None

    def to_json(self) -> dict[str, object]:
        def q(x: Quantiles) -> dict[str, float | None]:
            return {"p50": x.p50, "p90": x.p90, "p99": x.p99}

        slo = self.slo
        return {"requests": self.requests, "completed": self.completed,
                "failed": self.failed, "errors": self.errors, "not_sent": self.not_sent,
                "interrupted": self.interrupted, "ttft_s": q(self.ttft_s),
                "tpot_s": q(self.tpot_s), "e2e_s": q(self.e2e_s), "goodput": self.goodput,
                "output_tokens_per_s": self.output_tokens_per_s, "speed": self.speed,
                "wall_s": self.wall_s, "overhead_s": self.overhead_s,
                "overhead_share": self.overhead_share, "send_lag_s": self.send_lag_s,
                "server_ttft_s": None if self.server_ttft_s is None else q(self.server_ttft_s),
                "slo": {"ttft_p90_s": slo.ttft_p90_s if slo else None,
                        "tpot_p90_s": slo.tpot_p90_s if slo else None,
                        "met": slo.met if slo else None,
                        "goodput": slo.goodput if slo else None,
                        "ttft_met": slo.ttft_met if slo else None,
                        "tpot_met": slo.tpot_met if slo else None}}

    @property
    def failed(self) -> int:
        """Requests sent that did not complete (each counted once in `errors`, by kind)."""
        return sum(self.errors.values())


def prompt_ids(trace: Trace, i: int) -> list[int]:
    """Request i's prompt as token ids: by its block ids where the trace has them, else
    unique to the request (its first two tokens encode i) so no prefix cache finds it."""
    n = trace.inputs[i]
    if trace.blocks is not None and trace.blocks[i]:
        ids: list[int] = []
        for b in trace.blocks[i]:
            ids += [TOKEN_BASE + b % TOKEN_SPAN] * trace.block_tokens
            if len(ids) >= n:
                break
        ids += [TOKEN_BASE] * (n - len(ids))
        return ids[:n]
    head = [TOKEN_BASE + (i // TOKEN_SPAN) % TOKEN_SPAN, TOKEN_BASE + i % TOKEN_SPAN]
    return (head + [TOKEN_BASE + 7] * n)[:n]


def quantiles(xs: list[float]) -> Quantiles:
    s = sorted(xs)
    return Quantiles(percentile(s, 0.5), percentile(s, 0.9), percentile(s, 0.99))


def as_sent(trace: Trace, run: ReplayRun) -> Trace:
    """The requests the client sent, arriving when it sent them: what `--compare` runs the
    serving model on, so that a client late by bursts is compared with a model given the
    same bursts, not with the trace's even arrivals."""
    sent = [o for o in run.outcomes if o.sent_s is not None]
    return replace(trace, arrivals=[o.sent_s or 0.0 for o in sent],
                   inputs=[trace.inputs[o.index] for o in sent],
                   outputs=[trace.outputs[o.index] for o in sent],
                   blocks=None if trace.blocks is None else [trace.blocks[o.index] for o in sent])


def report(run: ReplayRun, ttft_slo_s: float | None = None,
           tpot_slo_s: float | None = None) -> ReplayReport:
    done = [o for o in run.outcomes if o.ok]
    errors = Counter(o.error for o in run.outcomes if o.error is not None)
    goodput = None
    if ttft_slo_s is not None and run.outcomes:
        good = sum(1 for o in done
                   if o.ttft_s is not None and o.ttft_s <= ttft_slo_s
                   and (tpot_slo_s is None or (o.tpot_s or 0.0) <= tpot_slo_s))
        goodput = good / len(run.outcomes)
    ttft = quantiles([o.ttft_s for o in done if o.ttft_s is not None])
    tpot = quantiles([t for o in done if (t := o.tpot_s) is not None])
    slo = None
    if ttft_slo_s is not None and goodput is not None:
        ttft_met = ttft.p90 is not None and ttft.p90 <= ttft_slo_s
        tpot_met = tpot_slo_s is None or tpot.p90 is None or tpot.p90 <= tpot_slo_s
        slo = SloResult(ttft_p90_s=ttft_slo_s, tpot_p90_s=tpot_slo_s, met=ttft_met and tpot_met,
                        goodput=round(goodput, 4), ttft_met=ttft_met, tpot_met=tpot_met)
    overhead = percentile(sorted(o.headers_s for o in done if o.headers_s is not None), 0.5)
    share = (overhead / ttft.p90 if overhead is not None and ttft.p90 else None)
    server = [t for o in done if (t := o.server_ttft_s) is not None]
    span = max(run.trace_s, max((o.arrival_s + (o.e2e_s or 0.0) for o in done), default=0.0))
    tokens = sum(o.output_tokens for o in done)
    return ReplayReport(
        requests=len(run.outcomes), completed=len(done), errors=dict(sorted(errors.items())),
        not_sent=run.not_sent, interrupted=run.interrupted,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=quantiles([o.e2e_s for o in done if o.e2e_s is not None]),
        goodput=goodput, output_tokens_per_s=tokens / span if span > 0 else 0.0,
        speed=run.speed, wall_s=run.wall_s, overhead_s=overhead, overhead_share=share,
        send_lag_s=percentile(sorted(o.sent_s - o.arrival_s for o in run.outcomes
                                     if o.sent_s is not None), 0.9),
        server_ttft_s=quantiles(server) if server else None, slo=slo)


async def _send(session: object, url: str, headers: dict[str, str], o: Outcome,
                body: bytes, speed: float, timeout_s: float) -> None:
    import aiohttp  # noqa: PLC0415 - replay only; `poolctl --help` does not load it

    assert isinstance(session, aiohttp.ClientSession)
    t0 = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, data=body, headers=headers) as resp:
                o.headers_s = (time.monotonic() - t0) * speed
                if resp.status != 200:
                    o.error = f"http {resp.status}"
                    await resp.read()
                    return
                done = False
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    choices = chunk.get("choices") or []
                    if choices and choices[0].get("text") and o.ttft_s is None:
                        o.ttft_s = (time.monotonic() - t0) * speed
                    usage = chunk.get("usage")
                    if isinstance(usage, dict):
                        o.output_tokens = int(usage.get("completion_tokens") or 0)
                if not done:
                    o.error = "stream ended early"
                    return
                o.e2e_s = (time.monotonic() - t0) * speed
                if o.ttft_s is None:
                    o.error = "no tokens"
    except TimeoutError:
        o.error = "timeout"
    except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError):
        o.error = "tls"
    except aiohttp.ClientConnectorError:
        o.error = "connect"
    except (aiohttp.ClientError, ConnectionError):
        o.error = "disconnected"
    except (ValueError, AttributeError, TypeError):
        o.error = "bad stream"


def tls_context(ca_file: str | None) -> ssl.SSLContext | None:
    """With `ca_file` (a sandbox's self-signed certificate), a context trusting it alone,
    as a trust anchor even if it names another issuer (ACM's requested certificates do);
    None: the system's trust store (aiohttp's default)."""
    if ca_file is None:
        return None
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return ctx


async def run_replay(trace: Trace, base_url: str, model: str, *, api_key: str | None = None,
                     speed: float = 1.0, max_concurrency: int | None = None,
                     timeout_s: float = 600.0,
                     progress: Callable[[str], None] | None = None,
                     ca_file: str | None = None) -> ReplayRun:
    """Send `trace` to `base_url` (`http(s)://host:port`); returns when every request ended,
    or what was measured when interrupted (SIGINT). `timeout_s` bounds each request (wall).
    `ca_file`: a certificate to trust (tls_context)."""
    import aiohttp  # noqa: PLC0415 - replay only

    url = base_url.rstrip("/") + "/v1/completions"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    run = ReplayRun(base_url, model, speed, trace.span_s)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, stop.set)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
        pass
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    tasks: set[asyncio.Task[None]] = set()
    t0 = time.monotonic()
    last = t0

    async def one(o: Outcome, body: bytes) -> None:
        if gate is None:
            await _send(session, url, headers, o, body, speed, timeout_s)
            return
        async with gate:
            await _send(session, url, headers, o, body, speed, timeout_s)

    def tell() -> None:
        if progress is None:
            return
        failed = sum(1 for o in run.outcomes if o.error)
        progress(f"replay: {len(run.outcomes)}/{len(trace)} sent, {len(tasks)} in flight, "
                 f"{failed} failed, {(time.monotonic() - t0) * speed:.0f} s of "
                 f"{trace.span_s:.0f} s (pool time)")

    conn = aiohttp.TCPConnector(limit=0, force_close=False, ssl=tls_context(ca_file) or True)
    # No cookie jar: each of the trace's requests is its own client, so a sticky load
    # balancer's cookie does not pin the whole trace to one node.
    async with aiohttp.ClientSession(connector=conn, cookie_jar=aiohttp.DummyCookieJar(),
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        for i, at in enumerate(trace.arrivals):
            wait = at / speed - (time.monotonic() - t0)
            if wait > 0:
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                except TimeoutError:
                    pass
            if stop.is_set():
                run.interrupted = True
                run.not_sent = len(trace) - i
                break
            o = Outcome(i, at, trace.inputs[i], trace.outputs[i],
                        sent_s=(time.monotonic() - t0) * speed)
            body = json.dumps({"model": model, "prompt": prompt_ids(trace, i),
                               "max_tokens": trace.outputs[i], "ignore_eos": True,
                               "stream": True,
                               "stream_options": {"include_usage": True}}).encode()
            run.outcomes.append(o)
            t = asyncio.create_task(one(o, body))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            if time.monotonic() - last >= PROGRESS_EVERY_S:
                last = time.monotonic()
                tell()
        while tasks and not stop.is_set():
            await asyncio.wait(set(tasks), timeout=PROGRESS_EVERY_S)
            tell()
        if tasks:  # interrupted: what is still in flight is cancelled, and said so
            run.interrupted = True
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for o in run.outcomes:
                if not o.ok and o.error is None:
                    o.error = "interrupted"
    run.wall_s = time.monotonic() - t0
    try:
        loop.remove_signal_handler(signal.SIGINT)
    except (NotImplementedError, RuntimeError, ValueError):
        pass
    return run


async def served_model(base_url: str, api_key: str | None = None,
                       ca_file: str | None = None) -> str:
    """The first model `/v1/models` lists (what a pool serves), or ValueError why not."""
    import aiohttp  # noqa: PLC0415 - replay only

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        conn = aiohttp.TCPConnector(ssl=tls_context(ca_file) or True)
        async with aiohttp.ClientSession(connector=conn,
                                         timeout=aiohttp.ClientTimeout(total=30)) as s:
            async with s.get(base_url.rstrip("/") + "/v1/models", headers=headers) as r:
                if r.status != 200:
                    raise ValueError(f"GET /v1/models answered HTTP {r.status}")
                data = await r.json(content_type=None)
    except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError) as e:
        raise ValueError(f"TLS with {base_url} failed ({e}); a private certificate: point "
                         "SSL_CERT_FILE at its CA") from None
    except (aiohttp.ClientError, TimeoutError) as e:
        raise ValueError(f"cannot reach {base_url} ({type(e).__name__})") from None
    try:
        return str(data["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise ValueError("/v1/models lists no model") from None


def write_requests_csv(run: ReplayRun, path: str) -> None:
    """One row per request sent: its index in the slice, arrival (pool s from the slice's
    start), tokens, TTFT, TPOT and end-to-end (pool s), and its error kind."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["index", "arrival_s", "prompt_tokens", "max_tokens", "output_tokens",
                    "ttft_s", "tpot_s", "e2e_s", "error"])
        for o in run.outcomes:
            w.writerow([o.index, f"{o.arrival_s:.3f}", o.prompt_tokens, o.max_tokens,
                        o.output_tokens, "" if o.ttft_s is None else f"{o.ttft_s:.4f}",
                        "" if o.tpot_s is None else f"{o.tpot_s:.5f}",
                        "" if o.e2e_s is None else f"{o.e2e_s:.4f}", o.error or ""])


def stderr_progress(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
