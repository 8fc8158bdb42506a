"""The batch stage (fast and slow lane): records -> token-budget batches -> model.

One plain aiokafka loop per worker over both lane topics, in its own consumer group
(``<group>-lanes``): ``getmany``, hand records to the lanes' :class:`LaneProcessor`,
batched sends, and a commit of each partition's contiguous prefix of records whose
fragments or reviews are on the broker. A record's offset is committed only after
what covers it is delivered, and scaling out means more partitions and more workers
in the consumer group.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from aiokafka import (
    AIOKafkaConsumer,
    ConsumerRebalanceListener,
    ConsumerRecord,
    TopicPartition,
)
from aiokafka.errors import ConsumerStoppedError
from pydantic import ValidationError

from streams.agents.common import RejoiningLoop, Turns
from streams.batch.lane import LaneProcessor
from streams.batch.window import TokenWindow
from streams.clean.redact import Redactor
from streams.clean.tokens import TokenCounter
from streams.gateway.gateway import Gateway
from streams.kafka.acks import AckHandle, Commits
from streams.kafka.connect import (
    commit_owned,
    stage_consumer,
)
from streams.metrics import Metrics
from streams.records import BatchOutcome, DeadLetter, NormalizedRecord, RawCoord
from streams.report.keys import record_place, report_key
from streams.settings import Settings

logger = logging.getLogger(__name__)


LANES = ("fast", "slow")
# (lane partitions owned, lane topic -> partition count) after each rebalance
OnAssignment = Callable[[list[tuple[str, int]], dict[str, int]], object]
FETCH_RECORDS = 2000  # records per getmany


def wire_batch(
    app: Any,
    settings: Settings,
    metrics: Metrics,
    gateways: dict[str, Gateway],
    counter: TokenCounter,
    on_assignment: OnAssignment | None = None,
) -> BatchLoop:
    """The batch loop, run as a task of the worker; ``on_assignment`` hears its lane
    partitions after every rebalance (the model quota follows them)."""
    loop = BatchLoop(settings, metrics, gateways, counter,
                     group=lanes_group(app.conf.id), on_assignment=on_assignment)

    @app.task
    async def batch_loop() -> None:
        await loop.run()

    return loop


def lanes_group(worker_group: str) -> str:
    """The consumer group of the batch loop."""
    return f"{worker_group}-lanes"


def new_processor(settings: Settings, lane: str, gateway: Gateway, counter: TokenCounter,
                  metrics: Metrics, *, publish: Any, ack: Any) -> LaneProcessor:
    """A lane's window and processor, from settings; the report place is the record's."""
    lane_settings = settings.lane(lane)  # type: ignore[arg-type]
    return LaneProcessor(
        window=TokenWindow(
            lane=lane, input_budget=lane_settings.input_budget,
            context_window=lane_settings.context_window,
            output_reserve=lane_settings.output_reserve, max_records=lane_settings.max_records,
            max_wait_seconds=lane_settings.max_wait_seconds, counter=counter),
        analyzer=gateway, publish=publish, ack=ack,
        model=settings.model.name, prompt_version=settings.model.prompt_version,
        max_inflight_batches=max(2, lane_settings.max_concurrency), metrics=metrics,
        place=functools.partial(record_place, window=settings.report.window,
                                group_by=settings.report.group_by,
                                shards=settings.report.shards))


def outcome_messages(outcome: BatchOutcome, settings: Settings
                     ) -> list[tuple[str, bytes, bytes]]:
    """(topic role, key, value) of everything one batch outcome publishes."""
    out = []
    for fragment in outcome.fragments:
        key = report_key(fragment, window=settings.report.window,
                         group_by=settings.report.group_by)
        out.append(("fragments", key.encode(), fragment.model_dump_json().encode()))
    for item in outcome.reviews:
        out.append(("review", item.id.encode(), item.model_dump_json().encode()))
    return out


class _Rebalance(ConsumerRebalanceListener):
    """Commit what is done before partitions leave; report what arrived."""

    def __init__(self, loop: BatchLoop) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.loop._commit()

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.loop.assigned(set(assigned))


class BatchLoop(RejoiningLoop):
    """The batch stage on aiokafka: both lanes in one consumer, committed on delivery.

    A failed publication restarts the loop: the consumer leaves the group and joins
    again from the committed offsets, so records whose output never reached the broker
    are read again (the report merge counts a record once, wherever it lands). On
    shutdown :meth:`drain` flushes the windows and waits for batches in flight, up to a
    deadline, then commits what is done; the rest is read again by the next owner.
    """

    name = "batch loop"

    def __init__(self, settings: Settings, metrics: Metrics, gateways: dict[str, Gateway],
                 counter: TokenCounter, *, group: str,
                 on_assignment: OnAssignment | None = None) -> None:
        super().__init__(settings, group, metrics)
        self.on_assignment = on_assignment
        self.redactor = Redactor.from_settings(settings)
        self.gateways = gateways
        self.counter = counter
        t = settings.topics
        self.lane_of = {t.fast: "fast", t.slow: "slow"}
        self.records_in = {lane: metrics.records_in.labels(f"batch-{lane}") for lane in LANES}
        self.processors: dict[str, LaneProcessor] = {}
        self._commits = Commits()
        self.turns = Turns()

    def _new_consumer(self) -> AIOKafkaConsumer:
        s = self.settings
        consumer = stage_consumer(
            s, self.group,
            # records wait in windows and on the model between fetches
            max_poll_interval_ms=int(max(300.0, 4 * s.slow.timeout_seconds) * 1000))
        consumer.subscribe([s.topics.fast, s.topics.slow], listener=_Rebalance(self))
        return consumer

    def _begin(self) -> list[asyncio.Task[None]]:
        s = self.settings
        self._commits = Commits()
        self.processors = {lane: new_processor(
            s, lane, self.gateways[lane], self.counter, self.metrics,
            publish=self._publish, ack=self._commits.acker.done) for lane in LANES}
        return [asyncio.create_task(p.run_timer()) for p in self.processors.values()]

    async def _consume(self) -> bool:
        """Fetch and hand over until stopped (True) or a publication failed (False)."""
        consumer = self._consumer
        assert consumer is not None
        while not self._stopping:
            if any(p.failed is not None for p in self.processors.values()):
                return False
            try:
                fetched = await consumer.getmany(timeout_ms=500, max_records=FETCH_RECORDS)
            except ConsumerStoppedError:  # drain() stopped it
                return True
            for tp, messages in fetched.items():
                lane = self.lane_of[tp.topic]
                self.records_in[lane].inc(len(messages))
                for m in messages:
                    if self._stopping:
                        break
                    await self.turns.give()  # the compactor and the lanes' batches run
                    handle = self._commits.acker.track(tp, (tp, m.offset))
                    try:
                        record = NormalizedRecord.model_validate_json(m.value or b"")
                    except ValidationError as exc:
                        await self._dead_letter(m, exc, handle)
                        continue
                    try:
                        await self.processors[lane].add(record, handle)
                    except Exception:  # the processor's publication failed
                        return False
            await self._commit()
        return True

    async def _publish(self, outcome: BatchOutcome) -> None:
        producer = self._producer
        assert producer is not None
        t = self.settings.topics
        names = {"fragments": t.fragments, "review": t.review}
        futures = [await producer.send(names[role], value, key=key)
                   for role, key, value in outcome_messages(outcome, self.settings)]
        await asyncio.gather(*futures)

    async def _dead_letter(self, m: ConsumerRecord, exc: ValidationError,
                           handle: AckHandle) -> None:
        producer = self._producer
        assert producer is not None
        letter = _bad_record(m.topic, m.partition, m.offset, m.value, exc,
                             self.settings.clean.deadletter_sample_bytes, self.redactor)
        fut = await producer.send(self.settings.topics.deadletter, letter, key=b"")
        acker = self._commits.acker
        counted = self.metrics.deadletters.labels(stage="batch", reason="bad_record")

        def delivered(f: asyncio.Future[Any]) -> None:
            if not f.cancelled() and f.exception() is None:
                counted.inc()
                acker.done(handle)

        fut.add_done_callback(delivered)

    async def _commit(self) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        await commit_owned(consumer, self._commits.take(set(consumer.assignment())))

    def assigned(self, partitions: set[TopicPartition]) -> None:
        """After a rebalance: tell ``on_assignment`` which lane partitions are ours."""
        consumer = self._consumer
        if self.on_assignment is None or consumer is None:
            return
        counts = {t: len(consumer.partitions_for_topic(t) or ()) for t in self.lane_of}
        if not all(counts.values()):
            return  # no metadata yet; the next rebalance tells
        self.on_assignment(sorted((tp.topic, tp.partition) for tp in partitions), counts)

    async def drain(self, timeout: float) -> None:
        """On shutdown: stop fetching, flush windows, wait for batches in flight up to
        ``timeout`` seconds, commit what is done, leave the group."""
        self._stopping = True
        if self._consumer is None:
            return
        try:
            await asyncio.wait_for(
                asyncio.gather(*(p.drain() for p in self.processors.values())),
                timeout=timeout)
        except TimeoutError:
            waiting = self._commits.acker.waiting()
            logger.warning("shutdown: %d record(s) not done within %.0fs; not committed, "
                           "the partitions' next owner reads them again", waiting, timeout)
        except Exception as exc:  # a failed publication: its records stay uncommitted
            logger.warning("shutdown: draining the lanes failed: %r", exc)
        await self._commit()
        await self._close()


def _bad_record(topic: str, partition: int, offset: int, value: bytes | None,
                exc: ValidationError, sample_bytes: int, redactor: Redactor) -> bytes:
    """A lane message that is not a NormalizedRecord (a foreign producer, a bug), with a
    redacted sample like every dead letter."""
    coord = RawCoord(topic=topic, partition=partition, offset=offset)
    return DeadLetter.of(
        value or b"", sample_bytes=sample_bytes, redact=lambda text: redactor.redact(text)[0],
        id=coord.id, raw=coord, source="unknown", stage="batch", reason="bad_record",
        detail=f"not a normalized record ({exc.error_count()} schema errors); only the clean "
               "agent should write to the lane topics").model_dump_json().encode()
