"""Create the pipeline's topics with explicit partition counts and configs.

Run by ``retro worker`` and ``retro produce`` before they start, so a fresh cluster
needs no manual set-up; an existing topic is left as it is (partitions are only ever
raised by an operator, since that reshuffles keys).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streams.kafka.connect import aiokafka_kwargs
from streams.settings import Settings

logger = logging.getLogger(__name__)

LONG_RETENTION_MS = 30 * 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def topic_specs(settings: Settings) -> list[TopicSpec]:
    t = settings.topics
    data = {"retention.ms": str(t.retention_ms)}
    keep = {"retention.ms": str(LONG_RETENTION_MS)}
    return [
        # only the topic `retro produce` writes to; other inputs belong to their owners
        TopicSpec(t.produce_topic, t.partitions, data),
        TopicSpec(t.fast, t.partitions, data),
        TopicSpec(t.slow, t.partitions, data),
        TopicSpec(t.deadletter, t.partitions, keep),
        TopicSpec(t.fragments, t.partitions, data),
        TopicSpec(t.traces, t.partitions, data),
        TopicSpec(t.review, t.partitions, keep),
        # latest report per key survives forever: the topic is the report store
        TopicSpec(t.reports, t.partitions, {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": "0.1",
            "segment.ms": str(3600 * 1000),
            "max.message.bytes": str(settings.kafka.max_message_bytes),
        }),
        # per report, what was notified of its incidents: the notifier's state, kept
        TopicSpec(t.notifications, t.partitions, {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": "0.1",
            "segment.ms": str(3600 * 1000),
        }),
    ]


# how long a start-up waits for the cluster to stop pointing at a broker that just died
ENSURE_RETRY_SECONDS = 15.0


async def ensure_topics(settings: Settings) -> list[str]:
    """Create missing topics; returns the names created. A retriable error (e.g. the
    admin request went to a broker that died and is still in the metadata) is retried
    with a fresh client for a while, so a worker or producer starts while one broker
    is down."""
    from aiokafka.errors import KafkaError

    deadline = time.monotonic() + ENSURE_RETRY_SECONDS
    while True:
        try:
            return await _ensure_topics(settings)
        except KafkaError as exc:
            if not getattr(exc, "retriable", False) or time.monotonic() > deadline:
                raise
            logger.info("creating topics: %r; retrying", exc)
            await asyncio.sleep(1.0)


async def _ensure_topics(settings: Settings) -> list[str]:
    admin = AIOKafkaAdminClient(**aiokafka_kwargs(settings))
    try:  # close even when start() fails, or asyncio warns about an unclosed client
        await admin.start()
        existing = set(await admin.list_topics())
        missing = [s for s in topic_specs(settings) if s.name not in existing]
        if not missing:
            return []
        new = [NewTopic(s.name, s.partitions, settings.topics.replication, topic_configs=s.config)
               for s in missing]
        try:
            response = await admin.create_topics(new)
        except TopicAlreadyExistsError:
            return []
        for name, code, message in _errors(response):
            if code not in (0, 36):  # 36: already exists (a racing worker made it)
                logger.error("creating topic %s failed: %s (%s)", name, message, code)
        created = [s.name for s in missing]
        logger.info("created topics %s", ", ".join(created))
        return created
    finally:
        await admin.close()


def _errors(response: object) -> list[tuple[str, int, str | None]]:
    out = []
    for item in getattr(response, "topic_errors", []):
        name, code, *rest = item
        out.append((name, code, rest[0] if rest else None))
    return out


async def ensure_group_offsets(settings: Settings, group: str, topics: list[str]) -> int:
    """Give every partition of ``topics`` a committed offset for ``group``: its log start.

    Delivery does not need it: a stage consumer without a committed offset starts at
    the earliest one (``stage_consumer``). The lag monitor does: it counts a partition
    without a commit from offset 0 (``lag_from_offsets``), so on a partition whose
    first records retention has deleted, a group with nothing left to read there, which
    therefore never commits, would show lag that never shrinks, and the stall detector
    would call the partition stalled. Done before the worker joins: an offset commit
    from outside the group only works while the group is empty, so when workers are
    already running (and so have committed) this is a no-op. Returns the number of
    partitions initialised.
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.errors import KafkaError

    from streams.kafka.connect import partition_leaders, stop_consumer

    admin = AIOKafkaAdminClient(**aiokafka_kwargs(settings))
    consumer = AIOKafkaConsumer(**aiokafka_kwargs(settings), group_id=group,
                                enable_auto_commit=False)
    try:
        await admin.start()
        await consumer.start()
        committed = None
        for attempt in range(30):  # a fresh cluster creates __consumer_offsets on first use
            try:
                committed = await admin.list_consumer_group_offsets(group)
                break
            except KafkaError as exc:
                if not getattr(exc, "retriable", False) or attempt == 29:
                    logger.warning("cannot read offsets of group %s (%r); leaving them "
                                   "unset", group, exc)
                    return 0
                await asyncio.sleep(1.0)
        assert committed is not None
        tps = [TopicPartition(*tp) for tp in sorted(await partition_leaders(admin, topics))]
        missing = [tp for tp in tps if tp not in committed or committed[tp].offset < 0]
        if not missing:
            return 0
        beginning = await consumer.beginning_offsets(missing)
        consumer.assign(missing)
        try:
            await consumer.commit({tp: beginning[tp] for tp in missing})
        except KafkaError as exc:  # the group is active: its members commit for it
            logger.info("group %s is active; not initialising offsets (%r)", group, exc)
            return 0
        logger.info("initialised offsets of group %s on %d partitions", group, len(missing))
        return len(missing)
    finally:
        await stop_consumer(consumer)
        await admin.close()
