"""Generated and mutated configs through `validate` and `plan` (issue 23, "fuzz, don't
enumerate").

Each example is a config that is valid to start with (the examples, the contract's pool, and
one with every optional block set), changed by one of:

- one field set to a hostile value (wrong types, zeros, negatives, NaN/inf, huge integers,
  Terraform templates, control and bidi characters, long text) or to any value its JSON
  Schema allows (drawn by hypothesis-jsonschema from `poolctl.schema.json`), a field
  deleted, or an unknown key added;
- whole sections replaced by ones drawn from the schema;
- YAML's own constructs placed in a mapping: complex keys, keys that are not names, merge
  keys (once, twice), anchors and aliases, tags, duplicate keys;
- damage to the text: characters (controls, BOM, YAML indicators, unicode) inserted, lines
  cut, the file truncated.

`poolctl validate` and `poolctl plan --json` then run on it in this process (tests/inproc.py,
the console script's entry), and must end in exit 0 or 1 (a rule), or exit 2 with one line
per problem on stderr, each starting `poolctl: ` (exactly one for a single changed value);
never a traceback or an internal error, no line that a control character could break or
repaint, `plan --json` output without NaN/Infinity, no process started and nothing written
anywhere but the example's own folder and $POOLCTL_HOME (an audit hook watches every open for
writing, mkdir, rename, remove and process start while a command runs).

`synth` is left out: it loads cdktf and the provider assemblies (~20 s per worker), and runs
after the same load and rules as `plan` (tests/unit/test_hostile_configs.py runs it on the
enumerated cases; tests/synth/test_contract.py synthesizes the accepted edges).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
import re
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, given, settings
from hypothesis import strategies as st

from poolctl.rules import CHECKS
from tests.configs import pool_yaml
from tests.inproc import run

ROOT = Path(__file__).resolve().parents[2]
SCHEMA: dict[str, Any] = json.loads((ROOT / "poolctl.schema.json").read_text())
AWS_ARN = "arn:aws:secretsmanager:us-east-1:123456789012:secret:vllm-key-AbCdEf"

# A config with every optional block set, so that mutations reach them as written too.
RICH = (
    "backend:\n"
    "  aws: {bucket: acme-tfstate, region: us-east-1, key_prefix: pools/x, "
    "dynamodb_table: tf-locks}\n"
    "  gcp: {bucket: acme-tfstate-gcs, prefix: pools}\n"
    + pool_yaml(
        extra_aws=(
            "      certificate_arn: arn:aws:acm:us-east-1:123456789012:certificate/"
            "0a1b2c3d-4e5f-6789-abcd-ef0123456789\n"
            "      image_builder_type: m6i.xlarge\n"
            "      ami_id: ami-0123456789abcdef0\n"
            "      access_logs_bucket: acme-alb-logs\n"
            "      access_logs_prefix: pools/chat\n"
            "      volume_initialization_rate_mib_s: 200\n"
            "      node_access: instance-connect\n"
            "      network:\n"
            "        vpc_id: vpc-0123456789abcdef0\n"
            "        subnet_ids: [subnet-0123456789abcdef0, subnet-0fedcba987654321f]\n"
            "        client_cidrs: [10.0.0.0/8]\n"),
        extra_gcp=(
            "      image: projects/acme-prod/global/images/family/gpu-node\n"
            "      base_image: family/gpu-base\n"
            "      image_builder_type: n2-standard-4\n"
            "      zones: [us-central1-a, us-central1-b]\n"
            "      network: projects/host-proj/global/networks/shared\n"
            "      subnetwork: projects/host-proj/regions/us-central1/subnetworks/nodes\n"
            "      certificate: chat-tls\n"
            "      node_access: iap\n"))
    .replace("      params_b: 70.6\n", "      params_b: 70.6\n      version: '2024-06-01'\n")
    .replace("      port: 8000\n", "      port: 8000\n      max_num_seqs: 128\n"
             "      extra_args: [--enable-prefix-caching]\n"
             f"      api_key_secret: {{aws: '{AWS_ARN}', gcp: vllm-key}}\n")
    .replace("    slo:\n", "    perf:\n      prefill_mfu: 0.5\n      step_overhead_ms: 4.0\n"
             "      decode_ms_batch1: 20.0\n      decode_ms_batch64: 30.0\n    slo:\n")
)
BASE_TEXTS = {p.parent.name: p.read_text()
              for p in sorted(ROOT.glob("examples/*/poolctl.yaml"))}
BASE_TEXTS |= {"contract": pool_yaml(), "rich": RICH}
BASES = {name: yaml.safe_load(text) for name, text in BASE_TEXTS.items()}

# ------------------------------------------------------------------ hypothesis-jsonschema


def _jsonschema_on_this_hypothesis() -> None:
    """hypothesis-jsonschema 0.23 draws objects with `many(...).more()`, an internal API that
    Hypothesis 6.1xx replaced by a context manager and an iterator. Give its module an
    adapter with the old method, built on the new one (nothing else sees it)."""
    from hypothesis.internal.conjecture import utils as cu
    from hypothesis_jsonschema import _from_schema

    if hasattr(cu.many, "more"):
        return

    class Many(cu.many):
        def more(self) -> bool:
            if self._depth is None:
                self.__enter__()
                self._steps = iter(self)
            for _ in self._steps:
                return True
            self.__exit__(None)
            return False

    _from_schema.cu = types.SimpleNamespace(  # type: ignore[attr-defined,assignment]
        **{**vars(cu), "many": Many})


_jsonschema_on_this_hypothesis()


def _inline(node: Any) -> Any:
    """The schema with every $ref replaced by its definition (the config model has no
    recursion): a field's schema then stands alone, and hypothesis-jsonschema does not
    canonicalise all of $defs again for each field (~0.5 s each)."""
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline(SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]])
        return {k: _inline(v) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v) for v in node]
    return node


INLINED: dict[str, Any] = _inline(SCHEMA)


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    return node


def _branches(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null alternatives of a schema node, resolved."""
    node = _resolve(node)
    subs = node.get("anyOf") or node.get("oneOf")
    if not subs:
        return [node]
    return [b for s in subs for b in _branches(s) if b.get("type") != "null"]


