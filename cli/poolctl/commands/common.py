"""Options every command shares, and the few rendering helpers they use."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from poolctl.capacity import measured_start_times
from poolctl.cloud import Cloud
from poolctl.clouds.base import CloudOps
from poolctl.clouds.registry import get_ops
from poolctl.config import Config, Pool, Target, find_config, load_config
from poolctl.endpoints import REAL_CLOUDS, CloudEndpoints, real_clouds
from poolctl.envcheck import REGION_RE
from poolctl.errors import UsageError
from poolctl.home import cannot_create
from poolctl.rules import errors, refusal, run_checks
from poolctl.runtime.common import watch_hint
from poolctl.sandbox import manager
from poolctl.sandbox.serving import sandbox_clock
from poolctl.starts import measured_starts

if TYPE_CHECKING:  # the config model (pydantic) loads only when a command runs
    from rich.console import Console

    from poolctl.rules import Finding


# -------------------------------------------------------------------------------------
# Numeric options: parsed here rather than by the option's own type, so that NaN, inf,
# `1_000`, non-ASCII digits and 5,000-digit numbers are refused with one line naming the flag
# (click attaches the flag to the BadParameter) before the command runs.

_REAL = re.compile(r"[+-]?(?:\d{1,30}(?:\.\d{0,30})?|\.\d{1,30})(?:[eE][+-]?\d{1,3})?", re.ASCII)
_WHOLE = re.compile(r"[+-]?\d{1,30}", re.ASCII)


def whole(lo: int, hi: int, what: str = "a whole number") -> Callable[[object], int]:
    """A typer `parser=` for an int option: a plain whole number from `lo` to `hi`."""

    def parse(raw: object) -> int:
        n: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):  # the option's default
            n = raw
        elif isinstance(raw, str) and _WHOLE.fullmatch(raw.strip()):
            n = int(raw.strip())
        if n is None or not lo <= n <= hi:
            raise typer.BadParameter(f"{str(raw)[:40]!r}: give {what} from {lo} to {hi}")
        return n

    return parse


def real(lo: float, hi: float, what: str = "a number", *, above: bool = False
         ) -> Callable[[object], float]:
    """A typer `parser=` for a float option: a finite number from `lo` (excluded when
    `above`) to `hi`."""

    def parse(raw: object) -> float:
        x: float | None = None
        if isinstance(raw, int | float) and not isinstance(raw, bool):  # the default
            x = float(raw)
        elif isinstance(raw, str) and _REAL.fullmatch(raw.strip()):
            x = float(raw.strip())
        if x is None or not math.isfinite(x) or not (x > lo if above else x >= lo) or x > hi:
            low = f"above {lo:g}" if above else f"from {lo:g}"
            raise typer.BadParameter(f"{str(raw)[:40]!r}: give {what} {low} to {hi:g}")
        return x

    return parse


# Seconds a command waits at most: a week is past any rollout poolctl runs.
WEEK_S = 7 * 24 * 3600


def region_name(raw: object) -> str:
    """A typer `parser=` for --region: a DNS label (it becomes part of an endpoint's host
    name), as AWS and GCP spell regions; `us-east-1;rm` is refused before any SDK call."""

    text = str(raw)
    if not REGION_RE.fullmatch(text):
        raise typer.BadParameter(f"{text[:40]!r} is not a region name; give one like "
                                 "us-east-1 or us-central1")
    return text


def gcp_project_id(raw: object) -> str:
    """A typer `parser=` for --project: a GCP project id (optionally domain-scoped)."""
    text = str(raw)
    if not re.fullmatch(r"(?:[a-z0-9.-]{1,63}:)?[a-z][a-z0-9-]{4,28}[a-z0-9]", text, re.ASCII):
        raise typer.BadParameter(f"{text[:40]!r} is not a GCP project id; give one like "
                                 "acme-prod (6-30 lowercase letters, digits and hyphens)")
    return text


# -------------------------------------------------------------------------------------
# Paths a command writes: checked before anything is written, one line naming the flag.


def check_creatable(folder: Path, flag: str, fix: str = "give a writable folder") -> None:
    """`folder` is (or can become) a folder poolctl can write in; else one line naming the
    flag. Leaves nothing behind."""

    if problem := cannot_create(folder):
        raise UsageError(f"{flag}: {folder}: {problem}; {fix}")


def make_folder(folder: Path, flag: str, fix: str = "give a writable folder") -> Path:
    """`mkdir -p folder`, a failure one line naming the flag."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{flag}: cannot make {folder} ({e.strerror or type(e).__name__}); "
                         f"{fix}") from None
    return folder


