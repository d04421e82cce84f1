"""poolctl's serving model run in wall time: the simulator's engines (`poolctl.simulate.Engine`:
continuous batching, chunked prefill, KV capacity, preemption, prefix cache) driven by the
clock instead of an event queue, for the stand-in vLLM server.

Pool time is wall time x `speed`: a step the model times at 20 ms ends 20 / speed ms of wall
time after it began. The driver sleeps until the next engine's step ends (or a request
arrives), then lets every engine whose step is due finish it at its own end time, so times
recorded in the engine are exact pool times and only the driver's wake-up lag (about a
millisecond of wall time) reaches the client, magnified by `speed`.

One node serves its data-parallel replicas as vLLM does: one engine per replica behind one
front end that sends each request to the engine with the fewest requests waiting and running.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from poolctl.servingmodel import ReplicaModel
from poolctl.simulate import INF, Engine, PrefixCache, Requests

NAN = math.nan


@dataclass
class Counters:
    """What /metrics reports beyond the engines' own tallies, per engine."""

    finished: int = 0
    generation_tokens: int = 0


class Live:
    """The engines of one node in wall time. Not thread-safe: one asyncio loop owns it."""

    def __init__(self, m: ReplicaModel, replicas: int, speed: float, prefix_caching: bool,
                 block_tokens: int, on_done: Callable[[int, int], None] | None = None) -> None:
        self.m, self.speed = m, speed
        self.req = Requests(arrival=[], inputs=[], outputs=[], replica=[], admitted=[],
                            first=[], finish=[], refused=[], blocks=[], cached=[], sent=[])
        self.engines = [Engine(i, m, self.req,
                               PrefixCache(block_tokens) if prefix_caching else None)
                        for i in range(replicas)]
        self.counters = [Counters() for _ in range(replicas)]
        self.t0 = time.monotonic()
        self.wake = asyncio.Event()
        self.first_seen: dict[int, asyncio.Event] = {}
        self.done: dict[int, asyncio.Event] = {}
        self.on_done = on_done

    def now(self) -> float:
        """Pool time, seconds since the engine started."""
        return (time.monotonic() - self.t0) * self.speed

    def submit(self, prompt_tokens: int, output_tokens: int, blocks: tuple[int, ...]) -> int:
        """Queue a request on the least-loaded engine; its id."""
        req = self.req
        rid = len(req.arrival)
        now = self.now()
        e = min(self.engines, key=lambda e: (e.outstanding, e.idx))
        for name, v in (("arrival", now), ("inputs", prompt_tokens),
                        ("outputs", output_tokens), ("replica", e.idx), ("admitted", NAN),
                        ("first", NAN), ("finish", NAN), ("refused", False), ("cached", 0),
                        ("sent", now)):
            getattr(req, name).append(v)
        assert req.blocks is not None
        req.blocks.append(blocks)
        self.first_seen[rid] = asyncio.Event()
        self.done[rid] = asyncio.Event()
        e.submit(rid, now)
        self.wake.set()
        return rid

    def generated(self, rid: int) -> int:
        """Tokens of `rid` out so far, counting the steps of a decode run already past."""
        req = self.req
        if req.finish[rid] == req.finish[rid]:
            return req.outputs[rid]
        e = self.engines[req.replica[rid] or 0]
        if rid not in e.join:
            return e.gen.get(rid, 0)
        n = e.generated(rid)
        if e.run is not None and e.n_dec:
            n += e.run.steps_within(self.now() - e.t0, e.run_n)
        return min(n, req.outputs[rid])

    def forget(self, rid: int) -> None:
        """The HTTP side is done with `rid`: drop its events (the engine's lists keep its
        numbers; they are a few dozen bytes a request)."""
        self.first_seen.pop(rid, None)
        self.done.pop(rid, None)

    def _finished(self, rid: int, t: float) -> None:
        req = self.req
        c = self.counters[req.replica[rid] or 0]
        c.finished += 1
        c.generation_tokens += req.outputs[rid]
        ev = self.done.get(rid)
        if ev is not None:
            ev.set()
        if self.on_done is not None:
            self.on_done(rid, req.replica[rid] or 0)

    async def run(self) -> None:
        """Drive the engines until cancelled."""
        req = self.req
        while True:
            nxt = min(e.end for e in self.engines)
            if nxt == INF:
                await self.wake.wait()
            else:
                delay = nxt / self.speed - (time.monotonic() - self.t0)
                if delay > 0:
                    try:
                        await asyncio.wait_for(self.wake.wait(), delay)
                    except TimeoutError:
                        pass
            self.wake.clear()
            now = self.now()
            for e in self.engines:
                while e.end <= now:
                    prefilling = [rid for rid, _ in e.chunks]
                    e.handle(e.end, self._finished)
                    for rid in prefilling:  # a prompt's last chunk emits its first token
                        ev = self.first_seen.get(rid)
                        if ev is not None and req.first[rid] == req.first[rid]:
                            ev.set()
