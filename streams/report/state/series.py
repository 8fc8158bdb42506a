"""Every template's records per minute, per service: the report's memory of what is usual.

Fragments bring each template's minute counts, level, the callees its failures name
and its failing records' trace ids (``Evidence``); the merge adds the share of them
its ledger has not counted yet, exactly as it does for ``service_minutes``, so the
series are a function of the records counted, not of how batches were cut or in which
order they came. A service keeps at most ``MAX_SERIES`` templates: past that the least
frequent share one ``OTHER_TEMPLATES`` series, so a service that logs ids in its
template cannot grow a report without bound (a day is at most 1,440 minutes per series).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from streams.records import LEVEL_RANK, smallest_traces
from streams.report.state.minutes import add_minutes
from streams.report.state.model import OTHER_TEMPLATES, Series

MAX_SERIES = 200  # templates kept per service

SeriesTable = dict[str, dict[str, Series]]


def higher_level(a: str | None, b: str | None) -> str | None:
    """The more severe of two levels (None: unknown, below every level)."""
    if a is None or (b is not None and LEVEL_RANK.get(b, 0) > LEVEL_RANK.get(a, 0)):
        return b
    return a


def earliest(times: Iterable[str | None]) -> str | None:
    """The earliest of some UTC ISO-8601 times (as text they sort in time order)."""
    return min((t for t in times if t), default=None)


def earliest_per_minute(parts: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """Per minute, the earliest of the times the parts give for it."""
    out: dict[str, str] = {}
    for part in parts:
        for minute, time in part.items():
            held = out.get(minute)
            if held is None or time < held:
                out[minute] = time
    return dict(sorted(out.items()))


def add_counts(*counts: Mapping[str, int]) -> dict[str, int]:
    """Counts summed per name, in name order."""
    out: dict[str, int] = {}
    for part in counts:
        for name, n in part.items():
            out[name] = out.get(name, 0) + n
    return dict(sorted(out.items()))


def add_series(*tables: Mapping[str, Mapping[str, Series]]) -> SeriesTable:
    """Series tables summed: per service and template, minutes and named counts added,
    the higher level kept; services and templates in name order, each service capped.
    A series found in one table only is shared with the result (series are values: no
    one changes one in place), so merging a fragment costs what it touches, not the day."""
    parts: dict[str, dict[str, list[Series]]] = {}
    for table in tables:
        for service, templates in table.items():
            mine = parts.setdefault(service, {})
            for template, series in templates.items():
                mine.setdefault(template, []).append(series)
    out: SeriesTable = {}
    for service in sorted(parts):
        summed = {}
        for template, group in parts[service].items():
            if len(group) == 1:  # a template this merge did not touch: shared, not rebuilt
                if group[0].minutes:
                    summed[template] = group[0]
                continue
            level = None
            for s in group:
                level = higher_level(level, s.level)
            minutes = add_minutes(*(s.minutes for s in group))
            if minutes:
                summed[template] = Series(level=level, minutes=minutes,
                                          named=add_counts(*(s.named for s in group)),
                                          traces=smallest_traces(*(s.traces for s in group)),
                                          first_seen=earliest(s.first_seen for s in group),
                                          starts=earliest_per_minute(s.starts for s in group))
        if summed:
            out[service] = _capped(summed)
    return out


def _capped(series: dict[str, Series]) -> dict[str, Series]:
    """The MAX_SERIES busiest templates of a service, the rest summed as one.

    The bucket an earlier merge made is never ranked as a template: it goes whole into
    the new one, so no record is lost however many merges a day's report goes through
    (which templates share the bucket still depends on when they came)."""
    if len(series) <= MAX_SERIES:
        return dict(sorted(series.items()))
    ranked = sorted(((t, s) for t, s in series.items() if t != OTHER_TEMPLATES),
                    key=lambda kv: (-sum(kv[1].minutes.values()), kv[0]))
    kept = dict(ranked[:MAX_SERIES - 1])
    rest = [s for _, s in ranked[MAX_SERIES - 1:]]
    if OTHER_TEMPLATES in series:
        rest.append(series[OTHER_TEMPLATES])
    # a mixed bucket has no level of its own: the analysis never reads it as an error
    kept[OTHER_TEMPLATES] = Series(minutes=add_minutes(*(s.minutes for s in rest)),
                                   named=add_counts(*(s.named for s in rest)),
                                   traces=smallest_traces(*(s.traces for s in rest)),
                                   first_seen=earliest(s.first_seen for s in rest),
                                   starts=earliest_per_minute(s.starts for s in rest))
    return dict(sorted(kept.items()))
