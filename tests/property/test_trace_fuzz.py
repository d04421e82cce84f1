"""Fuzzing what `simulate`, `plan --traffic` and `weights verify` read from users: the trace
parsers (Azure CSV, Mooncake JSONL) on arbitrary bytes and on mutated real rows, the weights
manifest, and the numeric options of `simulate` and `plan` through the CLI.

The property everywhere: the input is accepted as something valid (a trace sorted, finite,
non-negative, within the caps; a manifest whose every entry a node can check), or refused
with poolctl's own error (`UsageError`, which the CLI prints as one line, exit 2), never
anything else. Seeds are real rows: the Azure trace shipped in examples/traces and the
Mooncake sample in tests/data/traces (attribution in their READMEs).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sys
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from poolctl import traces, weights
from poolctl.errors import UsageError
from poolctl.traces import Trace, load_trace

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml"
AZURE_LINES = (ROOT / "examples" / "traces" / "azure-llm-2023-conv.csv").read_text(
    encoding="utf-8").splitlines(keepends=True)[:12]
MOONCAKE_ROWS = [json.loads(line) for line in (
    ROOT / "tests" / "data" / "traces" / "mooncake-sample.jsonl").read_text().splitlines()[:8]]


def check_trace(tr: Trace) -> None:
    """What every loaded trace is: the simulator relies on each of these."""
    n = len(tr)
    assert n >= 1 and len(tr.inputs) == len(tr.outputs) == n
    assert tr.arrivals[0] == 0.0
    assert all(math.isfinite(t) and t >= 0 for t in tr.arrivals)
    assert all(a <= b for a, b in zip(tr.arrivals, tr.arrivals[1:], strict=False))
    assert tr.span_s <= traces.MAX_SPAN_S
    for x in (*tr.inputs, *tr.outputs):
        assert type(x) is int and 0 <= x <= traces.MAX_TOKENS


def one_line(e: UsageError) -> None:
    text = str(e)
    assert text and "\n" not in text and "\r" not in text, repr(text)


def load_or_refuse(path: Path) -> Trace | None:
    """The trace, checked, or None when refused with one line."""
    try:
        tr = load_trace(path)
    except UsageError as e:
        one_line(e)
        return None
    check_trace(tr)
    return tr


# ------------------------------------------------------------------ arbitrary bytes


@given(data=st.binary(max_size=4096))
@example(data=b"")
@example(data=b"\xef\xbb\xbf")
@example(data=b"{")
@example(data=b"\x00" * 64)
def test_arbitrary_bytes(tmp_path_factory, data):
    f = tmp_path_factory.mktemp("b") / "t"
    f.write_bytes(data)
    load_or_refuse(f)


HEADS = [b"TIMESTAMP,ContextTokens,GeneratedTokens\n", b"\xef\xbb\xbfTIMESTAMP,ContextTokens,"
         b"GeneratedTokens\r\n", b'{"timestamp": 0, "input_length": 1, "output_length": 1}\n']


@given(head=st.sampled_from(HEADS), data=st.binary(max_size=2048), rows=st.integers(0, 3000))
def test_arbitrary_bytes_after_a_valid_start(tmp_path_factory, head, data, rows):
    # Past the format's detection and header, where the row parsers run; memory grows with
    # the file (a few dozen bytes per byte of a short row), never beyond.
    import tracemalloc

    f = tmp_path_factory.mktemp("h") / "t"
    row = b"0,0,0\n" if head[:1] != b"{" else head
    f.write_bytes(head + row * rows + data)
    tracemalloc.start()
    try:
        load_or_refuse(f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 64 * f.stat().st_size + (1 << 20), (peak, f.stat().st_size)


# ------------------------------------------------------------------ mutated real rows

# Values a user's tools write where a number belongs, and some that look like numbers.
HOSTILE_TEXT = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1", "-0", "+5", "1_000",
                "\u0661\u0662", "\uff11\uff12", "0x10", "1e3", "5.", ".5", "", " ", "1" * 30,
                "9" * 5000, "\x00", "\u202e1", "1 2", '"7"', "1,2", "2023-11-16", "24:00",
                "2023-02-30 10:00:00", "0001-01-01 00:00:00", "9999-12-31 23:59:59.9999999",
                "2023-11-16T18:15:46+14:00", "2023-11-16 18:15:46Z"]


@st.composite
def azure_text(draw: st.DrawFn) -> str:
    lines = list(AZURE_LINES)
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["field", "swap", "drop", "dup", "blank", "cut", "text",
                                   "bom", "crlf"]))
        fields = lines[i].rstrip("\r\n").split(",")
        if op == "field":
            j = draw(st.integers(0, len(fields) - 1))
            fields[j] = draw(st.sampled_from(HOSTILE_TEXT) | st.text(max_size=12))
            lines[i] = ",".join(fields) + "\n"
        elif op == "swap":  # unsorted times
            k = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[k] = lines[k], lines[i]
        elif op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "blank":
            lines.insert(i, draw(st.sampled_from(["\n", " \n", "\r\n", ",,\n"])))
        elif op == "cut":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif op == "text":
            pos = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:pos] + draw(st.text(max_size=6)) + lines[i][pos:]
        elif op == "bom":
            lines.insert(i, "\ufeff")
        else:
            lines[i] = lines[i].rstrip("\n") + "\r\n"
        if not lines:
            break
    return "".join(lines)


def same_with_a_bom(tmp: Path, text: str, tr: Trace | None) -> None:
    """Saved "UTF-8 with BOM" (Excel, Notepad), the file reads the same."""
    if text.startswith("\ufeff"):
        return  # it has one: a second is text, not a mark
    f = tmp / "bom"
    f.write_text("\ufeff" + text, encoding="utf-8", errors="surrogatepass")
    again = load_or_refuse(f)
    if tr is not None:
        assert again is not None
        assert (again.arrivals, again.inputs, again.outputs) == (tr.arrivals, tr.inputs,
                                                                 tr.outputs)


@given(text=azure_text())
@example(text="TIMESTAMP,ContextTokens,GeneratedTokens\n" + "9" * 400 + ",1,1\n")
def test_mutated_azure_rows(tmp_path_factory, text):
    tmp = tmp_path_factory.mktemp("a")
    f = tmp / "t.csv"
    f.write_text(text, encoding="utf-8", errors="surrogatepass")
    tr = load_or_refuse(f)
    if tr is not None:  # every count it took is written in ASCII digits, as the file says
        lines = text.removeprefix("\ufeff").split("\n")
        while not lines[0].strip():
            lines.pop(0)
        header = [h.strip() for h in lines[0].split(",")]
        rows = [r for r in csv.reader(io.StringIO("\n".join(lines[1:]))) if r]
        for col, got in (("ContextTokens", tr.inputs), ("GeneratedTokens", tr.outputs)):
            written = [r[header.index(col)].strip() for r in rows]
            assert all(re.fullmatch(r"[0-9]+", w) for w in written), written
            assert got == [int(w) for w in written]
    same_with_a_bom(tmp, text, tr)


JSON_VALUES: st.SearchStrategy[object] = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e400, -1, 0, -0.0, 1.5, 10**30,
                     10**400, True, False, None, "12", "1_000", "\u0661", "", [], {}, [1]]),
    st.integers(), st.floats(), st.text(max_size=8),
)


@st.composite
def mooncake_text(draw: st.DrawFn) -> str:
    rows = [dict(r) for r in MOONCAKE_ROWS]
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(rows) - 1))
        op = draw(st.sampled_from(["value", "drop-key", "add-key", "swap", "drop", "ms"]))
        if op == "value":
            key = draw(st.sampled_from(["timestamp", "input_length", "output_length",
                                        "hash_ids"]))
            rows[i][key] = draw(JSON_VALUES)
        elif op == "drop-key":
            rows[i].pop(draw(st.sampled_from(sorted(rows[i]))), None)
        elif op == "add-key":
            rows[i][draw(st.text(max_size=10))] = draw(JSON_VALUES)
        elif op == "swap":
            k = draw(st.integers(0, len(rows) - 1))
            rows[i], rows[k] = rows[k], rows[i]
        elif op == "drop" and len(rows) > 1:
            del rows[i]
        elif op == "ms":  # Mooncake's span cases: 0 then 1e15 ms, and friends
            rows[i]["timestamp"] = draw(st.sampled_from([0, 1e15, 2.6784e9, 2.6785e9, 1e300]))
    lines = [json.dumps(r) for r in rows]  # allow_nan: NaN and Infinity are written as such
    if draw(st.booleans()):  # and the text itself
        i = draw(st.integers(0, len(lines) - 1))
        pos = draw(st.integers(0, len(lines[i])))
        lines[i] = lines[i][:pos] + draw(st.text(max_size=6)) + lines[i][pos:]
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n", "\r\n"]))


@given(text=mooncake_text())
def test_mutated_mooncake_rows(tmp_path_factory, text):
    f = tmp_path_factory.mktemp("m") / "t.jsonl"
    f.write_text(text, encoding="utf-8", errors="surrogatepass")
    tr = load_or_refuse(f)
    if tr is not None:  # what was read is what the file says (lines end at \n only)
        rows = [json.loads(x) for x in text.removeprefix("\ufeff").split("\n") if x.strip()]
        written = [r["input_length"] for r in rows]
        assert all(type(w) is int or re.fullmatch(r"\s*[0-9]+\s*", w) for w in written)
        assert tr.inputs == [int(w) for w in written]
    same_with_a_bom(f.parent, text, tr)


def test_the_seeds_themselves_load(tmp_path):
    # The mutations start from valid traces (else the fuzzing tests only the refusals).
    (tmp_path / "a.csv").write_text("".join(AZURE_LINES))
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MOONCAKE_ROWS))
    assert len(load_trace(tmp_path / "a.csv")) == len(AZURE_LINES) - 1
    assert len(load_trace(tmp_path / "m.jsonl")) == len(MOONCAKE_ROWS)


# ------------------------------------------------------------------ the weights manifest

ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # sha256("abc")
PATHS = st.one_of(st.sampled_from(["config.json", "a/b", "../x", "/etc/passwd", "", ".",
                                   "a/../../x", "a//b", "a\x00b", "a\nb", "\u202e", "a\\b"]),
                  st.text(max_size=12))
ENTRIES = st.one_of(
    st.fixed_dictionaries({"sha256": st.sampled_from([ABC, ABC.upper(), "00", "g" * 64, ""])
                           | JSON_VALUES, "bytes": st.sampled_from([3, 0, -1, 2**50, 2**50 + 1])
                           | JSON_VALUES}),
    JSON_VALUES,
)
MANIFESTS = st.one_of(
    st.fixed_dictionaries({"files": st.dictionaries(PATHS, ENTRIES, max_size=4)}),
    st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=3),
    JSON_VALUES,
)


def verify_or_refuse(folder: Path) -> weights.Verified | None:
    try:
        result = weights.verify(folder)
    except UsageError as e:
        one_line(e)
        return None
    assert result.files >= 1 and all(isinstance(p, str) for p in result.problems)
    return result


@given(doc=MANIFESTS)
@example(doc={"files": {"config.json": {"sha256": ABC, "bytes": 1e400}}})
@example(doc={"files": {"config.json": {"sha256": ABC, "bytes": 3}}})
def test_manifest_documents(tmp_path_factory, doc):
    folder = tmp_path_factory.mktemp("w")
    (folder / "config.json").write_bytes(b"abc")
    (folder / "manifest.json").write_text(json.dumps(doc), errors="surrogatepass")
    result = verify_or_refuse(folder)
    if result is not None:
        assert result.ok == (doc == {"files": {"config.json": {"sha256": ABC, "bytes": 3}}}
                             or doc == {"files": {"config.json": {"sha256": ABC.upper(),
                                                                  "bytes": 3}}})


@given(data=st.binary(max_size=1024))
def test_manifest_bytes(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("wb")
    (folder / "config.json").write_bytes(b"abc")
    (folder / "manifest.json").write_bytes(data)
    verify_or_refuse(folder)


# ------------------------------------------------------------------ numeric options

# (flag, the range it takes): what the property checks an accepted value against.
SIMULATE_OPTIONS = {
    "--rate": (0, 100_000), "--duration": (0, traces.MAX_SPAN_S), "--seed": (0, 2**63 - 1),
    "--input-tokens": (1, traces.MAX_TOKENS), "--output-tokens": (1, traces.MAX_TOKENS),
    "--time-scale": (0.001, 1000), "--replicas": (1, 4096), "--warm": (0, 4096),
}
PLAN_OPTIONS = ("--rate", "--duration", "--seed", "--time-scale")
NUMBERS = st.one_of(
    st.sampled_from(["nan", "NaN", "-nan", "inf", "+inf", "-Infinity", "0", "-0", "-1", "0.0",
                     "1e-300", "1e300", "1e400", "1_000", "\u0661\u0662", "\uff11", "0x10",
                     "1e", ".", "", " 5 ", "9" * 5000, "4096", "4097", "100000", "100001",
                     "2678400", "2678401", "0.001", "0.0009", "1000", "1000.0001"]),
    st.floats().map(repr), st.floats().map(lambda x: f"{x:.3e}"),
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
    st.text(max_size=10).filter(lambda s: "\x00" not in s),
)


class Accepted(BaseException):  # noqa: N818  (not an error: the run got past every check)
    """Raised where the command would start simulating: every option was accepted. A
    BaseException, so that the CLI's last net (which turns an Exception into an internal
    error line) lets it through to the test."""


def _stop(*_args: object, **_kw: object) -> None:
    raise Accepted


@pytest.fixture(scope="module")
def cheap(tmp_path_factory):
    """Runs that stop where the simulation would start, with at most 2,000 synthetic requests
    (the cap's logic is the same at 1,000,000, the generation 500 times cheaper)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(traces, "MAX_REQUESTS", 2_000)
    # where the commands bound the names (they import them at the top)
    mp.setattr("poolctl.commands.simulate.run_pool", _stop)
    mp.setattr("poolctl.commands.check.recommend", _stop)
    yield
    mp.undo()


def run_option(command: str, flag: str, value: str) -> tuple[int | None, str]:
    """(exit code, stderr), or (None, "") when the run got to the simulation."""
    from tests.inproc import run

    base = ["-f", str(EXAMPLE), "--cloud", "aws"]
    if flag != "--rate":
        base += ["--rate", "1", "--duration", "60"] if flag != "--duration" else ["--rate",
                                                                                   "0.0001"]
    if command == "simulate" and flag == "--warm":
        base.append("--autoscale")
    try:
        res = run([command, *base, f"{flag}={value}"], env=dict(__import__("os").environ))
    except Accepted:
        return None, ""
    return res.returncode, res.stderr


def check_option(command: str, flag: str, value: str) -> None:
    code, err = run_option(command, flag, value)
    lo, hi = SIMULATE_OPTIONS[flag]
    if code is None:  # accepted: then it was a finite number in range
        v = float(value)
        assert math.isfinite(v) and lo <= v <= hi, (flag, value)
        return
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.startswith("poolctl:")]
    assert code == 2 and len(lines) == 1, (flag, value, code, err)
    # the flag, or the pair whose product is capped (--time-scale K: the span it stretches)
    assert lines[0].startswith((f"poolctl: {flag}", "poolctl: --rate/--duration")), lines[0]


@given(flag=st.sampled_from(sorted(SIMULATE_OPTIONS)), value=NUMBERS)
def test_simulate_numeric_options(cheap, flag, value):
    check_option("simulate", flag, value)


@given(flag=st.sampled_from(PLAN_OPTIONS), value=NUMBERS)
def test_plan_numeric_options(cheap, flag, value):
    check_option("plan", flag, value)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
