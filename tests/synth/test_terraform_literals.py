"""Strings from the file reach Terraform as literals (issue 8, points 1 and 2).

Every example stack of both clouds and hostile configs (each free-text field holding
Terraform template syntax, escapes, quotes, unicode and newlines) are synthesized in one
process; every string of every stack is then evaluated by real Terraform in one throwaway
configuration (outputs only: no provider, no network). poolctl's own `${...}` expressions
(references to the stack's resources and variables) are swapped for a marker first, since
the throwaway configuration has none of those objects; their quoted-string operands are
evaluated on their own. Each string must come back as the literal poolctl meant, each
hostile value must arrive whole, and both boot script variants must be the rendered scripts.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from poolctl.bootscript import render_boot_script
from poolctl.config import Config, load_config
from poolctl.errors import OperationFailed, UsageError

pytestmark = pytest.mark.synth

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(ROOT.glob("examples/*/poolctl.yaml"))
# Template syntax, escapes and characters that must all arrive as written.
HOSTILE = ('${file("/etc/hostname")}|%{ if true }x%{ endif }|$${e}|%%{d}|$$${t}|lone $|'
           '50%|back\\slash\\n|"dq" \'sq\'|ünï©ødé ✓|new\nline')
MARK = "@@poolctl-expression@@"  # stands for one of poolctl's own expressions

# Terraform reads these places literally (no template): raw values belong there.
LITERAL_KEYS = {("variable", "default"), ("variable", "description"), ("variable", "type"),
                ("output", "description")}
# Meta-arguments: references, not templates.
REFERENCE_KEYS = {"depends_on", "provider", "ignore_changes", "replace_triggered_by"}
FUNCTIONS = {"one", "length", "element", "lookup"}  # what poolctl's expressions call
KEYWORDS = {"for", "in", "if", "true", "false", "null"}


def _set(model, path: str, value):
    """`model` with the dotted `path` replaced, without validation: the stacks must hold
    whatever gets past the schema."""
    head, _, rest = path.partition(".")
    if not rest:
        return model.model_copy(update={head: value})
    return model.model_copy(update={head: _set(getattr(model, head), rest, value)})


def hostile(cfg: Config, field: str, value) -> Config:
    pool = cfg.pools[0]
    for other, v in NEEDS.get(field, {}).items():
        pool = _set(pool, other, v)
    return cfg.model_copy(update={"pools": [_set(pool, field, value)]})


NO_SLASH = HOSTILE.replace("/", "")  # names where `/` would make a path of them
# field -> hostile value (the prefixes keep values apart and parseable: `/`, `s3://b/`).
AWS_FIELDS = {
    "model.id": "m-" + HOSTILE,
    "model.version": "v-" + HOSTILE,
    "serving.image": "img-" + HOSTILE,
    "serving.health_path": "/hp-" + HOSTILE,
    "serving.extra_args": ["--x=" + HOSTILE],
    "aws.weights_uri": "s3://acme-models/wp-" + HOSTILE + "/",
    "aws.ami_ssm_parameter": "/ssm-" + HOSTILE,
    "aws.ami_id": "ami-" + HOSTILE,
    "aws.certificate_arn": "arn-" + HOSTILE,
    "aws.access_logs_bucket": "logs-" + HOSTILE,
    "aws.access_logs_prefix": "lp-" + HOSTILE,
    "aws.network.client_cidrs": ["cidr-" + HOSTILE],
    "aws.network.availability_zone_ids": ["az1-" + HOSTILE, "az2-" + HOSTILE],
}
GCP_FIELDS = {
    "model.id": "m-" + HOSTILE,
    "model.version": "v-" + HOSTILE,
    "serving.image": "img-" + HOSTILE,
    "serving.health_path": "/hp-" + HOSTILE,
    "gcp.project": "pr-" + HOSTILE,
    "gcp.zones": ["z-" + HOSTILE, "us-central1-a"],
    "gcp.image": "im-" + HOSTILE,
    "gcp.network": "net-" + NO_SLASH,
    "gcp.subnetwork": "sub-" + NO_SLASH,
    "gcp.weights_uri": "gs://acme-models/wp-" + HOSTILE + "/",
    "gcp.certificate": "cert-" + HOSTILE,
}
NEEDS = {"aws.access_logs_prefix": {"aws.access_logs_bucket": "acme-lb-logs"}}
# Fields no stack code parses: they must synthesize (a parsed one may refuse, naming it).
MUST_SYNTHESIZE = {"model.id", "model.version", "serving.image", "serving.health_path",
                   "serving.extra_args", "aws.ami_ssm_parameter", "aws.ami_id", "gcp.network",
                   "gcp.subnetwork", "gcp.image"}


def _targets():
    """(label, cfg, cloud, field or None, value) for the examples and every hostile field."""
    out = []
    for path in EXAMPLES:
        cfg = load_config(path)
        for t in cfg.targets(None, None):
            pool, cloud = t.pool, t.cloud
            one = cfg.model_copy(update={"pools": [pool]})
            out.append((f"{path.parent.name}/{cloud}", one, cloud, None, None))
    base = load_config(ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml")
    for cloud, fields in (("aws", AWS_FIELDS), ("gcp", GCP_FIELDS)):
        for field, value in fields.items():
            out.append((f"{cloud}:{field}", hostile(base, field, value), cloud, field, value))
    return out


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory):
    """label -> (cfg, cloud, field, value, stack JSON or the UsageError that refused it)."""
    from cdktn import App

    from poolctl_stacks.app import add_stacks

    root = tmp_path_factory.mktemp("literals")
    out = {}
    for i, (label, cfg, cloud, field, value) in enumerate(_targets()):
        app = App(outdir=str(root / str(i)), skip_validation=False)
        try:
            (name,) = add_stacks(app, cfg, cfg.targets(None, cloud))
        # Refusing a value is also safe: it never reaches Terraform. (ValueError: a parser
        # the schema runs at load time, met here because the test skips validation;
        # OperationFailed: a rule, which synthesis runs first.)
        except (UsageError, OperationFailed, ValueError) as e:
            out[label] = (cfg, cloud, field, value, e)
            continue
        app.synth()
        doc = json.loads((root / str(i) / "stacks" / name / "cdk.tf.json").read_text())
        out[label] = (cfg, cloud, field, value, doc)
    return out


# --- the strings of a stack, by how Terraform reads them --------------------------------


def strings(doc: dict):
    """(kind, string) for every string of a stack: `template` (Terraform evaluates it),
    `literal` (read as is) or `reference` (a meta-argument)."""
    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                if k != "//":  # cdktf's metadata comments: Terraform ignores them
                    yield from walk(v, (*path, k))
        elif isinstance(node, list):
            for v in node:
                yield from walk(v, path)
        elif isinstance(node, str):
            if path[0] == "terraform" or (path[0], path[-1]) in LITERAL_KEYS:
                yield "literal", node
            elif path[-1] in REFERENCE_KEYS:
                yield "reference", node
            else:
                yield "template", node

    yield from walk(doc, ())


def _closing(s: str, i: int) -> int:
    """Index of the `}` closing the sequence whose body starts at `i`."""
    depth = 0
    while i < len(s):
        ch = s[i]
        if ch == '"':
            i += 1
            while s[i] != '"':
                i += 2 if s[i] == "\\" else 1
        elif ch in "{[(":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "}":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    raise AssertionError(f"unterminated template sequence in {s!r}")


_TOKEN = re.compile(r'\s+|"(?:\\.|[^"\\])*"|[A-Za-z_][\w-]*|\d+|\[\*\]|==|!=|>=|<=|\|\||&&|'
                    r"[-+*/<>!?:.,()\[\]]")


def own_expression(body: str, doc: dict) -> list[str] | None:
    """The quoted-string operands of `body` if it is one of poolctl's own expressions
    (references to the stack's objects, its few functions, operators), else None."""
    declared = {"var", "data", *doc.get("resource", {})}
    bound: set[str] = set()
    quoted, pos, prev = [], 0, ""
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if not m:
            return None
        tok, pos = m.group(), m.end()
        if tok.isspace():
            continue
        if tok.startswith('"'):
            quoted.append(tok)
        elif re.fullmatch(r"[A-Za-z_][\w-]*", tok) and prev != ".":
            if prev == "for":
                bound.add(tok)
            nxt = body[pos:].lstrip()[:1]
            if nxt == "(" and tok not in FUNCTIONS:
                return None
            if nxt != "(" and tok not in declared | KEYWORDS | bound:
                return None
        prev = tok
    return quoted


def split_own(s: str, doc: dict) -> tuple[str, list[str]]:
    """`s` with poolctl's own `${...}` swapped for MARK, and their quoted operands."""
    out, quoted, i = [], [], 0
    while i < len(s):
        if s.startswith(("$${", "%%{"), i):
            out.append(s[i:i + 3])
            i += 3
        elif s.startswith("${", i):
            end = _closing(s, i + 2)
            q = own_expression(s[i + 2:end], doc)
            if q is None:
                out.append(s[i:end + 1])  # not poolctl's: Terraform gets it as is
            else:
                out.append(MARK)
                quoted += q
            i = end + 1
        else:
            out.append(s[i])
            i += 1
    return "".join(out), quoted


def unescape(s: str) -> str:
    """What Terraform makes of a template without sequences: the escapes undone."""
    return s.replace("$${", "${").replace("%%{", "%{")


def terraform_values(values: list[str], work: Path) -> list:
    """Each string evaluated by Terraform as a template (one run for all)."""
    tf = os.environ.get("POOLCTL_TERRAFORM") or shutil.which("terraform") or shutil.which(
        "tofu")
    if not tf:
        pytest.skip("no terraform/tofu on PATH: cannot run Terraform's template parser")
    work.mkdir()
    (work / "main.tf.json").write_text(json.dumps({"output": {"v": {"value": values}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    env.update(CHECKPOINT_DISABLE="1", TF_IN_AUTOMATION="1")
    proc = subprocess.run([tf, "apply", "-auto-approve", "-input=false", "-no-color"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    # Terraform's complaints (e.g. bash's `${1##*/}` in a startup script) name the problem.
    assert proc.returncode == 0, "\n".join(
        x for x in proc.stderr.splitlines() if x.startswith(("Error", "│ Error", "│   on")))[:3000]
    out = subprocess.run([tf, "output", "-json", "v"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def evaluated(synthesized, tmp_path_factory):
    """label -> (inputs sent to Terraform, Terraform's values, literal strings)."""
    sent: dict[str, list[str]] = {}
    literal: dict[str, list[str]] = {}
    for label, (*_, doc) in synthesized.items():
        if isinstance(doc, Exception):
            continue
        sent[label], literal[label] = [], []
        for kind, s in strings(doc):
            if kind == "literal":
                literal[label].append(s)
            elif kind == "template":
                text, quoted = split_own(s, doc)
                sent[label].append(text)
                # A quoted operand is a template too: evaluate it as a one-string expression.
                sent[label] += [f"${{{q}}}" for q in quoted]
    flat = sorted({s for v in sent.values() for s in v})
    got = dict(zip(flat, terraform_values(flat, tmp_path_factory.mktemp("tf") / "w"),
                   strict=True))
    return {label: (sent[label], [got[s] for s in sent[label]], literal[label])
            for label in sent}


def test_every_example_and_hostile_field_synthesized(synthesized):
    """Refusing a value with one line naming its key is as safe as escaping it; the
    examples and the fields no stack code parses must synthesize."""
    for label, (_, _, field, _, doc) in synthesized.items():
        if isinstance(doc, Exception):
            assert field and field not in MUST_SYNTHESIZE, f"{label}: {doc}"
            if isinstance(doc, UsageError | OperationFailed):
                assert field.rsplit(".", 1)[-1] in str(doc), f"{label}: {doc}"


def test_terraform_parses_every_string_as_the_literal_meant(evaluated):
    """The core check: what Terraform makes of each string is its text with the escapes
    undone, so no `${...}`/`%{...}` from the file was evaluated."""
    hostname = Path("/etc/hostname").read_text().strip() if Path(
        "/etc/hostname").exists() else None
    for label, (sent, values, _) in evaluated.items():
        for s, v in zip(sent, values, strict=True):
            if s.startswith("${\""):
                continue  # a quoted operand; checked below through the hostile values
            assert v == unescape(s), f"{label}: Terraform evaluated {s[:200]!r}"
            if hostname and hostname not in s:
                assert hostname not in v, label


def test_every_hostile_value_arrives_whole(synthesized, evaluated):
    for label, (_, _, field, value, doc) in synthesized.items():
        if field is None or isinstance(doc, Exception):
            continue
        _, values, literal = evaluated[label]
        seen = [v for v in values if isinstance(v, str)] + literal
        # AWS user data is gzip in base64 (no template syntax): the script inside it.
        seen += [gzip.decompress(base64.b64decode(v)).decode() for v in values
                 if isinstance(v, str)
                 and re.fullmatch(r"[A-Za-z0-9+/]{400,}={0,2}", v)]
        for item in value if isinstance(value, list) else [value]:
            text = "\n".join(seen)
            assert item in text or shlex.quote(item) in text, f"{label}: {item!r} lost"


def test_both_boot_script_variants_are_the_rendered_scripts(synthesized, evaluated):
    """Each stack holds the whole script and the image variant (the plan picks one from the
    node image's tag): Terraform hands both over byte for byte (gzip in base64 on AWS)."""
    checked = 0
    for label, (cfg, cloud, _, _, doc) in synthesized.items():
        if isinstance(doc, Exception):
            continue
        _, values, _ = evaluated[label]
        if cloud == "aws":
            values = [gzip.decompress(base64.b64decode(v)).decode() for v in values
                      if isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9+/]{400,}={0,2}", v)]
        for from_image in (False, True):
            script = render_boot_script(cfg, cfg.pools[0], cloud, from_image=from_image)
            assert script in values, f"{label}: Terraform changed the script ({from_image=})"
        checked += 1
    assert checked >= 6


def test_only_poolctls_own_expressions_are_left_unescaped(synthesized):
    """Without Terraform: once poolctl's own expressions (references, FUNCTIONS) are set
    aside, every `${`/`%{` left in any stack is an escaped one."""
    for label, (*_, doc) in synthesized.items():
        if isinstance(doc, Exception):
            continue
        for kind, s in strings(doc):
            if kind == "template":
                rest = split_own(s, doc)[0].replace("$${", "").replace("%%{", "")
                assert "${" not in rest and "%{" not in rest, (label, s[:200])


def test_literal_view_escapes_every_string_and_recomputes_derived_values():
    from poolctl_stacks.literal import literal_view

    cfg = load_config(ROOT / "examples" / "llama-70b-p5" / "poolctl.yaml")
    cfg = hostile(cfg, "serving.extra_args", ["a${b}", "%{c}$${d}"])
    assert cfg.pools[0].aws.weights.bucket == "acme-models"  # cached on the raw placement
    view = literal_view(cfg)
    assert view.pools[0].serving.extra_args == ["a$${b}", "%%{c}$$${d}"]
    assert "weights" not in vars(view.pools[0].aws)  # derived again from escaped fields
    assert view.pools[0].model == cfg.pools[0].model  # nothing to escape: equal
    with pytest.raises(ValueError):  # still frozen
        view.pools[0].aws.region = "x"
