"""The compactor: fragments merged into reports, published to the compacted reports topic.

Fragments are keyed by report id, so a report's fragments share one partition and
its state is local to the worker that owns that partition. Fragments are buffered
for ``RETRO_REPORT__PUBLISH_SECONDS``: each report is merged once per buffer and
published once to the compacted ``retro.reports`` topic, which is what every reader
uses; the buffered fragments are committed only after those writes are delivered.
The loop's state is the reports topic itself (``CompactLoop``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import ConsumerStoppedError, KafkaError
from aiokafka.partitioner import DefaultPartitioner
from pydantic import ValidationError

from streams.agents.common import RejoiningLoop, Turns
from streams.gateway.gateway import Gateway
from streams.gateway.rollup_prompt import ROLLUP_KIND, rollup_messages
from streams.kafka.acks import AckHandle, Commits
from streams.kafka.connect import (
    commit_owned,
    stage_consumer,
)
from streams.kafka.stall import StallDetector
from streams.metrics import Metrics
from streams.records import Fragment, Review
from streams.report.compact import fold
from streams.report.keys import format_time
from streams.report.model import Report
from streams.report.rollup import (
    RollupUpdate,
    needs_rollup,
    rollup_payload,
)
from streams.report.store import read_messages
from streams.settings import Settings

logger = logging.getLogger(__name__)

KIND_HEADER = "retro-kind"  # fragments topic messages that are not fragments say what they are
FETCH_RECORDS = 2000  # fragments per getmany


class ParsedReports:
    """Parsed reports kept next to their JSON, so a busy day's report is not re-parsed
    for every buffer. An entry is used only while the loop still holds the very string
    it was parsed from (a rebalance or a reload replaces it)."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._items: dict[str, tuple[str, Report]] = {}

    def get(self, report_id: str, stored: str | None) -> Report | None:
        if not stored:
            return None
        hit = self._items.get(report_id)
        if hit is not None and hit[0] is stored:
            return hit[1]
        report = Report.from_json(stored)
        self.put(report_id, stored, report)
        return report

    def put(self, report_id: str, stored: str, report: Report) -> None:
        self._items.pop(report_id, None)
        self._items[report_id] = (stored, report)
        while len(self._items) > self.size:
            self._items.pop(next(iter(self._items)))


def wire_compactor(app: Any, settings: Settings, metrics: Metrics,
                   gateway: Gateway | None = None) -> CompactLoop:
    """The compactor loop, run as a task of the worker; ``gateway`` writes the
    incidents' roll-ups when RETRO_REPORT__ROLLUP_SECONDS is set."""
    loop = CompactLoop(settings, metrics, group=fragments_group(app.conf.id), gateway=gateway)

    @app.task
    async def compactor_loop() -> None:
        await loop.run()

    return loop


@dataclass
class _Pending:
    """What one buffer holds for one report, in arrival order."""

    partition: int
    fragments: list[Fragment] = field(default_factory=list)
    rollups: list[RollupUpdate] = field(default_factory=list)


@dataclass
class _Buffer:
    """Fragments and roll-ups received since the last publication, by report."""

    work: dict[str, _Pending] = field(default_factory=dict)
    handles: list[AckHandle] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.handles)

    def add(self, message: Any, value: bytes | None, handle: AckHandle,
            metrics: Metrics) -> None:
        """Buffer one fragments-topic record."""
        _collect(message, value or b"", self.work, metrics)
        self.handles.append(handle)

    def take(self) -> tuple[dict[str, _Pending], list[AckHandle]]:
        work, handles = self.work, self.handles
        self.work, self.handles = {}, []
        return work, handles


def _collect(message: Any, value: bytes, pending: dict[str, _Pending],
             metrics: Metrics) -> None:
    if _kind(message) == ROLLUP_KIND:
        try:
            update = RollupUpdate.from_json(value)
        except ValueError as exc:
            logger.error("unreadable roll-up skipped: %s", exc)
            return
        pending.setdefault(update.report_id, _Pending(message.partition)).rollups.append(update)
        return
    try:
        fragment = Fragment.model_validate_json(value)
    except ValidationError as exc:
        logger.error("unreadable fragment at %s[%s]@%s skipped: %s", message.topic,
                     message.partition, message.offset, exc)
        metrics.report_updates.labels("invalid").inc()
        return
    report_id = (message.key or b"").decode() or "undated/all"
    work = pending.setdefault(report_id, _Pending(message.partition))
    work.partition = message.partition
    work.fragments.append(fragment)


