"""Hops into services (``streams.traces``) added to a report, idempotently.

Each trace's hops come with the coordinates of the trace marks they were measured
from; a trace whose marks the report already counted adds nothing, so the trace stage
sending a trace again after a crash changes no count. A hop's caller goes to the
report's call graph (``Report.calls``): who called whom, as the requests showed it. A
failed call (a caller that failed in a request after calling a callee) goes to
``Report.failed_calls``, per minute.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from streams.intervals import Coverage
from streams.records import HopsUpdate
from streams.report.state.model import Report

Hops = Mapping[str, Mapping[str, Mapping[str, int]]]  # service -> minute -> bin -> hops
Calls = Mapping[str, Mapping[str, int]]  # caller -> callee -> hops
# caller -> callee -> UTC minute -> requests that failed in the caller after calling it
FailedCalls = Mapping[str, Mapping[str, Mapping[str, int]]]


def apply_hops(report: Report, updates: Iterable[HopsUpdate], *, now: str
               ) -> tuple[Report, bool]:
    """The report with the hops of traces it has not counted yet (pure: ``report`` is not
    modified), and whether any were new."""
    seen = Coverage.from_json(report.hops_covered)
    added: list[tuple[str, str, int, str] | tuple[str, str, int]] = []
    failed: list[tuple[str, str, str]] = []
    for update in updates:
        for trace in update.traces:
            marks = Coverage.from_json(trace.covered)
            if seen.intersection(marks):
                continue
            seen = seen.union(marks)
            added.extend(trace.hops)
            failed.extend(trace.failed)
    if not added and not failed:
        return report, False
    out = report.model_copy()
    out.hops = add_hops(report.hops, _tally(added))
    out.calls = add_calls(report.calls, _callers(added))
    out.failed_calls = add_hops(report.failed_calls, _failed(failed))
    out.hops_covered = seen.to_json()
    out.version = report.version + 1
    out.updated_at = now
    return out, True


def add_hops(*tables: Hops | FailedCalls) -> dict[str, dict[str, dict[str, int]]]:
    """The tables summed, each a new dict (shards never share a trace mark): hops or
    failed calls, both counts three names deep."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for table in tables:
        for service, minutes in table.items():
            mine = out.setdefault(service, {})
            for minute, bins in minutes.items():
                held = mine.setdefault(minute, {})
                for b, n in bins.items():
                    held[b] = held.get(b, 0) + n
    return out


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
