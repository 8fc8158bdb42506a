"""Helpers shared by the agents: sending with delivery futures, acking on delivery."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger(__name__)


async def send(topic: Any, *, key: bytes, value: bytes, headers: Any = None) -> asyncio.Future:
    """Send now (not attached to the current event) and return the delivery future."""
    return await topic.send(key=key, value=value, headers=headers, force=True)


def ack_when_delivered(fut: asyncio.Future, event: Any) -> None:
    """Ack ``event`` once ``fut`` is delivered; a failed delivery leaves it unacked.

    faust commits only the offsets below the first unacked one, so an unacked record
    is read again after a restart: nothing is lost, at worst processed twice.
    """

    def done(f: asyncio.Future) -> None:
        if f.cancelled() or f.exception() is not None:
            logger.error("delivery failed for %s[%s]@%s; it stays unacked: %r",
                         event.message.topic, event.message.partition, event.message.offset,
                         None if f.cancelled() else f.exception())
            return
        event.ack()

    fut.add_done_callback(done)
