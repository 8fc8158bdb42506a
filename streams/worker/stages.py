"""Each stage's step on the stage runtime: its consumer group, its topics, its readers.

Every loop is a consumer group of its own (``<group>-raw``, ``-lanes``, ``-review``,
``-fragments``), so each stage scales by partitions and workers in that group. This
is the only place that knows which Kafka reader a step is given.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from streams.batch.step import LaneStep, OnAssignment
from streams.clean.cleaner import Cleaner
from streams.clean.step import CleanStep
from streams.gateway.gateway import Gateway
from streams.intervals import Coverage, split_message_key
from streams.kafka.connect import (
    QUIET_FETCH_WAIT_MS,
    aiokafka_kwargs,
    partitions_of,
    stage_producer,
    stop_consumer,
)
from streams.kafka.inputs import input_pattern
from streams.metrics import Metrics
from streams.records import Review
from streams.report.compactor.step import CompactStep
from streams.report.ops.redrive import (
    RedriveGate,
    RedriveStep,
    from_lanes,
    lane_coverage,
    to_lanes,
)
from streams.report.state.keys import record_place
from streams.report.store import read_messages, readable_partitions, refusals_raised
from streams.runtime.loop import StageLoop, Subscription
from streams.runtime.step import Message
from streams.settings import Settings
from streams.tokens import TokenCounter

logger = logging.getLogger(__name__)

FETCH_REVIEWS = 50  # reviews per getmany: one commit per fetch
RAW_FETCH_TIMEOUT_MS = 2000


def clean_group(worker_group: str) -> str:
    return f"{worker_group}-raw"


def lanes_group(worker_group: str) -> str:
    return f"{worker_group}-lanes"


def review_group(worker_group: str) -> str:
    return f"{worker_group}-review"


def fragments_group(worker_group: str) -> str:
    return f"{worker_group}-fragments"


RAW_FETCH_BYTES = 4 * 1024 * 1024  # per raw partition: ~13k records of 300 bytes


def clean_loop(settings: Settings, metrics: Metrics, worker_group: str) -> StageLoop:
    """Raw input topics -> clean -> the lanes or the dead letter."""
    s = settings
    step = CleanStep(s, Cleaner.from_settings(s, metrics=metrics), metrics)
    # aiokafka fetches a partition again only once its buffer is empty: a fetch that holds
    # seconds of work keeps a worker left with one partition from waiting on each one
    options = {"max_partition_fetch_bytes": max(RAW_FETCH_BYTES, s.clean.max_record_bytes * 4),
               # a topic created later that matches the pattern joins within this long
               "metadata_max_age_ms": 30_000 if s.topics.raw_pattern else 300_000}
    if s.topics.raw_pattern:
        subscription = Subscription(pattern=input_pattern(s), options=options)
    else:
        subscription = Subscription(topics=s.topics.raw_topics, options=options)
    return StageLoop(step, s, metrics, group=clean_group(worker_group),
                     subscription=subscription)


def lanes_loop(settings: Settings, metrics: Metrics, worker_group: str,
               gateways: dict[str, Gateway], counter: TokenCounter, *,
               on_assignment: OnAssignment | None = None) -> StageLoop:
    """Both lanes -> token-budget batches -> the model -> fragments | review."""
    s = settings
    place = functools.partial(record_place, window=s.report.window,
                              group_by=s.report.group_by, shards=s.report.shards)
    step = LaneStep(s, metrics, gateways, counter, place, on_assignment=on_assignment)
    # records wait in windows and on the model between fetches
    options = {"max_poll_interval_ms": int(max(300.0, 4 * s.slow.timeout_seconds) * 1000)}
    return StageLoop(step, s, metrics, group=lanes_group(worker_group),
                     subscription=Subscription(topics=[s.topics.fast, s.topics.slow],
                                               options=options))


def redrive_loop(settings: Settings, metrics: Metrics, worker_group: str,
                 gateways: Any) -> StageLoop:
    """Transient reviews -> their lane messages again, by offset -> the lanes."""
    s = settings
    r = s.review
    gate = RedriveGate(
        gateways.probe(timeout_seconds=s.fast.timeout_seconds),
        backoff_base=r.backoff_base_seconds, backoff_max=r.backoff_max_seconds,
        records_per_second=r.records_per_second)
    step = RedriveStep(s, metrics, gate, LaneReader(s))
    # a backoff wait happens between two getmany calls: keep the group membership
    poll_ms = int((r.backoff_max_seconds + 120) * 1000)
    return StageLoop(step, s, metrics, group=review_group(worker_group),
                     subscription=Subscription(
                         topics=[s.topics.review], fetch_records=FETCH_REVIEWS, poll_ms=1000,
                         options={"max_poll_interval_ms": max(300_000, poll_ms),
                                  "fetch_max_wait_ms": QUIET_FETCH_WAIT_MS}))


def compact_loop(settings: Settings, metrics: Metrics, worker_group: str, *,
                 gateway: Gateway | None = None) -> StageLoop:
    """Fragments -> merged into the reports loaded from the compacted topic -> reports;
    ``gateway`` writes the incidents' roll-ups when RETRO_REPORT__ROLLUP_SECONDS is set."""
    s = settings
    step = CompactStep(s, metrics, ReportsReader(s), gateway=gateway)
    options = {"max_partition_fetch_bytes": max(1024 * 1024, s.kafka.max_message_bytes),
               "fetch_max_wait_ms": QUIET_FETCH_WAIT_MS}
    return StageLoop(step, s, metrics, group=fragments_group(worker_group),
                     subscription=Subscription(topics=[s.topics.fragments], options=options))


