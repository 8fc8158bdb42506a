"""Fold fragments into per-window post-mortem reports, in place and idempotently.

A report's state is interval sets of raw coordinates: the report, each incident
and each incident's template evidence keep the records they cover, and every
count is the size of such a set, never a running sum. Merging a fragment adds
only the coordinates the report has not seen yet, so a replayed fragment or a
re-run batch that overlaps what is already counted never counts a record twice.

Everything else merges with order-free operations (union, min, max, the first
few examples by a fixed order), so fragments carrying the same analysis give the
same report in any order. A record claimed by one incident stays there: if a
re-run attributes it differently, the first attribution wins.

An incident's evidence is keyed by template text, and the clean stage's template
ids hold only inside one process: after every merge, a template that another one
covers is folded into it (``streams.report.state.evidence``), so an event mined by two
workers, or before and after a restart, ends as one entry whatever the order.

Each template keeps the smallest few trace ids of its failing records
(``Evidence.traces``), a bottom-k sample: merged by union and cut to the smallest
again wherever evidence is added, folded, composed or capped, so like the rest it
does not depend on order or replays.

Evidence is merged across services, so the report also counts each service's
records per minute (``Report.service_minutes``): a fragment adds the same minute
shares to its service as to its templates, so per minute the services' counts add
up to the templates' counts over all incidents.
"""

from __future__ import annotations

import hashlib
import logging
import re
from datetime import UTC, datetime
from typing import Any, Literal

from streams.batch.entities import top_entities
from streams.errors import ValidationFailed
from streams.intervals import Coverage
from streams.records import Evidence, Fragment, smallest_traces
from streams.report.state.evidence import fold_evidence
from streams.report.state.hops import add_calls, add_hops, add_next_lines
from streams.report.state.keys import format_time, parse_time
from streams.report.state.minutes import add_minutes, add_service_minutes, share_minutes
from streams.report.state.model import (
    MAX_TEMPLATES,
    OTHER_TEMPLATES,
    SEVERITY_WEIGHT,
    CoverageJSON,
    Incident,
    IncidentChange,
    Report,
    ReportChanges,
    Series,
    Suggestion,
    TemplateEvidence,
    pick_examples,
)
from streams.report.state.series import SeriesTable, add_series

logger = logging.getLogger(__name__)

MergeResult = Literal["applied", "duplicate", "partial"]

MAX_FRAGMENT_IDS = 10  # recent fragment ids, for debugging only: every report carries them
# Fields that depend on arrival order or wall clock; report_body leaves them out.
# hops_covered: where the trace stage's marks were, which depends on how it ran
_VOLATILE = {"version", "updated_at", "changes", "fragment_ids", "fragments_applied",
             "hops_covered"}
# Incident fields written by the roll-up (streams/report/analysis/rollup.py, run by
# CompactStep.background): they depend on when it ran, not on the fragments, so
# report_body leaves them out too.
_VOLATILE_INCIDENT = {"summary", "summary_count"}


def normalize_text(text: str) -> str:
    """Lowercase, digits collapsed, whitespace collapsed: "Disk 3 full." ~ "disk 12  full"."""
    text = re.sub(r"\d+", "#", text.lower())
    return re.sub(r"\s+", " ", text).strip(" .;:!")


def incident_key(event: str, cause: str) -> str:
    signature = f"{normalize_text(event)}\x1f{normalize_text(cause)}"
    return hashlib.sha256(signature.encode()).hexdigest()[:16]


def suggestion_key(text: str) -> str:
    return hashlib.sha256(normalize_text(text).encode()).hexdigest()[:16]


def merge(
    report: Report | None, fragment: Fragment, *, report_id: str, now: str | None = None
) -> tuple[Report, MergeResult]:
    """Fold one fragment into a report; returns the new report and what happened."""
    out, results = merge_all(report, [fragment], report_id=report_id, now=now)
    return out, results[0]


