"""What `warm` buys and who may act on a pool at once.

The purchase ledger, $POOLCTL_HOME/purchases.jsonl: one line per step of every purchase
(a Capacity Block, a GCP future reservation), appended and flushed to disk before the next
step, so that nothing bought goes unrecorded whatever interrupts the command:

- `buying`, before the call that buys: the offering, the window, when, by whom;
- `bought`, once the cloud answered, with the reservation's id (then the window is made);
- `failed`, when the cloud refused (nothing was bought).

A `buying` line with nothing after it is a purchase whose answer never arrived (Ctrl-C, a
dropped connection): the cloud may have made it. The cloud's record is the other half, and
the one shared with other machines: a block is tagged at purchase, atomically, with the pool,
the window, the time and the buyer, so `warm --list`, `status` and `capacity check` find a
block that no window uses from any machine, and the next `--reserve` uses it instead of
buying another.

The pool lock, $POOLCTL_HOME/locks/<stack>.lock: `warm` holds it (flock) from its first read
of the pool's windows to its last write, so two `warm` on one machine act one after the
other, and the second reads what the first wrote. Another machine is not held by it; the
windows' writer re-reads after writing and rewrites every edge when it finds a window it
did not know (`runtime/windows.py`).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import json
import os
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from poolctl import naming
from poolctl.cloud import Cloud
from poolctl.clouds.base import (
    BoughtBlock,
    CloudOps,
    Purchase,
    RunsBlockWindows,
    SchedulesWindows,
)
from poolctl.config import Config, Pool
from poolctl.errors import OperationFailed
from poolctl.home import open_private, poolctl_home, private_dir
from poolctl.progress import log
from poolctl.windows import parse_span_tag

LEDGER = "purchases.jsonl"
LOCK_WAIT_S = 600.0  # a window's purchase takes seconds; a lock held longer is a stuck run


def buyer() -> str:
    """Who buys: user@host, as the block's tag and the ledger record it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def ledger_path(home: Path | None = None) -> Path:
    return (home or poolctl_home()) / LEDGER


def record(p: Purchase) -> None:
    """Append one step and flush it to disk before returning (O_APPEND: one line, whole,
    whatever else writes the ledger at the same time)."""
    fd = open_private(ledger_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, (json.dumps(p.to_json(), sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def purchases(cfg: Config, pool: Pool, cloud: Cloud) -> list[Purchase]:
    """The pool's purchases, each at its last step, oldest first. A line that does not read
    (a crash mid-write on a file system without atomic appends) is passed over."""
    path = ledger_path()
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return []
    last: dict[tuple[str, str], Purchase] = {}
    fields = set(Purchase.__dataclass_fields__)
    for line in lines:
        try:
            raw = json.loads(line)
            p = Purchase(**{k: v for k, v in raw.items() if k in fields})
        except (ValueError, TypeError):
            continue
        if (p.project, p.pool, p.cloud) == (cfg.project, pool.name, str(cloud)):
            last[(p.window, p.offering)] = p
    return list(last.values())


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@contextlib.contextmanager
def pool_lock(cfg: Config, pool: Pool, cloud: Cloud, what: str) -> Iterator[None]:
    """Hold the pool's lock while `what` (a command's words) acts on it; wait for another
    holder, saying who once, up to LOCK_WAIT_S."""
    folder = private_dir(poolctl_home() / "locks")
    path = folder / f"{naming.stack_name(cfg, pool, cloud)}.lock"
    fd = open_private(path, os.O_RDWR | os.O_CREAT)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
                    log(f"{pool.name}: waiting for another poolctl acting on the pool "
                        f"({holder or 'unknown'}) ...")
                    told = True
                if time.monotonic() > deadline:
                    raise OperationFailed(
                        f"{pool.name}: another poolctl has acted on the pool for over "
                        f"{LOCK_WAIT_S:.0f} s ({path}); wait for it, or end it and run again"
                        ) from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {what}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def unanswered(cfg: Config, pool: Pool, cloud: Cloud, known: set[str]) -> list[Purchase]:
    """Purchases whose answer never came (`buying` last) for a window the cloud shows
    nothing of (`known`: the windows of the pool's blocks, schedules and block groups): not
    bought, or not listed yet."""
    return [p for p in purchases(cfg, pool, cloud)
            if p.state == "buying" and p.window not in known]


def bought_blocks(cfg: Config, pool: Pool, ops: CloudOps) -> list[BoughtBlock]:
    """The pool's bought blocks that have not ended (none where the cloud sells none)."""
    if not isinstance(ops, RunsBlockWindows):
        return []
    now = datetime.now(UTC)
    return [b for b in ops.pool_blocks(cfg, pool) if b.end > now]


def purchase_view(cfg: Config, pool: Pool, cloud: Cloud, ops: CloudOps
                  ) -> tuple[list[BoughtBlock], list[Purchase]]:
    """(the pool's bought blocks no window uses, purchases with no answer and nothing on
    the cloud for their window): what `capacity check` adds to its report."""
    blocks = bought_blocks(cfg, pool, ops)
    bws = ops.block_windows(cfg, pool) if isinstance(ops, RunsBlockWindows) else []
    used = {bw.block for bw in bws}
    known = {b.window or "" for b in blocks} | {bw.window.id for bw in bws}
    pending = unanswered(cfg, pool, cloud, known)
    if pending and isinstance(ops, SchedulesWindows):
        try:  # a window the cloud schedules answers for its purchase (GCP's requests)
            known |= {w.id for w in ops.scheduled_windows(ops.find_group(cfg, pool))[0]}
        except OperationFailed:  # not deployed: no window either
            pass
        pending = [p for p in pending if p.window not in known]
    return [b for b in blocks if b.id not in used], pending


def unused_line(pool: str, cloud: Cloud, b: BoughtBlock) -> str:
    """A block no window uses, in one line with the command that uses it."""
    span = parse_span_tag(b.span)
    how = (f"`poolctl warm --pool {pool} --cloud {cloud} --running --replicas N --from "
           f"{span[0]:%Y-%m-%dT%H:%MZ} --until {span[1]:%Y-%m-%dT%H:%MZ} --reserve --yes`, "
           f"N the replicas of its {span[2]} node(s), runs the window it was bought for in it"
           if span else "`poolctl warm --running --from T --until T --reserve --yes` with a "
           "window inside it runs one in it")
    who = f", bought {b.bought_at} by {b.bought_by}" if b.bought_at or b.bought_by else ""
    return (f"{pool}: Capacity Block {b.id} ({b.count} x {b.instance_type} in {b.zone}, "
            f"{b.start:%Y-%m-%dT%H:%MZ} to {b.end:%Y-%m-%dT%H:%MZ}, {b.state}{who}) has no "
            f"window: {how}; Capacity Blocks cannot be cancelled")


def pending_line(pool: str, p: Purchase) -> str:
    return (f"{pool}: the purchase of {p.kind} offering {p.offering} for window {p.window} "
            f"(${p.upfront_usd:,.2f}, {p.at} by {p.by}) got no answer (interrupted) and no "
            f"block carries its window's tag: it was not bought, or not yet listed; "
            f"`poolctl warm --list` again shows it if it was")


