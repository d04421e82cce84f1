"""Request traces: the Azure LLM inference CSV and the Mooncake JSONL (detected by content),
or synthetic Poisson traffic. Every value is data; a bad one is one line naming the file,
the line and the field.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from poolctl.errors import UsageError
from poolctl.readfile import open_regular, text_lines

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
MOONCAKE_HASHES = "hash_ids"  # the prompt's prefix-cache block ids, optional
# Tokens per `hash_ids` block: 512, as NVIDIA Dynamo's Mooncake-format tools take it
# (ai-dynamo/dynamo, benchmarks/data_generator/README.md); the published samples agree: the
# FAST25-release README's 6,955- and 6,472-token prompts carry ceil(n / 512) = 14 and 13 ids.
MOONCAKE_BLOCK_TOKENS = 512


Blocks = tuple[int, ...]  # a prompt's prefix-cache block ids, first block first


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival: seconds from the first, prompt and output tokens, and
    (Mooncake traces) each prompt's block ids of `block_tokens` tokens: two requests whose
    ids agree up to block k share their first k blocks of prompt. None: no reuse known."""

    source: str
    arrivals: list[float]
    inputs: list[int]
    outputs: list[int]
    blocks: list[Blocks] | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS

    def __len__(self) -> int:
        return len(self.arrivals)

    @property
    def span_s(self) -> float:
        return self.arrivals[-1] - self.arrivals[0] if self.arrivals else 0.0

    def scaled(self, k: float) -> Trace:
        """Replayed k times faster."""
        return Trace(f"{self.source} x{k:g}", [t / k for t in self.arrivals],
                     self.inputs, self.outputs, self.blocks, self.block_tokens)

    def window(self, start: float, end: float) -> Trace:
        """Requests arriving in [start, end), times shifted to start at 0."""
        idx = [i for i, t in enumerate(self.arrivals) if start <= t < end]
        return Trace(f"{self.source}[{start:.0f}s-{end:.0f}s]",
                     [self.arrivals[i] - start for i in idx],
                     [self.inputs[i] for i in idx], [self.outputs[i] for i in idx],
                     None if self.blocks is None else [self.blocks[i] for i in idx],
                     self.block_tokens)


def _bad(path: str, line: int, field: str, msg: str) -> UsageError:
    return UsageError(f"{path}:{line}: {field}: {msg}")


# Bounds on what a trace may hold, so that reading and replaying it take bounded time and
# memory. Measured here at the cap: a million Azure rows (34 MiB) load in 9 s; a million
# synthetic requests simulate in 47 s at 0.42 GB peak RSS (96 replicas of the example pool).
MAX_REQUESTS = 1_000_000
MAX_LINES = MAX_REQUESTS + 1  # and a header
MAX_TRACE_BYTES = 512 << 20  # a million lines of either published format: ~37 B (Azure), ~285 B
MAX_LINE_BYTES = 1 << 20  # a Mooncake line of a 1M-token prompt holds ~2,000 block ids: 16 KB
MAX_SPAN_S = 31 * 86_400  # a month: autoscaling samples a metric per minute over the span
MAX_TOKENS = 10**9  # no model's context window comes near a billion tokens
MAX_REPLICAS = 4096  # replicas a run simulates: `plan --traffic` searches up to it
_DIGITS = re.compile(r"[0-9]+")  # ASCII only: int() also takes '1_000' and Arabic-Indic
_SECONDS = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


def _show(s: str) -> str:
    """A name from the file, as it can go in a one-line message."""
    return s[:40] if s.isprintable() else repr(s[:40])


