"""Re-driving parked records: review -> raw records again -> cleaned -> lanes.

A review with a transient reason (``streams/gateway/reasons.py``) parked records the
provider could not answer then. The worker consumes ``retro.review`` in a consumer
group of its own (``<group>-review``), so each review partition, and so each review,
is re-driven by one worker at a time. For a transient review it waits until a probe
shows the provider answers (``RedriveGate``: exponential backoff between probes),
reads the review's records again from the raw topic by their coordinates, cleans them
with the Cleaner and sends them to their lane, at a bounded rate. The review's offset
is committed only once those records are on the lanes, so a crash re-drives a review
again rather than dropping it (the merge counts a record once). The re-analysed
records land in reports, and the audit counts them as analysed, no longer parked.

``retro review --redrive`` uses ``redrive_coverage`` to send chosen parked records,
of any reason, on demand.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from streams.agents.clean import route
from streams.clean.cleaner import Cleaner
from streams.gateway.redrive import RedriveGate, redrive_fetch
from streams.intervals import Coverage, split_message_key
from streams.kafka.connect import (
    aiokafka_kwargs,
    commit_owned,
    stage_consumer,
    stage_producer,
    stop_consumer,
)
from streams.metrics import Metrics
from streams.records import NormalizedRecord, Review
from streams.settings import Settings

logger = logging.getLogger(__name__)

FETCH_REVIEWS = 50  # reviews per getmany: one commit per fetch
RAW_FETCH_TIMEOUT_MS = 2000


def review_group(worker_group: str) -> str:
    """The consumer group of the re-drive loop."""
    return f"{worker_group}-review"


def wire_redrive(app: Any, settings: Settings, metrics: Metrics, gateways: Any) -> None:
    """Run the re-drive loop as a task of the worker (batch role); the call app.py makes."""
    if not settings.review.redrive:
        return
    r = settings.review
    gate = RedriveGate(
        gateways.probe(timeout_seconds=settings.fast.timeout_seconds),
        backoff_base=r.backoff_base_seconds, backoff_max=r.backoff_max_seconds,
        records_per_second=r.records_per_second)
    loop = RedriveLoop(settings, Cleaner.from_settings(settings), metrics, gate,
                       group=review_group(app.conf.id))

    @app.task
    async def redrive_loop() -> None:
        await loop.run()


def raw_consumer(settings: Settings) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(**aiokafka_kwargs(settings), group_id=None,
                            enable_auto_commit=False, auto_offset_reset="earliest")


async def fetch_raw(consumer: AIOKafkaConsumer, covered: Coverage) -> list[ConsumerRecord]:
    """The raw messages at ``covered`` (``topic/partition`` -> offset ranges), in order;
    a message carrying many records (``topic/partition@offset:count``) is read whole.

    Offsets no longer on the topic (retention) are skipped with a warning.
    """
    out: list[ConsumerRecord] = []
    messages: dict[str, list[list[int]]] = {}
    for key, ranges in covered.to_json().items():
        split = split_message_key(key)
        if split is None:
            messages.setdefault(key, []).extend(ranges)
        else:
            messages.setdefault(split[0], []).append([split[1], split[1]])
    for part, ranges in Coverage.from_json(messages).to_json().items():
        topic, _, partition = part.rpartition("/")
        tp = TopicPartition(topic, int(partition))
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
                messages = batch.get(tp, [])
                if not messages:
                    logger.warning("%s[%s]: offsets %s-%s could not be read again; skipped",
                                   topic, partition, position, last)
                    break
                out.extend(m for m in messages if first <= m.offset <= last)
                position = messages[-1].offset + 1
    return out


async def send_to_lanes(cleaner: Cleaner, producer: AIOKafkaProducer, settings: Settings,
                        messages: Iterable[ConsumerRecord], *, wanted: Coverage | None = None
                        ) -> tuple[list[Any], int]:
    """Clean ``messages`` again and send their records in ``wanted`` (all when None) to
    their lanes: (delivery futures, records).

    A record that now cleans into a dead letter is not sent: it was analysable once,
    and a dead letter beside its review would count it twice.
    """
    lanes = {"fast": settings.topics.fast, "slow": settings.topics.slow}
    futures: list[Any] = []
    wanted_parts = wanted.parts() if wanted is not None else None
    for m in messages:
        for routed in route(cleaner, value=m.value, key=m.key, topic=m.topic,
                            partition=m.partition, offset=m.offset, timestamp_ms=m.timestamp):
            if routed.lane not in lanes:
                logger.warning("%s[%s]@%s now cleans into a dead letter; left in review",
                               m.topic, m.partition, m.offset)
                continue
            if wanted_parts is not None:
                key, value = NormalizedRecord.model_validate_json(routed.value).raw.ledger_entry()
                if value not in wanted_parts.get(key, ()):
                    continue  # another record of a message carrying many
            futures.append(await producer.send(lanes[routed.lane], routed.value,
                                               key=routed.key))
    return futures, len(futures)


async def redrive_coverage(settings: Settings, covered: Coverage, *,
                           cleaner: Cleaner | None = None) -> int:
    """Send the raw records at ``covered`` to the lanes again; the records sent."""
    cleaner = cleaner or Cleaner.from_settings(settings)
    consumer = raw_consumer(settings)
    producer = stage_producer(settings)
    try:
        await consumer.start()
        await producer.start()
        messages = await fetch_raw(consumer, covered)
        futures, sent = await send_to_lanes(cleaner, producer, settings, messages,
                                            wanted=covered)
        await asyncio.gather(*futures)
        return sent
    finally:
        await stop_consumer(consumer)
        await producer.stop()


class RedriveLoop:
    """Consumes the review topic as a group; re-drives transient reviews once healthy."""

    def __init__(self, settings: Settings, cleaner: Cleaner, metrics: Metrics,
                 gate: RedriveGate, *, group: str) -> None:
        self.settings = settings
        self.cleaner = cleaner
        self.metrics = metrics
        self.gate = gate
        self.group = group

    async def run(self) -> None:
        s = self.settings
        # a backoff wait happens between two getmany calls: keep the group membership
        poll_ms = int((s.review.backoff_max_seconds + 120) * 1000)
        reviews = stage_consumer(
            s, self.group, s.topics.review,
            max_poll_interval_ms=max(300_000, poll_ms))
        raw = raw_consumer(s)
        producer = stage_producer(s)
        try:
            await producer.start()
            await raw.start()
            await reviews.start()
            logger.info("re-drive loop consuming %s as group %s", s.topics.review, self.group)
            while True:
                fetched = await reviews.getmany(timeout_ms=1000, max_records=FETCH_REVIEWS)
                if fetched:
                    await self.handle(reviews, raw, producer, fetched)
        finally:
            await stop_consumer(reviews)
            await stop_consumer(raw)
            await producer.stop()

    async def handle(self, reviews: AIOKafkaConsumer, raw: AIOKafkaConsumer,
                     producer: AIOKafkaProducer,
                     fetched: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Re-drive what the fetch holds; commit each partition up to what is on the lanes.

        When the provider does not answer the probe, the rest of the fetch is sought
        back and read again after the backoff.
        """
        futures: list[Any] = []

        async def redrive(review: Review) -> int:
            return await self._redrive(review, raw, producer, futures)

        outcome = await redrive_fetch(fetched, self.gate, redrive)
        if outcome.blocked:
            self.metrics.redrive_probes_failed.inc()
        done = outcome.done
        for tp, messages in fetched.items():  # what is not done is read again
            if tp in reviews.assignment():
                reviews.seek(tp, done.get(tp, messages[0].offset))
        try:
            await asyncio.gather(*futures)
        except KafkaError as exc:
            logger.error("re-driven records were not delivered (%r); their reviews are read "
                         "again", exc)
            for tp, messages in fetched.items():
                if tp in reviews.assignment():
                    reviews.seek(tp, messages[0].offset)
            return
        await commit_owned(reviews, done)

    async def _redrive(self, review: Review, raw: AIOKafkaConsumer,
                       producer: AIOKafkaProducer, futures: list[Any]) -> int:
        covered = Coverage.from_json(review.covered)
        messages = await fetch_raw(raw, covered)
        sent_futures, sent = await send_to_lanes(self.cleaner, producer, self.settings,
                                                 messages, wanted=covered)
        futures.extend(sent_futures)
        self.metrics.redriven_records.labels(review.reason).inc(sent)
        logger.info("re-driving review %s (%s, %s lane): %d records back to the lanes",
                    review.id, review.reason, review.lane, sent)
        return sent
