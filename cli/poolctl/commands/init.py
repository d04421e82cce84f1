"""init: a commented poolctl.yaml, a cdktf.json and a CI workflow for the user's repository."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from poolctl.catalog import load_catalog
from poolctl.cloud import Cloud
from poolctl.commands.common import check_creatable
from poolctl.config import parse_config
from poolctl.errors import UsageError, shown
from poolctl.files import create_new, replace_file
from poolctl.models import preset, suggest_model
from poolctl.rules import errors, run_checks
from poolctl.vllm_releases import releases

if TYPE_CHECKING:
    from poolctl.catalog import InstanceType
    from poolctl.models import Preset

DEFAULT_MODEL = "meta-llama/Llama-3.1-70B-Instruct"
# The type each cloud starts from (the contract's); others are tried, cheapest first, when
# the model does not fit it at any tensor_parallel.
DEFAULT_TYPE = {"aws": "p5.48xlarge", "gcp": "a3-highgpu-8g"}
DEFAULT_REGION = {"aws": "us-east-1", "gcp": "us-central1"}
SERVING_IMAGE = releases().default_image  # data/vllm_releases.yaml
MAX_MODEL_LEN = 16384  # a common serving length; the preset's max context caps it

CDKTF_JSON = {
    "language": "python",
    # poolctl's synthesis; it reads $POOLCTL_FILE or ./poolctl.yaml (poolctl_stacks.app)
    "app": "python -m poolctl_stacks.app",
    "projectId": "poolctl",
    "sendCrashReports": "false",
    "terraformProviders": [],
    "terraformModules": [],
    "codeMakerOutput": "imports",
    "context": {},
}

# CDK Terrain's CLI, the maintained fork of the archived cdktf CLI (whose `cdktf synth` runs
# the same app); the version package.json installs here (tests/unit/test_presets_init.py).
SYNTH_CLI = "cdktn-cli@0.24.0"

WORKFLOW = """\
# poolctl checks on every change to poolctl.yaml: the schema and every rule, the sizing
# and cost, and the synthesized Terraform (no cloud credentials needed for any of these).
name: poolctl
on:
  pull_request:
    paths: [poolctl.yaml]
  push:
    paths: [poolctl.yaml]
jobs:
  check:
    runs-on: ubuntu-latest
    env:
      # how your organization installs poolctl (a package index or a git URL)
      POOLCTL_PIP_SPEC: "poolctl[synth]"
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with: {{python-version: "3.11"}}
      - uses: actions/setup-node@v4
        with: {{node-version: "22"}}
      - run: pip install "$POOLCTL_PIP_SPEC" && npm install -g {cli}
      - run: poolctl validate
      - run: poolctl plan --cloud {cloud} --json > plan.json
      - run: cdktn synth
"""


def _slug(model_id: str) -> str:
    return model_id.split("/")[-1].lower().replace(".", "-")


def _pool_yaml(preset: Preset, row: InstanceType, region: str, zones: list[str], tp: int
               ) -> str:
    rpn = row.gpus // tp
    p = preset
    placement = (
        f"""    aws:
      region: {region}
      instance_type: {row.name}  # {row.gpus}x {row.gpu}; `poolctl catalog` lists the others
      # CHANGE ME: the bucket/prefix holding the weights (safetensors) and manifest.json
      # (poolctl weights manifest DIR writes it)
      weights_uri: s3://my-models/{_slug(p.id)}/
""" if row.cloud == Cloud.aws else f"""    gcp:
      project: my-gcp-project  # CHANGE ME: your project id
      region: {region}
      zones: [{", ".join(zones)}]
      machine_type: {row.name}  # {row.gpus}x {row.gpu}; `poolctl catalog` lists the others
      # CHANGE ME: the bucket/prefix holding the weights (safetensors) and manifest.json
      # (poolctl weights manifest DIR writes it)
      weights_uri: gs://my-models/{_slug(p.id)}/
""")
    return f"""\
