"""Stall detection for the liveness probe."""

from __future__ import annotations

from streams.kafka.stall import StallDetector

from helpers import FakeClock


def test_lag_with_a_frozen_commit_becomes_a_stall() -> None:
    clock = FakeClock()
    d = StallDetector(stall_seconds=300, clock=clock)
    p = ("retro.fragments", 1)
    d.observe({p: 100}, {p: 34})
    clock.now = 200
    d.observe({p: 100}, {p: 34})
    assert d.stalled() == []
    clock.now = 301
    d.observe({p: 100}, {p: 34})
    assert d.stalled() == [p]


def test_progress_or_no_lag_is_not_a_stall() -> None:
    clock = FakeClock()
    d = StallDetector(stall_seconds=300, clock=clock)
    moving, idle = ("raw", 0), ("raw", 1)
    for step in range(10):
        clock.now = step * 100.0
        d.observe({moving: step * 10, idle: 5}, {moving: 50, idle: 0})
    assert d.stalled() == []


def test_zero_disables_the_check() -> None:
    clock = FakeClock()
    d = StallDetector(stall_seconds=0, clock=clock)
    d.observe({("t", 0): 1}, {("t", 0): 9})
    clock.now = 10_000
    assert d.stalled() == []


def test_restart_starts_the_clock_again() -> None:
    clock = FakeClock()
    d = StallDetector(stall_seconds=10, clock=clock)
    p = ("t", 0)
    d.observe({p: 236}, {p: 64})
    clock.now = 10
    assert d.stalled() == [p]
    d.restart(p)
    clock.now = 11
    d.observe({p: 236}, {p: 64})
    assert d.stalled() == []
    clock.now = 20
    assert d.stalled() == [p]


def test_a_partition_that_moved_away_is_no_longer_watched() -> None:
    clock = FakeClock()
    d = StallDetector(stall_seconds=10, clock=clock)
    mine, moved = ("t", 0), ("t", 1)
    d.observe({mine: 1, moved: 1}, {mine: 0, moved: 5})
    clock.now = 60
    d.observe({mine: 1}, {mine: 0})  # a rebalance gave ("t", 1) to another worker
    assert d.stalled() == []