FileOpt = Annotated[
    Path | None,
    typer.Option(
        "-f", "--file", help="Config file (default ./poolctl.yaml or $POOLCTL_FILE).",
        show_default=False,
    ),
]
PoolOpt = Annotated[str | None, typer.Option("--pool", help="Act on this pool only.")]
# Commands that act on a cloud take --cloud the same way: the pools' only placement by default
# (AWS with --sandbox), else it must be given (`pick_cloud`). Commands that only read the file
# (validate, plan, synth, catalog) cover every placement by default.
CloudOpt = Annotated[
    Cloud | None,
    typer.Option("--cloud", help="Placement to act on (default: the pool's only placement; "
                 "required when the selected pools have both).", show_default=False),
]
CloudAllOpt = Annotated[
    Cloud | None, typer.Option("--cloud", help="Only this placement (default: every one).",
                               show_default=False)
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]
MeasuredOpt = Annotated[
    bool, typer.Option("--measured", help="Require the pool's measured start times (read "
                       "from its nodes' boots by `poolctl nodes` and `status`); without them, "
                       "exit 2. By default they are used where they exist, the catalog's "
                       "phases elsewhere.")
]
SandboxOpt = Annotated[
    bool, typer.Option("--sandbox", help="Target the local sandbox (poolctl sandbox start).")
]
AutoApproveOpt = Annotated[
    bool, typer.Option("--auto-approve", "--yes", "-y", help="Do not ask for confirmation.")
]


def cloud_value(cloud: Cloud | None) -> str | None:
    return cloud.value if cloud is not None else None


def load(file: Path | None) -> Config:

    with file_errors():
        return load_config(file)


@contextlib.contextmanager
def file_errors() -> Iterator[None]:
    """A config path the system refuses to even look at (a name too long, a loop of links) is
    one line naming -f, as a missing one is."""
    try:
        yield
    except OSError as e:
        raise UsageError(f"-f/--file: {str(e.filename)[:80]!r} cannot be read ({e.strerror}); "
                         "pass -f PATH of a poolctl.yaml (or set POOLCTL_FILE)") from None


def targets(cfg: Config, pool: str | None, cloud: Cloud | None) -> list[Target]:
    return cfg.targets(pool, cloud)


def endpoints_of(sandbox: bool) -> CloudEndpoints:
    """Where this command's cloud calls go, resolved once here at the edge: the real clouds,
    or with --sandbox the running sandbox (a line saying how to start it when none runs).
    Outside `poolctl sandbox ...`, this is the only code that loads the sandbox package."""
    if not sandbox:
        return real_clouds()

    return manager.endpoints()


def now_of(sandbox: bool) -> datetime:
    """The time a command schedules against: the machine's, or with --sandbox the sandbox's
    clock (which tests move, and a serving sandbox runs S times faster), so that `--from
    +10m` means ten minutes of the pool's time."""
    if not sandbox:
        return datetime.now(UTC)
    aws = manager.endpoints().aws
    assert aws is not None  # a sandbox emulates AWS
    return sandbox_clock(aws.url)


def pick_cloud(cfg: Config, pool: str | None, cloud: Cloud | None,
               endpoints: CloudEndpoints = REAL_CLOUDS) -> Cloud:
    """--cloud of a command that acts on one cloud: as given; the one cloud the endpoints
    reach (AWS with --sandbox: the sandbox emulates AWS only); else the one placement the
    selected pools have; else one line naming the choices (exit 2)."""
    if cloud is not None:
        return cloud
    if len(endpoints.clouds) == 1:
        return next(iter(endpoints.clouds))
    pools = cfg.select(pool)
    clouds = [c for c in Cloud if any(p.placement(c) for p in pools)]
    if len(clouds) == 1:
        return clouds[0]

    what = f"pool {pools[0].name!r} has" if len(pools) == 1 else "the selected pools have"
    raise UsageError(f"--cloud: {what} {' and '.join(clouds)} placements; pick one with "
                     f"{' or '.join(f'--cloud {c}' for c in clouds)}")


def cloud_targets(cfg: Config, pool: str | None, cloud: Cloud | None,
                  endpoints: CloudEndpoints = REAL_CLOUDS) -> list[Target]:
    """The targets of a command that acts on one cloud (`pick_cloud`), which the
    endpoints must reach."""
    picked = pick_cloud(cfg, pool, cloud, endpoints)
    endpoints.require(picked)
    return targets(cfg, pool, picked)


def one_target(cfg: Config, pool: str | None, cloud: Cloud | None,
               endpoints: CloudEndpoints = REAL_CLOUDS) -> Target:
    """The single target a command that changes one pool acts on."""
    tgts = cloud_targets(cfg, pool, cloud, endpoints)
    if len(tgts) != 1:
        names = ", ".join(t.pool.name for t in tgts)
        raise UsageError(f"--pool: this acts on one pool, the file gives {names}; pick one "
                         "with --pool")
    return tgts[0]


@dataclass(frozen=True)
class CloudContext:
    """What a command acting on the selected pools of one cloud works with: its -f, --pool,
    --cloud and --sandbox resolved once (`resolve_targets`)."""

    file: Path | None  # -f as given: the hints a command prints repeat it
    cfg: Config
    cloud: Cloud
    endpoints: CloudEndpoints
    targets: tuple[Target, ...]
    contact_email: str | None = None  # Cloud Quotas requests carry one (GCP)

    @cached_property
    def ops(self) -> CloudOps:
        """The cloud's operations, made on first use: a command that refuses its options
        after resolving them makes none."""
        return get_ops(self.cloud, self.endpoints, contact_email=self.contact_email)

    @cached_property
    def path(self) -> Path:
        """The config file read (for commands that record it or write it back)."""
        with file_errors():
            return find_config(self.file)


