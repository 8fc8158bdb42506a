"""The compactor as a step: fragments merged into reports, published to the compacted
reports topic.

Fragments carry the report they were cut for (keys partition alike on the fragments
and reports topics), so a report's fragments share one partition and its state is
local to the member that owns that partition. The compacted reports topic is the
state: a member given a fragments partition first loads the latest version of each
of its reports from there (``ReportSource``) and merges on. Fragments fetched within
``RETRO_REPORT__PUBLISH_SECONDS`` (or ``publish_max_fragments`` of them) are merged at
once, each changed report is published once, and the fragments are done when those
writes are delivered. A record merged again after a crash is a no-op (the report's
ledger already covers it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from pydantic import ValidationError

from streams.clock import Clock, Sleep
from streams.gateway.gateway import Gateway
from streams.gateway.rollup_prompt import ROLLUP_KIND, rollup_messages
from streams.metrics import Metrics
from streams.records import HOPS_KIND, KIND_HEADER, Fragment, HopsUpdate, Review
from streams.report.analysis.rollup import RollupUpdate, needs_rollup, rollup_payload
from streams.report.compactor.compact import fold
from streams.report.state.keys import format_time
from streams.report.state.model import Report
from streams.runtime.acks import AckHandle
from streams.runtime.state import PartitionedState
from streams.runtime.step import Context, Fetch, Message, Out, Step
from streams.settings import Settings

logger = logging.getLogger(__name__)

# a compaction key -> the report of its window before, as the reports topic holds it
WindowBefore = Callable[[str], Report | None]


class ReportSource(Protocol):
    """Reads the latest report versions back from the compacted reports topic."""

    async def read(self, partitions: set[int]) -> list[tuple[str, bytes | None, int]]:
        """(report key, latest value or None for a tombstone, fragments partition) of
        every report whose key belongs to ``partitions`` of the fragments topic."""
        ...


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


@dataclass
class _Pending:
    """What one buffer holds for one report, in arrival order."""

    partition: int
    fragments: list[Fragment] = field(default_factory=list)
    rollups: list[RollupUpdate] = field(default_factory=list)
    hops: list[HopsUpdate] = field(default_factory=list)


# fragments-topic messages that are not fragments: how each is read, where it waits
_UPDATES: dict[str, tuple[Callable[[bytes], Any], Callable[[_Pending], list[Any]]]] = {
    HOPS_KIND: (HopsUpdate.model_validate_json, lambda work: work.hops),
    ROLLUP_KIND: (RollupUpdate.from_json, lambda work: work.rollups),
}


@dataclass
class _Buffer:
    """Fragments and roll-ups received since the last publication, by report."""

    work: dict[str, _Pending] = field(default_factory=dict)
    handles: list[AckHandle] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.handles)

    def add(self, message: Message, handle: AckHandle, metrics: Metrics) -> Review | None:
        """Buffer one fragments-topic record; a fragment it cannot place comes back as a
        review, and its handle is the caller's to mark done."""
        review = _collect(message, self.work, metrics)
        if review is None:
            self.handles.append(handle)
        return review

    def take(self) -> tuple[dict[str, _Pending], list[AckHandle]]:
        work, handles = self.work, self.handles
        self.work, self.handles = {}, []
        return work, handles


def _collect(message: Message, pending: dict[str, _Pending], metrics: Metrics
             ) -> Review | None:
    """Buffer one fragments-topic message; a fragment with no report to go to is
    returned as a review, so its records stay accounted for."""
    value = message.value or b""
    kind = _kind(message)
    if kind in _UPDATES:
        read, queue = _UPDATES[kind]
        try:
            update = read(value)
        except ValueError as exc:  # pydantic's ValidationError is one
            logger.error("unreadable %s update skipped: %s", kind, exc)
            return None
        queue(pending.setdefault(update.report_id, _Pending(message.partition))).append(update)
        return None
    try:
        fragment = Fragment.model_validate_json(value)
    except ValidationError as exc:
        logger.error("unreadable fragment at %s[%s]@%s skipped: %s", message.topic,
                     message.partition, message.offset, exc)
        metrics.report_updates.labels("invalid").inc()
        return None
    # fragments written before they carried their report name it in the message key
    report_id = fragment.report_id or (message.key or b"").decode()
    if not report_id:
        metrics.report_updates.labels("invalid").inc()
        return rejected_review(fragment, "it names no report", "(none)")
    work = pending.setdefault(report_id, _Pending(message.partition))
    work.partition = message.partition
    work.fragments.append(fragment)
    return None


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
                      settings: Settings, send_update: Any,
                      window_before: WindowBefore | None = None) -> None:
    """One model call per incident that grew since its summary; each summary is sent
    with ``send_update(report_id, value)`` to be merged like a fragment. With
    ``window_before`` (a compaction key -> the report of its window before), a day's
    first hours are judged against yesterday's last, as the views judge them."""
    model = settings.model
    for report_id, stored in items:
        report = parsed.get(report_id, stored)
        if report is None:
            continue
        if window_before is not None:
            report.follows(window_before(report_id))
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




