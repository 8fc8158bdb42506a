"""Readiness sees an unreachable broker; the probe logs the change, not every failure."""

from __future__ import annotations

import asyncio
import logging

import pytest

from streams.kafka.probe import BrokerProbe

from helpers import FakeClock, busy_port, closed_port


class Broker:
    def __init__(self) -> None:
        self.up = True

    async def connect(self, host: str, port: int, timeout: float) -> None:
        if not self.up:
            raise ConnectionRefusedError(111, "Connection refused")


def test_readiness_fails_after_the_grace_and_recovers(caplog: pytest.LogCaptureFixture) -> None:
    clock, broker = FakeClock(), Broker()
    probe = BrokerProbe([("kafka", 9092)], grace_seconds=5, connect=broker.connect, clock=clock)
    caplog.set_level(logging.INFO, logger="streams.kafka.probe")
    assert asyncio.run(probe.check()) and probe.unreachable() is None
    broker.up = False
    for _ in range(4):
        asyncio.run(probe.check())
        clock.advance(2)
    reason = probe.unreachable()
    assert reason is not None and "kafka:9092" in reason and "connection refused" in reason
    broker.up = True
    assert asyncio.run(probe.check()) and probe.unreachable() is None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2  # one line when it went, one when it came back
    assert "unreachable" in messages[0] and "reachable again after 8s" in messages[1]


def test_a_short_blip_within_the_grace_is_not_unready() -> None:
    clock, broker = FakeClock(), Broker()
    probe = BrokerProbe([("kafka", 9092)], grace_seconds=5, connect=broker.connect, clock=clock)
    broker.up = False
    asyncio.run(probe.check())
    clock.advance(3)
    assert probe.unreachable() is None


def test_the_real_connect_tells_a_listening_port_from_a_closed_one() -> None:
    with busy_port() as port:
        assert asyncio.run(BrokerProbe([("127.0.0.1", port)]).check())
    with closed_port() as port:
        probe = BrokerProbe([("127.0.0.1", port)], grace_seconds=0)
        assert not asyncio.run(probe.check())
        assert "refused" in (probe.unreachable() or "")


def test_a_shutdown_with_kafka_gone_exits_without_waiting_out_client_timeouts() -> None:
    from streams.kafka.probe import EXIT_KAFKA_GONE, ExitWhenUnreachable

    clock, exits, up = FakeClock(), [], [True]
    guard = ExitWhenUnreachable([("kafka", 9092)], after_seconds=3, clock=clock,
                                connect=lambda h, p: up[0], exit=exits.append)
    assert not guard.check()  # reachable: the orderly shutdown goes on
    up[0] = False
    assert not guard.check()  # one failed probe is not enough
    clock.advance(1)
    assert not guard.check()  # two, but too soon after SIGTERM
    clock.advance(2)
    assert guard.check() and exits == [EXIT_KAFKA_GONE]


def test_a_reachable_broker_never_triggers_the_exit() -> None:
    from streams.kafka.probe import ExitWhenUnreachable

    clock, exits = FakeClock(), []
    guard = ExitWhenUnreachable([("kafka", 9092)], clock=clock, connect=lambda h, p: True,
                                exit=exits.append)
    for _ in range(20):
        clock.advance(1)
        assert not guard.check()
    assert exits == []
