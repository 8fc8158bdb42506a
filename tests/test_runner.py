"""The worker's garbage-collector tuning (streams/runner.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from streams.runner import tune_gc


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
