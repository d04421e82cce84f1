"""A node's start-up phases read back from its boot script's own log (the phase ledger).

The boot script (boot/_node_lib.sh.j2) logs to the node's console: one `boot:` line when it
starts (with the node's uptime: how long the machine took to boot), on AWS the lifecycle
state it is headed for, one `phase=NAME seconds=N` line as each phase ends, what it found in
place (`image: ... is on the root volume already`, `weights: ... is in the cache already`)
and `phase=total seconds=N uptime=U` once it serves, or `phase=failed seconds=N in=PHASE` and
a `FAILED:` line. A console keeps every boot of an instance: a warm node's first boot (which
stops before the weights, `boot: warm pool (...)`) and its later start are two.

How each boot started, for the start-time statistics:
- `cold`: a new node, its first boot that went on to serve;
- `warm_stopped`: a node started from the warm pool (stopped) to serve: a boot after one that
  prepared it;
- `warm_running`: a node that booted into a running warm pool (its whole start happens before
  demand needs it);
- `warm_prep`: a boot that prepared a node for the warm pool and stopped.

Where the pool shares vLLM's compile cache (`compile_cache_uri`), a boot also logs what it
found: `compile cache: hit` (fetched), `miss` (it compiles, then saves it for the next node)
or `on disk` (a warm node's root volume kept its own).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from poolctl.bootscript import FAILED, FAILED_LINE_MAX
from poolctl.errors import printable

BootKind = Literal["cold", "warm_stopped", "warm_running", "warm_prep"]
_LINE = re.compile(r"poolctl: (.*)$")
_FAILED = FAILED.removeprefix("poolctl: ")  # the boot script's `fail` line, after the prefix
_BOOT = re.compile(r"boot: \S+ serving .*, uptime ([0-9.]+)s$")
_TARGET = re.compile(r"boot: lifecycle target (\S+)$")
_PHASE = re.compile(r"phase=(\w+) seconds=(\d+)(?: (uptime|in)=(\S+))?$")
# The order a boot's phases run in (image beside gpus, nvme and weights): how a ledger prints.
ORDER = ("image", "hydrate", "gpus", "nvme", "weights", "compile_cache", "serving",
         "readiness")
# What the shared compile cache gave the boot (node.sh.j2, compile_cache_fetch).
_COMPILE = re.compile(r"compile cache: (hit|miss|on disk)\b")


@dataclass
class BootRecord:
    """One boot of a node, as its script logged it; seconds are the node's own."""

    kind: BootKind = "cold"
    boot_s: float | None = None  # the machine's boot: its uptime when the script began
    phases: dict[str, float] = field(default_factory=dict)  # phase -> seconds, as logged
    script_s: float | None = None  # the script, start to serving
    uptime_s: float | None = None  # power-on to serving (boot + script)
    image_on_disk: bool = False
    weights_cached: bool = False
    weights_streamed: bool = False  # the engine read them from the object store (stream)
    compile_cache: str | None = None  # hit | miss | on disk; None: no shared cache
    failed_in: str | None = None  # the phase a failed boot was in
    failure: str | None = None  # its FAILED: line
    target: str | None = None  # AWS: the lifecycle state it was headed for

    @property
    def served(self) -> bool:
        return self.uptime_s is not None and self.kind != "warm_prep"

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "boot_s": self.boot_s, "phases": dict(self.phases),
                "script_s": self.script_s, "start_s": self.uptime_s,
                "image_on_disk": self.image_on_disk, "weights_cached": self.weights_cached,
                "weights_streamed": self.weights_streamed,
                "compile_cache": self.compile_cache,
                "failed_in": self.failed_in, "failure": self.failure}


def parse_boots(console: str) -> list[BootRecord]:
    """Every boot the console holds, oldest first (a console cut at its start loses the
    boots before: a record with no `boot:` line is left out)."""
    boots: list[BootRecord] = []
    cur: BootRecord | None = None
    for raw in console.splitlines():
        m = _LINE.search(raw.rstrip("\r"))
        if m is None:
            continue
        text = m.group(1)
        if b := _BOOT.match(text):
            cur = BootRecord(boot_s=float(b.group(1)))
            if boots and boots[-1].kind == "warm_prep":
                cur.kind = "warm_stopped"
            boots.append(cur)
            continue
        if cur is None:
            continue
        if t := _TARGET.match(text):
            cur.target = t.group(1)
            if cur.target == "Warmed:Running":
                cur.kind = "warm_running"
        elif text.startswith("boot: warm pool ("):
            cur.kind = "warm_prep"
        elif text.startswith("image: ") and text.endswith("is on the root volume already"):
            cur.image_on_disk = True
        elif text.startswith("weights: ") and text.endswith("is in the cache already"):
            cur.weights_cached = True
        elif text.startswith("weights: streamed by the engine from "):
            cur.weights_streamed = True
        elif c := _COMPILE.match(text):
            cur.compile_cache = c.group(1)
        elif text.startswith(_FAILED):
            cur.failure = printable(text[len(_FAILED):].strip())[:FAILED_LINE_MAX]
        elif p := _PHASE.match(text):
            name, secs, key, value = p.group(1), float(p.group(2)), p.group(3), p.group(4)
            if name == "total":
                cur.script_s = secs
                cur.uptime_s = _number(value) if key == "uptime" else None
            elif name == "failed":
                cur.script_s = secs
                cur.failed_in = value if key == "in" else "boot"
            else:
                cur.phases[name] = secs
    return boots


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None
