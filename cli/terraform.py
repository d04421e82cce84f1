"""Terraform / OpenTofu orchestration: init, plan with a summary, apply, destroy.

Terraform's own output streams live, on stderr with poolctl's progress lines, so stdout
carries only results (the plan table, outputs, or --json); poolctl adds a plan summary,
timings per phase, a confirmation, and one clear line when something fails. Ctrl-C reaches
Terraform as exactly one interrupt (it runs in its own process group; poolctl forwards the
first one and waits), so it finishes the calls in flight and saves its state; poolctl then
says how to resume. A re-run adopts what an interrupted apply created but could not record
(`poolctl.deploy.adopt`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from poolctl.errors import OperationFailed, UsageError
from poolctl.home import (
    PRIVATE_UMASK,
    is_under_home,
    poolctl_home,
    tighten,
    write_private,
)

# Services the AWS stack and runtime commands call; the sandbox answers them all.
SANDBOX_SERVICES = ("autoscaling", "cloudwatch", "ec2", "elbv2", "iam", "kms", "logs", "s3",
                    "ssm", "sts", "servicequotas")


def find_binary() -> str:
    """POOLCTL_TERRAFORM, else `terraform`, else `tofu`."""
    named = os.environ.get("POOLCTL_TERRAFORM")
    if named:
        path = shutil.which(named)
        if not path:
            raise UsageError(f"POOLCTL_TERRAFORM={named}: not found; give a path to terraform "
                             "or tofu, or unset it")
        return path
    for name in ("terraform", "tofu"):
        path = shutil.which(name)
        if path:
            return path
    raise UsageError("terraform: neither `terraform` nor `tofu` is on PATH; install Terraform "
                     ">= 1.6 or OpenTofu, or set POOLCTL_TERRAFORM to its path")


def cli_config(mirror: str | None) -> Path | None:
    """A Terraform CLI config installing providers from a filesystem mirror, when one is named
    (`--provider-mirror` or POOLCTL_PROVIDER_MIRROR): deploys then work with no registry."""
    mirror = mirror or os.environ.get("POOLCTL_PROVIDER_MIRROR")
    if not mirror:
        return None
    mpath = Path(mirror).expanduser().resolve()
    if not mpath.is_dir():
        raise UsageError(f"--provider-mirror: {mirror} is not a directory; give the folder that "
                         "holds registry.terraform.io/hashicorp/...")
    # Only the providers the mirror holds (host/namespace/type folders): a mirror with aws
    # alone must not stop `init` from fetching google for a GCP deploy.
    found = sorted(f"{p.parent.parent.name}/{p.parent.name}/{p.name}"
                   for p in mpath.glob("*/*/*") if p.is_dir())
    if not found:
        raise UsageError(f"--provider-mirror: {mirror} holds no providers; give the folder that "
                         "holds registry.terraform.io/hashicorp/<provider>/...")
    include = ", ".join(f'"{f}"' for f in found)
    text = (
        "# written by poolctl: providers from the filesystem mirror, others from registries\n"
        "provider_installation {\n"
        f'  filesystem_mirror {{\n    path    = "{mpath}"\n    include = [{include}]\n  }}\n'
        f"  direct {{\n    exclude = [{include}]\n  }}\n"
        "}\n"
    )
    out = poolctl_home() / "terraform.rc"
    if not out.exists() or out.read_text() != text or out.stat().st_mode & 0o077:
        write_private(out, text)
    return out


@dataclass
class PlanSummary:
    add: Counter = field(default_factory=Counter)
    change: Counter = field(default_factory=Counter)
    destroy: Counter = field(default_factory=Counter)
    imports: Counter = field(default_factory=Counter)  # adopted (import blocks)

    @property
    def empty(self) -> bool:
        return not (self.add or self.change or self.destroy or self.imports)

    def totals(self) -> tuple[int, int, int]:
        return sum(self.add.values()), sum(self.change.values()), sum(self.destroy.values())

    def to_json(self) -> dict:
        types = sorted(set(self.add) | set(self.change) | set(self.destroy))
        return {t: {"add": self.add[t], "change": self.change[t], "destroy": self.destroy[t]}
                for t in types}


def summarize(plan_json: dict) -> PlanSummary:
    s = PlanSummary()
    for rc in plan_json.get("resource_changes", []):
        actions = rc.get("change", {}).get("actions", [])
        t = rc.get("type", "?")
        if rc.get("change", {}).get("importing"):
            s.imports[t] += 1
        if "create" in actions:
            s.add[t] += 1
        if "delete" in actions:
            s.destroy[t] += 1
        if actions == ["update"]:
            s.change[t] += 1
    return s


def _has_fd(stream) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # e.g. a test runner's capture buffer
        return False
    return True


def _forget_dead_synth_kernel() -> None:
    """Ctrl-C signals the whole foreground process group: Terraform, and also the Node
    process cdktf's jsii runtime keeps after the synth. Node dies of it, and jsii's exit hook
    would then print a BrokenPipeError traceback writing to it. Drop that hook when (and
    only when) the kernel is already dead: there is nothing left to shut down."""
    import atexit

    runtime = sys.modules.get("jsii._runtime")
    if runtime is None:
        return
    try:
        node = runtime.kernel.provider._process  # started on the first cdktf import
        if node._process.poll() is not None:
            atexit.unregister(node.stop)
    except Exception:  # private jsii API: a newer jsii only brings the traceback back
        pass


class _Stop:
    """What the interrupt handler knows: the Terraform process, and whether to stop."""

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.proc: subprocess.Popen | None = None
        self.requested = False

    def attach(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        if self.requested:  # the interrupt came while Terraform was being started
            proc.send_signal(signal.SIGINT)

    def handle(self, signum: int, frame) -> None:
        if self.requested:
            sys.stderr.write("== still waiting for Terraform to save its state (a second "
                             "interrupt would make it exit without saving)\n")
            return
        self.requested = True
        sys.stderr.write(f"== interrupt: Terraform ends its {self.phase} (calls in flight "
                         "finish or are cancelled) and saves its state; waiting for it\n")
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)


@contextlib.contextmanager
def _one_interrupt_for(phase: str) -> Iterator[_Stop]:
    """Pass ONE interrupt (Ctrl-C, or SIGTERM from a CI runner) on to Terraform, as SIGINT.

    Terraform's first SIGINT is a graceful stop: no new operations, in-flight ones end (or
    are cancelled) and the state is written. A second one makes it exit at once, state
    unsaved, leaving resources it created unrecorded. So Terraform runs in its own process
    group, out of the terminal's reach, and poolctl forwards one interrupt, then waits."""
    stop = _Stop(phase)
    if threading.current_thread() is not threading.main_thread():
        yield stop  # handlers can only be set in the main thread
        return
    saved = {sig: signal.signal(sig, stop.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


class Terraform:
    def __init__(self, workdir: Path, *, mirror: str | None = None,
                 extra_env: dict[str, str] | None = None) -> None:
        self.bin = find_binary()
        self.workdir = workdir
        self.env = dict(os.environ)
        self.env.update({"TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"})
        rc = cli_config(mirror)
        if rc is not None:
            self.env["TF_CLI_CONFIG_FILE"] = str(rc)
        elif self.env.get("TF_CLI_CONFIG_FILE") and not Path(
                self.env["TF_CLI_CONFIG_FILE"]).exists():
            # A config that does not exist only produces a warning on every call.
            del self.env["TF_CLI_CONFIG_FILE"]
        self.env.update(extra_env or {})
        self.timings: dict[str, float] = {}
        self.color = sys.stdout.isatty()

    def _args(self, *args: str) -> list[str]:
        out = [self.bin, *args]
        if not self.color and args[0] not in ("show", "output", "version", "state"):
            out.append("-no-color")
        return out

    def run(self, phase: str, *args: str, capture: bool = False,
            ok_codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        start = time.monotonic()
        private = is_under_home(self.workdir)
        with _one_interrupt_for(phase) as stop:
            proc = subprocess.Popen(
                self._args(*args), cwd=self.workdir, env=self.env, text=True,
                stdout=subprocess.PIPE if capture else (
                    sys.stderr.fileno() if _has_fd(sys.stderr) else None),
                stderr=subprocess.PIPE if capture else None,
                # A process group of its own: Ctrl-C at the terminal reaches poolctl only,
                # which passes exactly one on (see _one_interrupt_for).
                process_group=0,
                umask=PRIVATE_UMASK if private else -1,
            )
            stop.attach(proc)
            try:
                out, err = proc.communicate()
            finally:
                self.timings[phase] = self.timings.get(phase, 0) + time.monotonic() - start
                if private:
                    tighten(self.workdir)
        if stop.requested:
            _forget_dead_synth_kernel()
            raise OperationFailed(
                f"interrupted during `{Path(self.bin).name} {phase}`; Terraform saved its "
                f"state in {self.workdir}; run the same poolctl command again to resume"
            )
        if proc.returncode not in ok_codes:
            if capture and err:
                sys.stderr.write(err)
            raise OperationFailed(
                f"`{Path(self.bin).name} {' '.join(args[:1])}` failed (exit {proc.returncode}) "
                f"in {self.workdir}; its error is above"
            )
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def init(self) -> None:
        self.run("init", "init", "-input=false", "-upgrade=false")

    def plan(self, *, destroy: bool = False, out: str = "tfplan") -> PlanSummary:
        args = ["plan", "-input=false", "-detailed-exitcode", f"-out={out}"]
        if destroy:
            args.append("-destroy")
        self.run("plan", *args, ok_codes=(0, 2))
        shown = self.run("plan", "show", "-json", out, capture=True)
        return summarize(json.loads(shown.stdout))

    def apply(self, planfile: str = "tfplan") -> None:
        self.run("apply", "apply", "-input=false", "-auto-approve", planfile)

    def state_resources(self) -> dict[str, dict]:
        """Managed resources in the state: address -> attributes of its (first) instance.
        `state pull` reads any backend and needs no provider."""
        raw = self.run("state", "state", "pull", capture=True).stdout
        state = json.loads(raw) if raw.strip() else {}
        out = {}
        for r in state.get("resources", []):
            if r.get("mode") == "managed" and not r.get("module"):
                inst = (r.get("instances") or [{}])[0]
                out[f"{r['type']}.{r['name']}"] = inst.get("attributes") or {}
        return out

    def outputs(self) -> dict:
        res = self.run("output", "output", "-json", capture=True)
        return {k: v.get("value") for k, v in json.loads(res.stdout or "{}").items()}


def sandbox_override(region: str, endpoint: str, state_path: Path) -> dict:
    """Terraform override file for `--sandbox`: the synthesized JSON stays as is; this file
    points the provider at the emulator and keeps state next to the sandbox."""
    return {
        "provider": {
            "aws": [{
                "region": region,
                "access_key": "testing",
                "secret_key": "testing",
                "skip_credentials_validation": True,
                "skip_metadata_api_check": True,
                "skip_region_validation": True,
                "s3_use_path_style": True,
                "endpoints": [{svc: endpoint for svc in SANDBOX_SERVICES}],
            }]
        },
        "terraform": {"backend": {"local": {"path": str(state_path)}}},
    }
