"""The stand-in's HTTP front end: the parts of vLLM's OpenAI-compatible server a pool uses
(`/health`, `/v1/models`, `/v1/completions`, `/v1/chat/completions`, `/metrics`), with vLLM's
status codes, error bodies, streaming format and metric names (vllm/entrypoints/openai/ and
vllm/v1/metrics/loggers.py; v0.11 to v0.34, the release
of data/vllm_serve_flags.yaml).

Tokens are words: a prompt of N whitespace-separated words is N prompt tokens (a chat prompt:
the words of every message plus CHAT_TOKENS_PER_MESSAGE per message, for the template's role
markers), and every generated token is one filler word. Requests run to `max_tokens` (the
filler has no end-of-sequence), as `vllm bench serve` asks with `ignore_eos`. Prefix caching
sees the words: a block of `--block-size` words is cached under the hash of every word up to
its end, as vLLM hashes a block with its prefix.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from poolctl.histograms import LATENCY_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS
from poolctl.sandbox.vllm.flags import ServeArgs, known_flags
from poolctl.sandbox.vllm.live import Live

CHAT_TOKENS_PER_MESSAGE = 4
DEFAULT_COMPLETION_MAX_TOKENS = 16  # vLLM's completions default; chat: the room left
STREAM_TICK_S = 0.02  # wall seconds between streamed chunks of a decoding request
FILLER = " the"
LABELS = ("model_name", "engine")


def count_tokens(text: str) -> int:
    return len(text.split())


def prefix_blocks(words: list[str], block: int) -> tuple[int, ...]:
    """Block ids of a prompt's full blocks, each hashing its words and its prefix's id."""
    out: list[int] = []
    h = 0
    for k in range(len(words) // block):
        h = hash((h, *words[k * block:(k + 1) * block]))
        out.append(h)
    return tuple(out)


def _buckets_1_2_5(top: int) -> tuple[float, ...]:
    out: list[float] = []
    e = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**e
            if v > top:
                return tuple(out)
            out.append(v)
        e += 1


def error(status: int, message: str, kind: str) -> web.Response:
    """vLLM's ErrorResponse body."""
    return web.json_response({"object": "error", "message": message, "type": kind,
                              "param": None, "code": status}, status=status)