def merge_all(
    report: Report | None, fragments: list[Fragment], *, report_id: str, now: str | None = None
) -> tuple[Report, list[MergeResult]]:
    """Fold fragments into a report at once: one new version for all of them.

    Pure: the input report is not modified. The ledger (``covered``) decides what is
    new; only new records are counted, so replays and overlaps never count twice.
    ``now`` defaults to the wall clock and only sets ``updated_at``.
    """
    if report is not None and report.id != report_id:
        raise ValueError(f"fragments for report {report_id} cannot merge into {report.id}")
    base = report if report is not None else Report(id=report_id)
    seen = Coverage.from_json(base.covered)
    # Copy on write: only the incidents and suggestions a fragment changes are copied,
    # so ``base`` stays intact without deep-copying a whole day's report per merge.
    incidents = {i.key: i for i in base.incidents}
    suggestions = {s.key: s for s in base.suggestions}
    own: set[tuple[str, str]] = set()  # ("i"|"s", key) already copied
    touched: set[str] = set()
    models = set(base.models)
    applied: list[str] = []
    results: list[MergeResult] = []
    added = Coverage()  # new in this call; folded into the (large) ledger once, at the end
    gained: dict[str, dict[str, int]] = {}  # service -> minute -> records new in this call
    grown: list[SeriesTable] = []  # the series of the records new in this call
    for fragment in fragments:
        offered = _coverage(fragment.covered, fragment.id)
        new = offered.difference(seen).difference(added)
        if not new:
            logger.debug("fragment %s adds nothing to report %s", fragment.id, report_id)
            results.append("duplicate")
            continue
        result: MergeResult = "applied" if len(new) == len(offered) else "partial"
        if result == "partial":
            logger.info("fragment %s overlaps report %s: %s of %s records are new",
                        fragment.id, report_id, len(new), len(offered))
        key = incident_key(fragment.event, fragment.cause)
        incident = incidents.get(key)
        if incident is not None and ("i", key) not in own:
            incident = incident.model_copy(deep=True)
        own.add(("i", key))
        incidents[key], minutes, series = _absorb(incident, key, fragment, new)
        mine = gained.setdefault(fragment.service, {})
        for minute, n in minutes.items():
            mine[minute] = mine.get(minute, 0) + n
        grown.append({fragment.service: series})
        _add_suggestion(suggestions, own, fragment, key)
        added = added.union(new)
        touched.add(key)
        models.add(f"{fragment.model}@{fragment.prompt_version}")
        applied.append(fragment.id)
        results.append(result)
    if not applied:
        return base, results

    out = base.model_copy()
    out.covered = seen.union(added).to_json()
    out.incidents = sorted(incidents.values(), key=_incident_rank)
    out.suggestions = _rank_suggestions(suggestions, own, incidents, touched)
    out.services = sorted({s for i in out.incidents for s in i.services})
    out.models = sorted(models)
    out.first_seen = _earliest([i.first_seen for i in out.incidents])
    out.last_seen = _latest([i.last_seen for i in out.incidents])
    out.version = base.version + 1
    out.updated_at = now if now is not None else format_time(datetime.now(UTC))
    out.fragments_applied = base.fragments_applied + len(applied)
    out.fragment_ids = [*base.fragment_ids, *applied][-MAX_FRAGMENT_IDS:]
    out.service_minutes = add_service_minutes(base.service_minutes, gained)
    out.series = add_series(base.series, *grown)
    out.changes = diff_reports(base, out)
    return out, results


