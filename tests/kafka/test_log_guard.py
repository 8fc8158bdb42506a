"""Repeated warnings during a broker outage are summarised, not flooded."""

from __future__ import annotations

import io
import logging

from streams.kafka.log_guard import RepeatLimiter, limit_repeats

from helpers import FakeClock


def _logger(clock: FakeClock) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RepeatLimiter(burst=2, interval=30, clock=clock))
    log = logging.getLogger(f"test.guard.{id(out)}")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    return log, out


def test_a_flood_of_one_warning_becomes_a_few_lines_and_a_count() -> None:
    clock = FakeClock()
    log, out = _logger(clock)
    for i in range(1000):  # a tight reconnect loop: 1000 errors in 10 s
        log.error("Unable connect to node with id %s: %s", i % 3, "refused")
        clock.advance(0.01)
    assert out.getvalue().count("\n") == 2
    clock.advance(30)
    log.error("Unable connect to node with id %s: %s", 1, "refused")
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert "998 more like this in the last 30s were not logged" in lines[-1]


def test_other_messages_and_info_lines_pass() -> None:
    clock = FakeClock()
    log, out = _logger(clock)
    for _ in range(10):
        log.info("progress")
        log.warning("one")
        log.warning("two")
    lines = out.getvalue().splitlines()
    assert lines.count("progress") == 10
    assert lines.count("one") == 2 and lines.count("two") == 2


def test_installing_twice_adds_one_filter() -> None:
    handler = logging.StreamHandler(io.StringIO())
    limit_repeats([handler])
    limit_repeats([handler])
    assert sum(isinstance(f, RepeatLimiter) for f in handler.filters) == 1