# poolctl.yaml, written by `poolctl init`. Check it with `poolctl validate`, see sizes and
# cost with `poolctl plan`, deploy with `poolctl deploy --cloud {row.cloud}`.
# Every key: `poolctl schema` (JSON Schema). Sizes are in replicas; a node ({row.name})
# holds {rpn} replica(s) of tensor_parallel {tp}.
project: my-project  # prefix of every resource name and tag
pools:
  - name: {_slug(p.id)[:40].strip("-")}
    model:
      # A preset (`poolctl catalog`): {p.params_b:g} B params, {p.dtype}, {p.layers} layers,
      # {p.attention_heads} heads / {p.kv_heads} KV heads of {p.head_dim}, \
{p.max_context:,} context,
      # from {p.source}
      # Write any of params_b, dtype, layers, kv_heads, head_dim to override them, or
      # config_json: path/to/config.json for a model without a preset.
      id: {p.id}
    serving:
      image: {SERVING_IMAGE}
      tensor_parallel: {tp}  # fewest GPUs per replica holding weights + several full KV
      max_model_len: {min(MAX_MODEL_LEN, p.max_context)}
    scaling:
      min_replicas: {rpn}  # one node
      max_replicas: {4 * rpn}  # four nodes
      queue_target: 4  # waiting requests per replica before scaling out
    warm_pool:
      replicas: 0  # spare nodes kept stopped for fast scale-out (`poolctl warm` before a launch)
{placement}"""


def _fit(preset: Preset, cloud: Cloud) -> str:
    """The poolctl.yaml text of the first (type, tensor_parallel) that passes every rule
    (the default type first, then the cheapest); avoids a KV cache of few sequences."""

    cat = load_catalog()
    # Every name `names` gives has its row: the filter only tells the type checker so.
    rows = sorted((r for n in cat.names(cloud) if (r := cat.get(cloud, n)) is not None),
                  key=lambda r: (r.name != DEFAULT_TYPE[cloud], r.price.usd_per_hour))
    fallback = None
    for row in rows:
        region = DEFAULT_REGION[cloud] if DEFAULT_REGION[cloud] in row.regions else min(
            row.regions)
        zones = row.regions.get(region, [])[:3]
        for tp in (1, 2, 4, 8):
            text = _pool_yaml(preset, row, region, zones, tp)
            cfg = parse_config(text)
            found = run_checks(cfg, cfg.targets(None, None))
            if errors(found):
                continue
            if not any(f.check == "kv-concurrency" for f in found):
                return text
            fallback = fallback or text
    if fallback:
        return fallback
    raise UsageError(f"--model: {preset.id} does not fit any {cloud} type in the catalog at "
                     "any tensor_parallel; pick a quantized variant (`poolctl catalog`)")


def init(
    model: Annotated[str, typer.Option("--model", help="Model preset id (`poolctl catalog`).")]
    = DEFAULT_MODEL,
    cloud: Annotated[Cloud, typer.Option("--cloud", help="Where the pool runs.")] = Cloud.aws,
    dir: Annotated[Path, typer.Option("--dir", help="Folder to write into.")] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing files.")] = False,
) -> None:
    """Write a commented poolctl.yaml, a cdktf.json (`cdktn synth` runs poolctl's synthesis)
    and a CI workflow (.github/workflows/poolctl.yml)."""

    row = preset(model)
    if row is None:
        raise UsageError(f"--model: no preset for {model!r}{suggest_model(model)}; see "
                         "`poolctl catalog`, or write the model's fields in poolctl.yaml")
    files = {
        dir / "poolctl.yaml": _fit(row, cloud),
        dir / "cdktf.json": json.dumps(CDKTF_JSON, indent=2) + "\n",
        dir / ".github" / "workflows" / "poolctl.yml": WORKFLOW.format(cloud=cloud.value,
                                                                       cli=SYNTH_CLI),
    }
    # Check every file before writing any: nothing half-written.
    # lexists: a dangling symlink is taken too (writing through it would land outside --dir)
    taken = [str(p) for p in files if os.path.lexists(p)]
    if taken and not force:
        raise UsageError(f"--force: {', '.join(taken)} already exist(s); pass --force to "
                         "overwrite, or --dir to write elsewhere")
    blocked = next((q for p in files for q in (p, *p.parents) if (
        (q.is_dir() and not q.is_symlink()) if q == p
        else os.path.lexists(q) and not q.is_dir())), None)
    if blocked is not None:
        raise UsageError(f"--dir: {blocked} is in the way (a file where a folder goes, or a "
                         "folder where a file goes); pick another --dir")

    linked = next((dir / q for p in files for q in p.relative_to(dir).parents
                   if q != Path(".") and (dir / q).is_symlink()), None)
    if linked is not None:
        raise UsageError(f"--dir: {shown(linked, 300)} is a symlink; poolctl writes only inside "
                         "--dir: remove the link, or pick another --dir")
    check_creatable(dir, "--dir", "pick a folder you can write in")
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            if force:
                replace_file(path, text, follow_link=False)
            else:
                create_new(path, text)
            sys.stdout.write(f"wrote {path}\n")
    except FileExistsError as e:  # made meanwhile by another process
        raise UsageError(f"--force: {shown(e.filename, 300)} appeared while writing; pass --force "
                         "to overwrite, or --dir to write elsewhere") from None
    except OSError as e:  # the probe passed, the disk did not (full, quota)
        raise UsageError(f"--dir: cannot write {e.filename} ({e.strerror}); pick a folder you "
                         "can write in") from None
    sys.stderr.write(
        f"next: set weights_uri (and project) in {dir / 'poolctl.yaml'} (the nodes check the "
        "weights against a manifest.json: `poolctl weights manifest DIR` writes it before "
        f"the upload), then `poolctl validate`, `poolctl plan --cloud {cloud.value}`, "
        "`cdktn synth`\n")
