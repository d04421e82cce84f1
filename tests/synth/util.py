"""Shared synth-test helpers: checkov with named skips, terraform validate, module probes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from poolctl.cloud import Cloud

ROOT = Path(__file__).resolve().parents[2]
# The project's checkov configuration, what a user's CI reads scanning cdktf.out.
CHECKOV_CONFIG = ROOT / ".checkov.yaml"


def checkov_bin() -> str:
    """The current checkov release, what users scan cdktf.out with (new releases add checks,
    and the stacks must pass them): its own virtualenv `.venv-checkov`, which scripts/setup
    fills with the newest release (checkov pins its own dependencies, so it stays out of
    poolctl's), or POOLCTL_CHECKOV, or `checkov` on PATH."""
    named = os.environ.get("POOLCTL_CHECKOV")
    exe = named or ROOT / ".venv-checkov" / "bin" / "checkov"
    if Path(exe).is_file():
        return str(exe)
    found = None if named else shutil.which("checkov")
    assert found, (f"no checkov: {named or exe} is missing; run scripts/setup, or set "
                   "POOLCTL_CHECKOV to a checkov executable")
    return found


def checkov_config_skips() -> list[str]:
    return list(yaml.safe_load(CHECKOV_CONFIG.read_text())["skip-check"])


# Failures of checkov with no skip, per stack folder: one checkov process costs about 4 s of
# CPU whatever it scans, so a folder's siblings are scanned with it, and each skip list is a
# filter of the same findings (skipping a check is not running it: the same as dropping its
# findings). run_checkov refuses a .checkov.yaml that says more than the skips.
_FINDINGS: dict[Path, list[dict]] = {}


def _checkov(root: Path) -> list[dict]:
    """Failed checks (id, name, resource, file_path relative to `root`) of every
    cdk.tf.json under `root`, with no skip."""
    cmd = [checkov_bin(), "-d", str(root), "--framework", "terraform_json", "--skip-download",
           "--output", "json", "--quiet", "--compact"]
    # cwd: the scanned folder, so checkov does not also pick up the repository's config.
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=root)
    if not proc.stdout.strip():
        raise AssertionError(f"checkov produced no output: {proc.stderr[-2000:]}")
    data = json.loads(proc.stdout)
    reports = data if isinstance(data, list) else [data]
    failed = []
    for rep in reports:
        failed += rep.get("results", {}).get("failed_checks", [])
    return [{"id": f["check_id"], "name": f["check_name"], "resource": f["resource"],
             "file_path": f["file_path"]} for f in failed]


def _findings(stack_dir: Path) -> list[dict]:
    key = stack_dir.resolve()
    if key not in _FINDINGS:
        siblings = sorted(key.parent.iterdir())
        if all((s / "cdk.tf.json").is_file() for s in siblings):
            found = _checkov(key.parent)  # file_path: /<stack>/cdk.tf.json
            for s in siblings:
                _FINDINGS[s] = [f for f in found if f["file_path"].split("/")[1] == s.name]
        else:
            _FINDINGS[key] = _checkov(key)
    return _FINDINGS[key]


def run_checkov(stack_dir: Path, skips: list[str] | None = None) -> list[dict]:
    """Failed checks of `checkov --framework terraform_json` on `stack_dir`: with the
    project's `.checkov.yaml` (its skips), or with exactly `skips` when given. Returns the
    failures."""
    config = yaml.safe_load(CHECKOV_CONFIG.read_text())
    assert set(config) == {"framework", "skip-check"} and config["framework"] == [
        "terraform_json"], "run_checkov filters skips itself: teach it the new setting"
    skipped = set(config["skip-check"] if skips is None else skips)
    return [{k: f[k] for k in ("id", "name", "resource")} for f in _findings(stack_dir)
            if f["id"] not in skipped]


def terraform_validate(stack_dir: Path, work: Path, provider: str) -> None:
    """`terraform init -backend=false && terraform validate` on a copy of `stack_dir`, with
    providers from POOLCTL_PROVIDER_MIRROR; skips (saying why) where that cannot run."""
    import os
    import shutil

    import pytest

    from poolctl.terraform import cli_config

    tf = os.environ.get("POOLCTL_TERRAFORM") or shutil.which("terraform") or shutil.which("tofu")
    if not tf:
        pytest.skip("no terraform/tofu on PATH: cannot validate the JSON with the real CLI")
    mirror = os.environ.get("POOLCTL_PROVIDER_MIRROR")
    if not mirror or not any(Path(mirror).glob(f"registry.terraform.io/hashicorp/{provider}/*")):
        pytest.skip(f"no hashicorp/{provider} provider in POOLCTL_PROVIDER_MIRROR and no "
                    "registry here: provider schema not loadable")
    shutil.copytree(stack_dir, work)
    env = dict(os.environ, TF_CLI_CONFIG_FILE=str(cli_config(mirror)), CHECKPOINT_DISABLE="1")
    for args in (["init", "-backend=false", "-input=false"], ["validate", "-json"]):
        proc = subprocess.run([tf, *args], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["valid"] is True


def provider_modules_after_synth(config: Path, cloud: Cloud, out: Path, cwd: Path) -> list[str]:
    """The cdktf provider modules a fresh process has loaded after synthesizing `cloud`."""
    code = (
        "import sys, json\n"
        "from poolctl.config import load_config\n"
        "from poolctl_stacks.app import synth\n"
        f"cfg = load_config({str(config)!r})\n"
        f"synth([(cfg, cfg.targets(None, {cloud!r}))], {str(out)!r})\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('cdktn_provider'))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def synth_without_and_with_record(config: Path, cloud: Cloud, image: str, tmp_path: Path,
                                  monkeypatch) -> tuple[str, str]:
    """The stack JSON (text) of `config`'s first pool on `cloud` with its node image set to
    `image`, synthesized with an empty POOLCTL_HOME, then with a build record for `image`
    that names this poolctl's boot library and the pool's own serving image (pre-pulled:
    `plan` then shows a shorter or longer cold start, but the stack's warmup settings must
    not follow a record that only this machine has)."""
    from poolctl import bootscript, node_image
    from poolctl.config import load_config
    from poolctl_stacks.app import synth

    monkeypatch.setenv("POOLCTL_HOME", str(tmp_path / "home"))
    cfg = load_config(config)
    pool = cfg.pools[0]
    key = "ami_id" if cloud == "aws" else "image"
    placement = pool.placement(cloud)
    assert placement is not None, cloud
    placement = placement.model_copy(update={key: image})
    cfg = cfg.model_copy(update={"pools": [pool.model_copy(update={cloud: placement})]})
    texts = []
    for name in ("no-record", "record"):
        if name == "record":
            node_image.save_record({"cloud": cloud, "image_id": image, "base_image": "family/x",
                                "serving_image": pool.serving.image,
                                "boot_lib_version": bootscript.boot_library(cloud)["version"]})
            assert node_image.find_record(cloud, image) is not None
        (d,) = synth([(cfg, cfg.targets(None, cloud))], tmp_path / name)
        texts.append((d / "cdk.tf.json").read_text())
    return texts[0], texts[1]