def _schema_paths() -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every key path the schema defines (list items as index 0), with its schema."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}

    def walk(node: dict[str, Any], path: tuple[Any, ...]) -> None:
        for branch in _branches(node):
            for key, sub in branch.get("properties", {}).items():
                out[(*path, key)] = sub
                walk(sub, (*path, key))
            if branch.get("type") == "array" and "items" in branch:
                out[(*path, 0)] = branch["items"]
                walk(branch["items"], (*path, 0))

    walk(INLINED, ())
    return out


SCHEMA_PATHS = _schema_paths()


def _small(node: Any) -> Any:
    """`node` with at most 2 pools and 3 items in any other list: a drawn config stays a
    few KB (each pool is one of the model's whole trees to draw)."""
    if isinstance(node, dict):
        out = {k: _small(v) for k, v in node.items()}
        if out.get("type") == "array":
            out["maxItems"] = min(out.get("maxItems", 3), 3)
        return out
    if isinstance(node, list):
        return [_small(v) for v in node]
    return node


@functools.cache
def _from_schema(path: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    from hypothesis_jsonschema import from_schema

    node = _small(INLINED if not path else SCHEMA_PATHS[path])
    if not path:
        node["properties"]["pools"]["maxItems"] = 2
    return from_schema(node)


def _lookup(path: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The schema path of a data path (every list index as 0)."""
    key = tuple(0 if isinstance(p, int) else p for p in path)
    return key if key in SCHEMA_PATHS else None


# ------------------------------------------------------------------------------ values

HOSTILE_SCALARS: list[Any] = [
    0, -1, 1, 3, 7, 9, 2**31, 2**63, 10**30, 10**400, -(10**400), True, False, None,
    0.0, -0.0, 0.5, 1.0, 1.5, 1e-300, 5e-324, 1e308, -1e308,
    math.nan, math.inf, -math.inf,
    "", " ", "0", "1e400", "yes", "~", "..", "/", "/dev/zero", "/dev/stdin", "a" * 300,
    "x" * 5000, "${var.x}", 'file("/etc/passwd")', "%{ if true }x%{ endif }", "$${e}",
    "a\x00b", "\x1b[31mred\x1b[0m", "v1\u202e2v", "\u200bzero", "a\nb", "a\rb", "a\tb",
    "'\"", "\\", "ünï©ødé ✓", "\ufeffbom", "us-east-1; rm -rf /", "s3://a/../b/",
]


def hostile_values() -> st.SearchStrategy[Any]:
    scalar = st.one_of(
        st.sampled_from(HOSTILE_SCALARS),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=30),
        st.text(st.characters(codec="utf-8", categories=["Cc", "Cf", "Zl", "Zp", "Zs", "Co"]),
                min_size=1, max_size=5),
    )
    return st.one_of(
        scalar,
        st.lists(scalar, max_size=3),
        st.dictionaries(st.text(max_size=8), scalar, max_size=2),
    )


# ----------------------------------------------------------------------- data mutations


def _data_paths(data: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(data, dict):
        for k, v in data.items():
            yield (*path, k)
            yield from _data_paths(v, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield (*path, i)
            yield from _data_paths(v, (*path, i))


def _set(data: Any, path: tuple[Any, ...], value: Any) -> str:
    """Set `path` in `data`: "set"; "created" when mappings on the way had to be made
    (which may lack their own required keys); "" where a parent cannot hold it."""
    node, how = data, "set"
    for i, part in enumerate(path[:-1]):
        if isinstance(node, dict):
            if part not in node:
                node[part], how = ([] if isinstance(path[i + 1], int) else {}), "created"
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return ""
    last = path[-1]
    if isinstance(node, dict):
        node[last] = value
        return how
    if isinstance(node, list) and isinstance(last, int):
        if last < len(node):
            node[last] = value
        else:
            node.append(value)
        return how
    return ""


def _delete(data: Any, path: tuple[Any, ...]) -> None:
    node = data
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]


@st.composite
def one_change(draw: st.DrawFn) -> tuple[str, dict[str, Any], str, bool]:
    """(base name, changed data, what changed, single): one field set, deleted or added."""
    name = draw(st.sampled_from(sorted(BASES)))
    data = copy.deepcopy(BASES[name])
    present = list(_data_paths(data))
    op = draw(st.sampled_from(["hostile", "hostile", "schema", "schema", "delete", "unknown"]))
    if op == "delete":
        path = draw(st.sampled_from(present))
        _delete(data, path)
        return name, data, f"delete {path}", True
    if op == "unknown":
        mappings = [()] + [p for p in present if isinstance(_get(data, p), dict)]
        path = (*draw(st.sampled_from(mappings)), draw(st.text(min_size=1, max_size=12)))
        _set(data, path, draw(hostile_values()))
        return name, data, f"add {path}", path[-1] not in _get(BASES[name], path[:-1])
    # set: a path of the base (as written) or of the schema (perhaps absent from the base)
    path = draw(st.one_of(st.sampled_from(present), st.sampled_from(sorted(SCHEMA_PATHS, key=str))))
    value = draw(hostile_values()) if op == "hostile" or _lookup(path) is None else draw(
        _from_schema(_lookup(path)))
    how = _set(data, path, value)
    if not how:
        event("change: parent is not a mapping (unchanged)")
    # one problem, one line: a scalar or an empty list in place of one value (a mapping or a
    # list of several values may hold several problems)
    single = how == "set" and not isinstance(value, dict) and not (
        isinstance(value, list) and value)
    return name, data, f"{op} {path} = {value!r:.80}", single


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


# ---------------------------------------------------------------- emitting YAML ourselves

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*")


def _scalar(v: Any, draw: st.DrawFn | None = None) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ".nan"
        if math.isinf(v):
            return ".inf" if v > 0 else "-.inf"
        text = repr(v)
        # YAML 1.1 (PyYAML) reads a float only with a '.' in it
        return text if "." in text else text.replace("e", ".0e", 1)
    text = str(v)
    if draw is not None and _PLAIN.fullmatch(text) and draw(st.booleans()):
        return text  # plain: YAML's own typing applies (yes, 1e3, 12:30, 2024-01-01 ...)
    return json.dumps(text)  # JSON's escapes are YAML double-quoted escapes too


# What can be placed in a mapping (flow style), by YAML feature.
YAML_FEATURES = {
    "complex-key-list": ["[a, b]: c"],
    "complex-key-map": ["{a: 1}: c", "? {a: 1} : c"],
    "non-name-key": ["1: x", "null: x", "true: x", "1.5: x", "!!binary aGk=: x", "~: x"],
    "merge-once": ["<<: {}", "<<: {zz: 1}"],
    "merge-twice": ["<<: {}, <<: {}", "<<: {a: 1}, <<: {b: 2}"],
    "merge-bad": ["<<: 1", "<<: [1]", "<<: *nope"],
    "duplicate": ["dup: 1, dup: 2"],
    "tag": ["t: !!binary aGVsbG8=", "t: !!set {a, b}", "t: !!omap [a: 1]", "t: !!str 5",
            "t: !!float 1", "t: !!timestamp 2024-01-01", "t: !!python/name:os.system",
            "t: !custom x"],
    "nesting": ["deep: " + "[" * 40 + "]" * 40],
}


@st.composite
def yaml_document(draw: st.DrawFn) -> tuple[str, str]:
    """(text, feature): a base written in flow style with one YAML feature placed into one of
    its mappings, or with an anchor on one node and an alias to it at another."""
    name = draw(st.sampled_from(sorted(BASES)))
    data = BASES[name]
    mappings = [()] + [p for p in _data_paths(data) if isinstance(_get(data, p), dict)]
    target = draw(st.sampled_from(mappings))
    feature = draw(st.sampled_from(sorted(YAML_FEATURES) + ["anchor-alias"]))
    snippet = draw(st.sampled_from(YAML_FEATURES.get(feature, [""])))
    nodes = list(_data_paths(data))
    anchor_at = draw(st.sampled_from(nodes)) if feature == "anchor-alias" else None
    alias_at = draw(st.sampled_from(nodes)) if feature == "anchor-alias" else None

    def emit(node: Any, path: tuple[Any, ...]) -> str:
        mark = "&a " if path == anchor_at else ""
        if path == alias_at and anchor_at is not None and path != anchor_at:
            return "*a"
        if isinstance(node, dict):
            items = [f"{_scalar(k)}: {emit(v, (*path, k))}" for k, v in node.items()]
            if path == target and snippet:
                items.insert(draw(st.integers(0, len(items))), snippet)
            return mark + "{" + ", ".join(items) + "}"
        if isinstance(node, list):
            return mark + "[" + ", ".join(emit(v, (*path, i)) for i, v in enumerate(node)) + "]"
        return mark + _scalar(node, draw)

    return emit(data, ()) + "\n", f"{feature} at {target}"


@st.composite
def damaged_text(draw: st.DrawFn) -> tuple[str, str]:
    """(text, what): a base's text with characters inserted, a line cut, or truncated."""
    name = draw(st.sampled_from(sorted(BASE_TEXTS)))
    text = BASE_TEXTS[name]
    how = draw(st.sampled_from(["insert", "insert", "cut-line", "truncate"]))
    at = draw(st.integers(0, len(text)))
    if how == "insert":
        chunk = draw(st.one_of(
            st.sampled_from(["\x00", "\x1b", "\ufeff", "\u202e", "\x85", "\u2028", "\t", "\r",
                             ": ", "- ", "? ", "&a ", "*a", "!!", "<<: ", "{", "[", "'", '"',
                             "#", "|", ">", "%", "@", "`", "\n  ", "\n", "---\n", "...\n"]),
            st.text(max_size=6)))
        return text[:at] + chunk + text[at:], f"insert {chunk!r}"
    if how == "cut-line":
        lines = text.splitlines(keepends=True)
        i = draw(st.integers(0, len(lines) - 1))
        return "".join(lines[:i] + lines[i + 1:]), f"cut line {i + 1}"
    return text[:at], f"truncate at {at}"


# --------------------------------------------------------------- running and judging

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.symlink", "os.link",
                "os.truncate", "os.chmod", "os.chown", "shutil.rmtree", "shutil.move"}
_PROCESS_EVENTS = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                   "os.fork", "os.forkpty"}


