"""The clean stage: raw bytes in, a normalized record (or a dead letter) out.

Two ways to run it, chosen by ``RETRO_CLEAN__ENGINE``:

- ``faust``: a faust agent, one event at a time, acked when its output is delivered.
- ``aiokafka``: a plain aiokafka loop inside the worker (its own consumer group,
  ``<group>-raw``): ``getmany``, clean, batched sends, commit once the whole fetch is
  delivered. faust's per-event path cost most of the clean stage's CPU (README,
  "faust or aiokafka on the hot path"); this loop skips it.

Both route a record the same way (``route``), and both commit an offset only after
what was produced for it is on the broker.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from streams.agents.common import Turns, ack_when_delivered, new_acker, send, track
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


def wire_clean(app: Any, settings: Settings, metrics: Metrics, topics: dict[str, Any]) -> None:
    cleaner = Cleaner.from_settings(settings, metrics=metrics)
    if settings.clean.engine == "aiokafka":
        loop = CleanLoop(settings, cleaner, metrics, group=clean_group(app.conf.id))

        @app.task
        async def clean_loop() -> None:
            await loop.run()

        return
    targets = {"fast": topics["fast"], "slow": topics["slow"], "deadletter": topics["deadletter"]}
    # labelled children looked up once: labels() per record cost 2-3% of a worker's CPU
    records_in = metrics.records_in.labels("clean")
    counters = RouteCounters(metrics, targets)

    if settings.topics.raw_pattern:
        logger.warning("the faust clean engine reads the listed topics %s only, not "
                       "RETRO_TOPICS__RAW_PATTERN %r; use RETRO_CLEAN__ENGINE=aiokafka for it",
                       settings.topics.raw, settings.topics.raw_pattern)

    @app.agent(topics["raw"], name="clean", concurrency=1)
    async def clean_agent(stream: Any) -> None:
        acker = new_acker()
        async for event in stream.noack().events():
            handle = track(acker, event)
            m = event.message
            records_in.inc()
            # faust's message timestamp is in seconds
            stamp = int(m.timestamp * 1000) if m.timestamp else None
            futures = []
            for routed in route(cleaner, value=m.value, key=m.key, topic=m.topic,
                                partition=m.partition, offset=m.offset, timestamp_ms=stamp):
                fut = await send(targets[routed.lane], key=routed.key, value=routed.value)
                fut.add_done_callback(functools.partial(_count_delivered, counters, routed))
                futures.append(fut)
            # acked once every record of the message is delivered
            ack_when_delivered(_all_delivered(futures), acker, handle)


def _count_delivered(counters: RouteCounters, routed: Routed, fut: asyncio.Future) -> None:
    if not fut.cancelled() and fut.exception() is None:
        counters.delivered(routed)


class RouteCounters:
    """Routed records and dead letters, counted once their message is on the broker.

    Counting when a record is cleaned counted every attempt: a fetch read again after
    a failed delivery showed more dead letters than the topic held.
    """

    def __init__(self, metrics: Metrics, lanes: Iterable[str]) -> None:
        self.records_out = {lane: metrics.records_out.labels(lane) for lane in lanes}
        self.deadletters = metrics.deadletters

    def delivered(self, routed: Routed) -> None:
        self.records_out[routed.lane].inc()
        if routed.reason is not None:
            self.deadletters.labels(stage="clean", reason=routed.reason).inc()

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


def _all_delivered(futures: list[asyncio.Future]) -> asyncio.Future:
    """One future for many deliveries: fails if any does."""
    return futures[0] if len(futures) == 1 else asyncio.gather(*futures)


def clean_group(worker_group: str) -> str:
    """The consumer group of the aiokafka clean loop: its own, beside faust's."""
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
