"""The worker's garbage-collector tuning, its shutdown budget and its logging
(streams/runner.py)."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.kafka.log_guard import RepeatLimiter
from streams.runner import drain_within, host_worker, tune_gc
from streams.settings import Settings


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


@pytest.fixture
def restored_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_faust_sets_up_one_stderr_line_per_record_with_repeats_limited(
        tmp_path: Path, restored_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    """faust clears the root logger's handlers and installs its own when the worker
    starts: the configuration it is given keeps a broker outage to a few lines."""
    from streams.app import build_app

    settings = Settings(state_dir=tmp_path, kafka={"bootstrap": "127.0.0.1:9"})
    host = host_worker(build_app(settings, web=False).app, settings)
    host._setup_logging()  # what faust runs first when the worker starts
    [handler] = logging.getLogger().handlers
    assert any(isinstance(f, RepeatLimiter) for f in handler.filters)
    log = logging.getLogger("aiokafka.conn")
    for node in range(10):
        log.warning("Unable connect to node with id %s", node)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and lines[0].endswith(
        "WARNING aiokafka.conn: Unable connect to node with id 0")
