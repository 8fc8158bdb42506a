"""The compactor agent: fragments merged into reports held in a changelogged table.

Fragments are keyed by report id, so a report's fragments share one partition and
the faust table (partitioned like the fragments topic) is local to the worker that
owns it. Fragments are buffered for ``RETRO_REPORT__PUBLISH_SECONDS``: each report
is merged once per buffer and published once to the changelog and to the compacted
``retro.reports`` topic, which is what every reader uses; the buffered events are
acked only after those writes are delivered.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from streams.agents.common import new_acker, send, track
from streams.gateway.gateway import Gateway
from streams.gateway.rollup_prompt import ROLLUP_KIND, rollup_messages
from streams.kafka.acks import AckHandle, OrderedAcker
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
from streams.settings import Settings

logger = logging.getLogger(__name__)

KIND_HEADER = "retro-kind"  # fragments topic messages that are not fragments say what they are


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
            buffer.add(event, track(acker, event), metrics)
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

    def add(self, event: Any, handle: AckHandle, metrics: Metrics) -> None:
        _collect(event, self.work, metrics)
        self.handles.append(handle)

    def take(self) -> tuple[dict[str, _Pending], list[AckHandle]]:
        work, handles = self.work, self.handles
        self.work, self.handles = {}, []
        return work, handles


def _collect(event: Any, pending: dict[str, _Pending], metrics: Metrics) -> None:
    message = event.message
    if _kind(message) == ROLLUP_KIND:
        try:
            update = RollupUpdate.from_json(event.value)
        except ValueError as exc:
            logger.error("unreadable roll-up skipped: %s", exc)
            return
        pending.setdefault(update.report_id, _Pending(message.partition)).rollups.append(update)
        return
    try:
        fragment = Fragment.model_validate_json(event.value)
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
        review = Review(id=f"r-{fragment.id}", lane=fragment.lane, reason="bad_fragment",
                        detail=f"could not merge into report {report_id}: {why}",
                        covered=fragment.covered, record_ids=[], model=fragment.model,
                        prompt_version=fragment.prompt_version, output=None)
        await (await send(topics["review"], key=review.id.encode(),
                          value=review.model_dump_json().encode()))
    return folded.report


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
    model = settings.model

    @app.timer(interval=settings.report.rollup_seconds)
    async def rollup_incidents() -> None:
        for report_id, stored in list(table.items()):
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
                await send(fragments, key=report_id.encode(), value=update.to_json().encode(),
                           headers=[(KIND_HEADER, ROLLUP_KIND.encode())])