class Watch:
    """What a command did outside its folder (an audit hook fills it while armed)."""

    armed: Watch | None = None

    def __init__(self, allowed: Path) -> None:
        self.allowed = str(allowed.resolve())
        self.found: list[str] = []

    def path_ok(self, path: object) -> bool:
        if isinstance(path, int):
            return True  # an open file descriptor
        full = os.path.realpath(os.fsdecode(path))  # type: ignore[arg-type]
        return (full == os.devnull or full.startswith(self.allowed + os.sep)
                or f"{os.sep}__pycache__{os.sep}" in full)  # imports compile on first use


def _audit(name: str, args: tuple[Any, ...]) -> None:
    watch = Watch.armed
    if watch is None:
        return
    if name == "open":
        path, _mode, flags = args
        if flags and flags & _WRITE_FLAGS and not watch.path_ok(path):
            watch.found.append(f"open for writing: {path!r}")
    elif name in _PATH_EVENTS:
        for path in args[:2]:
            if isinstance(path, str | bytes | os.PathLike) and not watch.path_ok(path):
                watch.found.append(f"{name}: {path!r}")
    elif name in _PROCESS_EVENTS:
        watch.found.append(f"{name}: {args[:2]!r}")


sys.addaudithook(_audit)  # for the whole worker, but it acts only while a Watch is armed


