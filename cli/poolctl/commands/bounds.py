"""Numeric options with bounds: a value outside them is one line naming the flag and the range
(UsageError, exit 2), refused while the command line is parsed, before a file is read.

Why not click's FloatRange: it lets NaN through (every comparison with NaN is false), takes
`1_000` and Arabic-Indic digits through Python's float(), and reports in several lines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from poolctl.errors import UsageError

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_SPECIAL = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)


def _fmt(x: float) -> str:
    return f"{int(x):,}" if x == int(x) and abs(x) < 1e19 else f"{x:g}"


def bounded(flag: str, lo: float, hi: float, unit: str, *, integer: bool = False,
            above: bool = False) -> Callable[[object], float | int]:
    """A typer `parser` for `flag`: a finite number (whole when `integer`) from `lo` (above
    `lo` when `above`) to `hi`, written in ASCII digits. `unit` says what it counts."""
    rng = f"{'above' if above else 'from'} {_fmt(lo)} {'and at most' if above else 'to'} " \
          f"{_fmt(hi)}"
    kind = "a whole number" if integer else "a number"

    def parse(value: object) -> float | int:
        if isinstance(value, int | float) and not isinstance(value, bool):
            v: float | int = value  # a default, already a number
            shown = str(value)
        else:
            shown = str(value).strip()
            pattern = _INT if integer else _FLOAT
            if not (pattern.fullmatch(shown) or (not integer and _SPECIAL.fullmatch(shown))):
                raise UsageError(f"{flag}: {shown[:40]!r} is not {kind} in digits 0-9; give "
                                 f"{unit}, {rng}")
            if len(shown) > 60:  # int() of thousands of digits is slow, then refused
                raise UsageError(f"{flag}: {shown[:20]}... ({len(shown):,} characters) is out "
                                 f"of range; give {unit}, {rng}")
            v = int(shown) if integer else float(shown)
        if not math.isfinite(v):
            raise UsageError(f"{flag}: {shown} is not a finite number; give {unit}, {rng}")
        if v < lo or v > hi or (above and v == lo):
            raise UsageError(f"{flag}: {shown} is out of range; give {unit}, {rng}")
        return v

    parse.__name__ = "integer" if integer else "float"  # the metavar click shows in --help
    return parse
