"""The notifier as a step: report versions in, incident changes decided, sent, recorded.

The loop is a consumer group of its own on the compacted notifications topic, where
each report's ledger (``streams.notify.ledger``) is one message keyed by the report
id. Owning a partition of that topic is what makes a member the one notifier of the
reports whose ids hash to it, however many workers run: on assignment it loads those
ledgers, as the compactor loads its reports; before a partition moves it finishes the
send in hand and records it, so the next owner knows what was said.

A report is composed of shares that other members compact, so the notifier reads the
composed reports a follower of the reports topic holds (the one the HTTP views use).
On each new version, and every second meanwhile, it plans: ``alerts_for`` the report
(its incidents of the day, one alert each), ``Planner.plan`` against the ledger, and
any change decided is written to the ledger before it is sent (so a restart sends it,
never forgets it). Sends run off that path: each sink has a bounded queue and a task
of its own, so a slow or failing sink never holds the reports, the ledger or the other
sink back; a full queue drops the send and counts it, and the next round queues it
again, as the ledger still owes it. Once a sink takes a change its count in the ledger
moves on, so a re-read, a restart or a new owner does not send it twice; only a crash
between a sink's answer and that record repeats the one change in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, Protocol

from streams.clock import Clock, Sleep
from streams.metrics import Metrics
from streams.notify.incidents import Alert, alerts_for
from streams.notify.ledger import Notices, Planner
from streams.notify.messages import alertmanager_alerts, report_link, webhook_message
from streams.notify.sinks import MAX_WAIT, Sink
from streams.redact import Redactor
from streams.report.analysis.departures import Walk
from streams.report.state.keys import UNDATED, format_time, parse_time
from streams.report.state.model import Report
from streams.runtime.state import PartitionedState
from streams.runtime.step import Context, Fetch, Out, Step
from streams.settings import Settings

logger = logging.getLogger(__name__)
DERIVE_BACKOFF = 4.0  # a report's incidents take at most a fifth of the notifier's time

TICK_SECONDS = 1.0  # at least one planning round this often (refreshes, windows ending)
# at most one this often: a version that changed a page waits for the next round, and
# versions come every second or less while records flow, so a round a tick made most
# pages wait most of a second (deriving is throttled per report by DERIVE_BACKOFF)
ROUND_SECONDS = 0.2
QUIET_SECONDS = 600.0  # a window no record reached this long, with a later one begun, is over


class Reports(Protocol):
    """The latest reports composed from their shares (``streams.report.store``)."""

    def ids(self) -> list[str]: ...

    def get(self, report_id: str) -> Report | None: ...


class LedgerSource(Protocol):
    async def read(self, partitions: set[int]) -> list[tuple[str, bytes | None, int]]:
        """(report id, latest ledger or None for a tombstone, partition) of every
        report ledger on ``partitions`` of the notifications topic."""
        ...


PartitionOf = Callable[[bytes, int], int]  # (key, partition count) -> the key's partition


class NotifyStep(Step):
    """Plans on report versions, records in the ledger, sends from per-sink queues."""

    name = "notify loop"

    def __init__(self, settings: Settings, metrics: Metrics, *, reports: Reports,
                 source: LedgerSource, sinks: list[Sink], partition_of: PartitionOf,
                 changed: asyncio.Event | None = None,
                 ready: asyncio.Event | None = None,
                 mono: Clock = time.monotonic, sleep: Sleep = asyncio.sleep,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 tick_seconds: float = TICK_SECONDS,
                 round_seconds: float = ROUND_SECONDS) -> None:
        self.settings = settings
        self.metrics = metrics
        self.reports = reports
        self.source = source
        self.sinks = sinks
        self.partition_of = partition_of
        self.changed = changed
        self.ready = ready  # set once the reports are read to the end: none lacks a share
        self.mono = mono  # the planning rounds and the refreshes go by this clock
        self.sleep = sleep  # and wait with this sleep: tests pass a fake pair
        self.wall = wall
        self.tick_seconds = tick_seconds
        self.round_seconds = round_seconds
        self.topic = settings.topics.notifications
        n = settings.notify
        self.planner = Planner(min_severity=n.min_severity, end_after=n.end_after_seconds,
                               silent_after=n.silent_after_seconds)
        self.redactor = Redactor.from_settings(settings)
        # report id -> its ledger, of the partitions assigned and loaded
        self.state: PartitionedState[Notices] = PartitionedState()
        self._between_owners = False
        # report -> (its revision, its alerts, when they were derived, what that cost)
        self._alerts: dict[str, tuple[tuple[Any, ...], list[Alert], float, float]] = {}
        self._walks: dict[str, Walk] = {}  # report -> its baseline walk so far
        self._queues: dict[str, asyncio.Queue[tuple[str, str]]] = {}
        self._queued: set[tuple[str, str, str]] = set()
        self._idle: dict[str, asyncio.Event] = {}
        self._refreshed_at: float | None = None
        self._failure: str | None = None
        self._planning_now = asyncio.Lock()  # held while a round decides and records

    # ------------------------------------------------------------------ runtime

    def begin(self, ctx: Context) -> None:
        self._failure = None
        self.state.clear()
        self._between_owners = False
        self._queued.clear()
        size = self.settings.notify.queue_size
        self._queues = {s.name: asyncio.Queue(maxsize=size) for s in self.sinks}
        self._idle = {s.name: asyncio.Event() for s in self.sinks}
        for event in self._idle.values():
            event.set()

    def background(self, ctx: Context) -> list[Any]:
        return [self._guarded("planning", lambda: self._planning(ctx)), *self.senders(ctx)]

    def senders(self, ctx: Context) -> list[Any]:
        """One task per sink, taking its queue's sends in order."""
        return [self._guarded(f"sending to {s.name}", functools.partial(self._sending, ctx, s))
                for s in self.sinks]

    def failure(self) -> str | None:
        return self._failure

    async def _guarded(self, what: str, task: Callable[[], Coroutine[Any, Any, None]]
                       ) -> None:
        """A task that stops with an error ends the membership instead of leaving the
        partitions owned by a member that no longer plans or sends."""
        try:
            await task()
        except Exception as exc:
            logger.exception("notify: %s stopped", what)
            self._failure = f"{what} failed: {exc!r}"

    async def take(self, fetch: Fetch, ctx: Context) -> None:
        """The ledger messages are this member's own writes (or were loaded on
        assignment): nothing to do but let the commit pass them."""
        for part, messages in fetch.items():
            for m in messages:
                ctx.done(ctx.track(part, m.offset))

    async def assigned(self, parts: set[Any], ctx: Context) -> None:
        """Forget the ledgers of partitions that left, load those that arrived."""
        self._between_owners = False
        partitions = {p.partition for p in parts if p.topic == self.topic}
        gained = await self.state.assign(partitions, self.source.read, Notices.from_bytes)
        if gained:
            logger.info("notify: loaded the ledgers of %d report(s) of partitions %s",
                        self.state.keys_in(gained), sorted(gained))

    async def revoked(self, parts: set[Any], ctx: Context) -> None:
        """Stop planning and sending; the send in flight finishes and is recorded before
        the partitions move (aiokafka waits for this)."""
        self._between_owners = True
        await self._quiet()

    async def drain(self, ctx: Context) -> None:
        self._between_owners = True
        await self._quiet()
        for sink in self.sinks:
            await sink.close()

    async def _quiet(self) -> None:
        """Wait (bounded) for the planning round and the sends in flight: what they
        decided or delivered is recorded before the next owner loads the ledgers."""

        async def settled() -> None:
            async with self._planning_now:
                pass
            await asyncio.gather(*(e.wait() for e in self._idle.values()))

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(settled(), timeout=self.settings.notify.timeout_seconds + 5)


    @property
    def ledger(self) -> dict[str, Notices]:
        """Each owned report's ledger."""
        return self.state.values

    # ------------------------------------------------------------------ planning

    async def _planning(self, ctx: Context) -> None:
        if self.ready is not None:  # a report read in part could look ended, or gone
            await self.ready.wait()
        while True:
            began = self.mono()
            if not self._between_owners and self.state.loaded:
                await self.plan(ctx)
            await self._wake(began)

    async def _wake(self, began: float) -> None:
        """Until the next round: a tick after this one ``began``, or as soon as a report
        changes but never within ``round_seconds`` of it, however busy the reports are."""
        if self.changed is None:  # nothing tells of changes: a round a tick
            await self.sleep(max(self.tick_seconds - (self.mono() - began), 0.0))
            return
        await self.sleep(max(self.round_seconds - (self.mono() - began), 0.0))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(),
                                   timeout=max(self.tick_seconds - (self.mono() - began), 0.0))
        self.changed.clear()

    async def plan(self, ctx: Context) -> None:
        """One round over the owned reports: decide, record, queue what is owed."""
        async with self._planning_now:
            await self._plan(ctx)

    async def _plan(self, ctx: Context) -> None:
        count = ctx.partition_count(self.topic)
        if count == 0:
            return
        ids = [rid for rid in self.reports.ids() if not rid.startswith(UNDATED)]
        latest = latest_windows(ids)
        mono = self.mono()
        wall = self.wall()
        now = format_time(wall)
        n = self.settings.notify
        refresh = self._refreshed_at is None or mono - self._refreshed_at >= n.refresh_seconds
        owned = set()
        for rid in ids:
            home = self.partition_of(rid.encode(), count)
            if home not in self.state.loaded or self._between_owners:
                continue
            owned.add(rid)
            notices = self.ledger.get(rid)
            report = self.reports.get(rid)
            if report is None:
                continue
            alerts = self._alerts_of(report, closed=window_over(report, latest, wall))
            if not alerts and (notices is None or not any(e.open for e in notices.entries)):
                continue
            if notices is None:
                notices = Notices(report_id=rid)
            if self.planner.plan(notices, alerts, now=now, mono=mono):
                self.ledger[rid] = notices
                await self._write(ctx, rid)
            self.state.home[rid] = home
            for entry in notices.entries:
                for sink in self.sinks:
                    am_refresh = refresh and entry.open and sink.name == "alertmanager"
                    if entry.owed(sink.name) > 0 or am_refresh:
                        self._enqueue(sink, rid, entry.id)
            await ctx.give()
        if not self._between_owners:  # a report another member took over is walked there
            for rid in self._walks.keys() - owned:
                del self._walks[rid]
        if refresh:
            self._refreshed_at = mono

    def _alerts_of(self, report: Report, *, closed: bool) -> list[Alert]:
        """The report's incidents, derived once per version, and no sooner after the last
        derivation than DERIVE_BACKOFF times what it cost: late in a busy day a report
        takes seconds to walk and new versions come every few, so deriving each one
        would take the worker's whole time; a page then waits a few seconds more."""
        rid = report.id
        revision = (report.version, report.updated_at, report.record_count, closed)
        held = self._alerts.get(rid)
        began = self.mono()
        if held is not None and (held[0] == revision
                                 or began - held[2] < DERIVE_BACKOFF * held[3]):
            return held[1]
        # the baseline walk is kept while the report grows; a closed one grows no more
        walk = self._walks.pop(rid, None) if closed else self._walks.setdefault(rid, Walk())
        try:
            alerts = alerts_for(
                report, redactor=self.redactor, closed=closed,
                resolve_after_minutes=self.settings.notify.resolve_after_minutes, walk=walk)
        except Exception:  # one unreadable report must not silence the others
            logger.exception("notify: the incidents of report %s could not be derived", rid)
            alerts = []
        self._alerts[rid] = (revision, alerts, began, self.mono() - began)
        return alerts

    async def _write(self, ctx: Context, rid: str) -> None:
        """Record the report's ledger; returns once it is delivered (raises if not: the
        runtime then rejoins and the ledger is loaded again)."""
        value = self.ledger[rid].to_bytes()
        await (await ctx.send([Out(self.topic, rid.encode(), value)]))

    # ------------------------------------------------------------------ sending

    def _enqueue(self, sink: Sink, rid: str, entry_id: str) -> None:
        job = (sink.name, rid, entry_id)
        if job in self._queued:
            return
        try:
            self._queues[sink.name].put_nowait((rid, entry_id))
        except asyncio.QueueFull:
            sink.dropped()  # the ledger still owes it: the next round queues it again
            return
        self._queued.add(job)

    async def _sending(self, ctx: Context, sink: Sink) -> None:
        queue = self._queues[sink.name]
        idle = self._idle[sink.name]
        while True:
            rid, entry_id = await queue.get()
            idle.clear()
            try:
                outcome = await self._deliver(ctx, sink, rid, entry_id)
            finally:
                self._queued.discard((sink.name, rid, entry_id))
                idle.set()
            if outcome == "failed":  # the sink is down: let it be a while
                await self.sleep(MAX_WAIT)

    async def _deliver(self, ctx: Context, sink: Sink, rid: str, entry_id: str) -> str:
        notices = self.ledger.get(rid)
        entry = notices.entry(entry_id) if notices is not None else None
        if entry is None or self._between_owners:
            return "stopped"
        link = report_link(self.settings, rid)

        def stop() -> bool:
            return self._between_owners

        if sink.name == "alertmanager":
            owed = len(entry.changes)
            outcome = await sink.send(alertmanager_alerts(
                entry, link=link, now=self.wall(),
                refresh_seconds=self.settings.notify.refresh_seconds), stop=stop)
            if outcome in ("sent", "rejected") and entry.delivered.get(sink.name, 0) < owed:
                entry.delivered[sink.name] = owed
                await self._write(ctx, rid)
            return outcome
        outcome = "sent"
        while entry.owed(sink.name) > 0:
            n = entry.delivered.get(sink.name, 0)
            outcome = await sink.send(webhook_message(entry, n, link=link), stop=stop)
            if outcome not in ("sent", "rejected"):
                break
            entry.delivered[sink.name] = n + 1
            await self._write(ctx, rid)
        return outcome


def _group(rid: str) -> str:
    return rid.split("/", 1)[-1]


def _bucket(rid: str) -> str:
    return rid.split("/", 1)[0]


def window_over(report: Report, latest: dict[str, str], now: datetime) -> bool:
    """Whether the report's window is over: a later window of its group has begun and
    no record has reached this one for QUIET_SECONDS. A window that still grows is not
    over, whatever else began: records without a time of their own are dated when
    they arrive, so a replay of old logs opens today's window beside it."""
    if latest.get(_group(report.id)) == _bucket(report.id):
        return False
    updated = parse_time(report.updated_at)
    return updated is None or (now - updated).total_seconds() >= QUIET_SECONDS


def latest_windows(ids: list[str]) -> dict[str, str]:
    """Per group, its latest window: an incident of an earlier one goes on there, if
    at all."""
    latest: dict[str, str] = {}
    for rid in ids:
        group, bucket = _group(rid), _bucket(rid)
        if bucket > latest.get(group, ""):
            latest[group] = bucket
    return latest
