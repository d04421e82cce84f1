"""TIME flags and trace offsets (`warm --from/--until`, `simulate --warm-window`) drawn from
their grammar and from hostile text (issue 31): every input is a time within the bounds, or
one line naming the flag (exit 2). Never exit 70, never a time past the bounds, never a hang
(`--warm-window 0,1e300,1` used to replay forever)."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from poolctl.errors import UsageError
from poolctl.windows import MAX_AHEAD, MAX_SPAN, parse_span, parse_time, parse_warm_window
from tests import inproc
from tests.unit.test_simulate import one_line

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
NUM = st.one_of(st.integers(0, 10**12).map(str), st.sampled_from(
    ["", "0", "99999999999", "9" * 5000, "١٢", "²", "1e300", "1.5", "-1", "+1", " 1"]))
UNIT = st.sampled_from(["d", "h", "m", "s", "", "x", "D"])
OFFSET = st.lists(st.tuples(NUM, UNIT), min_size=1, max_size=4).map(
    lambda parts: "+" + "".join(n + u for n, u in parts))
ZONE = st.sampled_from(["Z", "z", "+00:00", "-23:59", "+23:59", "+01:00", "", "+24:00"])
RFC = st.builds(
    lambda y, mo, d, h, mi, s, z: f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}{z}",
    st.integers(1, 9999), st.integers(0, 13), st.integers(0, 32), st.integers(0, 25),
    st.integers(0, 61), st.integers(0, 61), ZONE)
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)
TIMES = st.one_of(OFFSET, RFC, TEXT)


@given(text=TIMES)
@example(text="+99999999999d")
@example(text="9999-12-31T23:00:00-23:59")
@example(text="0001-01-01T00:00:00+23:59")
@example(text="9999-12-31T23:59:59Z")
@example(text="+" + "9" * 5000 + "d")
def test_a_time_is_within_bounds_or_one_line_naming_the_flag(text):
    try:
        at = parse_time("--from", text, NOW)
    except UsageError as e:
        assert str(e).startswith("--from ") and "\n" not in str(e), str(e)
        return
    assert abs(at - NOW) <= MAX_AHEAD
    assert at.astimezone(UTC).tzinfo is UTC  # converts without overflow


SPAN = st.one_of(NUM, st.tuples(NUM, UNIT).map("".join), TEXT,
                 st.floats(allow_nan=True, allow_infinity=True).map(repr))


@given(text=SPAN)
@example(text="1e300")
@example(text="99999999999d")
def test_a_span_is_within_a_trace_or_one_line(text):
    try:
        s = parse_span("--warm-window UNTIL", text)
    except UsageError as e:
        assert str(e).startswith("--warm-window UNTIL") and "\n" not in str(e)
        return
    assert 0 <= s <= MAX_SPAN.total_seconds()


@given(start=SPAN, end=SPAN, n=NUM, state=st.sampled_from(["", ",running", ",stopped", ",x"]),
       neg=st.booleans())
@example(start="0", end="99999999999d", n="1", state="", neg=False)
@example(start="0", end="1h", n="²", state="", neg=False)
@example(start="0", end="1h", n="9" * 5000, state="", neg=False)
@example(start="99999999999d", end="1h", n="1", state="", neg=True)
@example(start="0", end="1e300", n="1", state="", neg=False)
def test_warm_window_is_a_bounded_window_or_one_line(start, end, n, state, neg):
    text = f"{'-' if neg else ''}{start},{end},{n}{state}"
    try:
        a, b, replicas, _ = parse_warm_window(text)
    except UsageError as e:
        assert str(e).startswith("--warm-window") and "\n" not in str(e)
        return
    assert -MAX_SPAN.total_seconds() <= a < b <= MAX_SPAN.total_seconds()
    assert 1 <= replicas <= 999_999


EXAMPLE = "examples/llama-70b-p5/poolctl.yaml"


@pytest.mark.parametrize(("args", "flag", "says"), [
    (["simulate", "--rate", "1", "--autoscale", "--warm-window", "0,99999999999d,1"],
     "--warm-window UNTIL", "31 days"),
    (["simulate", "--rate", "1", "--autoscale", "--warm-window", "0,1e300,1"],
     "--warm-window UNTIL", "31 days"),
    (["simulate", "--rate", "1", "--autoscale", "--warm-window", "0,1h,²"],
     "--warm-window", "N is a number of replicas"),
    (["simulate", "--rate", "1", "--autoscale", "--warm-window", "0,1h," + "9" * 5000],
     "--warm-window", "N is a number of replicas"),
    (["simulate", "--rate", "1", "--autoscale", "--warm-window", "-99999999999d,1h,1"],
     "--warm-window FROM", "31 days"),
    (["warm", "--replicas", "1", "--running", "--from", "+99999999999d", "--until", "+1d"],
     "--from", "up to 366 days ahead"),
    (["warm", "--replicas", "1", "--running", "--from", "9999-12-31T23:00:00-23:59",
      "--until", "+1d"], "--from", "366 days"),
    (["warm", "--replicas", "1", "--running", "--from", "9999-01-01T00:00:00Z", "--until",
      "9999-01-02T00:00:00Z"], "--from", "366 days"),
])
def test_the_issues_rows_are_one_line_exit_2(args, flag, says, tmp_path):
    r = inproc.run([*args, "-f", EXAMPLE, "--cloud", "aws"],
                   env={**os.environ, "POOLCTL_HOME": str(tmp_path)}, timeout=60)
    line = one_line(r.returncode, r.stderr)
    assert flag in line and says in line, line
