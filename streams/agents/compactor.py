"""The compactor: fragments merged into reports, published to the compacted reports topic.

Fragments are keyed by report id, so a report's fragments share one partition and
its state is local to the worker that owns that partition. Fragments are buffered
for ``RETRO_REPORT__PUBLISH_SECONDS``: each report is merged once per buffer and
published once to the compacted ``retro.reports`` topic, which is what every reader
uses; the buffered fragments are committed only after those writes are delivered.

Two engines (``RETRO_REPORT__ENGINE``): ``aiokafka`` (default), a plain loop whose
state is the reports topic itself (``CompactLoop``); ``faust``, an agent with a
changelogged table (``wire_compactor``).
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

from streams.agents.common import RejoiningLoop, Turns, new_acker, send, track
from streams.gateway.gateway import Gateway
from streams.gateway.rollup_prompt import ROLLUP_KIND, rollup_messages
from streams.kafka.acks import AckHandle, Commits, OrderedAcker
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
FETCH_RECORDS = 2000  # fragments per getmany (aiokafka engine)


class ParsedReports:
    """Parsed reports kept next to the table, so a busy day's report is not re-parsed
    from JSON for every fragment. An entry is used only while the table still holds
    the very string it was parsed from (a rebalance or recovery replaces it)."""

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
                   topics: dict[str, Any], gateway: Gateway | None = None) -> Any:
    """The aiokafka loop (run as a worker task; ``RETRO_REPORT__ENGINE=aiokafka``, the
    default), or the faust agent with its changelogged table (``faust``)."""
    if settings.report.engine == "aiokafka":
        loop = CompactLoop(settings, metrics, group=fragments_group(app.conf.id),
                           gateway=gateway)

        @app.task
        async def compactor_loop() -> None:
            await loop.run()

        return loop
    # values are the report JSON text; faust json-encodes the string in the changelog
    table = app.Table("retro-reports", default=None, partitions=settings.topics.partitions,
                      key_type=str, value_type=str, extra_topic_configs={
                          "max.message.bytes": str(settings.kafka.max_message_bytes)})
    reports = topics["reports"]
    parsed = ParsedReports()
    report_settings = settings.report

    async def store(report_id: str, partition: int, updated: Report) -> list[Any]:
        """Write a report to the table, its changelog partition and the reports topic
        (serialized once); returns the delivery futures. The changelog partition is the
        fragments partition the report lives on, named explicitly: a buffer of events
        may mix partitions, so faust's "current event" is not the report's."""
        body = updated.to_json()
        table.data[report_id] = body
        parsed.put(report_id, body, updated)
        return [table.send_changelog(partition, report_id, body),
                await send(reports, key=report_id.encode(), value=body.encode())]

    buffer = _Buffer()
    lock = asyncio.Lock()
    acker = new_acker()
    fragments_topic = settings.topics.fragments
    ownership = Ownership()

    @app.on_partitions_revoked.connect
    async def _revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        mine = {tp for tp in revoked if tp.topic == fragments_topic}
        ownership.revoke({tp.partition for tp in mine})
        for tp in mine:
            acker.forget(tp)

    async def flush() -> None:
        """Merge what the buffer holds, publish each changed report once, and ack its
        events when every write is delivered (a failed write leaves them unacked, so
        they are read again). Reports on partitions this worker no longer owns are
        dropped unwritten: their new owner re-reads the fragments from its commit."""
        async with lock:
            work, held = buffer.take()
            if not held:
                return
            owned = {tp.partition for tp in app.consumer.assignment()
                     if tp.topic == fragments_topic}
            since = ownership.snapshot(owned)
            futures: list[Any] = []
            for report_id, pending in work.items():
                updated = None
                if ownership.still(since, pending.partition):
                    updated = await _fold(report_id, pending, table, parsed, topics, metrics)
                # checked again after the await: a rebalance may have moved it meanwhile
                if not ownership.still(since, pending.partition):
                    logger.info("report %s moved to another worker; not written", report_id)
                    continue
                if updated is not None:
                    futures += await store(report_id, pending.partition, updated)
            delivered = asyncio.gather(*futures)
            for handle in held:
                if ownership.still(since, handle.token.message.partition):
                    _ack_if_still_owned(delivered, acker, handle, ownership, since)
                # else: an old ownership's event, forgotten at revocation, never acked

    @app.agent(topics["fragments"], name="compactor", concurrency=1)
    async def compactor_agent(stream: Any) -> None:
        async for event in stream.noack().events():
            buffer.add(event.message, event.value, track(acker, event), metrics)
            if buffer.size >= report_settings.publish_max_fragments:
                await flush()

    @app.timer(interval=report_settings.publish_seconds)
    async def publish_reports() -> None:
        await flush()

    if gateway is not None and settings.report.rollup_seconds > 0:
        _wire_rollup(app, settings, table, parsed, gateway, topics["fragments"])
    return table


class Ownership:
    """Fragments partitions owned, and how many times each was revoked.

    A flush that started before a rebalance must neither write the reports of a
    partition that moved nor ack its fragments: Kafka accepts a commit from a member
    that rejoined without the partition, so a late ack committed past fragments whose
    report write the new owner's table never saw (a report written twice as version
    1, records missing in the audit). A flush snapshots the revocation counts and
    acts on a partition only while its count is unchanged.
    """

    def __init__(self) -> None:
        self._revoked: dict[int, int] = {}

    def revoke(self, partitions: set[int]) -> None:
        for p in partitions:
            self._revoked[p] = self._revoked.get(p, 0) + 1

    def snapshot(self, owned: set[int]) -> dict[int, int]:
        return {p: self._revoked.get(p, 0) for p in owned}

    def still(self, since: dict[int, int], partition: int) -> bool:
        """Owned when ``since`` was taken and not revoked after."""
        return partition in since and self._revoked.get(partition, 0) == since[partition]


def _ack_if_still_owned(delivered: asyncio.Future[Any], acker: OrderedAcker,
                        handle: AckHandle, ownership: Ownership, since: dict[int, int]) -> None:
    def done(f: asyncio.Future[Any]) -> None:
        if f.cancelled() or f.exception() is not None:
            logger.error("report writes failed; their fragments stay unacked: %r",
                         None if f.cancelled() else f.exception())
        elif ownership.still(since, handle.token.message.partition):
            acker.done(handle)

    delivered.add_done_callback(done)


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
        """Buffer one fragments-topic message (a faust message or an aiokafka record)."""
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


async def _fold(report_id: str, work: _Pending, table: Any, parsed: ParsedReports,
                topics: dict[str, Any], metrics: Metrics) -> Report | None:
    """The report with this buffer's fragments and roll-ups in it, or None if unchanged;
    fragments that cannot be merged go to review, so their records stay accounted for."""
    current = parsed.get(report_id, table.get(report_id))
    folded = fold(current, work.fragments, work.rollups, report_id=report_id,
                  now=format_time(datetime.now(UTC)))
    for result in folded.results:
        metrics.report_updates.labels(result).inc()
    for fragment, why in folded.rejected:
        review = rejected_review(fragment, why, report_id)
        await (await send(topics["review"], key=review.id.encode(),
                          value=review.model_dump_json().encode()))
    return folded.report


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


def _wire_rollup(app: Any, settings: Settings, table: Any, parsed: ParsedReports,
                 gateway: Gateway, fragments: Any) -> None:
    """On a timer, summarize incidents that grew; the summary goes back through the
    fragments topic (keyed by report) because faust tables are written in-stream only."""

    async def send_update(report_id: str, value: bytes) -> None:
        await send(fragments, key=report_id.encode(), value=value,
                   headers=[(KIND_HEADER, ROLLUP_KIND.encode())])

    @app.timer(interval=settings.report.rollup_seconds)
    async def rollup_incidents() -> None:
        await rollup_pass(list(table.items()), parsed, gateway, settings, send_update)


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


# --- the aiokafka engine ---------------------------------------------------------------------


def fragments_group(worker_group: str) -> str:
    """The consumer group of the aiokafka compactor loop: its own, beside faust's."""
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
    a no-op (the report's ledger already covers it). faust's per-event path gave the
    compactor one fragment per turn of the event loop; it trailed thousands of
    fragments behind, and after a rebalance a partition could sit unread until the
    re-read guard fired (README, "faust or aiokafka on the hot path").
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
