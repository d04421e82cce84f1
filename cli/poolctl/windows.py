"""Launch windows (`warm --from/--until`): the TIME flags, a window's bounds, and the sizes
overlapping windows give the group at each edge.

A window raises the group's minimum by its nodes from `start` to `end`; where windows
overlap, the larger raise holds (never the sum: two teams preparing for one launch ask for
the same spare capacity). The clouds apply it themselves, with nobody watching: AWS as
scheduled actions (absolute sizes at each edge: `edges`), GCP as autoscaler scaling
schedules (the autoscaler already takes the largest of its schedules). Pure functions: no
cloud calls, no clock but the `now` given.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

from poolctl.errors import UsageError, shown
from poolctl.traces import MAX_SPAN_S

# poolctl's bound, not a cloud's: a window prepares a launch; a size held for longer belongs
# in the file (scaling.min_replicas), where `plan` prices it.
MAX_WINDOW = timedelta(days=31)
# GCP scaling schedules: "The minimum duration for scaling schedules is 5 minutes"; AWS has no
# minimum, but one window means the same on both clouds.
MIN_WINDOW = timedelta(minutes=5)
WINDOW_PREFIX = "poolctl-window-"

# How far ahead a TIME flag may name: poolctl's bound, not a cloud's (launch windows are
# planned within a year; EC2 sells Capacity Blocks weeks ahead, not years). It also keeps
# every time far from datetime's year 9999, where a zone's conversion overflows.
MAX_AHEAD = timedelta(days=366)
# A time from a trace's start (`simulate --warm-window`): within a trace poolctl can replay.
MAX_SPAN = timedelta(seconds=MAX_SPAN_S)

# ASCII digits only ([0-9], not \d: Python's \d takes ١٢ and other scripts' digits); the
# sum is taken in Python's integers and held to the bound before any timedelta is made, and
# a flag over 64 characters is refused before int() meets 5,000 digits.
_OFFSET = re.compile(r"\+(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_LONGEST = 64
# RFC 3339 date-time: a date, T (or a space), a time to the second or minute, and a zone.
_RFC3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,9})?)?"
                      r"([Zz]|[+-][0-9]{2}:[0-9]{2})")


@dataclass(frozen=True)
class Window:
    """One window: `nodes` above the kept minimum from `start` to `end`. `start` None: it
    has begun (AWS forgets a scheduled action once it ran)."""

    id: str
    nodes: int
    start: datetime | None
    end: datetime

    def active(self, at: datetime) -> bool:
        return (self.start is None or self.start <= at) and at < self.end


@dataclass(frozen=True)
class Edge:
    """The group's sizes from `at` on: the minimum, and the desired size when the edge lowers
    the minimum (a raise lets the cloud lift the desired size to it)."""

    window: str
    kind: str  # from | until
    at: datetime
    min_nodes: int
    desired_nodes: int | None


def _offset_seconds(m: re.Match[str]) -> int:
    d, h, mi, s = (int(g or 0) for g in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def _span_words(td: timedelta) -> str:
    return f"{td.days} days" if td.days else str(td)


def parse_time(flag: str, text: str, now: datetime) -> datetime:
    """RFC 3339 with a zone (2026-12-05T09:30:00Z, ...+01:00) or an offset from now (+2h,
    +10m, +1d, +1h30m, +90s), at most MAX_AHEAD from now; UsageError naming the flag and the
    bound otherwise."""
    value = text.strip()
    if len(value) > _LONGEST:
        raise UsageError(f"{flag} {shown(text)}: over {_LONGEST} characters; give an RFC 3339 "
                         "time or an offset such as +2h")
    far = (f"{flag} {shown(text)}: more than {_span_words(MAX_AHEAD)} from now; poolctl "
           f"schedules launch windows up to {_span_words(MAX_AHEAD)} ahead")
    if value.startswith("+"):
        m = _OFFSET.fullmatch(value)
        if m is None or not any(m.groups()):
            raise UsageError(f"{flag} {shown(text)}: an offset is +N followed by d, h, m or s "
                             "(e.g. +2h, +10m, +1h30m)")
        seconds = _offset_seconds(m)
        if seconds > MAX_AHEAD.total_seconds():
            raise UsageError(far)
        return now + timedelta(seconds=seconds)
    if not _RFC3339.fullmatch(value):
        raise UsageError(f"{flag} {shown(text)}: give an RFC 3339 time with its zone "
                         "(2026-12-05T09:30:00Z, 2026-12-05T10:30:00+01:00) or an offset "
                         "from now (+2h)")
    try:
        at = datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
        ahead = at - now
    except (ValueError, OverflowError) as exc:
        raise UsageError(f"{flag} {shown(text)}: not a valid time ({exc})") from None
    if abs(ahead) > MAX_AHEAD:
        raise UsageError(far if ahead > timedelta(0) else
                         f"{flag} {shown(text)}: more than {_span_words(MAX_AHEAD)} ago; give "
                         "a time from now on")
    return at


def parse_span(flag: str, text: str) -> float:
    """Seconds from a trace's start: 600, 600s, 10m, 1h30m, 1d; at most MAX_SPAN (a trace
    poolctl replays is no longer)."""
    value = text.strip()
    if len(value) > _LONGEST:
        raise UsageError(f"{flag}: {shown(text)} is over {_LONGEST} characters; give a time "
                         "from the trace's start (600, 10m, 1h30m)")
    bound = (f"{flag}: {shown(text)} is past the longest trace poolctl replays "
             f"({_span_words(MAX_SPAN)}); give a time within the trace")
    try:
        seconds = float(value)
    except ValueError:
        m = _OFFSET.fullmatch("+" + value)
        if m is None or not any(m.groups()):
            raise UsageError(f"{flag}: {shown(text)} is not a time from the trace's start "
                             "(600, 10m, 1h30m)") from None
        whole = _offset_seconds(m)
        if whole > MAX_SPAN.total_seconds():
            raise UsageError(bound) from None
        return float(whole)
    if not math.isfinite(seconds) or seconds < 0:
        raise UsageError(f"{flag}: {shown(text)} is not a time from the trace's start (0 or "
                         "more)")
    if seconds > MAX_SPAN.total_seconds():
        raise UsageError(bound)
    return seconds


def parse_warm_window(text: str) -> tuple[float, float, int, bool]:
    """`simulate --warm-window FROM,UNTIL,N[,running|stopped]` -> (from s, until s, replicas,
    running), each part held to its bounds; one line naming the flag otherwise."""
    parts = [x.strip() for x in text.split(",")]
    if len(parts) not in (3, 4):
        raise UsageError(f"--warm-window {shown(text)}: give FROM,UNTIL,N[,running|stopped] (e.g. "
                         "0,1h,8 or 5m,65m,8,stopped)")
    # FROM below 0: the window began before the trace (its nodes serve from the start).
    start = (-parse_span("--warm-window FROM", parts[0][1:]) if parts[0].startswith("-")
             else parse_span("--warm-window FROM", parts[0]))
    end = parse_span("--warm-window UNTIL", parts[1])
    if end <= start:
        raise UsageError(f"--warm-window {shown(text)}: UNTIL must be after FROM")
    if re.fullmatch("[0-9]{1,6}", parts[2]) is None or int(parts[2]) < 1:
        raise UsageError(f"--warm-window {shown(text)}: N is a number of replicas, 1 to "
                         "999999")
    state = parts[3] if len(parts) == 4 else "running"
    if state not in ("running", "stopped"):
        raise UsageError(f"--warm-window {shown(text)}: the state is running or stopped")
    return start, end, int(parts[2]), state == "running"


def check_window(start: datetime, end: datetime, now: datetime) -> None:
    """One line naming the flag for a window that cannot be scheduled."""
    if start <= now:
        raise UsageError(f"--from {start.isoformat()}: the window starts in the past (now "
                         f"{now.isoformat(timespec='seconds')}); give a later time or +10m")
    if end <= start:
        raise UsageError(f"--until {end.isoformat()}: must be after --from "
                         f"{start.isoformat()}")
    if end - start < MIN_WINDOW:
        raise UsageError(f"--until {end.isoformat()}: the window lasts {end - start}; at least "
                         f"{MIN_WINDOW} (GCP's shortest scaling schedule)")
    if end - start > MAX_WINDOW:
        raise UsageError(f"--until {end.isoformat()}: the window lasts {end - start}; at most "
                         f"{MAX_WINDOW.days} days (a longer size belongs in the file's "
                         "scaling.min_replicas)")


# AWS Capacity Blocks for ML (EC2 user guide): 1, 2, 4 ... 64 instances; 1-day steps up to
# 14 days, then 7-day steps up to 182; every block ends at 11:30 UTC; EC2 begins terminating
# a block's instances 30 minutes before its end.
BLOCK_COUNTS = (1, 2, 4, 8, 16, 32, 64)
BLOCK_END = time(11, 30, tzinfo=UTC)
BLOCK_MARGIN = timedelta(minutes=30)
# AWS advises scaling a group in *more* than 30 minutes before its block ends (Auto Scaling
# user guide, Capacity Blocks); 5 minutes more let the load balancer drain (120 s) first.
SCALE_IN_LEAD = BLOCK_MARGIN + timedelta(minutes=5)


@dataclass(frozen=True)
class BlockNeed:
    """The Capacity Block a window needs: `count` instances for `hours`, starting by the
    window's start (at `earliest`: an 11:30 UTC, or now when that is past) and ending 30
    minutes after its end or later (by `latest`)."""

    count: int
    hours: int
    earliest: datetime
    latest: datetime

    def covers(self, start: datetime, end: datetime, block_start: datetime,
               block_end: datetime) -> bool:
        return block_start <= start and block_end >= end + BLOCK_MARGIN


def block_need(nodes: int, start: datetime, end: datetime, now: datetime) -> BlockNeed:
    """The block for `nodes` from `start` to `end`: one that began at the 11:30 UTC by the
    window's start, or, that 11:30 being past, one that begins now or later (EC2 offers blocks
    starting between two 11:30s, and none in the past)."""
    count = next((c for c in BLOCK_COUNTS if c >= nodes), None)
    if count is None:
        raise UsageError(f"--reserve: {nodes} nodes; a Capacity Block holds at most "
                         f"{BLOCK_COUNTS[-1]} instances")
    first = datetime.combine(start.astimezone(UTC).date(), BLOCK_END)
    if first > start:
        first -= timedelta(days=1)
    days = math.ceil((end + BLOCK_MARGIN - first) / timedelta(days=1))
    if days > 14:
        days = 7 * math.ceil(days / 7)
    if days > 182:
        raise UsageError("--reserve: the window needs a Capacity Block of more than 182 days")
    return BlockNeed(count=count, hours=24 * days, earliest=max(first, now),
                     latest=first + timedelta(days=days))


def window_id(kind: str, nodes: int, start: datetime, end: datetime) -> str:
    """The id of a window of `kind` (running, warm, block): the same for the same nodes and
    times to the minute, so a command run twice (a retried CI job) names the same window,
    and what it bought (a block tagged with the id, a GCP request named by it) is found
    again instead of bought again."""
    key = "/".join([kind, str(nodes), *(f"{t.astimezone(UTC):%Y-%m-%dT%H:%M}"
                                        for t in (start, end))])
    return "w" + hashlib.sha256(key.encode()).hexdigest()[:6]


# Two windows of the same nodes whose starts and ends are this close are one: a command
# given +1h and run again a few minutes later asks for the window already scheduled.
SAME_WITHIN = MIN_WINDOW


def same_window(a: Window, b: Window) -> bool:
    """Whether `b` asks for what `a` already is (same nodes, edges within SAME_WITHIN)."""
    if a.nodes != b.nodes or a.start is None or b.start is None:
        return False
    return abs(a.start - b.start) <= SAME_WITHIN and abs(a.end - b.end) <= SAME_WITHIN


def span_tag(w: Window) -> str:
    """The window as a tag value: FROM/UNTIL/NODES (UTC, to the minute)."""
    assert w.start is not None  # a window being bought for has its start
    return (f"{w.start.astimezone(UTC):%Y-%m-%dT%H:%MZ}/{w.end.astimezone(UTC):%Y-%m-%dT%H:%MZ}"
            f"/{w.nodes}")


def parse_span_tag(text: str | None) -> tuple[datetime, datetime, int] | None:
    """`span_tag` read back, or None for a value poolctl did not write."""
    parts = (text or "").split("/")
    if len(parts) != 3 or not parts[2].isascii() or not parts[2].isdigit():
        return None
    try:
        start, end = (datetime.strptime(x, "%Y-%m-%dT%H:%MZ").replace(tzinfo=UTC)
                      for x in parts[:2])
    except ValueError:
        return None
    return start, end, int(parts[2])


def edges(windows: list[Window], base_min: int) -> list[Edge]:
    """The absolute sizes at every window's start and end: the kept minimum plus the largest
    raise among the windows open just after that moment; in time order. A started window
    (start None) has no start edge left."""
    points = sorted(
        [(w.start, "from", w) for w in windows if w.start is not None]
        + [(w.end, "until", w) for w in windows],
        key=lambda p: (p[0], p[1] == "from", p[2].id))
    out: list[Edge] = []
    before = base_min + max((w.nodes for w in windows if w.start is None), default=0)
    for at, kind, w in points:
        min_nodes = base_min + max((x.nodes for x in windows if x.active(at)), default=0)
        out.append(Edge(window=w.id, kind=kind, at=at, min_nodes=min_nodes,
                        desired_nodes=min_nodes if min_nodes < before else None))
        before = min_nodes
    return out


def raise_at(windows: list[Window], at: datetime) -> int:
    """Nodes above the kept minimum at `at`: the largest open window's."""
    return max((w.nodes for w in windows if w.active(at)), default=0)
