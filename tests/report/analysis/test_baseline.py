"""Counts against a baseline (streams.report.analysis.baseline): burst, new, chronic, silent."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from streams.records import minute_of as minute_key
from streams.report.analysis.baseline import BURST_P, judge, minute_of, poisson_tail, silent_since

START = datetime(2026, 3, 1, 0, 0, tzinfo=UTC)
DAY_END = START + timedelta(hours=24)


def _series(counts: dict[int, int]) -> dict[str, int]:
    """Minute offset from START -> records."""
    return {minute_key((START + timedelta(minutes=m)).isoformat()): n
            for m, n in counts.items()}


def test_poisson_tail_matches_the_direct_sum() -> None:
    for k, mean in ((3, 0.5), (10, 2.0), (40, 12.5)):
        direct = 1 - sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(k))
        assert poisson_tail(k, mean) == pytest.approx(direct, rel=1e-6)
    assert poisson_tail(0, 3.0) == 1.0
    assert poisson_tail(5000, 10.0) < 1e-300 or poisson_tail(5000, 10.0) == 0.0


def test_minute_keys_round_trip() -> None:
    t = datetime(2026, 3, 1, 9, 27, 41, tzinfo=UTC)
    assert minute_key(t.isoformat()) == "2026-03-01T09:27"
    assert minute_of("2026-03-01T09:27") == t.replace(second=0)
    assert minute_of("not a minute") is None


def test_a_burst_against_a_steady_background_is_a_burst() -> None:
    counts = {m: 1 for m in range(0, 24 * 60, 30)}  # one record every half hour
    counts.update({600 + i: 8 for i in range(3)})  # 24 records in three minutes
    verdict = judge(_series(counts), START, DAY_END)
    assert verdict.kind == "burst"
    assert verdict.start == START + timedelta(minutes=600)
    assert verdict.end == START + timedelta(minutes=603)
    assert verdict.p < BURST_P and verdict.burst_count >= 24


def test_the_same_records_spread_evenly_are_chronic_not_a_burst() -> None:
    counts = {m: 1 for m in range(0, 24 * 60, 3)}  # 480 records, steady all day
    verdict = judge(_series(counts), START, DAY_END)
    assert verdict.kind == "chronic"
    assert not verdict.significant


def test_few_records_over_hours_are_sporadic() -> None:
    counts = {60: 1, 300: 1, 700: 2, 1300: 1}
    assert judge(_series(counts), START, DAY_END).kind == "sporadic"


def test_a_template_that_starts_late_is_new_and_one_that_starts_early_is_not() -> None:
    late = {m: 1 for m in range(900, 1400, 20)}  # from 15:00, steady
    assert judge(_series(late), START, DAY_END).kind == "new"
    early = {m: 1 for m in range(0, 1400, 20)}
    assert judge(_series(early), START, DAY_END).kind == "chronic"


def test_a_short_window_has_no_baseline() -> None:
    counts = {0: 50, 1: 60}
    assert judge(_series(counts), START, START + timedelta(minutes=2)).kind == "unjudged"


def test_a_minimum_count_holds_whatever_the_tail_says() -> None:
    counts = {700: 4}  # four records at once in a day of nothing: too few to call
    assert judge(_series(counts), START, DAY_END).kind != "burst"


def test_a_service_that_goes_silent_is_found_with_the_time() -> None:
    counts = {m: 3 for m in range(0, 600)}  # busy, then nothing from minute 600 on
    since = silent_since(_series(counts), START, START + timedelta(minutes=660))
    assert since == START + timedelta(minutes=600)


def test_a_quiet_service_with_a_gap_is_not_silent() -> None:
    counts = {m: 1 for m in range(0, 600, 45)}  # one record every 45 min
    assert silent_since(_series(counts), START, START + timedelta(minutes=660)) is None
