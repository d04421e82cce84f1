"""The start times a pool's nodes measured (the phase ledger), kept where `plan` and
`simulate` read them: `$POOLCTL_HOME/starts/<stack>.json`, one sample a node's boot that
served (its uptime when it served: the machine's boot plus the boot script), written each time
`poolctl nodes` or `status` reads the nodes' consoles (runtime/ledger.py).

A sample is keyed by node and boot, so reading the same console twice counts it once; the
newest MAX_SAMPLES a kind are kept, so the figures follow the pool as its image and
configuration change. `measured_starts` gives the p50 and p90 a kind; `plan` and `simulate`
use the p50 in place of the catalog's phases once a kind has MIN_SAMPLES (`--measured` to
require it).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from poolctl import naming
from poolctl.cloud import Cloud
from poolctl.config import Config, Pool
from poolctl.home import poolctl_home, write_private
from poolctl.simulate import percentile

KINDS = ("cold", "warm_stopped", "warm_running")
MAX_SAMPLES = 200  # a kind's newest
MIN_SAMPLES = 1  # a kind's figure is measured from this many boots on


@dataclass(frozen=True)
class StartSample:
    key: str  # "<node id>#<boot ordinal>"
    kind: str
    seconds: float
    at: str  # when it was read, RFC 3339


@dataclass(frozen=True)
class KindStarts:
    kind: str
    n: int
    p50_s: float
    p90_s: float
    newest: str  # when the newest sample was read


def path(cfg: Config, pool: Pool, cloud: Cloud) -> Path:
    return poolctl_home() / "starts" / f"{naming.stack_name(cfg, pool, cloud)}.json"


def _load(p: Path) -> list[StartSample]:
    try:
        raw = json.loads(p.read_text())
    except (OSError, ValueError):
        return []
    out = []
    for s in raw.get("samples", []) if isinstance(raw, dict) else []:
        try:
            sample = StartSample(str(s["key"]), str(s["kind"]), float(s["seconds"]),
                                 str(s["at"]))
        except (KeyError, TypeError, ValueError):
            continue  # a hand-edited line: not a sample
        if sample.kind in KINDS and 0 <= sample.seconds < 86_400:
            out.append(sample)
    return out


def record(cfg: Config, pool: Pool, cloud: Cloud, seen: list[tuple[str, str, float]]
           ) -> None:
    """Add (key, kind, seconds) samples not kept yet; keep each kind's newest."""
    p = path(cfg, pool, cloud)
    kept = _load(p)
    known = {s.key for s in kept}
    now = datetime.now(UTC).isoformat(timespec="seconds")
    new = [StartSample(k, kind, round(sec, 1), now) for k, kind, sec in seen
           if k not in known and kind in KINDS]
    if not new:
        return
    every = kept + new
    trimmed = [s for kind in KINDS for s in [x for x in every if x.kind == kind][-MAX_SAMPLES:]]
    write_private(p, json.dumps({"samples": [asdict(s) for s in trimmed]}, indent=1) + "\n")


def measured_starts(cfg: Config, pool: Pool, cloud: Cloud) -> dict[str, KindStarts]:
    """Kind -> its figures, for kinds with MIN_SAMPLES or more."""
    samples = _load(path(cfg, pool, cloud))
    out = {}
    for kind in KINDS:
        xs = [s for s in samples if s.kind == kind]
        if len(xs) >= MIN_SAMPLES:
            secs = sorted(s.seconds for s in xs)
            out[kind] = KindStarts(kind, len(xs), round(percentile(secs, 0.5) or 0.0, 1),
                                   round(percentile(secs, 0.9) or 0.0, 1),
                                   max(s.at for s in xs))
    return out