def compose(report_id: str, shards: list[Report]) -> Report:
    """One report from the shards its records were compacted in (see ``report_shard``).

    Shards never share a record, so ledgers are unioned and counts (per service and
    minute too) added; the rest merges with the same order-free rules as fragments.
    """
    if len(shards) == 1 and shards[0].id == report_id:
        return shards[0]
    ordered = sorted(shards, key=lambda r: r.id)
    covered = Coverage()
    incidents: dict[str, Incident] = {}
    suggestions: dict[str, Suggestion] = {}
    for shard in ordered:
        covered = covered.union(Coverage.from_json(shard.covered))
        for inc in shard.incidents:
            incidents[inc.key] = _combine(incidents.get(inc.key), inc)
        for sug in shard.suggestions:
            held = suggestions.get(sug.key)
            merged = sug.model_copy() if held is None else held
            if held is not None:
                merged.text = min(held.text, sug.text, key=_text_order)
                merged.incidents = sorted({*held.incidents, *sug.incidents})
            suggestions[sug.key] = merged
    out = Report(id=report_id)
    out.covered = covered.to_json()
    out.incidents = sorted(incidents.values(), key=_incident_rank)
    out.suggestions = _rank_suggestions(suggestions, {("s", k) for k in suggestions},
                                        incidents, set(incidents))
    out.services = sorted({s for i in out.incidents for s in i.services})
    out.models = sorted({m for r in ordered for m in r.models})
    out.first_seen = _earliest([r.first_seen for r in ordered])
    out.last_seen = _latest([r.last_seen for r in ordered])
    out.version = sum(r.version for r in ordered)
    out.updated_at = max((r.updated_at for r in ordered if r.updated_at), default=None)
    out.fragments_applied = sum(r.fragments_applied for r in ordered)
    out.fragment_ids = [f for r in ordered for f in r.fragment_ids][-MAX_FRAGMENT_IDS:]
    out.service_minutes = add_service_minutes(*(r.service_minutes for r in ordered))
    out.series = add_series(*(r.series for r in ordered))
    out.hops = add_hops(*(r.hops for r in ordered))
    out.calls = add_calls(*(r.calls for r in ordered))
    out.failed_calls = add_hops(*(r.failed_calls for r in ordered))
    out.next_lines = add_next_lines(*(r.next_lines for r in ordered))
    marks = Coverage()
    for shard in ordered:
        marks = marks.union(Coverage.from_json(shard.hops_covered))
    out.hops_covered = marks.to_json()
    out.changes = ReportChanges(
        from_version=sum(r.changes.from_version for r in ordered),
        to_version=out.version,
        records_before=sum(r.changes.records_before for r in ordered),
        records_after=sum(r.changes.records_after for r in ordered),
        new_incidents=[c for r in ordered for c in r.changes.new_incidents],
        growing=[c for r in ordered for c in r.changes.growing],
    )
    return out


def _combine(held: Incident | None, inc: Incident) -> Incident:
    if held is None:
        return inc.model_copy(deep=True)
    held.event = min(held.event, inc.event, key=_text_order)
    held.cause = min(held.cause, inc.cause, key=_text_order)
    held.severity = max(held.severity, inc.severity, key=SEVERITY_WEIGHT.__getitem__)
    held.services = sorted({*held.services, *inc.services})
    held.lanes = sorted({*held.lanes, *inc.lanes})
    held.first_seen = _earliest([held.first_seen, inc.first_seen])
    held.last_seen = _latest([held.last_seen, inc.last_seen])
    if inc.summary and (not held.summary or inc.summary_count > held.summary_count):
        held.summary = inc.summary  # the summary of the largest share
    held.summary_count += inc.summary_count
    held.count += inc.count
    evidence = {ev.template: ev for ev in held.evidence}
    for ev in inc.evidence:
        _add_evidence(evidence, ev.template, ev.count, ev.examples, ev.entities, ev.minutes,
                      ev.traces)
    held.evidence = _capped(fold_evidence(evidence))
    return held


def diff_reports(before: Report | None, after: Report) -> ReportChanges:
    """New and growing incidents between two versions (any two, not only adjacent)."""
    old = {i.key: i.count for i in before.incidents} if before is not None else {}
    new_incidents: list[IncidentChange] = []
    growing: list[IncidentChange] = []
    for inc in after.incidents:
        count = inc.count
        change = IncidentChange(key=inc.key, before=old.get(inc.key, 0), after=count)
        if inc.key not in old:
            new_incidents.append(change)
        elif count > old[inc.key]:
            growing.append(change)
    growing.sort(key=lambda c: (c.before - c.after, c.key))
    return ReportChanges(
        from_version=before.version if before is not None else 0,
        to_version=after.version,
        records_before=before.record_count if before is not None else 0,
        records_after=after.record_count,
        new_incidents=new_incidents,
        growing=growing,
    )


