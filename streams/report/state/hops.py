"""Hops into services (``streams.traces``) added to a report, idempotently.

Each trace's hops come with the coordinates of the trace marks they were measured
from; a trace whose marks the report already counted adds nothing, so the trace stage
sending a trace again after a crash changes no count. A hop's caller goes to the
report's call graph (``Report.calls``): who called whom, as the requests showed it. A
failed call (a caller that failed in a request after calling a callee) goes to
``Report.failed_calls``, per minute. Which line a service wrote right after which in a
request goes to ``Report.next_lines``, per minute, at most ``MAX_LINES`` lines a
service and ``MAX_NEXT`` next lines each (the rest summed as ``OTHER_TEMPLATES``), so a
service that logs ids in its template cannot grow a report without bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from streams.intervals import Coverage
from streams.records import HopsUpdate
from streams.report.state.model import OTHER_TEMPLATES, Report

MAX_LINES = 200  # lines kept per service, as templates are (``series.MAX_SERIES``)
MAX_NEXT = 8  # next lines kept per line: a line is followed by one or a few

Hops = Mapping[str, Mapping[str, Mapping[str, int]]]  # service -> minute -> bin -> hops
Calls = Mapping[str, Mapping[str, int]]  # caller -> callee -> hops
# caller -> callee -> UTC minute -> requests that failed in the caller after calling it
FailedCalls = Mapping[str, Mapping[str, Mapping[str, int]]]
# service -> template -> the template of its next line in the request ("": none) ->
# UTC minute -> times
NextLines = Mapping[str, Mapping[str, Mapping[str, Mapping[str, int]]]]
NextLinesTable = dict[str, dict[str, dict[str, dict[str, int]]]]


def apply_hops(report: Report, updates: Iterable[HopsUpdate], *, now: str
               ) -> tuple[Report, bool]:
    """The report with the hops of traces it has not counted yet (pure: ``report`` is not
    modified), and whether any were new."""
    seen = Coverage.from_json(report.hops_covered)
    added: list[tuple[str, str, int, str] | tuple[str, str, int]] = []
    failed: list[tuple[str, str, str]] = []
    next_lines: list[tuple[str, str, str, str, int]] = []
    for update in updates:
        for trace in update.traces:
            marks = Coverage.from_json(trace.covered)
            if seen.intersection(marks):
                continue
            seen = seen.union(marks)
            added.extend(trace.hops)
            failed.extend(trace.failed)
            next_lines.extend(trace.next_lines)
    if not added and not failed and not next_lines:
        return report, False
    out = report.model_copy()
    out.hops = add_hops(report.hops, _tally(added))
    out.calls = add_calls(report.calls, _callers(added))
    out.failed_calls = add_hops(report.failed_calls, _failed(failed))
    out.next_lines = add_next_lines(report.next_lines, _next_lines(next_lines))
    out.hops_covered = seen.to_json()
    out.version = report.version + 1
    out.updated_at = now
    return out, True


def add_hops(*tables: Hops | FailedCalls) -> dict[str, dict[str, dict[str, int]]]:
    """The tables summed, each a new dict (shards never share a trace mark): hops, failed
    calls or one service's next lines, all counts three names deep."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for table in tables:
        for service, minutes in table.items():
            mine = out.setdefault(service, {})
            for minute, bins in minutes.items():
                held = mine.setdefault(minute, {})
                for b, n in bins.items():
                    held[b] = held.get(b, 0) + n
    return out


def add_next_lines(*tables: NextLines) -> NextLinesTable:
    """The next-lines tables summed, each a new dict, each service and line capped: past
    ``MAX_LINES`` lines the least written are dropped, past ``MAX_NEXT`` next lines
    of one the least frequent are summed as ``OTHER_TEMPLATES`` (a line's count stays)."""
    out: NextLinesTable = {}
    for table in tables:
        for service, lines in table.items():  # a service's lines: counts three deep
            out[service] = add_hops(out.get(service, {}), lines)
    for service, lines in out.items():
        for line, nexts in lines.items():
            if len(nexts) > MAX_NEXT:
                lines[line] = _capped_next(nexts)
        if len(lines) > MAX_LINES:
            ranked = sorted(lines, key=lambda t: (-_written(lines[t]), t))
            out[service] = {t: lines[t] for t in ranked[:MAX_LINES]}
    return out


def _written(nexts: Mapping[str, Mapping[str, int]]) -> int:
    return sum(n for minutes in nexts.values() for n in minutes.values())


def _capped_next(nexts: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    ranked = sorted((t for t in nexts if t != OTHER_TEMPLATES),
                    key=lambda t: (-sum(nexts[t].values()), t))
    kept = {t: nexts[t] for t in ranked[:MAX_NEXT - 1]}
    rest: dict[str, int] = {}
    for t in (*ranked[MAX_NEXT - 1:], *([OTHER_TEMPLATES] if OTHER_TEMPLATES in nexts else [])):
        for minute, n in nexts[t].items():
            rest[minute] = rest.get(minute, 0) + n
    kept[OTHER_TEMPLATES] = rest
    return kept


def add_calls(*tables: Calls) -> dict[str, dict[str, int]]:
    """The call graphs summed, each a new dict."""
    out: dict[str, dict[str, int]] = {}
    for table in tables:
        for caller, callees in table.items():
            mine = out.setdefault(caller, {})
            for callee, n in callees.items():
                mine[callee] = mine.get(callee, 0) + n
    return out


def _tally(hops: Iterable[tuple[str, str, int, str] | tuple[str, str, int]]) -> Hops:
    out: dict[str, dict[str, dict[str, int]]] = {}
    for service, minute, b, *_ in hops:
        bins = out.setdefault(service, {}).setdefault(minute, {})
        bins[str(b)] = bins.get(str(b), 0) + 1
    return out


def _callers(hops: Iterable[tuple[str, str, int, str] | tuple[str, str, int]]) -> Calls:
    out: dict[str, dict[str, int]] = {}
    for service, _, _, *caller in hops:
        if caller:
            callees = out.setdefault(caller[0], {})
            callees[service] = callees.get(service, 0) + 1
    return out


def _failed(failed: Iterable[tuple[str, str, str]]) -> FailedCalls:
    out: dict[str, dict[str, dict[str, int]]] = {}
    for caller, callee, minute in failed:
        minutes = out.setdefault(caller, {}).setdefault(callee, {})
        minutes[minute] = minutes.get(minute, 0) + 1
    return out


def _next_lines(next_lines: Iterable[tuple[str, str, str, str, int]]) -> NextLinesTable:
    out: NextLinesTable = {}
    for service, minute, line, after, n in next_lines:
        minutes = out.setdefault(service, {}).setdefault(line, {}).setdefault(after, {})
        minutes[minute] = minutes.get(minute, 0) + n
    return out
