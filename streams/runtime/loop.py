"""The stage runtime on aiokafka: one loop runs any step.

Each loop is a consumer group of its own: ``getmany`` -> ``step.take`` -> sends in
record batches -> commit each partition's delivered prefix. A failed delivery, a
step that raises or says it cannot go on, or a commit held back too long ends the
membership: the loop leaves the group and joins again from the committed offsets, so
whatever was not delivered is read again (the report merge counts a record once).
On a rebalance the step delivers what it can before its partitions move, and loads
what arrives before anything of it is merged. ``drain`` is the bounded shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import ConsumerStoppedError

from streams.kafka.batching import BatchSender
from streams.kafka.connect import commit_owned, stage_consumer, stage_producer, stop_consumer
from streams.kafka.stall import StallDetector
from streams.metrics import Metrics
from streams.runtime.context import RunContext
from streams.runtime.step import Out, Step
from streams.settings import Settings

logger = logging.getLogger(__name__)

RESTART_SECONDS = 5.0  # after a failed membership, before the loop joins again
FETCH_RECORDS = 2000  # records per getmany


@dataclass
class Subscription:
    """What a loop reads and how its consumer is tuned."""

    topics: list[str] = field(default_factory=list)
    pattern: str | None = None  # a regex over topic names; topics created later join
    options: dict[str, Any] = field(default_factory=dict)  # aiokafka consumer options
    fetch_records: int = FETCH_RECORDS
    poll_ms: int = 500

    def describe(self) -> str:
        return self.pattern if self.pattern else ", ".join(self.topics)


class _Producer:
    """Queues outputs on an aiokafka producer: batches when plain, one by one with headers."""

    def __init__(self, producer: Any) -> None:
        self.producer = producer

    async def queue(self, outs: list[Out]) -> list[asyncio.Future[Any]]:
        plain = [(o.topic, o.key, o.value) for o in outs if not o.headers]
        futures = await BatchSender(self.producer).send(plain) if plain else []
        for o in outs:
            if o.headers:
                futures.append(await self.producer.send(o.topic, o.value, key=o.key,
                                                        headers=list(o.headers)))
        return futures


class _Consumer:
    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer

    def owned(self) -> set[Any]:
        return set(self.consumer.assignment())

    def seek(self, part: Any, offset: int) -> None:
        self.consumer.seek(part, offset)

    def partition_count(self, topic: str) -> int:
        return len(self.consumer.partitions_for_topic(topic) or ())


class _Listener(ConsumerRebalanceListener):
    """aiokafka awaits both callbacks before the rebalance goes on."""

    def __init__(self, loop: StageLoop) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.loop.revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.loop.assigned(set(assigned))


class StageLoop:
    """Runs one step in a consumer group of its own until drained."""

    def __init__(self, step: Step, settings: Settings, metrics: Metrics, *, group: str,
                 subscription: Subscription) -> None:
        self.step = step
        self.settings = settings
        self.metrics = metrics
        self.group = group
        self.subscription = subscription
        self.ctx: RunContext | None = None
        self._consumer: Any = None
        self._producer: Any = None
        self._stopping = False
        self._between_owners = False  # revoked, not yet told what is assigned
        self._owned: set[Any] = set()
        self._held: StallDetector | None = None

    @property
    def name(self) -> str:
        return self.step.name

    def assignment(self) -> set[TopicPartition]:
        """Partitions this loop owns now (for stall detection and the model quota)."""
        return set(self._consumer.assignment()) if self._consumer is not None else set()

    async def run(self) -> None:
        while not self._stopping:
            failed = await self._membership()
            if failed and not self._stopping:
                logger.error("%s: %s; rejoining from the committed offsets in %.0fs",
                             self.name, failed, RESTART_SECONDS)
                for topic in self._topics():  # its partitions are read again from the commit
                    self.metrics.offset_rereads.labels(topic).inc()
                await asyncio.sleep(RESTART_SECONDS)

    def _topics(self) -> list[str]:
        if self._consumer is not None and self._consumer.subscription():
            return sorted(self._consumer.subscription())
        return list(self.subscription.topics)

    async def _membership(self) -> str | None:
        """Join, consume until stopped (None) or failed (why), leave."""
        s = self.settings
        sub = self.subscription
        self._producer = stage_producer(s)
        self._consumer = stage_consumer(s, self.group, **sub.options)
        ctx = self.ctx = RunContext(_Producer(self._producer), _Consumer(self._consumer))
        self._owned, self._between_owners = set(), False
        held = max(self.step.held_seconds, 0.0)
        self._held = StallDetector(held) if held > 0 else None
        self.step.begin(ctx)
        tasks: list[asyncio.Task[None]] = []
        try:
            await self._producer.start()
            await self._consumer.start()
            if sub.pattern:
                self._consumer.subscribe(pattern=sub.pattern, listener=_Listener(self))
            else:
                self._consumer.subscribe(topics=sub.topics, listener=_Listener(self))
            logger.info("%s consuming %s as group %s", self.name, sub.describe(), self.group)
            tasks = [asyncio.create_task(c) for c in self.step.background(ctx)]
            return await self._consume(ctx)
        finally:
            for task in tasks:
                task.cancel()
            if not self._stopping:
                await self._close()

    async def _consume(self, ctx: RunContext) -> str | None:
        consumer = self._consumer
        sub = self.subscription
        while not self._stopping:
            why = ctx.failed or self.step.failure()
            if why is not None:
                return why
            try:
                fetched = await consumer.getmany(timeout_ms=sub.poll_ms,
                                                 max_records=sub.fetch_records)
            except ConsumerStoppedError:  # drain() stopped it
                return None
            if self._stopping:
                return None
            try:
                if fetched:
                    await self.step.take(fetched, ctx)
                await self.step.tick(ctx)
            except Exception as exc:  # a delivery that failed to queue, or a bug
                logger.exception("%s: handling a fetch failed", self.name)
                return f"handling a fetch failed: {exc!r}"
            if self._held_too_long(ctx):
                return "a record held its partition's commit back"
            await self.commit()
        return None

    def _held_too_long(self, ctx: RunContext) -> bool:
        """True when one record has held its partition's commit back for the step's
        ``held_seconds``: the partition is read again from its commit."""
        if self._held is None or self._between_owners:
            return False
        waiting = ctx.commits.oldest_pending()
        # a pending record is lag; its offset not moving is the commit held back
        self._held.observe(waiting, dict.fromkeys(waiting, 1))
        held = self._held.stalled()
        for tp in held:
            logger.warning("%s: a record has held the commit back for %.0fs; reading the "
                           "partition again from its commit", tp, self._held.stall_seconds)
        return bool(held)

    async def commit(self) -> None:
        if self.ctx is not None and self._consumer is not None:
            await commit_owned(self._consumer, self.ctx.ready())

    async def revoked(self, parts: set[Any]) -> None:
        ctx = self.ctx
        if ctx is None:
            return
        try:
            await self.step.revoked(parts, ctx)
        except Exception as exc:  # not committed: the next owner reads them again
            logger.warning("%s: delivering before a rebalance failed: %r", self.name, exc)
        finally:
            self._between_owners = True
        await self.commit()

    async def assigned(self, parts: set[Any]) -> None:
        ctx = self.ctx
        if ctx is None:
            return
        for part in self._owned - parts:  # moved away: none of its records is ours now
            ctx.commits.acker.forget(part)
        self._owned = set(parts)
        self._between_owners = False
        try:
            await self.step.assigned(parts, ctx)
        except Exception as exc:  # aiokafka would only log a callback's error
            logger.exception("%s: taking over partitions failed", self.name)
            ctx.fail(f"taking over partitions failed: {exc!r}")

    async def drain(self, timeout: float) -> None:
        """On shutdown: stop fetching, let the step finish and the deliveries land (up to
        ``timeout`` seconds), commit what is done, leave the group."""
        self._stopping = True
        ctx = self.ctx
        if self._consumer is None or ctx is None:
            return

        async def finish() -> None:
            await self.step.drain(ctx)
            await ctx.delivered()

        try:
            await asyncio.wait_for(finish(), timeout=timeout)
        except TimeoutError:
            logger.warning("shutdown: %s: %d record(s) not done within %.0fs; not committed, "
                           "the partitions' next owner reads them again", self.name,
                           ctx.commits.acker.waiting(), timeout)
        except Exception as exc:  # a failed delivery: its records stay uncommitted
            logger.warning("shutdown: %s: finishing failed: %r", self.name, exc)
        await self.commit()
        await self._close()

    async def _close(self) -> None:
        if self._consumer is not None:
            await stop_consumer(self._consumer)
        if self._producer is not None:
            await self._producer.stop()