def report_body(report: Report) -> dict[str, Any]:
    """The content that must not depend on fragment order or duplication."""
    exclude: dict[str, Any] = dict.fromkeys(_VOLATILE, True)
    exclude["incidents"] = {"__all__": _VOLATILE_INCIDENT}
    return report.model_dump(mode="json", exclude=exclude)


def _absorb(
    inc: Incident | None, key: str, fragment: Fragment, new: Coverage
) -> tuple[Incident, dict[str, int], dict[str, Series]]:
    """The incident with the fragment's ``new`` records added, their minute counts (the
    shares its templates got, which the fragment's service gets too) and those shares
    per template, as series of the fragment's service."""
    event, cause = _display(fragment.event), _display(fragment.cause)
    if inc is None:
        inc = Incident(key=key, event=event, cause=cause, severity=fragment.severity)
    inc.event = min(inc.event, event, key=_text_order)
    inc.cause = min(inc.cause, cause, key=_text_order)
    inc.severity = max(inc.severity, fragment.severity, key=SEVERITY_WEIGHT.__getitem__)
    inc.services = sorted({*inc.services, fragment.service})
    inc.lanes = sorted({*inc.lanes, fragment.lane})
    times = [fragment.timestamp, fragment.window.start, fragment.window.end]
    inc.first_seen = _earliest([inc.first_seen, *times])
    inc.last_seen = _latest([inc.last_seen, *times])
    inc.count += len(new)

    evidence = {ev.template: ev for ev in inc.evidence}
    claimed = Coverage()
    implicit = []
    shares: list[dict[str, int]] = []
    series: list[tuple[Evidence, int, dict[str, int]]] = []  # (evidence, new records, minutes)
    for ev in fragment.evidence:
        if not ev.covered:
            implicit.append(ev)
            continue
        # a record re-read before its commit can be cleaned again under another template
        # and meet its first copy in one batch: it counts for the first template only
        part = _coverage(ev.covered, fragment.id).intersection(new).difference(claimed)
        claimed = claimed.union(part)
        shares.append(share_minutes(ev.minutes, len(part), ev.count))
        series.append((ev, len(part), shares[-1]))
        _add_evidence(evidence, ev.template, len(part), ev.examples,
                      _new_share(ev.entities, len(part), ev.count), shares[-1], ev.traces)
    # Evidence without its own coverage (older producers) gets what no template claimed.
    remainder = len(new.difference(claimed))
    for ev in implicit:
        shares.append(share_minutes(ev.minutes, remainder, ev.count))
        series.append((ev, remainder, shares[-1]))
        _add_evidence(evidence, ev.template, remainder, ev.examples,
                      _new_share(ev.entities, remainder, ev.count), shares[-1], ev.traces)
    inc.evidence = _capped(fold_evidence(evidence))
    table = add_series(*({fragment.service: {ev.template: Series(
        level=ev.level, minutes=part, named=_new_share(ev.named, new, ev.count),
        traces=ev.traces, first_seen=ev.first_seen, starts=ev.starts)}}
        for ev, new, part in series if part))
    return inc, add_minutes(*shares), table.get(fragment.service, {})


def _add_evidence(
    evidence: dict[str, TemplateEvidence], template: str, count: int, examples: list[str],
    entities: dict[str, int] | None = None, minutes: dict[str, int] | None = None,
    traces: list[str] | None = None,
) -> None:
    """Counts ``count`` records new to the report. ``entities`` and ``minutes`` must be
    those records' share already: only the caller knows which records were new.
    ``traces`` is the sample of all the offered records: a sample unions idempotently,
    so the records counted before add nothing twice."""
    if not count:
        return
    ev = evidence.setdefault(template, TemplateEvidence(template=template))
    ev.count += count
    ev.examples = pick_examples([*ev.examples, *examples])
    if entities:
        summed = dict(ev.entities)
        for name, n in entities.items():
            summed[name] = summed.get(name, 0) + n
        ev.entities = top_entities(summed)
    if minutes:
        ev.minutes = add_minutes(ev.minutes, minutes)
    if traces:
        ev.traces = smallest_traces(ev.traces, traces)


