"""What the stage loops share: taking turns on the event loop, rejoining after a failure."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from streams.clock import Clock
from streams.kafka.connect import stage_producer, stop_consumer
from streams.metrics import Metrics
from streams.settings import Settings

logger = logging.getLogger(__name__)


TURN_SECONDS = 0.002


class Turns:
    """Lets the worker's other stages run at least every ``quantum`` seconds of a loop
    over a fetch.

    The stages share one event loop, and a task that never suspends holds it: with
    the clean and batch loops yielding only every 100 records (~25 ms each), a stage
    that suspends between records got one record per round and fell thousands of
    records behind until the input ran dry. A time quantum bounds that wait whatever
    a record costs.
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


RESTART_SECONDS = 5.0  # after a failed publication, before a loop reads its commits again


class RejoiningLoop:
    """A stage loop with a consumer group of its own that, when what it produced could
    not be delivered, leaves the group and joins again from its committed offsets, so
    the records whose output never reached the broker are read again.

    A subclass builds its consumer (``_new_consumer``), resets its state and starts its
    helper tasks (``_begin``), and consumes until stopped (True) or failed (False).
    """

    name = "loop"

    def __init__(self, settings: Settings, group: str, metrics: Metrics) -> None:
        self.settings = settings
        self.group = group
        self.metrics = metrics
        self._consumer: Any = None
        self._producer: Any = None
        self._stopping = False

    def assignment(self) -> set[Any]:
        """Partitions this loop owns now (for stall detection)."""
        return set(self._consumer.assignment()) if self._consumer is not None else set()

    def _new_consumer(self) -> Any:
        raise NotImplementedError

    def _begin(self) -> list[asyncio.Task[Any]]:
        """Reset per-membership state; the helper tasks to cancel when it ends."""
        return []

    async def _consume(self) -> bool:
        raise NotImplementedError

    async def run(self) -> None:
        while not self._stopping:
            self._producer = stage_producer(self.settings)
            self._consumer = self._new_consumer()
            topics = sorted(self._consumer.subscription())
            tasks = self._begin()
            failed = False
            try:
                await self._producer.start()
                await self._consumer.start()
                logger.info("%s consuming %s as group %s", self.name, ", ".join(topics),
                            self.group)
                failed = not await self._consume()
            finally:
                for task in tasks:
                    task.cancel()
                if not self._stopping:
                    await self._close()
            if failed and not self._stopping:
                # the failure logged its own reason (an undelivered output, reports
                # that did not load, a commit held back)
                logger.error("%s: rejoining from the committed offsets in %.0fs", self.name,
                             RESTART_SECONDS)
                for topic in topics:  # its partitions are read again from the commit
                    self.metrics.offset_rereads.labels(topic).inc()
                await asyncio.sleep(RESTART_SECONDS)

    async def _close(self) -> None:
        if self._consumer is not None:
            await stop_consumer(self._consumer)
        if self._producer is not None:
            await self._producer.stop()
