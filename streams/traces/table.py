"""Open traces and the hops into services they show (pure: no Kafka, clock injected).

A request's trace id is on the lines of every service it passed through. In a trace, a
service's first line comes after the line its caller wrote just before calling it: the
time between the two is the **hop** into the service (the network to it, its queue,
its start of work). A slowed service (a delayed network, a starved CPU) shows there
while its own lines and its callers' errors may say nothing.

A trace is complete when no more of its lines can come. Lines of one trace come from
several input partitions, cleaned by several workers, so a trace closes only when

* no line of it came for ``HOLD_SECONDS`` (as tracing backends close a trace after an
  idle period), and
* every input partition still sending has moved ``GRACE_MS`` past its last line in
  event time (a partition far behind, a replay say, may still hold some of its lines),
* and the table is ``IDLE_SECONDS`` old: a new owner has heard from every input that
  is sending before it trusts the ones it heard from.

A service that failed in a request (a line at WARN or above) after calling another is
linked to the one it called last before its first failing line (``failed_calls_of``):
a caller's generic "500" then points at the callee whose own lines did not fail, an
early return, say.

Which line a service wrote right after which in a request (``next_lines_of``) tells an
early return from routine: a line it always writes after another goes missing while
that one goes on.

Lines of a trace that arrive after it closed are dropped for ``REMEMBER_MS`` (their hops
would be counted twice, from half a trace).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from streams.intervals import Coverage
from streams.records import HopsUpdate, TraceHops, TraceMark, minute_of

HOLD_SECONDS = 5.0
GRACE_MS = 30_000
REMEMBER_MS = 10 * 60_000
IDLE_SECONDS = 10.0  # an input partition silent this long holds no trace open


def hop_bin(delay_ms: float) -> int:
    """Half-octave bins: 0 below 1 ms, then 1 + floor(2 log2 ms), so bin b + 4 is four
    times slower than bin b."""
    return 0 if delay_ms < 1 else 1 + int(2 * math.log2(delay_ms))


def epoch_ms(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp).timestamp() * 1000)


def hops_of(marks: Iterable[TraceMark]) -> list[tuple[TraceMark, str, int]]:
    """(the service's first mark, its caller, the hop into it in ms) for every service
    of a trace but the one it began in: the time since the line just before, which
    another service, its caller, wrote. Lines of one millisecond are ordered by
    service, never by where they were read: a replay through other partitions times
    the same hops."""
    ordered = sorted(((epoch_ms(m.timestamp), m.service, m.id, m) for m in marks),
                     key=lambda x: x[:3])
    seen: set[str] = set()
    out = []
    for i, (at, _, _, mark) in enumerate(ordered):
        if mark.service in seen:
            continue
        seen.add(mark.service)
        if i:
            out.append((mark, ordered[i - 1][3].service, at - ordered[i - 1][0]))
    return out


def failed_calls_of(marks: Collection[TraceMark],
                    hops: Iterable[tuple[TraceMark, str, int]] | None = None
                    ) -> list[tuple[TraceMark, str]]:
    """(a service's first failing mark, the service it called last before it) for each
    service that failed in a trace after calling another: a call is a hop whose caller
    it is (``hops``: the trace's ``hops_of``), made when the callee's first line came."""
    if not any(m.failing for m in marks):  # most requests fail nowhere
        return []
    ordered = sorted(marks, key=lambda m: (epoch_ms(m.timestamp), m.service, m.id))
    called: dict[str, list[tuple[int, str]]] = {}  # caller -> (when, callee) in time order
    for mark, caller, _ in hops_of(ordered) if hops is None else hops:
        called.setdefault(caller, []).append((epoch_ms(mark.timestamp), mark.service))
    out = []
    seen: set[str] = set()
    for mark in ordered:
        if not mark.failing or mark.service in seen:
            continue
        seen.add(mark.service)
        at = epoch_ms(mark.timestamp)
        before = [callee for when, callee in called.get(mark.service, ()) if when <= at]
        if before:
            out.append((mark, before[-1]))
    return out


def next_lines_of(marks: Iterable[TraceMark]) -> list[tuple[str, str, str, str, int]]:
    """(service, UTC minute, template, the template of the service's next line in the
    trace or "" when none came, times) for each line of each service: in time order,
    lines of one millisecond in the order they were written (their raw coordinates).
    Marks of an older clean stage carry no template and count nothing."""
    by_service: dict[str, list[tuple[int, str, int, int, int, TraceMark]]] = {}
    for m in marks:
        if m.template:
            by_service.setdefault(m.service, []).append(
                (epoch_ms(m.timestamp), m.raw.topic, m.raw.partition, m.raw.offset,
                 m.raw.index or 0, m))
    counts: dict[tuple[str, str, str, str], int] = {}
    for service, lines in by_service.items():
        lines.sort(key=lambda x: x[:5])
        for i, (*_, mark) in enumerate(lines):
            minute = minute_of(mark.timestamp)
            if minute is None:
                continue
            after = lines[i + 1][5].template if i + 1 < len(lines) else ""
            key = (service, minute, mark.template, after)
            counts[key] = counts.get(key, 0) + 1
    return [(*key, n) for key, n in sorted(counts.items())]


@dataclass
class OpenTrace:
    """One trace's marks so far, and what its messages are tracked by."""

    marks: dict[str, TraceMark] = field(default_factory=dict)  # by record id
    tags: list[Any] = field(default_factory=list)  # the caller's, one per message
    offsets: list[tuple[str, int, int]] = field(default_factory=list)  # its messages
    last_ms: int = 0
    touched: float = 0.0  # when its latest message arrived (the injected clock)


class TraceTable:
    """The open traces of one traces-topic partition."""

    def __init__(self, *, since: float = 0.0, hold_seconds: float = HOLD_SECONDS,
                 grace_ms: int = GRACE_MS, remember_ms: int = REMEMBER_MS,
                 idle_seconds: float = IDLE_SECONDS) -> None:
        self.since = since  # when the table began (the injected clock)
        self.hold_seconds = hold_seconds
        self.grace_ms = grace_ms
        self.remember_ms = remember_ms
        self.idle_seconds = idle_seconds
        self.open: dict[str, OpenTrace] = {}
        self.closed: set[str] = set()  # traces whose late lines drop
        # (last line, trace) of the closed ones, a heap: a check costs what it forgets,
        # not all it remembers
        self._closing: list[tuple[int, str]] = []
        # input partition -> (its latest line in event time, when a mark of it came)
        self.progress: dict[tuple[str, int], tuple[int, float]] = {}
        self.late = 0  # marks dropped because their trace had closed

    def add(self, mark: TraceMark, at: tuple[str, int, int], tag: Any, now: float) -> bool:
        """Take one mark (``at``: where its message is); False when its trace closed
        already, so the caller is done with ``tag`` at once."""
        when = epoch_ms(mark.timestamp)
        source = (mark.raw.topic, mark.raw.partition)
        latest = self.progress.get(source)
        self.progress[source] = (when if latest is None else max(latest[0], when), now)
        if mark.trace in self.closed:
            self.late += 1
            return False
        trace = self.open.get(mark.trace)
        if trace is None:
            trace = self.open[mark.trace] = OpenTrace(last_ms=when)
        trace.marks.setdefault(mark.id, mark)
        trace.tags.append(tag)
        trace.offsets.append(at)
        trace.last_ms = max(trace.last_ms, when)
        trace.touched = now
        return True

    def watermark(self, now: float) -> float:
        """The event time every input partition still sending has reached; infinite when
        none is (everything sent is in)."""
        active = [ms for ms, seen in self.progress.values() if now - seen < self.idle_seconds]
        return float(min(active)) if active else math.inf

    def due(self, now: float) -> list[OpenTrace]:
        """Close and return the traces that are complete."""
        if now - self.since < self.idle_seconds:
            return []
        mark = self.watermark(now)
        done = [t for t, trace in self.open.items()
                if now - trace.touched >= self.hold_seconds
                and trace.last_ms + self.grace_ms <= mark]
        out = [self._close(t) for t in done]
        if self._closing:  # forgotten once the newest line is REMEMBER_MS past them
            newest = max(ms for ms, _ in self.progress.values())
            while self._closing and self._closing[0][0] + self.remember_ms <= newest:
                self.closed.discard(heapq.heappop(self._closing)[1])
        return out

    def flush(self) -> list[OpenTrace]:
        """Close every trace (the input has ended)."""
        return [self._close(t) for t in list(self.open)]

    def _close(self, trace_id: str) -> OpenTrace:
        trace = self.open.pop(trace_id)
        self.closed.add(trace_id)
        heapq.heappush(self._closing, (trace.last_ms, trace_id))
        return trace


def hop_updates(traces: Iterable[OpenTrace], place: Callable[[TraceMark], str]
                ) -> list[HopsUpdate]:
    """The hops, failed calls and next lines of closed ``traces``, one update per report;
    ``place``: the report of a record (``record_place``), here of the service's first
    line (of the caller's first failing line, for a failed call)."""
    by_report: dict[str, list[TraceHops]] = {}
    for trace in traces:
        hops: dict[str, list[tuple[str, str, int, str] | tuple[str, str, int]]] = {}
        failed: dict[str, list[tuple[str, str, str]]] = {}
        timed = hops_of(trace.marks.values())
        for mark, caller, delay in timed:
            minute = minute_of(mark.timestamp)
            if minute is not None:
                hops.setdefault(place(mark), []).append(
                    (mark.service, minute, hop_bin(delay), caller))
        for mark, callee in failed_calls_of(trace.marks.values(), timed):
            minute = minute_of(mark.timestamp)
            if minute is not None:
                failed.setdefault(place(mark), []).append((mark.service, callee, minute))
        nexts: dict[str, list[tuple[str, str, str, str, int]]] = {}
        steps = next_lines_of(trace.marks.values())
        if steps:  # to the report of the service's first line, as its hop
            firsts: dict[str, TraceMark] = {}
            for mark in trace.marks.values():
                held = firsts.get(mark.service)
                if held is None or (mark.timestamp, mark.id) < (held.timestamp, held.id):
                    firsts[mark.service] = mark
            where = {service: place(mark) for service, mark in firsts.items()}
            for step in steps:
                nexts.setdefault(where[step[0]], []).append(step)
        if not hops and not failed and not nexts:
            continue
        covered = Coverage.from_coords(trace.offsets).to_json()
        for report_id in sorted(hops.keys() | failed.keys() | nexts.keys()):
            by_report.setdefault(report_id, []).append(TraceHops(
                covered=covered, hops=hops.get(report_id, []),
                failed=failed.get(report_id, []), next_lines=nexts.get(report_id, [])))
    return [HopsUpdate(report_id=r, traces=t) for r, t in sorted(by_report.items())]