class CompactStep(Step):
    """Buffers fragments, merges and publishes reports on time, done on delivery."""

    name = "compactor loop"

    def __init__(self, settings: Settings, metrics: Metrics, source: ReportSource, *,
                 gateway: Gateway | None = None, window_before: WindowBefore | None = None,
                 clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep) -> None:
        self.settings = settings
        self.metrics = metrics
        self.source = source
        self.gateway = gateway
        self.window_before = window_before  # the roll-ups' baseline of a window's first hours
        self.clock = clock  # publishing is due by this clock
        self.sleep = sleep  # and the roll-ups wait with this sleep: tests pass a fake pair
        # compaction key -> latest JSON, of the fragments partitions assigned and loaded
        self.state: PartitionedState[str] = PartitionedState()
        self.parsed = ParsedReports()
        self._buffer = _Buffer()
        # revoked, not yet told what is assigned: nothing is written, as a late write for
        # a partition that moved could land after its next owner loaded it
        self._between_owners = False
        self._lock = asyncio.Lock()
        self._flushed_at = clock()
        self.records_in = metrics.records_in.labels("compactor")
        after = settings.kafka.reread_held_seconds
        # a buffer legitimately waits up to publish_seconds before it is published
        self.held_seconds = max(after, 4 * settings.report.publish_seconds) if after > 0 else 0

    def begin(self, ctx: Context) -> None:
        self._buffer, self._between_owners = _Buffer(), False
        self.state.clear()

    @property
    def reports(self) -> dict[str, str]:
        """The latest JSON of each report of the owned partitions."""
        return self.state.values

    def background(self, ctx: Context) -> list[Any]:
        if self.gateway is not None and self.settings.report.rollup_seconds > 0:
            return [self._rollups(self.gateway, ctx)]
        return []

    async def take(self, fetch: Fetch, ctx: Context) -> None:
        """Buffer a fetch; a partition whose reports are not loaded yet is read again.

        aiokafka fetches a partition as soon as it is assigned, while the assignment
        callback is still loading its reports. Its fragments cannot be merged yet, and
        dropping them lost them: the position had moved past them and the commit
        waited for them forever (a stuck partition in a two-worker run).
        """
        review_topic = self.settings.topics.review
        for part, messages in fetch.items():
            if part.partition not in self.state.loaded:
                ctx.reread(part, messages[0].offset)
                continue
            self.records_in.inc(len(messages))
            for m in messages:
                handle = ctx.track(part, m.offset)
                review = self._buffer.add(m, handle, self.metrics)
                if review is not None:
                    await ctx.send([Out(review_topic, review.id.encode(),
                                        review.model_dump_json().encode())], done=[handle])
                await ctx.give()

    async def tick(self, ctx: Context) -> None:
        report = self.settings.report
        size = self._buffer.size
        due = self.clock() - self._flushed_at >= report.publish_seconds
        if size >= report.publish_max_fragments or (size and due):
            await self.flush(ctx)

    async def flush(self, ctx: Context) -> None:
        """Merge what the buffer holds, publish each changed report once; the fragments
        are done once every write is delivered (raises if one failed: nothing of this
        buffer is committed and the runtime rejoins)."""
        async with self._lock:
            if self._between_owners:
                return
            work, held = self._buffer.take()
            self._flushed_at = self.clock()
            if not held:
                return
            t = self.settings.topics
            # assigned and loaded: a partition whose reports did not load is not merged
            owned = self.state.loaded & {p.partition for p in ctx.owned() if p.topic == t.fragments}
            now = format_time(datetime.now(UTC))
            outs: list[Out] = []
            for key, pending in work.items():
                if pending.partition not in owned:
                    continue  # moved: its next owner reads these fragments again
                folded = fold(self.parsed.get(key, self.reports.get(key)), pending.fragments,
                              pending.rollups, report_id=key, now=now, hops=pending.hops)
                for result in folded.results:
                    self.metrics.report_updates.labels(result).inc()
                for fragment, why in folded.rejected:
                    review = rejected_review(fragment, why, key)
                    outs.append(Out(t.review, review.id.encode(),
                                    review.model_dump_json().encode()))
                if folded.report is not None:
                    body = folded.report.to_json()
                    self.state.put(key, body, pending.partition)
                    self.parsed.put(key, body, folded.report)
                    outs.append(Out(t.reports, key.encode(), body.encode()))
            done = [h for h in held if h.key.partition in owned]
            await (await ctx.send(outs, done=done))

    async def revoked(self, parts: set[Any], ctx: Context) -> None:
        """Publish what was merged before partitions move; aiokafka waits for it, so a
        partition's next owner loads its reports only after these writes."""
        try:
            await self.flush(ctx)
        finally:
            self._between_owners = True

    async def assigned(self, parts: set[Any], ctx: Context) -> None:
        """Forget the reports of partitions that left, and load the latest version of
        every report of the partitions that arrived. A partition kept through the
        rebalance keeps its state: nobody else owned it in between. If loading fails,
        the new partitions are not merged (an empty state would write reports without
        their earlier records) and the runtime rejoins."""
        self._between_owners = False
        partitions = {p.partition for p in parts if p.topic == self.settings.topics.fragments}
        gained = await self.state.assign(partitions, self.source.read, bytes.decode)
        if gained:
            logger.info("loaded %d report(s) of fragments partitions %s",
                        self.state.keys_in(gained), sorted(gained))

    async def _rollups(self, gateway: Gateway, ctx: Context) -> None:
        topic = self.settings.topics.fragments

        async def send_update(report_id: str, value: bytes) -> None:
            await ctx.send([Out(topic, report_id.encode(), value,
                                headers=((KIND_HEADER, ROLLUP_KIND.encode()),))])

        while True:
            await self.sleep(self.settings.report.rollup_seconds)
            await rollup_pass(list(self.reports.items()), self.parsed, gateway,
                              self.settings, send_update, self.window_before)

    async def drain(self, ctx: Context) -> None:
        """Publish what is buffered."""
        await self.flush(ctx)