def raw_consumer(settings: Settings) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(**aiokafka_kwargs(settings), group_id=None,
                            enable_auto_commit=False, auto_offset_reset="earliest")


class RawReader:
    """Reads raw messages again by coordinates (a consumer outside any group, started
    at first use)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None

    async def read(self, covered: Coverage) -> list[Message]:
        if self._consumer is None:
            consumer = raw_consumer(self.settings)
            await consumer.start()
            self._consumer = consumer
        return await fetch_raw(self._consumer, covered)


class LaneReader(RawReader):
    """Reads lane messages again by their coordinates, for the re-drive: the lanes hold
    the cleaner's redacted output, so reading them needs no access to the raw topic."""

    async def close(self) -> None:
        if self._consumer is not None:
            await stop_consumer(self._consumer)
            self._consumer = None


async def fetch_raw(consumer: AIOKafkaConsumer, covered: Coverage) -> list[Message]:
    """The raw messages at ``covered`` (``topic/partition`` -> offset ranges), in order;
    a message carrying many records (``topic/partition@offset:count``) is read whole.

    Offsets no longer on the topic (retention) are skipped with a warning; a topic
    this user may not read raises NotAuthorized.
    """
    out: list[Message] = []
    messages: dict[str, list[list[int]]] = {}
    for key, ranges in covered.to_json().items():
        split = split_message_key(key)
        if split is None:
            messages.setdefault(key, []).extend(ranges)
        else:
            messages.setdefault(split[0], []).append([split[1], split[1]])
    allowed: dict[str, list[int]] = {}
    for part, ranges in Coverage.from_json(messages).to_json().items():
        topic, _, partition = part.rpartition("/")
        if topic not in allowed:  # a refused topic would only time out below
            allowed[topic] = await readable_partitions(consumer, topic)
        if int(partition) not in allowed[topic]:
            logger.warning("%s[%s] does not exist; offsets %s could not be read again",
                           topic, partition, ranges)
            continue
        with refusals_raised(topic):
            out.extend(await _read_ranges(consumer, TopicPartition(topic, int(partition)),
                                          ranges))
    return out


