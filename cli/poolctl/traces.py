"""Request traces: the Azure LLM inference CSV and the Mooncake JSONL (detected by content),
or synthetic Poisson traffic. Every value is data; a bad one is one line naming the file,
the line and the field.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from poolctl.errors import UsageError

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
MOONCAKE_EXTRA = {"hash_ids"}  # prefix-cache block ids in the published traces; not used


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival: seconds from the first, prompt and output tokens."""

    source: str
    arrivals: list[float]
    inputs: list[int]
    outputs: list[int]

    def __len__(self) -> int:
        return len(self.arrivals)

    @property
    def span_s(self) -> float:
        return self.arrivals[-1] - self.arrivals[0] if self.arrivals else 0.0

    def scaled(self, k: float) -> Trace:
        """Replayed k times faster."""
        return Trace(f"{self.source} x{k:g}", [t / k for t in self.arrivals],
                     self.inputs, self.outputs)

    def window(self, start: float, end: float) -> Trace:
        """Requests arriving in [start, end), times shifted to start at 0."""
        idx = [i for i, t in enumerate(self.arrivals) if start <= t < end]
        return Trace(f"{self.source}[{start:.0f}s-{end:.0f}s]",
                     [self.arrivals[i] - start for i in idx],
                     [self.inputs[i] for i in idx], [self.outputs[i] for i in idx])


def _bad(path: str, line: int, field: str, msg: str) -> UsageError:
    return UsageError(f"{path}:{line}: {field}: {msg}")


def _tokens(path: str, line: int, field: str, raw: object) -> int:
    if isinstance(raw, bool):
        raw = "true"
    try:
        n = int(raw) if isinstance(raw, int) else int(str(raw).strip())
    except ValueError:
        raise _bad(path, line, field, f"{str(raw)[:40]!r} is not a whole number of tokens; "
                   "fix or remove the line") from None
    if n < 0:
        raise _bad(path, line, field, f"{n} tokens is negative; fix or remove the line")
    return n


def _azure_time(path: str, line: int, raw: str) -> float:
    raw = raw.strip()
    try:
        return float(raw)  # seconds, as some derived traces write them
    except ValueError:
        pass
    try:
        # Python 3.11 reads the trace's 7 fractional digits (to microseconds).
        return datetime.fromisoformat(raw).timestamp()
    except ValueError:
        raise _bad(path, line, "TIMESTAMP", f"{raw[:40]!r} is neither a date-time "
                   "(2023-11-16 18:15:46.68) nor seconds; fix the line") from None


def _azure(path: str, text: str) -> tuple[list[float], list[int], list[int], list[int]]:
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    unknown = [h for h in header if h not in AZURE_COLUMNS]
    missing = [c for c in AZURE_COLUMNS if c not in header]
    if unknown or missing:
        what = f"unknown column {unknown[0]!r}" if unknown else f"no column {missing[0]!r}"
        raise _bad(path, 1, "header", f"{what}; an Azure trace has exactly "
                   f"{','.join(AZURE_COLUMNS)}")
    it, ic, io_ = (header.index(c) for c in AZURE_COLUMNS)
    ts, ins, outs, lines = [], [], [], []
    for line, row in enumerate(reader, start=2):
        if not row:
            continue
        lines.append(line)
        if len(row) != len(header):
            raise _bad(path, line, "row", f"{len(row)} fields, the header has {len(header)}")
        ts.append(_azure_time(path, line, row[it]))
        ins.append(_tokens(path, line, "ContextTokens", row[ic]))
        outs.append(_tokens(path, line, "GeneratedTokens", row[io_]))
    return ts, ins, outs, lines


def _mooncake(path: str, text: str) -> tuple[list[float], list[int], list[int], list[int]]:
    ts, ins, outs, lines = [], [], [], []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        lines.append(line)
        try:
            obj = json.loads(raw)
        except ValueError as e:
            # JSONDecodeError says where; a plain ValueError (an integer of over 4,300 digits)
            # has no .msg
            why = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            raise _bad(path, line, "line", f"not JSON ({why}); one object per line") from None
        if not isinstance(obj, dict):
            raise _bad(path, line, "line", "not a JSON object; one object per line")
        for k in obj:
            if k not in MOONCAKE_FIELDS and k not in MOONCAKE_EXTRA:
                raise _bad(path, line, str(k)[:40], "unknown field; a Mooncake trace has "
                           f"{', '.join(MOONCAKE_FIELDS)}")
        for k in MOONCAKE_FIELDS:
            if k not in obj:
                raise _bad(path, line, k, "missing; add it")
        t = obj["timestamp"]
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            raise _bad(path, line, "timestamp", f"{str(t)[:40]!r} is not a number of ms")
        ts.append(t / 1000)
        ins.append(_tokens(path, line, "input_length", obj["input_length"]))
        outs.append(_tokens(path, line, "output_length", obj["output_length"]))
    return ts, ins, outs, lines


def load_trace(path: str | Path) -> Trace:
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"--trace: {name} not found; give a trace file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--trace: {name} cannot be read as UTF-8 text ({e})") from None
    first = text.lstrip()[:1]
    if first == "{":
        (ts, ins, outs, lines), tfield = _mooncake(name, text), "timestamp"
    elif first:
        (ts, ins, outs, lines), tfield = _azure(name, text), "TIMESTAMP"
    else:
        raise UsageError(f"{name}:1: file: the trace is empty; give an Azure CSV or a "
                         "Mooncake JSONL trace")
    if not ts:
        raise _bad(name, 1, "file", "the trace has no requests; give at least one")
    for i, t in enumerate(ts):
        if t < 0:
            raise _bad(name, lines[i], tfield, f"{t:g} is negative; times count from >= 0")
        if i and t < ts[i - 1]:
            raise _bad(name, lines[i], tfield, "earlier than the line before; sort the trace "
                       "by time")
    t0 = ts[0]
    return Trace(name, [t - t0 for t in ts], ins, outs)


def synthetic(rate: float, duration_s: float, seed: int, input_mean: float,
              output_mean: float, dist: str = "exponential") -> Trace:
    """Poisson arrivals at `rate`/s; token lengths exponential (or fixed) around their means,
    at least one token each."""
    if rate <= 0 or duration_s <= 0:
        raise UsageError("--rate/--duration: both must be positive")
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