class Metrics(Collector):
    """Gauges and counters read from the engines at scrape time; histograms observed when a
    request finishes (times in pool seconds)."""

    def __init__(self, live: Live, name: str, max_model_len: int,
                 buckets: Mapping[str, tuple[float, ...]] | None = None) -> None:
        self.live, self.name = live, name
        self.registry = CollectorRegistry()
        self.registry.register(self)

        def hist(metric: str, doc: str, buckets: Iterable[float]) -> Histogram:
            return Histogram(metric, doc, LABELS, buckets=tuple(buckets),
                             registry=self.registry)

        # vLLM's default edges per family, or --custom-histogram-buckets' (v0.32 on)
        family = dict(buckets or {}).get
        tokens = family("request_tokens", _buckets_1_2_5(max_model_len))
        # prometheus_client appends _seconds nowhere: the names are vLLM's as written
        self.ttft = hist("vllm:time_to_first_token_seconds",
                         "Histogram of time to first token in seconds.",
                         family("time_to_first_token", TTFT_BUCKETS))
        # per request (its mean time per output token), as vLLM V1 observes this one; its
        # per-token histograms (vllm:inter_token_latency_seconds) are not served
        self.tpot = hist("vllm:request_time_per_output_token_seconds",
                         "Histogram of time_per_output_token_seconds per request.",
                         family("inter_token_latency", TPOT_BUCKETS))
        self.e2e = hist("vllm:e2e_request_latency_seconds",
                        "Histogram of e2e request latency in seconds.",
                        family("request_latency", LATENCY_BUCKETS))
        self.queue = hist("vllm:request_queue_time_seconds",
                          "Histogram of time spent in WAITING phase for request.",
                          family("request_latency", LATENCY_BUCKETS))
        self.prompt = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                           tokens)
        self.generation = hist("vllm:request_generation_tokens",
                               "Number of generation tokens processed.", tokens)
        # every engine's series from the start, as vLLM's make_per_engine makes them
        for h in (self.ttft, self.tpot, self.e2e, self.queue, self.prompt, self.generation):
            for e in live.engines:
                h.labels(name, str(e.idx))

    def observe(self, rid: int, engine: int) -> None:
        r = self.live.req
        labels = (self.name, str(engine))
        out = r.outputs[rid]
        self.ttft.labels(*labels).observe(r.first[rid] - r.arrival[rid])
        if out > 1:
            self.tpot.labels(*labels).observe((r.finish[rid] - r.first[rid]) / (out - 1))
        self.e2e.labels(*labels).observe(r.finish[rid] - r.arrival[rid])
        self.queue.labels(*labels).observe(r.admitted[rid] - r.arrival[rid])
        self.prompt.labels(*labels).observe(r.inputs[rid])
        self.generation.labels(*labels).observe(out)

    def collect(self) -> Iterator[Any]:
        live = self.live

        def family(cls: Any, metric: str, doc: str, value: Any) -> Any:
            f = cls(metric, doc, labels=list(LABELS))
            for e in live.engines:
                f.add_metric([self.name, str(e.idx)], value(e))
            return f

        kv = live.m.kv_tokens
        yield family(GaugeMetricFamily, "vllm:num_requests_running",
                     "Number of requests in model execution batches.", lambda e: len(e.running))
        yield family(GaugeMetricFamily, "vllm:num_requests_waiting",
                     "Number of requests waiting to be processed.", lambda e: len(e.waiting))
        yield family(GaugeMetricFamily, "vllm:kv_cache_usage_perc",
                     "KV-cache usage. 1 means 100 percent usage.", lambda e: e.kv / kv)
        yield family(CounterMetricFamily, "vllm:prefix_cache_queries",
                     "Prefix cache queries, in terms of number of queried tokens.",
                     lambda e: e.prompt_tokens)
        yield family(CounterMetricFamily, "vllm:prefix_cache_hits",
                     "Prefix cache hits, in terms of number of cached tokens.",
                     lambda e: e.hit_tokens)
        yield family(CounterMetricFamily, "vllm:num_preemptions",
                     "Cumulative number of preemption from the engine.",
                     lambda e: e.preemptions)
        yield family(CounterMetricFamily, "vllm:prompt_tokens",
                     "Number of prefill tokens processed.", lambda e: e.prompt_tokens)
        yield family(CounterMetricFamily, "vllm:generation_tokens",
                     "Number of generation tokens processed.",
                     lambda e: live.counters[e.idx].generation_tokens)
        ok = CounterMetricFamily("vllm:request_success",
                                 "Count of successfully processed requests.",
                                 labels=[*LABELS, "finished_reason"])
        for e in live.engines:
            ok.add_metric([self.name, str(e.idx), "length"], live.counters[e.idx].finished)
        yield ok