@dataclass(frozen=True)
class TargetContext(CloudContext):
    """A command that changes one pool: its one target (`resolve_target`)."""

    @property
    def target(self) -> Target:
        return self.targets[0]

    @property
    def pool(self) -> Pool:
        return self.target.pool

    def hint(self, what: str = "status") -> str:
        """The command that watches this pool, with the options this one was given."""
        return watch_hint(self.cloud, self.file, self.pool, self.endpoints, what)


def resolve_targets(file: Path | None, pool: str | None, cloud: Cloud | None, sandbox: bool,
                    *, contact_email: str | None = None) -> CloudContext:
    """The file, where the calls go (`--sandbox`), then the pools of the one cloud picked
    (`cloud_targets`), which those endpoints must reach."""
    cfg = load(file)
    endpoints = endpoints_of(sandbox)
    tgts = cloud_targets(cfg, pool, cloud, endpoints)
    return CloudContext(file=file, cfg=cfg, cloud=tgts[0].cloud, endpoints=endpoints,
                        targets=tuple(tgts), contact_email=contact_email)


def resolve_target(file: Path | None, pool: str | None, cloud: Cloud | None, sandbox: bool
                   ) -> TargetContext:
    """As `resolve_targets`, for a command that acts on one pool (`one_target`)."""
    cfg = load(file)
    endpoints = endpoints_of(sandbox)
    tgt = one_target(cfg, pool, cloud, endpoints)
    return TargetContext(file=file, cfg=cfg, cloud=tgt.cloud, endpoints=endpoints,
                         targets=(tgt,))


def start_times(cfg: Config, pool: Pool, cloud: Cloud, required: bool
                ) -> tuple[dict[str, float], dict[str, Any]]:
    """The start times `plan` and `simulate` use for the pool: its measured ones by kind
    (capacity.measured_start_times) where they exist, and what they are, for the output."""
    measured = measured_starts(cfg, pool, cloud)
    if required and not measured:
        raise UsageError(f"--measured: no start of pool {pool.name} on {cloud} has been "
                         f"measured yet; `poolctl nodes --cloud {cloud} --pool {pool.name}` "
                         "reads them from the deployed pool's nodes")
    times = measured_start_times(pool, cloud, measured)
    return times, {"source": "measured" if times else "catalog", "seconds": times,
                   "measured": {k: asdict(v) for k, v in measured.items()}}


def start_words(label: str, info: dict[str, Any]) -> str:
    """One line saying which start times were used."""
    if info["source"] == "catalog":
        return f"{label}: start times from the catalog's phases (none measured yet)"
    return f"{label}: start times measured: " + "; ".join(
        f"{k.replace('_', ' ')} {v:g} s (p50 of {info['measured'][k]['n']} boot(s), plus "
        "joining the load balancer)" for k, v in info["seconds"].items())


def emit_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


PIPE_WIDTH = 200


def console() -> Console:
    from rich.console import Console  # noqa: PLC0415 (rich loads when a table prints)

    # Rich lays a table out in 80 columns off a terminal and cuts cells to "us-e…": a CI log
    # or a pipe gets the whole of each cell instead (COLUMNS still rules when set).
    wide = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    # No colours: what a table prints passes stdout's escaping of control characters
    # (errors.EscapingStream), which would show a colour's escape sequence as text.
    # No emoji codes: an ARN's ":secret:" (Secrets Manager) would print as an emoji.
    return Console(highlight=False, width=PIPE_WIDTH if wide else None, color_system=None,
                   emoji=False)


def print_findings(findings: Iterable[Finding], stream: TextIO | None = None) -> None:
    """Findings go to stderr, one line each, so stdout stays clean for --json."""
    stream = stream or sys.stderr
    for f in findings:
        stream.write(f.line() + "\n")


def confirm(question: str, auto_approve: bool) -> bool:
    if auto_approve:
        return True
    if not sys.stdin.isatty():

        raise UsageError("--auto-approve: no terminal to confirm on; pass --auto-approve to go on")
    return typer.confirm(question, default=False)


OutOpt = Annotated[Path, typer.Option("--out", help="Synthesis output folder.")]
MirrorOpt = Annotated[
    str | None,
    typer.Option("--provider-mirror", envvar="POOLCTL_PROVIDER_MIRROR",
                 help="Install providers from this filesystem mirror (offline applies)."),
]


def require_valid(cfg: Config, tgts: list[Target]) -> None:
    """What plan, synth and deploy run first: print findings, refuse on any error."""

    findings = run_checks(cfg, tgts)
    print_findings(findings)
    errs = errors(findings)
    if errs:
        raise refusal(errs, f"{len(errs)} rule(s) failed (listed above); nothing was changed "
                      "— fix them and run `poolctl validate`")