def _new_share(entities: dict[str, int], new: int, offered: int) -> dict[str, int]:
    """A fragment's entity counts for the records of it that are new to the report:
    all of them, or (partly a replay) scaled to the new share, rounded up."""
    if not entities or new >= offered:
        return entities
    return {name: -(-n * new // offered) for name, n in entities.items()}


def _capped(evidence: dict[str, TemplateEvidence]) -> list[TemplateEvidence]:
    """The MAX_TEMPLATES most frequent templates; the rest counted as one entry, so an
    incident's size does not grow with the variety of its lines (counts stay exact)."""
    other = evidence.pop(OTHER_TEMPLATES, None)
    ranked = sorted(evidence.values(), key=lambda e: (-e.count, e.template))
    if len(ranked) > MAX_TEMPLATES:
        rest = ranked[MAX_TEMPLATES:]
        ranked = ranked[:MAX_TEMPLATES]
        other = other or TemplateEvidence(template=OTHER_TEMPLATES)
        other.count += sum(e.count for e in rest)
        other.minutes = add_minutes(other.minutes, *(e.minutes for e in rest))
        other.traces = smallest_traces(other.traces, *(e.traces for e in rest))
        other.examples = pick_examples([*other.examples, *(x for e in rest for x in e.examples)])
    return [*ranked, other] if other is not None else ranked


def _add_suggestion(
    suggestions: dict[str, Suggestion], own: set[tuple[str, str]], fragment: Fragment, key: str
) -> None:
    text = _display(fragment.suggestion)
    if not text:
        return
    skey = suggestion_key(text)
    s = suggestions.get(skey)
    if s is None:
        s = Suggestion(key=skey, text=text)
    elif ("s", skey) not in own:
        s = s.model_copy()
    own.add(("s", skey))
    suggestions[skey] = s
    s.text = min(s.text, text, key=_text_order)
    s.incidents = sorted({*s.incidents, key})


def _rank_suggestions(
    suggestions: dict[str, Suggestion], own: set[tuple[str, str]], incidents: dict[str, Incident],
    touched: set[str],
) -> list[Suggestion]:
    for skey, s in list(suggestions.items()):
        if touched.isdisjoint(s.incidents):
            continue  # only suggestions of changed incidents can change
        if ("s", skey) not in own:
            s = suggestions[skey] = s.model_copy()
            own.add(("s", skey))
        linked = [incidents[k] for k in s.incidents if k in incidents]
        s.severity = max((i.severity for i in linked), key=SEVERITY_WEIGHT.__getitem__)
        # an incident's records are its own: the linked incidents' counts never overlap
        s.records = sum(i.count for i in linked)
        s.score = SEVERITY_WEIGHT[s.severity] * s.records
    # the most severe first, then the widest reach: "No action needed" on 1,000 routine
    # lines must not outrank the fix for a high-severity incident
    return sorted(suggestions.values(),
                  key=lambda s: (-SEVERITY_WEIGHT[s.severity], -s.score, s.key))


def _incident_rank(inc: Incident) -> tuple[int, int, str]:
    """Most severe first, then the most records: a critical disk-full with 29 records
    matters more than 1,700 records of routine traffic."""
    return (-SEVERITY_WEIGHT[inc.severity], -inc.count, inc.key)


def _coverage(data: CoverageJSON, fragment_id: str) -> Coverage:
    try:
        return Coverage.from_json(data)
    except (ValueError, TypeError) as exc:
        raise ValidationFailed(
            f"fragment {fragment_id} has unusable covered ranges ({exc}); send it to review"
        ) from exc


def _display(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _text_order(text: str) -> tuple[int, str]:
    return (len(text), text)


def _canonical_times(values: list[str | None]) -> list[str]:
    parsed = (parse_time(v) for v in values)
    return [format_time(p) for p in parsed if p is not None]


def _earliest(values: list[str | None]) -> str | None:
    return min(_canonical_times(values), default=None)


def _latest(values: list[str | None]) -> str | None:
    return max(_canonical_times(values), default=None)