def rejected_review(fragment: Fragment, why: str, report_id: str) -> Review:
    """A fragment the merge refused, parked so its records stay accounted for."""
    return Review(id=f"r-{fragment.id}", lane=fragment.lane, reason="bad_fragment",
                  detail=f"could not merge into report {report_id}: {why}",
                  covered=fragment.covered, record_ids=[], model=fragment.model,
                  prompt_version=fragment.prompt_version, output=None)


def _kind(message: Any) -> str | None:
    headers = message.headers or []
    items = headers.items() if isinstance(headers, dict) else headers
    for key, value in items:
        if key == KIND_HEADER:
            return value.decode() if isinstance(value, bytes) else str(value)
    return None


async def rollup_pass(items: list[tuple[str, str]], parsed: ParsedReports, gateway: Gateway,
                      settings: Settings, send_update: Any) -> None:
    """One model call per incident that grew since its summary; each summary is sent
    with ``send_update(report_id, value)`` to be merged like a fragment."""
    model = settings.model
    for report_id, stored in items:
        report = parsed.get(report_id, stored)
        if report is None:
            continue
        for incident in report.incidents:
            if not needs_rollup(incident):
                continue
            payload = rollup_payload(report_id, incident, report=report)
            messages = rollup_messages(payload, prompt_version=model.prompt_version)
            summary, reason = await gateway.summarize(messages)
            if summary is None:
                logger.warning("no roll-up for incident %s of %s: %s", incident.key,
                               report_id, reason)
                continue
            update = RollupUpdate(report_id=report_id, incident_key=incident.key,
                                  summary=summary, based_on_count=incident.count,
                                  model=model.name, prompt_version=model.prompt_version)
            await send_update(report_id, update.to_json().encode())


def fragments_group(worker_group: str) -> str:
    """The consumer group of the compactor loop."""
    return f"{worker_group}-fragments"


class _Handover(ConsumerRebalanceListener):
    """Publish and commit what was merged before partitions move; load what arrives.

    aiokafka awaits both before the rebalance goes on, so a partition's next owner
    loads its reports only after this worker's last writes for it are delivered."""

    def __init__(self, loop: CompactLoop) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: Any) -> None:
        try:
            await self.loop.flush()
        except KafkaError as exc:  # not committed: the next owner merges them again
            logger.warning("publishing before a rebalance failed: %r", exc)
        finally:
            # nothing more is written until load() says which partitions are ours: a
            # late write for a partition that moved could land after its next owner
            # loaded it
            self.loop.between_owners = True

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.loop.load({tp.partition for tp in assigned
                              if tp.topic == self.loop.settings.topics.fragments})


