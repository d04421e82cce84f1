"""Terraform / OpenTofu orchestration: init, plan with a summary, apply, destroy.

Terraform's own output goes to a log file under $POOLCTL_HOME (`logs/<stack>/`, private;
`--verbose` shows it on stderr too), the boot script's text left out. The screen gets
poolctl's lines: a live progress line per phase on a terminal (one line per finished
resource elsewhere), the plan summary, and on failure Terraform's `Error:` blocks with the
log's path. stdout carries only results (the plan table, outputs, or --json). `init` is
skipped when the providers, their lock file and the backend settings are those of the last
successful init in the same folder. Ctrl-C reaches Terraform as exactly one interrupt (it
runs in its own process group; poolctl forwards the first one and waits), so it finishes the
calls in flight and saves its state; poolctl then says how to resume. A re-run adopts what
an interrupted apply created but could not record (`poolctl.deploy.adopt`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from poolctl.endpoints import AwsEndpoint
from poolctl.errors import OperationFailed, UsageError
from poolctl.home import (
    PRIVATE_UMASK,
    is_under_home,
    open_private,
    poolctl_home,
    private_dir,
    tighten,
    write_private,
)
from poolctl.progress import Progress

# Services the AWS stack and runtime commands call; the sandbox answers them all.
ENDPOINT_SERVICES = ("autoscaling", "cloudwatch", "ec2", "elbv2", "iam", "kms", "logs", "s3",
                    "scheduler", "ssm", "sts", "servicequotas")


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


# Sizes worth a line of the plan summary: per resource type, the attributes (paths into its
# values) that set how many nodes the pool runs or keeps warm.
SIZE_FIELDS: dict[str, tuple[tuple[str | int, ...], ...]] = {
    "aws_autoscaling_group": (
        ("min_size",), ("max_size",), ("desired_capacity",), ("warm_pool", 0, "min_size"),
        ("warm_pool", 0, "max_group_prepared_capacity"), ("warm_pool", 0, "pool_state")),
    "google_compute_region_instance_group_manager": (
        ("target_size",), ("target_stopped_size",), ("target_suspended_size",)),
    "google_compute_region_autoscaler": (
        ("autoscaling_policy", 0, "min_replicas"), ("autoscaling_policy", 0, "max_replicas")),
}


@dataclass
class SizeChange:
    address: str
    field: str  # e.g. warm_pool.min_size
    before: int | str | None  # None: the resource is created (before) / destroyed (after)
    after: int | str | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


# Terraform's words for a resource change (`terraform show -json`'s `actions` lists), as its
# own plan output says them: a delete and a create together are a replacement, in either order.
_ACTIONS = {("create",): "create", ("update",): "update", ("delete",): "destroy",
            ("delete", "create"): "replace", ("create", "delete"): "replace"}


@dataclass(frozen=True)
class ResourceChange:
    """One resource the plan changes: `action` create, update, replace, destroy or import
    (adopted into the state, nothing else changed)."""

    address: str
    action: str

    def to_json(self) -> dict[str, str]:
        return {"address": self.address, "action": self.action}


@dataclass
class PlanSummary:
    add: Counter[str] = field(default_factory=Counter)
    change: Counter[str] = field(default_factory=Counter)
    destroy: Counter[str] = field(default_factory=Counter)
    imports: Counter[str] = field(default_factory=Counter)  # adopted (import blocks)
    sizes: list[SizeChange] = field(default_factory=list)
    # Every size attribute as the plan leaves it (as it was, for one destroyed), changed or not
    size_values: dict[str, int | str] = field(default_factory=dict)
    cost: dict[str, Any] = field(default_factory=dict)  # the pool's cost per hour (deploy)
    resources: list[ResourceChange] = field(default_factory=list)  # in the plan's order

    @property
    def empty(self) -> bool:
        return not (self.add or self.change or self.destroy or self.imports)

    def totals(self) -> tuple[int, int, int]:
        return sum(self.add.values()), sum(self.change.values()), sum(self.destroy.values())

    def to_json(self) -> dict[str, dict[str, int]]:
        types = sorted(set(self.add) | set(self.change) | set(self.destroy))
        return {t: {"add": self.add[t], "change": self.change[t], "destroy": self.destroy[t]}
                for t in types}


def _dig(values: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        try:
            values = values[key]
        except (KeyError, IndexError, TypeError):
            return None
    return values


def summarize(plan_json: dict[str, Any]) -> PlanSummary:
    """Counts per resource type, and the size attributes that change, from `terraform show
    -json PLANFILE` (never from Terraform's text)."""
    s = PlanSummary()
    for rc in plan_json.get("resource_changes", []):
        change = rc.get("change", {})
        actions = change.get("actions", [])
        t = rc.get("type", "?")
        word = _ACTIONS.get(tuple(actions))
        if word is None and change.get("importing"):
            word = "import"
        if word is not None:
            s.resources.append(ResourceChange(str(rc.get("address", t)), word))
        if change.get("importing"):
            s.imports[t] += 1
        if "create" in actions:
            s.add[t] += 1
        if "delete" in actions:
            s.destroy[t] += 1
        if actions == ["update"]:
            s.change[t] += 1
        if t not in SIZE_FIELDS or actions == ["read"]:
            continue
        for path in SIZE_FIELDS[t]:
            before = _dig(change.get("before"), path)
            after = _dig(change.get("after"), path)
            value = before if actions == ["delete"] else after
            if value is not None:
                s.size_values[".".join(str(k) for k in path if k != 0)] = value
            if before != after:
                s.sizes.append(SizeChange(rc.get("address", t),
                                          ".".join(str(k) for k in path if k != 0),
                                          before, after))
    return s


# ---------------------------------------------------------------------------------------
# What Terraform prints: into a private log; on the screen only its errors (and, with
# --verbose, all of it), its progress as poolctl's own lines.

LOG_KEEP = 20  # newest logs kept per stack


def log_path(stack: str, command: str) -> Path:
    """A new log file's path, `$POOLCTL_HOME/logs/<stack>/<UTC time>-<command>-<pid>.log`
    (folders 0700; Terraform.run creates the file 0600);
    the oldest logs of the stack beyond LOG_KEEP are removed."""
    folder = private_dir(poolctl_home() / "logs" / stack)
    for old in sorted(folder.glob("*.log"))[:-LOG_KEEP + 1]:
        old.unlink(missing_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")  # sorts by time, never reused
    return folder / f"{stamp}-{command}-{os.getpid()}.log"


# The boot script is data the plan prints in full (base64 user data on AWS, a heredoc on
# GCP): nothing a reader needs, and it fills screens. Its value is left out, on screen and
# in the log.
_BOOT_ATTR = re.compile(r'^(\s*[-+~]?\s*"?(?:user_data(?:_base64)?|startup-script|'
                        r'metadata_startup_script)"?\s*=\s*)(.*)$')
BOOT_HIDDEN = "(boot script, not shown)"


class Redactor:
    """Line by line: the boot script's value replaced by BOOT_HIDDEN (a heredoc dropped up
    to its end marker)."""

    def __init__(self) -> None:
        self.heredoc: str | None = None

    def __call__(self, line: str) -> str | None:
        if self.heredoc is not None:
            if line.strip() == self.heredoc:
                self.heredoc = None
            return None
        m = _BOOT_ATTR.match(line)
        if not m:
            return line
        here = re.match(r"<<-?(\w+)\s*$", m.group(2))
        if here:
            self.heredoc = here.group(1)
        return m.group(1) + BOOT_HIDDEN


def error_blocks(lines: list[str]) -> list[str]:
    """Terraform's `Error:` blocks (with -no-color, on its stderr) from its stderr lines;
    warnings left out."""
    out: list[str] = []
    keep = False
    for line in lines:
        if line.startswith("Error: "):
            keep = True
        elif line.startswith("Warning: "):
            keep = False
        if keep:
            out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return out


# Terraform's (and OpenTofu's) machine-readable UI: with -json, plan and apply write one JSON
# message a line, a stable interface (its "ui" version 1.x), where the human output is not
# (developer.hashicorp.com/terraform/internals/machine-readable-ui; opentofu.org's is the
# same). poolctl reads progress, failures and the summary from it.
JSON_UI_MAJOR = "1"
JSON_COMMANDS = ("plan", "apply")
# apply_start / apply_complete hooks' actions, as the progress line says them
_STARTED = {"create": "creating", "update": "changing", "delete": "destroying",
            "replace": "replacing", "import": "importing", "read": "reading"}
_FINISHED = {"create": "created", "update": "changed", "delete": "destroyed",
             "replace": "replaced", "import": "imported", "read": "read"}


@dataclass(frozen=True)
class Diagnostic:
    """An error or warning of Terraform's, from its `diagnostic` message."""

    severity: str  # error | warning
    summary: str
    detail: str = ""
    address: str = ""  # the resource it concerns, when it concerns one

    def lines(self) -> list[str]:
        """As Terraform's human output shows it: `Error: SUMMARY`, the resource, the detail."""
        out = [f"{self.severity.capitalize()}: {self.summary}"]
        if self.address:
            out.append(f"  with {self.address}")
        if self.detail:
            out += ["", *self.detail.splitlines()]
        return out


def ui_message(line: str) -> dict[str, Any] | None:
    """One line of -json output as its message; None when it is not one (a provider's stray
    text, a crash's dump): such a line is logged as it is."""
    if not line.startswith("{"):
        return None
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) and isinstance(msg.get("type"), str) else None


def diagnostic_of(msg: dict[str, Any]) -> Diagnostic | None:
    d = msg.get("diagnostic")
    if msg.get("type") != "diagnostic" or not isinstance(d, dict):
        return None
    return Diagnostic(str(d.get("severity", "error")), str(d.get("summary", "")),
                      str(d.get("detail") or ""), str(d.get("address") or ""))


def log_lines(msg: dict[str, Any]) -> list[str]:
    """What the log keeps of a message: its one-line `@message`, a diagnostic in full. No
    attribute values are in any of them (the boot script included)."""
    diag = diagnostic_of(msg)
    if diag is not None:
        return diag.lines()
    text = str(msg.get("@message", ""))
    return [text] if text else []


class _Watch:
    """Progress states from Terraform's -json messages: resources read (quiet: the live line
    only), started (quiet) and finished (a line of its own off a terminal)."""

    def __init__(self, progress: Progress, label: str, phase: str, total: int) -> None:
        self.progress, self.label, self.phase, self.total = progress, label, phase, total
        self.done = self.read = 0
        progress.update(f"{label}: {phase}", quiet=True)

    def message(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        raw_hook = msg.get("hook")
        hook: dict[str, Any] = raw_hook if isinstance(raw_hook, dict) else {}
        raw_res = hook.get("resource")
        res: dict[str, Any] = raw_res if isinstance(raw_res, dict) else {}
        addr, action = str(res.get("addr", "?")), str(hook.get("action", ""))
        count = f"{self.done}/{self.total}" if self.total else str(self.done)
        if kind == "apply_start":
            self.progress.update(f"{self.label}: {self.phase} {count}, "
                                 f"{_STARTED.get(action, action)} {addr}", quiet=True)
        elif kind == "apply_complete":
            self.done += 1
            count = f"{self.done}/{self.total}" if self.total else str(self.done)
            self.progress.update(f"{self.label}: {self.phase} {count}: {addr} "
                                 f"{_FINISHED.get(action, action)}")
        elif kind == "refresh_complete":
            self.read += 1
            self.progress.update(f"{self.label}: {self.phase}, {self.read} read", quiet=True)


class _Stop:
    """What the interrupt handler knows: the Terraform process, and whether to stop."""

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.proc: subprocess.Popen[str] | None = None
        self.requested = False

    def attach(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        if self.requested:  # the interrupt came while Terraform was being started
            proc.send_signal(signal.SIGINT)

    def handle(self, signum: int, frame: FrameType | None) -> None:
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


INIT_KEY_FILE = ".poolctl-init-key"


class Terraform:
    def __init__(self, workdir: Path, *, mirror: str | None = None,
                 extra_env: dict[str, str] | None = None, label: str | None = None,
                 log: Path | None = None, verbose: bool = False) -> None:
        """`label`: the stack's name in progress lines; `log`: Terraform's output goes there
        (default: a new file under $POOLCTL_HOME/logs/<label>/); `verbose`: and to stderr."""
        self.bin = find_binary()
        self.workdir = workdir
        self.env = dict(os.environ)
        self.env.update({"TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"})
        # Terraform and its Go providers collect garbage at Go's default GOGC=100; the AWS
        # provider's start-up (its schema, on every plan and apply) is allocation-bound, and
        # 400 cut a plan's CPU by about a fifth here (scripts/bench/terraform_gogc.sh) for some
        # hundred MB more memory. A GOGC the user set wins.
        self.env.setdefault("GOGC", "400")
        rc = cli_config(mirror)
        if rc is not None:
            self.env["TF_CLI_CONFIG_FILE"] = str(rc)
        elif self.env.get("TF_CLI_CONFIG_FILE") and not Path(
                self.env["TF_CLI_CONFIG_FILE"]).exists():
            # A config that does not exist only produces a warning on every call.
            del self.env["TF_CLI_CONFIG_FILE"]
        self.env.update(extra_env or {})
        self.timings: dict[str, float] = {}
        self.label = label or Path(workdir).name
        self._log = log
        self.verbose = verbose
        self.total = 0  # changes the next apply makes (progress N/total)

    @property
    def log(self) -> Path:
        if self._log is None:
            self._log = log_path(self.label, "terraform")
        return self._log

    def _args(self, *args: str) -> list[str]:
        # plan and apply: the -json stream (JSON_COMMANDS); init and the rest: plain text,
        # which goes to the log, its Error: blocks found by their first word.
        out = [self.bin, *args]
        if args[0] in JSON_COMMANDS:  # a flag of the subcommand: before a plan file's name
            out.insert(2, "-json")
        elif args[0] not in ("show", "output", "version", "state"):
            out.append("-no-color")
        return out

    def _pump(self, stream: Iterable[str], sink: Callable[[str], None], redact: Redactor,
              watch: _Watch | None, keep: list[str] | None,
              diagnostics: list[Diagnostic] | None = None) -> None:
        for raw in stream:
            msg = ui_message(raw.strip()) if diagnostics is not None else None
            if msg is not None and diagnostics is not None:
                if msg.get("type") == "version" and not str(msg.get("ui", "1")).startswith(
                        JSON_UI_MAJOR + "."):
                    sink(f"poolctl: this {Path(self.bin).name}'s machine-readable UI is "
                         f"version {msg.get('ui')}; poolctl reads {JSON_UI_MAJOR}.x")
                if (diag := diagnostic_of(msg)) is not None and diag.severity == "error":
                    diagnostics.append(diag)
                lines = log_lines(msg)
                if watch is not None:
                    watch.message(msg)
            else:
                line = redact(raw.rstrip("\n"))
                lines = [] if line is None else [line]
            for line in lines:
                sink(line)
                if keep is not None:
                    keep.append(line)

    def run(self, phase: str, *args: str, capture: bool = False,
            ok_codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
        """`capture`: return the output (JSON for poolctl to read; not logged); else the
        output goes to the log (and to stderr with --verbose), with progress on stderr."""
        start = time.monotonic()
        private = is_under_home(self.workdir)
        err_lines: list[str] = []
        diagnostics: list[Diagnostic] = []  # the -json stream's errors
        streamed = args[0] in JSON_COMMANDS
        out = err = None
        with contextlib.ExitStack() as stack:
            stop = stack.enter_context(_one_interrupt_for(phase))
            if not capture:
                log = stack.enter_context(os.fdopen(open_private(
                    self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "w", buffering=1))
                log.write(f"\n# poolctl {datetime.now(UTC).isoformat(timespec='seconds')}: "
                          f"{Path(self.bin).name} {' '.join(args)} (in {self.workdir})\n")
                progress = stack.enter_context(Progress())
                watch = _Watch(progress, self.label, phase,
                               self.total if phase in ("apply", "destroy") else 0)
                lock = threading.Lock()

                def sink(line: str) -> None:
                    with lock:
                        log.write(line + "\n")
                    if self.verbose:
                        progress.note(line)
            proc = subprocess.Popen(
                self._args(*args), cwd=self.workdir, env=self.env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                # A process group of its own: Ctrl-C at the terminal reaches poolctl only,
                # which passes exactly one on (see _one_interrupt_for).
                process_group=0,
                umask=PRIVATE_UMASK if private else -1,
            )
            stop.attach(proc)
            try:
                if capture:
                    out, err = proc.communicate()
                else:
                    readers = [threading.Thread(target=self._pump, daemon=True, args=(
                        s, sink, Redactor(), w, k, d)) for s, w, k, d in (
                        (proc.stdout, watch, None, diagnostics if streamed else None),
                        (proc.stderr, None, err_lines, None))]
                    for t in readers:
                        t.start()
                    proc.wait()
                    for t in readers:
                        t.join()
            finally:
                self.timings[phase] = self.timings.get(phase, 0) + time.monotonic() - start
                if private:
                    tighten(self.workdir)
        name = f"{Path(self.bin).name} {args[0]}"
        if stop.requested:
            raise OperationFailed(
                f"interrupted during `{Path(self.bin).name} {phase}`; Terraform saved its "
                f"state in {self.workdir}; run the same poolctl command again to resume"
                + ("" if capture else f" (its log: {self.log})"))
        if proc.returncode not in ok_codes:
            if capture:
                if err:
                    sys.stderr.write(err)
                raise OperationFailed(f"`{name}` failed (exit {proc.returncode}) in "
                                      f"{self.workdir}; its error is above")
            # -json: the errors are diagnostics in the stream (stderr holds what went wrong
            # before it began, e.g. a bad flag); else Terraform's Error: blocks on stderr
            shown = [line for d in diagnostics for line in d.lines()] + error_blocks(err_lines)
            if not self.verbose:  # with --verbose they are on the screen already
                sys.stderr.write("".join(f"{line}\n" for line in shown))
            raise OperationFailed(
                f"`{name}` failed (exit {proc.returncode}) in {self.workdir}"
                + ("; its error is above" if shown else "") + f"; the whole log: {self.log}")
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def _init_key(self) -> str:
        """What `init` depends on: the binary, the CLI config (provider installation), the
        `terraform` blocks (required providers, backend) of the configuration, the lock file
        and what the last init left in .terraform (backend settings, installed providers)."""
        h = hashlib.sha256(self.bin.encode())
        rc = self.env.get("TF_CLI_CONFIG_FILE")
        for path in sorted(self.workdir.glob("*.tf.json")):
            try:
                block = json.loads(path.read_text()).get("terraform")
            except (OSError, ValueError, AttributeError):
                block = path.name  # unreadable: let init report it
            h.update(f"{path.name}\0{json.dumps(block, sort_keys=True)}\0".encode())
        dot = self.workdir / ".terraform"
        for dep in (Path(rc) if rc else None, self.workdir / ".terraform.lock.hcl",
                    dot / "terraform.tfstate"):
            h.update(dep.read_bytes() if dep and dep.is_file() else b"-")
        if (dot / "providers").is_dir():
            h.update("\0".join(sorted(str(p.relative_to(dot)) for p in
                                      (dot / "providers").rglob("*"))).encode())
        return h.hexdigest()

    def init_current(self) -> bool:
        """Nothing `init` depends on changed since the last successful one in this folder."""
        mark = self.workdir / INIT_KEY_FILE
        return mark.is_file() and mark.read_text() == self._init_key()

    def init(self) -> bool:
        """`terraform init`, unless `init_current()` (a --plan-only saves its seconds).
        True when it ran."""
        if self.init_current():
            return False
        (self.workdir / INIT_KEY_FILE).unlink(missing_ok=True)
        self.run("init", "init", "-input=false", "-upgrade=false")
        write_private(self.workdir / INIT_KEY_FILE, self._init_key())
        return True

    def plan(self, *, destroy: bool = False, out: str = "tfplan") -> PlanSummary:
        args = ["plan", "-input=false", "-detailed-exitcode", f"-out={out}"]
        if destroy:
            args.append("-destroy")
        self.run("plan", *args, ok_codes=(0, 2))
        shown = self.run("plan", "show", "-json", out, capture=True)
        summary = summarize(json.loads(shown.stdout))
        self.total = sum(summary.totals()) + sum(summary.imports.values())
        return summary

    def apply(self, planfile: str = "tfplan", *, phase: str = "apply") -> None:
        self.run(phase, "apply", "-input=false", "-auto-approve", planfile)

    def state_resources(self) -> dict[str, dict[str, Any]]:
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

    def outputs(self) -> dict[str, Any]:
        res = self.run("output", "output", "-json", capture=True)
        return {k: v.get("value") for k, v in json.loads(res.stdout or "{}").items()}


def endpoint_override(region: str, endpoint: AwsEndpoint, state_path: Path) -> dict[str, Any]:
    """Terraform override file for one AWS endpoint (the sandbox): the synthesized JSON stays
    as is; this file points the provider at the endpoint, with its credentials, and keeps the
    state in a local file beside it."""
    creds = endpoint.credentials
    return {
        "provider": {
            "aws": [{
                "region": region,
                "access_key": creds.get("aws_access_key_id", ""),
                "secret_key": creds.get("aws_secret_access_key", ""),
                "skip_credentials_validation": True,
                "skip_metadata_api_check": True,
                "skip_region_validation": True,
                "s3_use_path_style": True,
                "endpoints": [{svc: endpoint.url for svc in ENDPOINT_SERVICES}],
            }]
        },
        "terraform": {"backend": {"local": {"path": str(state_path)}}},
    }
