"""Which report a record belongs to: "<UTC bucket>/<group>", and the time format reports use.

A record's report is a function of the record alone (``record_place``): its own
timestamp and fields, never the batch it happened to travel in. Replays and
re-batching after a crash or a rebalance therefore land every record in the same
report, whose coverage check makes counting it twice impossible.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from streams.records import AnyRecord, iso_utc, service_of

if TYPE_CHECKING:
    from streams.report.state.model import Report

logger = logging.getLogger(__name__)

Window = Literal["hour", "day", "week"]
GroupBy = Literal["service", "source", "all"]
UNDATED = "undated"
SHARD_MARK = "#"  # "<report id>#<shard>": the key one share of a report is compacted under
# a time as the clean stage writes it (fixed-width UTC, milliseconds), its hour captured
_UTC_MILLIS = re.compile(r"(\d{4}-\d\d-\d\dT(?:[01]\d|2[0-3])):[0-5]\d:[0-5]\d\.\d{3}Z", re.ASCII)


def record_place(record: AnyRecord, *, window: Window, group_by: GroupBy,
                 shards: int = 1) -> str:
    """The key a record is compacted under, from the record alone.

    The report id's bucket is the record's own timestamp ("undated" without one); its
    group is the record's service (the source when it names none), its source, or
    "all". With ``shards`` > 1 a report is compacted in that many shares, by the
    record's raw partition, so one busy report spreads over partitions and workers;
    readers compose the shares (``report_of`` names the report of a key).
    """
    if window not in _WINDOWS or group_by not in _GROUPS:
        _check(window, group_by)
    if group_by == "all":
        group = "all"
    elif group_by == "service":
        group = service_of(record)
    else:
        group = record.source
    # called for every record of every fragment: a time as records carry it goes
    # straight to its hour's cached report id
    timestamp = record.timestamp
    match = _UTC_MILLIS.fullmatch(timestamp) if timestamp else None
    report_id = _hour_report(match.group(1), window, group) if match is not None else None
    if report_id is None:
        report_id = f"{_bucket_of(timestamp, window)}/{_clean_group(group)}"
    if shards > 1:
        return f"{report_id}{SHARD_MARK}{record.raw.partition % shards}"
    return report_id


@functools.lru_cache(maxsize=4096)
def _hour_report(hour: str, window: Window, group: str) -> str | None:
    """The report id of every time in UTC ``hour`` of ``group``, None if it is no date."""
    bucket = _hour_bucket(hour, window)
    return None if bucket is None else f"{bucket}/{_clean_group(group)}"


def report_of(key: str) -> str:
    """The report id of a compaction key: "2026-11-29/all#3" -> "2026-11-29/all"."""
    return key.split(SHARD_MARK, 1)[0]


def previous_window(report_id: str, ids: Iterable[str]) -> str | None:
    """The id among ``ids`` of the latest earlier window of the same group
    ("2026-11-28/all" for "2026-11-29/all"); None for an undated report or a first one.
    Buckets of one window size sort as text in time order."""
    bucket, _, group = report_of(report_id).partition("/")
    if bucket == UNDATED:
        return None
    earlier = [b for b, _, g in (report_of(i).partition("/") for i in ids)
               if g == group and b != UNDATED and len(b) == len(bucket) and b < bucket]
    return f"{max(earlier)}/{group}" if earlier else None


def link_windows(reports: Mapping[str, Report]) -> None:
    """Tell each report of ``reports`` (by id) the report of its window before, if held."""
    for rid, report in reports.items():
        before = previous_window(rid, reports)
        report.follows(reports.get(before) if before is not None else None)


_WINDOWS = ("hour", "day", "week")
_GROUPS = ("service", "source", "all")


def _check(window: str, group_by: str) -> None:
    if window not in ("hour", "day", "week"):
        raise ValueError(f"report window must be hour, day or week, not {window!r}")
    if group_by not in ("service", "source", "all"):
        raise ValueError(f"report group_by must be service, source or all, not {group_by!r}")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        logger.warning("ignoring timestamp %r: not ISO-8601", value)
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def format_time(value: datetime) -> str:
    """The one time format of reports: fixed-width UTC with milliseconds and "Z"."""
    return iso_utc(value)


def _bucket_of(timestamp: str | None, window: Window) -> str:
    """``_bucket(parse_time(timestamp), window)``; for a time as records carry it, looked
    up per UTC hour, which is all its bucket depends on (hours repeat, times seldom do)."""
    if timestamp:
        match = _UTC_MILLIS.fullmatch(timestamp)
        if match is not None:
            bucket = _hour_bucket(match.group(1), window)
            if bucket is not None:
                return bucket
    return _bucket(parse_time(timestamp), window)


@functools.lru_cache(maxsize=4096)
def _hour_bucket(hour: str, window: Window) -> str | None:
    """The bucket of every time in UTC ``hour`` ("2026-11-28T09"), None if it is no date."""
    try:
        when = datetime.fromisoformat(f"{hour}:00:00.000Z")
    except ValueError:
        return None  # the caller parses the whole time again, and warns
    return _bucket(when, window)


def _bucket(when: datetime | None, window: Window) -> str:
    if when is None:
        return UNDATED
    if window == "hour":
        return when.strftime("%Y-%m-%dT%H")
    if window == "day":
        return when.strftime("%Y-%m-%d")
    iso = when.isocalendar()
    return f"{iso.year}-W{iso.week:02d}"


@functools.lru_cache(maxsize=4096)
def _clean_group(value: str) -> str:
    """A group is one path segment of a report id: no slashes, no whitespace (cached: a
    stream has few services and sources)."""
    value = re.sub(r"[\s/]+", "_", value.strip())
    return value or "unknown"