def _tokens(path: str, line: int, field: str, raw: object) -> int:
    """A whole number of tokens written in ASCII digits (a JSON integer, or a CSV field)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        n = raw
    elif isinstance(raw, str) and _DIGITS.fullmatch(raw.strip()):
        digits = raw.strip().lstrip("0") or "0"
        n = int(digits) if len(digits) <= 10 else MAX_TOKENS + 1
    else:
        shown = json.dumps(raw)[:40] if not isinstance(raw, str) else repr(raw[:40])
        raise _bad(path, line, field, f"{shown} is not a whole number of tokens in digits "
                   "0-9; fix or remove the line")
    if n < 0:
        raise _bad(path, line, field, f"{n} tokens is negative; fix or remove the line")
    if n > MAX_TOKENS:
        raise _bad(path, line, field, f"over {MAX_TOKENS:,} tokens (longer than any model's "
                   "context); fix or remove the line")
    return n


def _azure_time(path: str, line: int, raw: str) -> float:
    raw = raw.strip()
    if _SECONDS.fullmatch(raw):
        secs = float(raw)  # seconds, as some derived traces write them
        if not math.isfinite(secs):  # 400 digits are inf to a float
            raise _bad(path, line, "TIMESTAMP", f"{raw[:20]}... is too large a number of "
                       "seconds; fix the line")
        return secs
    try:
        if not raw.isascii():
            raise ValueError(raw)
        # Python 3.11 reads the trace's 7 fractional digits (to microseconds).
        t = datetime.fromisoformat(raw)
    except ValueError:
        raise _bad(path, line, "TIMESTAMP", f"{raw[:40]!r} is neither a date-time "
                   "(2023-11-16 18:15:46.68) nor seconds; fix the line") from None
    # Without a zone the published traces mean UTC; the machine's zone (and its daylight
    # saving jumps) must not stretch or shrink the gaps between requests.
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


# times, inputs, outputs, lines, block ids (None: the trace has none)
Rows = tuple[list[float], list[int], list[int], list[int], list[Blocks] | None]
Lines = Iterator[tuple[int, str]]


def _azure(path: str, lines: Lines) -> Rows:
    numbers: list[int] = []

    def numbered() -> Iterator[str]:
        for n, text in lines:
            numbers.append(n)
            yield text

    reader = csv.reader(numbered())
    ts: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    where: list[int] = []
    try:
        header = [h.strip() for h in next(reader, [])]
        unknown = [h for h in header if h not in AZURE_COLUMNS]
        missing = [c for c in AZURE_COLUMNS if c not in header]
        if unknown or missing or len(set(header)) != len(header):
            what = (f"unknown column {_show(unknown[0])!r}" if unknown else
                    f"no column {missing[0]!r}" if missing else "a column twice")
            raise _bad(path, numbers[-1], "header", f"{what}; an Azure trace has exactly "
                       f"{','.join(AZURE_COLUMNS)}")
        it, ic, io_ = (header.index(c) for c in AZURE_COLUMNS)
        for row in reader:
            line = numbers[-1]
            if not row:
                continue
            if len(row) != len(header):
                raise _bad(path, line, "row", f"{len(row)} fields, the header has "
                           f"{len(header)}")
            ts.append(_azure_time(path, line, row[it]))
            ins.append(_tokens(path, line, "ContextTokens", row[ic]))
            outs.append(_tokens(path, line, "GeneratedTokens", row[io_]))
            where.append(line)
    except csv.Error as e:  # a NUL byte, a stray quote, a field over csv's size limit
        raise _bad(path, numbers[-1] if numbers else 1, "row", f"not CSV ({e}); fix the "
                   "line") from None
    return ts, ins, outs, where, None


def _blocks(path: str, line: int, raw: object) -> Blocks:
    """`hash_ids`: a list of whole numbers (ids, not hashes of text: Mooncake remaps them)."""
    if isinstance(raw, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                     and 0 <= x for x in raw):
        return tuple(raw)
    raise _bad(path, line, MOONCAKE_HASHES, "not a list of block ids (whole numbers >= 0); "
               "fix the line or drop the field")


def _mooncake(path: str, lines: Lines) -> Rows:
    ts: list[float] = []
    ins: list[int] = []
    outs: list[int] = []
    where: list[int] = []
    blocks: list[Blocks] = []
    for line, raw in lines:
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError as e:
            # JSONDecodeError says where; a plain ValueError (an integer of over 4,300 digits)
            # has no .msg
            why = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            raise _bad(path, line, "line", f"not JSON ({why}); one object per line") from None
        except RecursionError:
            raise _bad(path, line, "line", "nested too deeply; one flat object per line"
                       ) from None
        if not isinstance(obj, dict):
            raise _bad(path, line, "line", "not a JSON object; one object per line")
        for k in obj:
            if k not in MOONCAKE_FIELDS and k != MOONCAKE_HASHES:
                raise _bad(path, line, _show(k), "unknown field; a Mooncake trace has "
                           f"{', '.join(MOONCAKE_FIELDS)}")
        for k in MOONCAKE_FIELDS:
            if k not in obj:
                raise _bad(path, line, k, "missing; add it")
        t = obj["timestamp"]
        try:
            ms = float(t) if isinstance(t, int | float) and not isinstance(t, bool) else None
        except OverflowError:  # an integer beyond a float's range
            raise _bad(path, line, "timestamp", f"{str(t)[:20]}... is too large a number of "
                       "ms") from None
        if ms is None or not math.isfinite(ms):
            raise _bad(path, line, "timestamp", f"{json.dumps(t)[:40]} is not a finite number "
                       "of ms")
        ts.append(ms / 1000)
        ins.append(_tokens(path, line, "input_length", obj["input_length"]))
        outs.append(_tokens(path, line, "output_length", obj["output_length"]))
        blocks.append(_blocks(path, line, obj.get(MOONCAKE_HASHES, [])))
        where.append(line)
    # A trace without a single id says nothing of reuse (as an Azure one).
    return ts, ins, outs, where, blocks if any(blocks) else None


def load_trace(path: str | Path) -> Trace:
    """An Azure CSV or a Mooncake JSONL trace (by its first character), checked line by line:
    a regular file of at most MAX_TRACE_BYTES and MAX_LINES lines, sorted by time,
    spanning at most MAX_SPAN_S. Anything else is one line naming the file, line and field."""
    name = str(path) if str(path).isprintable() else repr(str(path))
    fix = "give an Azure CSV or a Mooncake JSONL trace file"
    with open_regular(path, "--trace", fix, MAX_TRACE_BYTES) as fh:
        lines = text_lines(fh, name, MAX_TRACE_BYTES, MAX_LINE_BYTES, MAX_LINES,
                           f"poolctl replays at most {MAX_REQUESTS:,} requests")
        skipped = []
        first = ""
        for n, text in lines:
            if text.strip():
                first = text.lstrip()[:1]
                skipped.append((n, text))
                break
        if not first:
            raise UsageError(f"{name}:1: file: the trace is empty; {fix}")
        rest = itertools.chain(skipped, lines)
        if first == "{":
            (ts, ins, outs, where, blocks), tfield, unit = (_mooncake(name, rest),
                                                            "timestamp", 1000)
        else:
            (ts, ins, outs, where, blocks), tfield, unit = _azure(name, rest), "TIMESTAMP", 1
    if not ts:
        raise _bad(name, 1, "file", "the trace has no requests; give at least one")
    for i, t in enumerate(ts):
        if t < 0:
            raise _bad(name, where[i], tfield, f"{t * unit:g} is negative; times count from "
                       ">= 0")
        if i and t < ts[i - 1]:
            raise _bad(name, where[i], tfield, "earlier than the line before; sort the trace "
                       "by time")
        if t - ts[0] > MAX_SPAN_S:
            days = (t - ts[0]) / 86_400
            shown = f"{days:,.0f}" if days < 1e9 else f"{days:.3g}"
            raise _bad(name, where[i], tfield, f"{shown} days after the first request; "
                       f"poolctl replays at most {MAX_SPAN_S // 86_400} days: cut the trace "
                       "to a window, or check the unit (Mooncake: ms)")
    t0 = ts[0]
    return Trace(name, [t - t0 for t in ts], ins, outs, blocks)


def synthetic(rate: float, duration_s: float, seed: int, input_mean: float,
              output_mean: float, dist: str = "exponential") -> Trace:
    """Poisson arrivals at `rate`/s; token lengths exponential (or fixed) around their means,
    at least one token each."""
    if not (0 < rate < math.inf and 0 < duration_s <= MAX_SPAN_S):
        raise UsageError("--rate/--duration: both must be positive numbers, the duration at "
                         f"most {MAX_SPAN_S:,} s ({MAX_SPAN_S // 86_400} days)")
    if rate * duration_s > MAX_REQUESTS:
        raise UsageError(f"--rate/--duration: {rate:g}/s for {duration_s:g} s is "
                         f"{rate * duration_s:,.0f} requests; poolctl replays at most "
                         f"{MAX_REQUESTS:,}: lower either")
    if not (1 <= input_mean <= MAX_TOKENS and 1 <= output_mean <= MAX_TOKENS):
        raise UsageError("--input-tokens/--output-tokens: means must be numbers from 1 to "
                         f"{MAX_TOKENS:,}")
    rng = random.Random(seed)

    def length(mean: float) -> int:
        if dist == "fixed":
            return max(1, round(mean))
        return max(1, math.ceil(rng.expovariate(1 / mean)))

    arrivals, ins, outs = [], [], []
    t = rng.expovariate(rate)
    while t < duration_s:
        arrivals.append(t)
        ins.append(length(input_mean))
        outs.append(length(output_mean))
        t += rng.expovariate(rate)
    if not arrivals:
        raise UsageError("--rate/--duration: no request arrives; raise either")
    return Trace(f"poisson {rate:g}/s for {duration_s:g}s (seed {seed})", arrivals, ins, outs)


# A day of traffic (`simulate --days`): the template trace's arrivals, hour after hour, thinned
# along a cosine between `trough` (its share of the peak's rate) and 1, peaking at
# DAILY_PEAK_HOUR UTC. The shape is an assumption, not a measurement: the shared traces are an
# hour each (docs/planning.md#several-days-of-traffic); the flags change it.
DAILY_TROUGH = 0.2
DAILY_PEAK_HOUR = 14.0
MAX_DAYS = 14


def daily_rate(t_s: float, trough: float = DAILY_TROUGH,
               peak_hour: float = DAILY_PEAK_HOUR) -> float:
    """The curve's share of the peak rate at `t_s` seconds from midnight UTC of day 0."""
    phase = 2 * math.pi * (t_s / 3600 - peak_hour) / 24
    return trough + (1 - trough) * (1 + math.cos(phase)) / 2


