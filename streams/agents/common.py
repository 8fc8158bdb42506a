"""Helpers shared by the agents: sending with delivery futures, acking on delivery."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

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


def new_acker() -> OrderedAcker:
    return OrderedAcker(lambda event: event.ack())
