"""The worker's garbage-collector tuning and its shutdown budget (streams/runner.py)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from streams.runner import drain_within, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_tune_gc_freezes_what_exists_and_widens_the_young_generation(restored_gc: None) -> None:
    gc.unfreeze()
    before = gc.get_threshold()
    survivor: list[list[int]] = [[]]  # alive at start-up, like the app's objects

    def walked() -> bool:  # in a generation the collector walks
        return any(o is survivor for g in range(3) for o in gc.get_objects(generation=g))

    assert walked()
    tune_gc(gen0=12_345)
    assert gc.get_threshold() == (12_345, before[1], before[2])
    assert gc.get_freeze_count() > 0
    assert not walked()


class SlowLoop:
    """A stage loop whose drain needs ``takes`` seconds of a shared fake clock."""

    def __init__(self, takes: float, now: list[float]) -> None:
        self.takes, self.now, self.given = takes, now, -1.0

    async def drain(self, timeout: float) -> None:
        self.given = timeout
        self.now[0] += min(self.takes, timeout)


def test_the_loops_drain_within_the_shutdown_seconds_in_all() -> None:
    """RETRO_SHUTDOWN_SECONDS bounds the whole drain, not each loop's: the batch role
    runs two loops, the all-in-one worker four, and the grace period is one."""
    now = [0.0]
    loops = [SlowLoop(50, now), SlowLoop(10, now), SlowLoop(30, now)]
    asyncio.run(drain_within(loops, 60, clock=lambda: now[0]))
    assert [loop.given for loop in loops] == [60, 10, 0]  # each drained, the last in no time
    assert now[0] == 60