def daily(template: Trace, days: int, trough: float = DAILY_TROUGH,
          peak_hour: float = DAILY_PEAK_HOUR, seed: int = 0) -> Trace:
    """`days` days of `template`'s traffic: its requests (arrival offsets stretched to an
    hour, prompt and output lengths) repeated every hour, each kept with the curve's share
    at its arrival (thinning keeps the template's bursts), from midnight UTC. Prefix-cache
    block ids are dropped: copies of one prompt an hour apart are not what its users send."""
    if not 1 <= days <= MAX_DAYS:
        raise UsageError(f"--days: {days} is not a number of days from 1 to {MAX_DAYS}")
    if not 0 < trough <= 1:
        raise UsageError(f"--trough: {trough:g} is not a share of the peak rate in (0, 1]")
    if not template.arrivals or template.span_s <= 0:
        raise UsageError(f"{template.source}: one request or none; --days repeats a trace "
                         "of at least two requests")
    mean = trough + (1 - trough) / 2
    expected = len(template) * 3600 / template.span_s * 24 * days * mean
    if expected > MAX_REQUESTS:
        raise UsageError(f"--days {days}: ~{expected:,.0f} requests from {template.source}; "
                         f"poolctl replays at most {MAX_REQUESTS:,}: fewer days, a lower "
                         "--trough, or a shorter/slower trace (--time-scale below 1)")
    rng = random.Random(seed)
    stretch = 3600 / template.span_s
    offsets = [(t - template.arrivals[0]) * stretch for t in template.arrivals]
    arrivals, ins, outs = [], [], []
    for hour in range(24 * days):
        for off, n_in, n_out in zip(offsets, template.inputs, template.outputs, strict=True):
            t = hour * 3600 + min(off, 3599.999)
            if rng.random() < daily_rate(t, trough, peak_hour):
                arrivals.append(t)
                ins.append(n_in)
                outs.append(n_out)
    return Trace(f"{template.source} over {days} day(s) (trough {trough:g}, peak "
                 f"{peak_hour:g}:00 UTC)", arrivals, ins, outs)