class Server:
    def __init__(self, args: ServeArgs, live: Live, api_keys: tuple[str, ...],
                 max_model_len: int) -> None:
        self.args, self.live, self.api_keys = args, live, api_keys
        self.max_model_len = max_model_len
        self.metrics = Metrics(live, args.model_name, max_model_len, args.histogram_buckets)
        live.on_done = self.metrics.observe
        self.created = int(time.time())

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth], client_max_size=64 << 20)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # vLLM's AuthenticationMiddleware: /v1 paths need "Authorization: Bearer <key>"
        if self.api_keys and request.path.startswith("/v1"):
            got = request.headers.get("Authorization", "")
            if got not in {f"Bearer {k}" for k in self.api_keys}:
                return web.json_response({"error": "Unauthorized"}, status=401)
        resp: web.StreamResponse = await handler(request)
        return resp

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": known_flags()[0]})

    async def metrics_page(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.metrics.registry),
                            content_type="text/plain", charset="utf-8")

    async def models(self, request: web.Request) -> web.Response:
        data = [{"id": n, "object": "model", "created": self.created, "owned_by": "vllm",
                 "root": self.args.model, "parent": None, "max_model_len": self.max_model_len}
                for n in self.args.served_model_names]
        return web.json_response({"object": "list", "data": data})

    async def _body(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return error(400, "Request body is not valid JSON.", "BadRequestError")
        if not isinstance(body, dict):
            return error(400, "Request body must be a JSON object.", "BadRequestError")
        model = body.get("model")
        if model is not None and model not in self.args.served_model_names:
            return error(404, f"The model `{model}` does not exist.", "NotFoundError")
        return body

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            words = prompt.split()
        elif isinstance(prompt, list) and prompt and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            words = [str(t) for t in prompt]
        else:
            return error(400, "prompt must be a string or a list of token ids",
                         "BadRequestError")
        return await self._serve(request, body, words, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(
                isinstance(m, dict) and isinstance(m.get("content", ""), str) for m in msgs):
            return error(400, "messages must be a non-empty list of {role, content} objects",
                         "BadRequestError")
        words: list[str] = []
        for m in msgs:
            words += [f"<{m.get('role', 'user')}>"] * CHAT_TOKENS_PER_MESSAGE
            words += str(m.get("content", "")).split()
        return await self._serve(request, body, words, chat=True)

    async def _serve(self, request: web.Request, body: dict[str, Any], words: list[str],
                     chat: bool) -> web.StreamResponse:
        n_in = len(words)
        raw = body.get("max_completion_tokens", body.get("max_tokens"))
        if raw is None:
            out = (self.max_model_len - n_in) if chat else DEFAULT_COMPLETION_MAX_TOKENS
        elif isinstance(raw, int) and not isinstance(raw, bool) and raw >= 1:
            out = raw
        else:
            return error(400, "max_tokens must be at least 1, got " + json.dumps(raw),
                         "BadRequestError")
        if n_in + out > self.max_model_len:
            return error(400, f"This model's maximum context length is {self.max_model_len} "
                         f"tokens. However, you requested {n_in + out} tokens ({n_in} in the "
                         f"messages, {out} in the completion). Please reduce the length of the "
                         "messages or completion.", "BadRequestError")
        live = self.live
        rid = live.submit(n_in, out, prefix_blocks(words, self.args.block_size))
        try:
            if body.get("stream"):
                opts = body.get("stream_options")
                usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
                return await self._stream(request, rid, n_in, out, chat, usage)
            await live.done[rid].wait()
            return web.json_response(self._whole(n_in, out, chat))
        finally:
            live.forget(rid)

    def _usage(self, n_in: int, out: int) -> dict[str, int]:
        return {"prompt_tokens": n_in, "total_tokens": n_in + out, "completion_tokens": out}

    def _whole(self, n_in: int, out: int, chat: bool) -> dict[str, Any]:
        text = FILLER * out
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                "created": int(time.time()), "model": self.args.model_name,
                "usage": self._usage(n_in, out)}
        if chat:
            return {**head, "object": "chat.completion", "choices": [{
                "index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": None, "finish_reason": "length", "stop_reason": None}]}
        return {**head, "object": "text_completion", "choices": [{
            "index": 0, "text": text, "logprobs": None, "finish_reason": "length",
            "stop_reason": None}]}

    async def _stream(self, request: web.Request, rid: int, n_in: int, out: int, chat: bool,
                      usage: bool) -> web.StreamResponse:
        live = self.live
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        cid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"

        async def send(choice: dict[str, Any] | None, use: dict[str, int] | None = None) -> None:
            chunk = {"id": cid, "object": kind, "created": created,
                     "model": self.args.model_name,
                     "choices": [] if choice is None else [choice]}
            if use is not None or usage:
                chunk["usage"] = use
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            if chat:
                return {"index": 0, "delta": {"content": text}, "logprobs": None,
                        "finish_reason": finish}
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                    "stop_reason": None}

        try:
            if chat:
                await send({"index": 0, "delta": {"role": "assistant", "content": ""},
                            "logprobs": None, "finish_reason": None})
            await live.first_seen[rid].wait()
            sent = 0
            done = live.done[rid]
            while sent < out:
                n = live.generated(rid)
                if n > sent:
                    last = n >= out
                    await send(choice(FILLER * (n - sent), "length" if last else None))
                    sent = n
                    if last:
                        break
                try:
                    await asyncio.wait_for(done.wait(), STREAM_TICK_S)
                except TimeoutError:
                    pass
            if usage:
                await send(None, self._usage(n_in, out))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            # the client went away: the request still runs to its end in the engine (vLLM
            # would abort it; the stand-in does not, see docs/sandbox.md)
            pass
        return resp
