"""A cause cut to one incident: its records in some services and minutes (pure).

A cause (``causes.py``) groups one failure's records over the whole report, which may
hold several incidents of it: a service failing at 09:03 and again at 09:22, or the
same "Service discovery" failure in callers of different services. The post-mortem
tells each incident from its own part of such a cause, counted from the report's
series (records per service, template and minute), and the rest is left for the
other incidents.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta

from streams.report.analysis.causes import Cause
from streams.report.state.keys import parse_time
from streams.report.state.minutes import (
    MINUTE_FORMAT,
    add_minutes,
    minute_counts,
    minute_time,
    parse_minute,
)
from streams.report.state.model import Incident, Series
from streams.report.state.series import earliest_per_minute

ByService = dict[str, dict[str, int]]  # service -> minute -> records
ANY_SERVICE = ""  # a cause's records whose services the series cannot tell apart


def minutes_of(cause: Cause, by_key: Mapping[str, Incident]) -> dict[str, int]:
    """``cause``'s records per minute, from its incidents' evidence."""
    return add_minutes(*(minute_counts(by_key[k].evidence) for k in cause.keys if k in by_key))


@dataclass(frozen=True, slots=True)
class Minutes:
    """Where a cut falls: ``start`` to ``end`` (minute keys, both kept), and the records
    up to ``tail_s`` after them with it, before ``until`` (the next incident's)."""

    start: str
    end: str
    until: str | None
    tail_s: float


@dataclass(frozen=True, slots=True)
class CauseRecords:
    """Each cause's records per service and minute, counted once (a part cut from a
    cause has its own)."""

    by_key: Mapping[str, Incident]
    series: Mapping[str, Mapping[str, Series]]
    # id(cause) -> (the cause, its records, each minute's earliest failing record's time)
    counted: dict[int, tuple[Cause, ByService, dict[str, str]]] = field(default_factory=dict)

    def of(self, cause: Cause) -> tuple[ByService, dict[str, str]]:
        """``cause``'s records per service and minute, and each minute's earliest failing
        record's time: a part's own, else its templates' series in its services; where
        the series hold none of them (a model that named its templates otherwise), all
        its records per minute under ``ANY_SERVICE``, without times."""
        known = self.counted.get(id(cause))
        if known is not None and known[0] is cause:
            return known[1], known[2]
        templates = {ev.template for key in cause.keys if key in self.by_key
                     for ev in self.by_key[key].evidence}
        per: ByService = {}
        held: list[Series] = []
        for service in cause.services:
            found = [s for t in sorted(templates)
                     if (s := self.series.get(service, {}).get(t)) is not None]
            if found:
                per[service] = add_minutes(*(s.minutes for s in found))
            held += found
        starts = earliest_per_minute(s.starts for s in held)
        if not per:
            per = {ANY_SERVICE: minutes_of(cause, self.by_key)}
        self.keep(cause, per, starts)  # asked again for each incident it may tell of
        return per, starts

    def keep(self, cause: Cause, per: ByService, starts: dict[str, str]) -> Cause:
        self.counted[id(cause)] = (cause, per, starts)
        return cause


def minute_of(stamp: str, shift: int) -> str | None:
    """The minute key of ``stamp`` moved by ``shift`` minutes."""
    when = parse_time(stamp)
    if when is None:
        return None
    return (when + timedelta(minutes=shift)).strftime(MINUTE_FORMAT)


def cut(cause: Cause, services: set[str], where: Minutes, records: CauseRecords
        ) -> tuple[Cause, Cause | None] | None:
    """The part of ``cause`` in ``services`` and ``where``, and the rest of it (None
    when there is none); None when no record of it is there."""
    per, starts = records.of(cause)
    mine = [service for service in per if service in services or service == ANY_SERVICE]
    start, end = where.start, where.end
    if not any(start <= m <= end for service in mine for m in per[service]):
        return None
    # its records right after go with it, as a cause that soon after joins an episode:
    # a failure winding down writes a line or two after its last departing minute
    for minute in sorted({m for service in mine for m in per[service] if m > end}):
        if (where.until is not None and minute >= where.until) or (
                parse_minute(minute) - parse_minute(end)).total_seconds() > where.tail_s:
            break
        end = minute
    inside: ByService = {}
    for service in mine:
        kept = {m: n for m, n in per[service].items() if start <= m <= end}
        if kept:
            inside[service] = kept
    left: ByService = {}
    for service, minutes in per.items():
        rest = {m: n for m, n in minutes.items() if m not in inside.get(service, {})}
        if rest:
            left[service] = rest
    if not left:
        return cause, None
    count = sum(n for minutes in inside.values() for n in minutes.values())
    # what its counts said of it all ("first seen 09:03") is told as of it all
    anomaly = (f"{cause.anomaly}; {count:,} of its {cause.count:,} records fall in this "
               "incident's minutes") if cause.anomaly else None
    part = _spanning(cause, inside, starts, count, anomaly)
    rest = _spanning(cause, left, starts, max(cause.count - count, 0), cause.anomaly)
    return records.keep(part, inside, starts), records.keep(rest, left, starts)


def dated_by(cause: Cause, per: ByService, starts: dict[str, str], first: str, last: str
             ) -> Cause:
    """``cause`` dated by its records ``per`` from minute ``first`` to ``last`` (a burst
    of it); its count and services stay all of its records'."""
    inside = {service: {m: n for m, n in minutes.items() if first <= m <= last}
              for service, minutes in per.items()}
    inside = {service: minutes for service, minutes in inside.items() if minutes}
    if not inside:
        return cause
    return replace(_spanning(cause, inside, starts, cause.count, cause.anomaly),
                   services=cause.services)


def _spanning(cause: Cause, per: ByService, starts: dict[str, str], count: int,
              anomaly: str | None) -> Cause:
    """``cause`` told of the records ``per`` alone: in their services, dated by its own
    first and last record where they fall in their minutes, else by the first minute's
    earliest failing record and the last minute's end."""
    minutes = add_minutes(*per.values())
    first, last = min(minutes), max(minutes)
    first_seen = cause.first_seen if _in_minute(cause.first_seen, first) \
        else starts.get(first) or minute_time(first)
    last_seen = cause.last_seen if _in_minute(cause.last_seen, last) \
        else minute_time(_minute_after(last))
    services = list(cause.services) if ANY_SERVICE in per \
        else [s for s in cause.services if s in per]
    return replace(cause, count=count, services=services, first_seen=first_seen,
                   last_seen=last_seen, burst=None, anomaly=anomaly)


def _in_minute(stamp: str | None, minute: str) -> bool:
    when = parse_time(stamp)
    return when is not None and when.strftime(MINUTE_FORMAT) == minute


def _minute_after(minute: str) -> str:
    return (parse_minute(minute) + timedelta(minutes=1)).strftime(MINUTE_FORMAT)