@pytest.fixture(scope="module", autouse=True)
def _one_command_tree():
    """Typer builds its click command tree on every `main()` (~70 ms of the ~100 ms a
    validate takes in-process); the tree is the same each time, so build it once here."""
    import typer.main

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(typer.main, "get_command", functools.cache(typer.main.get_command))
        yield


def _event(text: str) -> None:
    """A statistics label (`--hypothesis-show-statistics`), inside a given-test only."""
    from hypothesis.control import _current_build_context

    if _current_build_context.value is not None:
        event(text)


FINDING = re.compile(r"^(\S.*: )?(error|warning|info): \[[a-z0-9-]+\] ")
INPUT_CHECKS = tuple(c.id for c in CHECKS if c.input)  # their errors exit 2


def _no_constant(name: str) -> Any:
    raise AssertionError(f"plan --json printed {name}, which is not JSON")


def judge(text: str | bytes, what: str, *, single: bool) -> dict[str, int]:
    """Run validate and plan --json on `text`; assert the contract; the exit codes."""
    codes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="fuzz-") as tmp:
        folder = Path(tmp)
        f = folder / "poolctl.yaml"
        f.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder / "user"),
               "POOLCTL_HOME": str(folder / "home"), "AWS_EC2_METADATA_DISABLED": "true",
               "NO_GCE_CHECK": "true", "LANG": "C.UTF-8"}
        for argv in (["validate"], ["plan", "--json"]):
            watch = Watch(folder)
            Watch.armed = watch
            try:
                r = run([*argv, "-f", str(f)], env=env, cwd=folder, timeout=120)
            finally:
                Watch.armed = None
            context = f"{what}\n$ poolctl {' '.join(argv)}\nexit {r.returncode}\n{r.stderr}"
            assert not watch.found, f"{watch.found}\n{context}"
            assert r.returncode in (0, 1, 2), context
            assert "Traceback" not in r.stderr + r.stdout, context
            assert "internal error" not in r.stderr, context
            lines = r.stderr.splitlines()
            # one line per problem: nothing in it may break or repaint a terminal line
            unprintable = [line for line in lines if not line.isprintable()]
            assert not unprintable, f"{unprintable!r}\n{context}"
            # Exit 2 from a rule judging input (a fallback type that can never serve): the
            # findings as for a failed rule, one of them that rule's error.
            input_error = r.returncode == 2 and any(
                f": error: [{check}]" in line for line in lines for check in INPUT_CHECKS)
            if r.returncode == 2 and not input_error:
                assert lines and all(line.startswith("poolctl: ") for line in lines), context
                if single:
                    assert len(lines) == 1, context
                assert r.stdout == "", context
            else:
                ok = ("poolctl: ", "ok: ", "FAILED: ")
                assert all(line.startswith(ok) or FINDING.match(line) for line in lines), context
            if r.returncode == 1:
                assert any(": error: [" in line for line in lines), context
            if argv[0] == "plan" and r.returncode == 0:
                out = json.loads(r.stdout, parse_constant=_no_constant)
                assert out["pools"], context
            assert sorted(p.name for p in folder.iterdir() if p.name != "home") == [
                "poolctl.yaml"], context
            codes[argv[0]] = r.returncode
            _event(f"{argv[0]}: exit {r.returncode}")
            if r.returncode == 2:
                break  # plan reads the file the same way: the same line
    return codes


