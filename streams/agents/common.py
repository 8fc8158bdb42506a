"""Helpers shared by the agents: sending with delivery futures, acking on delivery."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from streams.clock import Clock
from streams.kafka.acks import AckHandle, OrderedAcker

logger = logging.getLogger(__name__)


async def send(topic: Any, *, key: bytes, value: bytes, headers: Any = None) -> asyncio.Future:
    """Send now (not attached to the current event) and return the delivery future."""
    return await topic.send(key=key, value=value, headers=headers, force=True)


def track(acker: OrderedAcker, event: Any) -> AckHandle:
    """Register a received event; it is acked once it and all before it are done."""
    return acker.track(event.message.tp, event)


def ack_when_delivered(fut: asyncio.Future, acker: OrderedAcker, handle: AckHandle) -> None:
    """Mark ``handle`` done once ``fut`` is delivered; a failed delivery never is.

    An event that is never acked holds back the partition's commit, so it is read
    again after a restart: nothing is lost, at worst processed twice.
    """

    def done(f: asyncio.Future) -> None:
        if f.cancelled() or f.exception() is not None:
            m = handle.token.message
            logger.error("delivery failed for %s[%s]@%s; it stays unacked: %r", m.topic,
                         m.partition, m.offset, None if f.cancelled() else f.exception())
            return
        acker.done(handle)

    fut.add_done_callback(done)


TURN_SECONDS = 0.002


class Turns:
    """Lets the worker's other stages run at least every ``quantum`` seconds of a loop
    over a fetch.

    The stages share one event loop, and a task that never suspends holds it: with
    the clean and batch loops yielding only every 100 records (~25 ms each), the
    faust compactor, which suspends between fragments, got one fragment per round
    and fell thousands of fragments behind until the input ran dry. A time quantum
    bounds that wait whatever a record costs.
    """

    def __init__(self, quantum: float = TURN_SECONDS, clock: Clock = time.perf_counter) -> None:
        self.quantum = quantum
        self.clock = clock
        self._since = clock()

    async def give(self) -> None:
        """Suspend once if this loop has held the event loop for a quantum."""
        if self.clock() - self._since >= self.quantum:
            await asyncio.sleep(0)
            self._since = self.clock()


def new_acker() -> OrderedAcker:
    return OrderedAcker(lambda event: event.ack())