async def _read_ranges(consumer: AIOKafkaConsumer, tp: TopicPartition,
                       ranges: list[list[int]]) -> list[Message]:
    """The messages of one partition at inclusive offset ``ranges``, in order."""
    out: list[Message] = []
    consumer.assign([tp])
    end = (await consumer.end_offsets([tp]))[tp]
    for first, last in ranges:
        last = min(last, end - 1)
        if first > last:
            continue
        consumer.seek(tp, first)
        position = first
        while position <= last:
            batch = await consumer.getmany(tp, timeout_ms=RAW_FETCH_TIMEOUT_MS)
            fetched = batch.get(tp, [])
            if not fetched:
                logger.warning("%s[%s]: offsets %s-%s could not be read again; skipped",
                               tp.topic, tp.partition, position, last)
                break
            out.extend(m for m in fetched if first <= m.offset <= last)
            position = fetched[-1].offset + 1
    return out


async def redrive_coverage(settings: Settings, covered: Coverage, *,
                           cleaner: Cleaner | None = None) -> int:
    """Send the raw records at ``covered`` to the lanes again, cleaned again (``retro
    review --redrive`` for reviews without lane coordinates); the records sent."""
    cleaner = cleaner or Cleaner.from_settings(settings)
    lanes = {"fast": settings.topics.fast, "slow": settings.topics.slow}
    reader = RawReader(settings)
    try:
        messages = await reader.read(covered)
    finally:
        await reader.close()
    return await _produce(settings, to_lanes(cleaner, lanes, messages, wanted=covered))


async def redrive_reviews(settings: Settings, parked: list[tuple[Review, Coverage]]
                          ) -> tuple[int, Coverage]:
    """Send the ``parked`` records of each review to the lanes again (``retro review
    --redrive``), read back from the lanes at the review's lane coordinates; (the
    records sent, the parked records of the reviews without lane coordinates, which
    only the raw topic holds)."""
    lanes = [settings.topics.fast, settings.topics.slow]
    where, wanted, unplaced = Coverage(), Coverage(), Coverage()
    for review, records in parked:
        at = lane_coverage(review, lanes)
        if at is None:
            unplaced = unplaced.union(records)
        else:
            where, wanted = where.union(at), wanted.union(records)
    if not wanted:
        return 0, unplaced
    reader = LaneReader(settings)
    try:
        outs, foreign = from_lanes(await reader.read(where), wanted, lanes)
    finally:
        await reader.close()
    if foreign or len(outs) < len(wanted):
        logger.warning("%d parked records are no longer on the lanes and stay parked; %d "
                       "lane messages at their coordinates were none of them",
                       len(wanted) - len(outs), foreign)
    return await _produce(settings, outs), unplaced


async def _produce(settings: Settings, outs: list[Any]) -> int:
    """Send ``outs`` and wait until every one is on the broker; how many."""
    if not outs:
        return 0
    producer = stage_producer(settings)
    try:
        await producer.start()
        await asyncio.gather(*[await producer.send(o.topic, o.value, key=o.key) for o in outs])
        return len(outs)
    finally:
        await producer.stop()


class ReportsReader:
    """The latest version of each report whose key belongs to given partitions of the
    fragments topic, read from the compacted reports topic."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def read(self, partitions: set[int]) -> list[tuple[str, bytes | None, int]]:
        s = self.settings
        probe = raw_consumer(s)
        try:
            await probe.start()
            fragments_partitions = await partitions_of(probe, s.topics.fragments)
            count = len(await partitions_of(probe, s.topics.reports))
        finally:
            await stop_consumer(probe)
        # alike partition counts put a key on the same partition of both topics
        to_read = partitions if count == len(fragments_partitions) else None
        partitioner = DefaultPartitioner()
        latest: dict[str, tuple[bytes | None, int]] = {}
        async for m in read_messages(s, s.topics.reports, to_read):
            if m.key is None:
                continue
            home = partitioner(m.key, fragments_partitions, fragments_partitions)
            if home in partitions:
                latest[m.key.decode()] = (m.value, home)
        return [(key, value, home) for key, (value, home) in latest.items()]
