"""The clean stage: raw bytes in, a normalized record (or a dead letter) out.

A plain aiokafka loop inside the worker (its own consumer group, ``<group>-raw``):
``getmany``, clean, batched sends, commit once the whole fetch is delivered, so an
offset is committed only after what was produced for it is on the broker.
``route`` is where a record goes; re-drive routes the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from streams.agents.common import Turns
from streams.clean.cleaner import Cleaner
from streams.ingest.keys import source_of_key
from streams.kafka.batching import BatchSender
from streams.kafka.connect import (
    commit_owned,
    stage_consumer,
    stage_producer,
    stop_consumer,
)
from streams.kafka.inputs import input_pattern
from streams.metrics import Metrics
from streams.records import DeadLetter, RawCoord
from streams.settings import Settings

logger = logging.getLogger(__name__)

FETCH_RECORDS = 2000  # records per getmany: one commit per fetch
RETRY_SECONDS = 5.0  # after a failed delivery, before the fetch is read again


@dataclass(frozen=True)
class Routed:
    lane: str  # fast | slow | deadletter
    key: bytes
    value: bytes
    reason: str | None = None  # a dead letter's reason code


def route(cleaner: Cleaner, *, value: bytes | None, key: bytes | None, topic: str,
          partition: int, offset: int, timestamp_ms: int | None) -> list[Routed]:
    """Where the log records of one raw message go, and as what (one per record: an
    envelope may carry many); never raises on bad input."""
    coord = RawCoord(topic=topic, partition=partition, offset=offset)
    source = source_of_key(key)
    received = datetime.fromtimestamp(timestamp_ms / 1000, UTC) if timestamp_ms else None
    routed = []
    for out in cleaner.clean(value or b"", coord, source, received_at=received):
        if isinstance(out, DeadLetter):
            routed.append(Routed("deadletter", out.id.encode(), out.model_dump_json().encode(),
                                 reason=out.reason))
        else:  # the raw key keeps --spread partitioning in the lanes; redacted, as the
            # key is read by every reader of the lanes (a DSN as --source carried its password)
            routed.append(Routed(out.lane, cleaner.lane_key(key) if key else out.source.encode(),
                                 out.model_dump_json().encode()))
    return routed


def wire_clean(app: Any, settings: Settings, metrics: Metrics) -> CleanLoop:
    """The clean loop, run as a task of the worker."""
    loop = CleanLoop(settings, Cleaner.from_settings(settings, metrics=metrics), metrics,
                     group=clean_group(app.conf.id))

    @app.task
    async def clean_loop() -> None:
        await loop.run()

    return loop


class RouteCounters:
    """Routed records and dead letters, counted once their message is on the broker.

    Counting when a record is cleaned counted every attempt: a fetch read again after
    a failed delivery showed more dead letters than the topic held.
    """

    def __init__(self, metrics: Metrics, lanes: Iterable[str]) -> None:
        self.records_out = {lane: metrics.records_out.labels(lane) for lane in lanes}
        self.deadletters = metrics.deadletters

    def delivered_all(self, routed: Iterable[Routed]) -> None:
        """A whole fetch delivered: one increment per lane and reason."""
        lanes: dict[str, int] = {}
        reasons: dict[str, int] = {}
        for r in routed:
            lanes[r.lane] = lanes.get(r.lane, 0) + 1
            if r.reason is not None:
                reasons[r.reason] = reasons.get(r.reason, 0) + 1
        for lane, n in lanes.items():
            self.records_out[lane].inc(n)
        for reason, n in reasons.items():
            self.deadletters.labels(stage="clean", reason=reason).inc(n)


def clean_group(worker_group: str) -> str:
    """The consumer group of the clean loop."""
    return f"{worker_group}-raw"


class CleanLoop:
    """The clean stage on aiokafka: fetch, clean, send in batches, commit after delivery.

    A failed delivery commits nothing: the fetch is read again after RETRY_SECONDS. A
    commit refused by a rebalance is logged: the partition's new owner re-reads what
    was not committed (the lanes may then hold a record twice; coverage-based merging
    counts it once).
    """

    def __init__(self, settings: Settings, cleaner: Cleaner, metrics: Metrics, *,
                 group: str) -> None:
        self.settings = settings
        self.cleaner = cleaner
        self.group = group
        t = settings.topics
        self.targets = {"fast": t.fast, "slow": t.slow, "deadletter": t.deadletter}
        self.records_in = metrics.records_in.labels("clean")
        self.counters = RouteCounters(metrics, self.targets)
        self.turns = Turns()

    async def run(self) -> None:
        s = self.settings
        consumer = stage_consumer(
            s, self.group,
            max_partition_fetch_bytes=max(1024 * 1024, s.clean.max_record_bytes * 4),
            # a topic created later that matches the pattern joins within this long
            metadata_max_age_ms=30_000 if s.topics.raw_pattern else 300_000)
        producer = stage_producer(s)
        await producer.start()
        try:
            await consumer.start()
            if s.topics.raw_pattern:  # topics created later join at the next metadata refresh
                consumer.subscribe(pattern=input_pattern(s))
            else:
                consumer.subscribe(topics=s.topics.raw_topics)
            logger.info("clean loop consuming %s as group %s",
                        input_pattern(s) if s.topics.raw_pattern else s.topics.raw, self.group)
            while True:
                fetched = await consumer.getmany(timeout_ms=500, max_records=FETCH_RECORDS)
                if fetched:
                    await self._handle(consumer, producer, fetched)
        finally:
            await stop_consumer(consumer)
            await producer.stop()

    async def _handle(self, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer,
                      fetched: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        sent: list[Routed] = []
        for messages in fetched.values():
            self.records_in.inc(len(messages))
            for m in messages:
                sent += route(self.cleaner, value=m.value, key=m.key, topic=m.topic,
                              partition=m.partition, offset=m.offset, timestamp_ms=m.timestamp)
                await self.turns.give()
        try:
            # KafkaError also when queueing: no metadata while the broker is away
            await asyncio.gather(*await BatchSender(producer).send(
                (self.targets[r.lane], r.key, r.value) for r in sent))
        except KafkaError as exc:
            logger.error("delivering cleaned records failed (%r); nothing committed, "
                         "reading the fetch again in %.0fs", exc, RETRY_SECONDS)
            await asyncio.sleep(RETRY_SECONDS)
            for tp, messages in fetched.items():
                if tp in consumer.assignment():
                    consumer.seek(tp, messages[0].offset)
            return
        self.counters.delivered_all(sent)
        await commit_owned(consumer, {tp: messages[-1].offset + 1
                                      for tp, messages in fetched.items()})