class CompactLoop(RejoiningLoop):
    """The compactor on aiokafka: fragments merged into reports, committed on delivery.

    The compacted reports topic is the state: a report's latest version there is the
    report, so a worker given a fragments partition loads the latest version of each
    of its reports from that topic (keys partition alike on both topics) and merges on.
    Fragments fetched within ``publish_seconds`` (or ``publish_max_fragments`` of them)
    are merged at once, each changed report is published once, and their offsets are
    committed when those writes are delivered. A record merged again after a crash is
    a no-op (the report's ledger already covers it).
    """

    name = "compactor loop"

    def __init__(self, settings: Settings, metrics: Metrics, *, group: str,
                 gateway: Gateway | None = None) -> None:
        super().__init__(settings, group, metrics)
        self.gateway = gateway
        self.reports: dict[str, str] = {}  # compaction key -> latest JSON, owned partitions
        self._partition_of: dict[str, int] = {}
        self.parsed = ParsedReports()
        self._buffer = _Buffer()
        self._commits = Commits()
        self._owned: set[int] = set()  # fragments partitions assigned and loaded
        self._lock = asyncio.Lock()
        self._load_failed = False
        self.between_owners = False  # revoked, not yet told what is assigned
        self._flushed_at = time.monotonic()
        self._held: StallDetector | None = None  # commits held back by one fragment
        self.records_in = metrics.records_in.labels("compactor")
        self.turns = Turns()

    def _new_consumer(self) -> AIOKafkaConsumer:
        s = self.settings
        consumer = stage_consumer(
            s, self.group, max_partition_fetch_bytes=max(1024 * 1024, s.kafka.max_message_bytes))
        consumer.subscribe([s.topics.fragments], listener=_Handover(self))
        return consumer

    def _begin(self) -> list[asyncio.Task[None]]:
        self._commits, self._buffer, self._owned = Commits(), _Buffer(), set()
        after = self.settings.kafka.reread_held_seconds
        # a buffer legitimately waits up to publish_seconds before it is published
        self._held = StallDetector(max(after, 4 * self.settings.report.publish_seconds)
                                   ) if after > 0 else None
        self._load_failed = self.between_owners = False
        self.reports.clear()
        self._partition_of.clear()
        if self.gateway is not None and self.settings.report.rollup_seconds > 0:
            return [asyncio.create_task(self._rollups(self.gateway))]
        return []

    async def _consume(self) -> bool:
        """Fetch, buffer, publish on time; until stopped (True) or a write failed (False)."""
        consumer = self._consumer
        assert consumer is not None
        report = self.settings.report
        while not self._stopping:
            try:
                fetched = await consumer.getmany(timeout_ms=500, max_records=FETCH_RECORDS)
            except ConsumerStoppedError:  # drain() stopped it
                return True
            if self._load_failed:
                return False
            await self._take(consumer, fetched)
            due = time.monotonic() - self._flushed_at >= report.publish_seconds
            if self._buffer.size >= report.publish_max_fragments or (self._buffer.size and due):
                try:
                    await self.flush()
                except KafkaError as exc:
                    logger.error("publishing reports failed: %r", exc)
                    return False
            if self._held_too_long():
                return False
        return True

    def _held_too_long(self) -> bool:
        """True when a fragment has held its partition's commit back for
        ``RETRO_KAFKA__REREAD_HELD_SECONDS``: the loop rejoins and reads it again."""
        if self._held is None or self.between_owners:
            return False
        waiting = self._commits.oldest_pending()
        # a pending fragment is lag; its offset not moving is the commit held back
        self._held.observe(waiting, dict.fromkeys(waiting, 1))
        held = self._held.stalled()
        for tp in held:
            logger.warning("%s: a fragment has held the commit back for %.0fs; reading the "
                           "partition again from its commit", tp, self._held.stall_seconds)
        return bool(held)

    async def _take(self, consumer: AIOKafkaConsumer,
                    fetched: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Buffer a fetch; a partition whose reports are still loading is read again.

        aiokafka fetches a partition as soon as it is assigned, while the assignment
        callback is still loading its reports. Its fragments cannot be merged yet, and
        dropping them lost them: the position had moved past them and the commit
        waited for them forever (a stuck partition in a two-worker run).
        """
        for tp, messages in fetched.items():
            if tp.partition not in self._owned:
                if tp in consumer.assignment():
                    consumer.seek(tp, messages[0].offset)
                continue
            self.records_in.inc(len(messages))
            for m in messages:
                handle = self._commits.acker.track(tp, (tp, m.offset))
                self._buffer.add(m, m.value, handle, self.metrics)
                await self.turns.give()

    async def flush(self) -> None:
        """Merge what the buffer holds, publish each changed report once, then commit
        the fragments once every write is delivered (raises if one failed: nothing of
        this buffer is committed and the loop rejoins)."""
        async with self._lock:
            if self.between_owners:
                return
            consumer, producer = self._consumer, self._producer
            work, held = self._buffer.take()
            self._flushed_at = time.monotonic()
            if not held or consumer is None or producer is None:
                return
            t = self.settings.topics
            # assigned and loaded: a partition whose reports did not load is not merged
            owned = self._owned & {tp.partition for tp in consumer.assignment()
                                   if tp.topic == t.fragments}
            now = format_time(datetime.now(UTC))
            futures = []
            for key, pending in work.items():
                if pending.partition not in owned:
                    continue  # moved: its next owner reads these fragments again
                folded = fold(self.parsed.get(key, self.reports.get(key)), pending.fragments,
                              pending.rollups, report_id=key, now=now)
                for result in folded.results:
                    self.metrics.report_updates.labels(result).inc()
                for fragment, why in folded.rejected:
                    review = rejected_review(fragment, why, key)
                    futures.append(await producer.send(
                        t.review, review.model_dump_json().encode(), key=review.id.encode()))
                if folded.report is not None:
                    body = folded.report.to_json()
                    self.reports[key] = body
                    self._partition_of[key] = pending.partition
                    self.parsed.put(key, body, folded.report)
                    futures.append(await producer.send(t.reports, body.encode(),
                                                       key=key.encode()))
            await asyncio.gather(*futures)
            for handle in held:
                if handle.key.partition in owned:
                    self._commits.acker.done(handle)
            await commit_owned(consumer, self._commits.take(set(consumer.assignment())))

    async def load(self, partitions: set[int]) -> None:
        """After a rebalance: forget the reports of partitions that left, and load the
        latest version of every report of the partitions that arrived. A partition kept
        through the rebalance keeps its state: nobody else owned it in between. If
        loading fails, the new partitions are not merged (an empty state would write
        reports without their earlier records) and the loop rejoins the group."""
        for p in self._owned - partitions:
            self._commits.acker.forget(TopicPartition(self.settings.topics.fragments, p))
        for key in [k for k, p in self._partition_of.items() if p not in partitions]:
            self.reports.pop(key, None)
            del self._partition_of[key]
        kept = self._owned & partitions
        gained = partitions - self._owned
        self._owned = kept
        self.between_owners = False
        if not gained:
            return
        try:
            loaded = await self._read_reports(gained)
        except Exception as exc:  # a callback's error would only be logged by aiokafka
            logger.error("loading the reports of fragments partitions %s failed: %r; "
                         "rejoining", sorted(gained), exc)
            self._load_failed = True
            return
        self._owned = set(partitions)
        logger.info("loaded %d report(s) of fragments partitions %s", loaded, sorted(gained))

    async def _read_reports(self, partitions: set[int]) -> int:
        """The latest version of each report whose key belongs to ``partitions`` of the
        fragments topic, read from the compacted reports topic."""
        s = self.settings
        producer = self._producer
        assert producer is not None
        # the producer fetches a topic's metadata when asked (a consumer only its own)
        fragments_partitions = sorted(await producer.partitions_for(s.topics.fragments))
        count = len(await producer.partitions_for(s.topics.reports))
        # alike partition counts put a key on the same partition of both topics
        to_read = partitions if count == len(fragments_partitions) else None
        partitioner = DefaultPartitioner()
        async for m in read_messages(s, s.topics.reports, to_read):
            if m.key is None:
                continue
            home = partitioner(m.key, fragments_partitions, fragments_partitions)
            if home in partitions:
                self._keep(m.key.decode(), m.value, home)
        return sum(1 for p in self._partition_of.values() if p in partitions)

    def _keep(self, key: str, value: bytes | None, partition: int) -> None:
        """A report version read back; a tombstone deletes the report."""
        if value is None:
            self.reports.pop(key, None)
            self._partition_of.pop(key, None)
            return
        self.reports[key] = value.decode()
        self._partition_of[key] = partition

    async def _rollups(self, gateway: Gateway) -> None:
        producer = self._producer
        assert producer is not None
        topic = self.settings.topics.fragments

        async def send_update(report_id: str, value: bytes) -> None:
            await producer.send(topic, value, key=report_id.encode(),
                                headers=[(KIND_HEADER, ROLLUP_KIND.encode())])

        while True:
            await asyncio.sleep(self.settings.report.rollup_seconds)
            await rollup_pass(list(self.reports.items()), self.parsed, gateway,
                              self.settings, send_update)

    async def drain(self, timeout: float) -> None:
        """On shutdown: stop fetching, publish and commit what is buffered (up to
        ``timeout`` seconds), leave the group."""
        self._stopping = True
        if self._consumer is None:
            return
        try:
            await asyncio.wait_for(self.flush(), timeout=timeout)
        except (TimeoutError, KafkaError) as exc:
            logger.warning("shutdown: publishing the last reports failed (%r); not "
                           "committed, the partitions' next owner merges them again", exc)
        await self._close()
