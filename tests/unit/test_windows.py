"""Launch windows: the TIME flags, a window's bounds, and the sizes overlapping windows give
the group at each edge (poolctl.windows; no cloud)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from poolctl.errors import UsageError
from poolctl.windows import MAX_WINDOW, Window, check_window, edges, parse_time, raise_at

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
H = timedelta(hours=1)


@pytest.mark.parametrize(("text", "expected"), [
    ("+2h", NOW + timedelta(hours=2)),
    ("+10m", NOW + timedelta(minutes=10)),
    ("+1h30m", NOW + timedelta(minutes=90)),
    ("+1d", NOW + timedelta(days=1)),
    ("+90s", NOW + timedelta(seconds=90)),
    ("2026-12-05T09:30:00Z", datetime(2026, 12, 5, 9, 30, tzinfo=UTC)),
    ("2026-12-05t09:30z", datetime(2026, 12, 5, 9, 30, tzinfo=UTC)),
    # 10:30 at +01:00 is 09:30 UTC.
    ("2026-12-05T10:30:00+01:00", datetime(2026, 12, 5, 9, 30, tzinfo=UTC)),
    ("2026-12-05 09:30:00.5-00:30", datetime(2026, 12, 5, 10, 0, 0, 500000, tzinfo=UTC)),
])
def test_parse_time_accepts_rfc3339_with_zone_and_offsets(text, expected):
    assert parse_time("--from", text, NOW) == expected


@pytest.mark.parametrize("text", [
    "2026-12-05T09:30:00",  # no zone: which 09:30?
    "2026-12-05",  # a date alone
    "tomorrow", "", "+", "+2", "+2x", "+h", "-2h", "+2h+1m",
    "2026-13-05T09:30:00Z",  # month 13
    "2026-12-05T25:00:00Z",
])
def test_parse_time_refuses_everything_else_naming_the_flag(text):
    with pytest.raises(UsageError) as err:
        parse_time("--until", text, NOW)
    assert str(err.value).startswith("--until ")
    assert "\n" not in str(err.value)


def test_check_window_bounds():
    check_window(NOW + H, NOW + 2 * H, NOW)  # fine
    check_window(NOW + H, NOW + H + MAX_WINDOW, NOW)  # exactly the longest
    for start, end, flag in [
        (NOW - H, NOW + H, "--from"),  # in the past
        (NOW, NOW + H, "--from"),  # now is not ahead
        (NOW + 2 * H, NOW + H, "--until"),  # before --from
        (NOW + H, NOW + H, "--until"),  # empty
        (NOW + H, NOW + H + timedelta(minutes=4), "--until"),  # under GCP's 5 minutes
        (NOW + H, NOW + H + MAX_WINDOW + timedelta(seconds=1), "--until"),
    ]:
        with pytest.raises(UsageError) as err:
            check_window(start, end, NOW)
        assert str(err.value).startswith(flag)


def _w(wid, nodes, start_h, end_h):
    return Window(id=wid, nodes=nodes, start=None if start_h is None else NOW + start_h * H,
                  end=NOW + end_h * H)


def test_one_window_raises_then_restores():
    # Kept minimum 1; +2 nodes from 1h to 2h: 3 at 1h, back to 1 (desired too) at 2h.
    e = edges([_w("wa", 2, 1, 2)], base_min=1)
    assert [(x.kind, x.at - NOW, x.min_nodes, x.desired_nodes) for x in e] == [
        ("from", H, 3, None), ("until", 2 * H, 1, 1)]


def test_overlapping_windows_take_the_larger_raise_never_the_sum():
    # A: +2 over 1h..3h; B: +5 over 2h..4h; kept minimum 1.
    # 1h: A alone -> 1+2 = 3. 2h: A and B -> 1+max(2,5) = 6 (not 1+7).
    # 3h: B alone -> 6 still (no drop, desired untouched). 4h: none -> 1, desired 1.
    e = edges([_w("wa", 2, 1, 3), _w("wb", 5, 2, 4)], base_min=1)
    assert [(x.window, x.kind, x.min_nodes, x.desired_nodes) for x in e] == [
        ("wa", "from", 3, None), ("wb", "from", 6, None),
        ("wa", "until", 6, None), ("wb", "until", 1, 1)]
    # B ends first inside a longer, smaller A: 1h A +2 -> 3; 2h B +5 -> 6; 3h B ends -> 3
    # (a drop: desired 3); 4h A ends -> 1.
    e = edges([_w("wa", 2, 1, 4), _w("wb", 5, 2, 3)], base_min=1)
    assert [(x.min_nodes, x.desired_nodes) for x in e] == [(3, None), (6, None), (3, 3),
                                                           (1, 1)]


def test_back_to_back_windows_hand_over_at_the_same_instant():
    # A ends at 2h when B starts: at 2h B's +4 holds (the end sorts before the start).
    e = edges([_w("wa", 2, 1, 2), _w("wb", 4, 2, 3)], base_min=0)
    assert [(x.kind, x.at - NOW, x.min_nodes) for x in e] == [
        ("from", H, 2), ("until", 2 * H, 4), ("from", 2 * H, 4), ("until", 3 * H, 0)]


def test_a_begun_window_has_only_its_end_left():
    # A began (AWS ran and forgot its start): +3 until 2h; B +1 from 1h to 3h; kept 2.
    e = edges([_w("wa", 3, None, 2), _w("wb", 1, 1, 3)], base_min=2)
    # 1h: both open -> 2+3 = 5 (no change); 2h: B alone -> 3, a drop; 3h: 2.
    assert [(x.window, x.kind, x.min_nodes, x.desired_nodes) for x in e] == [
        ("wb", "from", 5, None), ("wa", "until", 3, 3), ("wb", "until", 2, 2)]
    assert raise_at([_w("wa", 3, None, 2)], NOW) == 3
    assert raise_at([_w("wa", 3, None, 2)], NOW + 2 * H) == 0  # the end is exclusive


def test_offsets_keep_the_zone_of_now():
    tz = timezone(timedelta(hours=-5))
    now = datetime(2026, 12, 4, 7, 0, tzinfo=tz)
    assert parse_time("--from", "+1h", now) == datetime(2026, 12, 4, 13, 0, tzinfo=UTC)


def test_block_need_covers_the_window_from_an_1130_utc_start_to_30_minutes_past_its_end():
    from poolctl.windows import block_need

    day = datetime(2026, 12, 7, tzinfo=UTC)
    now = day - timedelta(days=2)
    # 12:00-14:00: the block from 11:30 that day; 14:00 + 30 min is within 24 h.
    need = block_need(2, day + timedelta(hours=12), day + timedelta(hours=14), now)
    assert (need.count, need.hours) == (2, 24)
    assert need.earliest == day + timedelta(hours=11, minutes=30)
    # 10:00-12:00: 11:30 that day is after the start, so from 11:30 the day before; to
    # 12:30 = 25 h after it -> 2 days.
    need = block_need(3, day + timedelta(hours=10), day + timedelta(hours=12), now)
    assert (need.count, need.hours) == (4, 48)  # 3 nodes: blocks come in 1, 2, 4, 8 ...
    assert need.earliest == day - timedelta(hours=12, minutes=30)
    # 15 days from 12:00: 16 days of blocks -> past 14, 7-day steps -> 21 days.
    need = block_need(1, day + timedelta(hours=12), day + timedelta(days=15, hours=12), now)
    assert need.hours == 21 * 24
    assert need.covers(day + timedelta(hours=12), day + timedelta(days=15, hours=12),
                       need.earliest, need.latest)
    assert not need.covers(day + timedelta(hours=12), day + timedelta(days=15, hours=12),
                           need.earliest, day + timedelta(days=15, hours=12))  # no 30 min
    with pytest.raises(UsageError, match="--reserve"):
        block_need(65, day + H, day + 2 * H, now)


def test_block_need_for_a_window_today_after_1130_asks_for_blocks_from_now():
    from poolctl.windows import block_need

    now = datetime(2026, 12, 7, 14, 16, 30, tzinfo=UTC)
    # 14:26-15:26: today's 11:30 is past and EC2 offers nothing that starts in the past, so
    # the search starts now; the block still ends by 11:30 tomorrow (15:56 is within a day
    # of today's 11:30: 24 h asked).
    need = block_need(2, now + timedelta(minutes=10), now + timedelta(minutes=70), now)
    assert (need.count, need.hours, need.earliest) == (2, 24, now)
    assert need.latest == datetime(2026, 12, 8, 11, 30, tzinfo=UTC)
    # A block from 14:20 (the next 5-minute mark) to 11:30 tomorrow covers it; one from
    # 14:30 does not (it starts after --from).
    assert need.covers(now + timedelta(minutes=10), now + timedelta(minutes=70),
                       datetime(2026, 12, 7, 14, 20, tzinfo=UTC), need.latest)
    assert not need.covers(now + timedelta(minutes=10), now + timedelta(minutes=70),
                           datetime(2026, 12, 7, 14, 30, tzinfo=UTC), need.latest)
