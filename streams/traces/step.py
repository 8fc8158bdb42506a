"""The trace stage as a step: trace marks in, each complete trace's hops out.

The clean stage sends a mark for every dated record with a trace id to the traces
topic, keyed by the trace id, so all lines of a request meet in one partition whatever
worker cleaned them. Each partition's open traces wait in a ``TraceTable``; a trace
that is complete goes to the reports of its services as hops (on the fragments topic,
``KIND_HEADER`` "hops"), and its marks are done once those are delivered. A crash or a
rebalance re-reads the marks of traces still open (after a rebalance Kafka reads every
partition again from its commit); a trace sent again is skipped by the report, which
counts marks by their coordinates.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from streams.metrics import Metrics
from streams.records import HOPS_KIND, KIND_HEADER, TraceMark, read_mark
from streams.runtime.step import Context, Fetch, Out, Part, Step
from streams.settings import Settings
from streams.traces.table import OpenTrace, TraceTable, hop_updates

logger = logging.getLogger(__name__)

_HEADERS = ((KIND_HEADER, HOPS_KIND.encode()),)
CHECK_SECONDS = 0.5  # how often the open traces are looked over: each look costs all of them


class TraceStep(Step):
    """Marks of the owned traces partitions -> hops into services, per report."""

    name = "trace loop"

    def __init__(self, settings: Settings, metrics: Metrics,
                 place: Callable[[TraceMark], str], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fragments = settings.topics.fragments
        self.place = place
        self.clock = clock
        self.marks = {o: metrics.trace_marks.labels(o) for o in ("timed", "late", "unreadable")}
        self.tables: dict[Part, TraceTable] = {}
        self._checked = -CHECK_SECONDS

    def begin(self, ctx: Context) -> None:
        self.tables.clear()

    async def take(self, fetch: Fetch, ctx: Context) -> None:
        now = self.clock()
        for part, messages in fetch.items():
            table = self.tables.get(part)
            if table is None:
                table = self.tables[part] = TraceTable(since=now)
            for m in messages:
                handle = ctx.track(part, m.offset)
                try:
                    mark = read_mark(m.value or b"")
                except ValueError as exc:  # not a mark: nothing to time, never a stuck partition
                    logger.warning("unreadable trace mark at %s[%s]@%s skipped: %s",
                                   m.topic, m.partition, m.offset, exc)
                    self.marks["unreadable"].inc()
                    ctx.done(handle)
                    continue
                if not table.add(mark, (m.topic, m.partition, m.offset), handle, now):
                    self.marks["late"].inc()
                    ctx.done(handle)  # its trace was sent already: a late line
        await self.tick(ctx)

    async def tick(self, ctx: Context) -> None:
        now = self.clock()
        if now - self._checked < CHECK_SECONDS:
            return
        self._checked = now
        await self._send([t for table in self.tables.values() for t in table.due(now)], ctx)

    async def revoked(self, parts: set[Any], ctx: Context) -> None:
        """Open traces are let go: after a rebalance every partition, kept or not, is
        read again from its commit, so their marks come back (to whoever owns them)."""
        for part in parts:
            self.tables.pop(part, None)
            ctx.forget(part)

    async def _send(self, closed: list[OpenTrace], ctx: Context) -> None:
        if not closed:
            return
        handles = [h for trace in closed for h in trace.tags]
        self.marks["timed"].inc(len(handles))
        outs = [Out(self.fragments, u.report_id.encode(), u.model_dump_json().encode(),
                    _HEADERS) for u in hop_updates(closed, self.place)]
        if not outs:  # traces of one service: no hop
            for handle in handles:
                ctx.done(handle)
            return
        await ctx.send(outs, done=handles)