# ------------------------------------------------------------------------------- tests


def test_every_base_is_accepted():
    """The mutations start from valid configs: each base passes validate and plan."""
    for name, text in BASE_TEXTS.items():
        assert judge(text, name, single=True) == {"validate": 0, "plan": 0}, name


@given(one_change())
def test_one_field_changed(change):
    name, data, what, single = change
    event(f"change: {what.split(' ', 1)[0]}")
    judge(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), f"{name}: {what}",
          single=single)


SECTIONS = [p for p in SCHEMA_PATHS if len(p) == 3 and p[:2] == ("pools", 0)] + [
    ("backend",), ("backend", "aws"), ("backend", "gcp")]


@settings(max_examples=max(10, settings().max_examples // 4))
@given(st.sampled_from(sorted(BASES)), st.lists(st.sampled_from(SECTIONS), min_size=1,
                                               max_size=3, unique=True), st.data())
def test_sections_drawn_from_the_schema(name, sections, data):
    """Whole sections (serving, scaling, aws, backend ...) replaced by what the schema
    allows: drawing whole configs takes ~1 s each (hypothesis-jsonschema's object
    strategy), sections a tenth of that."""
    config = copy.deepcopy(BASES[name])
    for path in sections:
        _set(config, path, data.draw(_from_schema(path), label=str(path)))
    judge(yaml.safe_dump(config, sort_keys=False, allow_unicode=True),
          f"{name}: sections {sections}", single=False)


@settings(max_examples=max(10, settings().max_examples // 4))
@given(_from_schema(()))
def test_whole_configs_drawn_from_the_schema(config):
    judge(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), "whole config",
          single=False)


@given(yaml_document())
def test_yaml_constructs(doc):
    text, what = doc
    event(f"yaml: {what.split(' ', 1)[0]}")
    judge(text, what, single=False)


@given(damaged_text())
def test_damaged_text(damage):
    text, what = damage
    event(f"damage: {what.split(' ', 1)[0]}")
    judge(text, what, single=False)
