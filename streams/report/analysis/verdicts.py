"""The baseline's verdict on each template of a report incident, for the roll-up prompt
(pure: no I/O, no clock).

Why here and only here: the baseline is the report's. The report keeps every
template's records per minute per service (``Report.series``) and the post-mortem walks
them into departures, chronic lines and a day of incidents with an origin service
(``departures.py``, ``incidents.py``). A batch prompt (``streams.batch.prompt``) holds
one batch of records and no past, so the batch stage has no verdict to give; the
roll-up, one model call per report incident that grew (``rollup.py``), reads the report
and its post-mortem, so it carries them, and a real model summarises from the same
footing as the post-mortem. The rules model reads them too (``streams.gateway.rules``).

For each template of the incident, in each of its services (the departed first, at most
``MAX_SERVICES``), one verdict:

* ``new``: a failing line its service never wrote in its baseline;
* ``departed``: kind ``burst`` (a failing line far above its usual rate) or ``thin`` (a
  usual line that thinned out while the line it follows went on);
* ``chronic``: a failing line present through its baseline, at its usual rate:
  background, never an origin;
* ``usual``: judged against its baseline and within it;
* ``unknown``: no baseline judged it: undated records, all of them before the stream
  held ``MIN_BASELINE_RECORDS`` records, or a line below WARN first seen after that
  (only failing lines are judged new or bursting, so a new routine line is not usual).
  An error line the report began with gives its ``kind`` ``standing``, one begun too
  soon after for the new test to decide ``early``, with its ``records``: either may be
  where the log's incident is, and neither is usual.

A new or departed entry gives its first departed minute, how many minutes departed, and
its strongest minute with the records observed against those expected (0 for a new
line); ``chronic: true`` when it is background besides (it went on long enough to
become so, or it was background until it burst). A service of
the incident whose whole volume fell while its records came (within ``GAP_MINUTES``) is
``departed`` of kind ``quiet`` in ``services``.

The day incidents those departures belong to (at most ``MAX_INCIDENTS``, most severe
first) are listed once, referred to by index: origin service, this incident's role in
it (``origin``, ``caller`` or ``affected``), start and end, severity, callers, the
change named as its trigger, and its leading departure. A departure belongs to an
incident when its service is one of the incident's and its minute falls within it
(from ``GAP_MINUTES`` before its start, as callers may suffer first, to its end).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from streams.batch.covering import canonical_templates, covers
from streams.records import LEVEL_RANK
from streams.report.analysis.departures import (
    ALL_CALLS,
    ALL_LINES,
    FAILING_RANK,
    MIN_BASELINE_RECORDS,
    Departure,
    Findings,
)
from streams.report.analysis.incidents import GAP_MINUTES, DayIncident
from streams.report.state.minutes import parse_minute
from streams.report.state.model import OTHER_TEMPLATES, Incident, Series
from streams.report.state.series import higher_level
from streams.report.state.wording import clip

MAX_SERVICES = 3  # verdicts per template
MAX_INCIDENTS = 3  # day incidents a payload names
MAX_CALLERS = 5
MAX_LEAD_CHARS = 200
MAX_TRIGGER_CHARS = 160
_ORDER = {"new": 0, "departed": 1, "chronic": 2, "usual": 3, "unknown": 4}


@dataclass
class Baseline:
    """One report's series, departures and day incidents, indexed for many incidents."""

    series: Mapping[str, Mapping[str, Series]]
    findings: Findings
    incidents: Sequence[DayIncident]
    judged_from: str | None = None
    _lines: dict[tuple[str, str], list[Departure]] = field(default_factory=dict)
    _services: dict[str, list[Departure]] = field(default_factory=dict)  # quiet, slow
    _chronic: set[tuple[str, str]] = field(default_factory=set)
    _unjudged: dict[tuple[str, str], Departure] = field(default_factory=dict)
    _roots: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, series: Mapping[str, Mapping[str, Series]], findings: Findings,
           incidents: Sequence[DayIncident]) -> Baseline:
        out = cls(series, findings, incidents, judged_from=_judged_from(series))
        for dep in findings.departures:
            if dep.template in (ALL_LINES, ALL_CALLS):  # a service's volume or its calls
                out._services.setdefault(dep.service, []).append(dep)
            else:
                out._lines.setdefault((dep.service, dep.template), []).append(dep)
        out._chronic = set(findings.chronic)
        out._unjudged = {(d.service, d.template): d for d in findings.unjudged}
        return out

    def read(self, incident: Incident, templates: Sequence[str]
             ) -> tuple[list[list[dict[str, Any]]], dict[str, Any] | None]:
        """(per template of ``templates``, its verdicts; the incident's ``baseline``
        block), or no block when nothing of the incident has a baseline."""
        refs: list[DayIncident] = []  # the day incidents named, in the order first met
        per_template = [self._template(incident, t, refs) for t in templates]
        services = []
        for service in sorted(set(incident.services)):
            own = [d for d in self._services.get(service, ()) if _during(d, incident)]
            if own:
                services.append({"service": service, **self._departed(own, refs)})
        if not any(per_template) and not services:
            return per_template, None
        ranked = sorted(refs, key=self._rank)[:MAX_INCIDENTS]
        index = {id(i): n for n, i in enumerate(ranked)}
        for entry in [e for entries in per_template for e in entries] + services:
            if "incidents" in entry:
                entry["incidents"] = sorted({index[id(r)] for r in entry["incidents"]
                                             if id(r) in index})
                if not entry["incidents"]:
                    del entry["incidents"]
        block: dict[str, Any] = {"judged_from": self.judged_from,
                                 "incidents": [_incident(i, incident) for i in ranked]}
        if services:
            block["services"] = services
        return per_template, block

    def _template(self, incident: Incident, template: str, refs: list[DayIncident]
                  ) -> list[dict[str, Any]]:
        out = []
        for service in sorted(set(incident.services)):
            root, first, last, failing = self._root(service, template)
            if root is None:
                continue
            deps = self._lines.get((service, root))
            chronic = (service, root) in self._chronic
            if deps:
                entry = {"service": service, **self._departed(deps, refs)}
                if chronic:
                    entry["chronic"] = True
            elif chronic:
                entry = {"service": service, "verdict": "chronic"}
            elif (unjudged := self._unjudged.get((service, root))) is not None:
                entry = {"service": service, "verdict": "unknown", "kind": unjudged.kind,
                         "records": unjudged.observed}
            elif self.judged_from is not None and last >= self.judged_from \
                    and (failing or first < self.judged_from):
                entry = {"service": service, "verdict": "usual"}
            else:
                entry = {"service": service, "verdict": "unknown"}
            out.append(entry)
        out.sort(key=lambda e: (_ORDER[e["verdict"]], e["service"]))
        return out[:MAX_SERVICES]

    def _root(self, service: str, template: str) -> tuple[str | None, str, str, bool]:
        """(the canonical template ``template`` is counted under in ``service``, the first
        and last minutes it had records, whether it is at WARN or above); a None
        template when the service has no dated series of it."""
        own = self.series.get(service) or {}
        roots = self._roots.get(service)
        if roots is None:
            roots = canonical_templates(t for t in own if t != OTHER_TEMPLATES)
            self._roots[service] = roots
        keys = [template] if template in roots else sorted(
            k for k in roots if covers(k, template) or covers(template, k))
        root = roots[keys[0]] if keys else None
        group = [own[k] for k, r in roots.items() if r == root and own[k].minutes]
        if root is None or not group:
            return None, "", "", False
        level = None
        for s in group:
            level = higher_level(level, s.level)
        return (root, min(min(s.minutes) for s in group), max(max(s.minutes) for s in group),
                LEVEL_RANK.get(level or "", 0) >= FAILING_RANK)

    def _departed(self, deps: list[Departure], refs: list[DayIncident]) -> dict[str, Any]:
        ordered = sorted(deps, key=lambda d: d.minute)
        peak = min(ordered, key=lambda d: (-d.surprise, -d.observed, d.minute))
        first = ordered[0]
        mine: list[DayIncident] = []
        for dep in ordered:
            day = self._day_incident(dep)
            if day is not None and all(day is not r for r in mine):
                mine.append(day)
                if all(day is not r for r in refs):
                    refs.append(day)
        entry: dict[str, Any] = {
            "verdict": "new" if first.kind == "new" else "departed",
            "kind": peak.kind, "first": first.minute, "minutes": len(ordered),
            "at": peak.minute, "observed": peak.observed, "expected": round(peak.expected, 1),
        }
        if mine:
            entry["incidents"] = mine  # day incidents, turned into indices by ``read``
        return entry

    def _day_incident(self, dep: Departure) -> DayIncident | None:
        at = _iso(dep.minute)
        early = _iso(dep.minute, plus=GAP_MINUTES)
        near = [i for i in self.incidents
                if dep.service in i.services and i.started <= early and at < i.ended]
        return min(near, key=lambda i: (dep.service != i.origin, self._rank(i)), default=None)

    def _rank(self, incident: DayIncident) -> int:
        return next(n for n, i in enumerate(self.incidents) if i is incident)


def _incident(day: DayIncident, incident: Incident) -> dict[str, Any]:
    mine = set(incident.services)
    role = ("origin" if day.origin in mine else
            "caller" if mine & set(day.callers) else "affected")
    out: dict[str, Any] = {
        "origin": day.origin, "role": role, "started": day.started, "ended": day.ended,
        "severity": day.severity, "callers": day.callers[:MAX_CALLERS],
    }
    if day.trigger is not None:
        out["trigger"] = {"service": day.trigger.service, "time": day.trigger.time,
                          "text": clip(day.trigger.text, MAX_TRIGGER_CHARS)}
    if day.evidence:
        lead = day.evidence[0]
        line = (lead.service if lead.template in (ALL_LINES, ALL_CALLS)
                else f"{lead.template} in {lead.service}")
        out["lead"] = clip(f"{line}: {lead.describe()}", MAX_LEAD_CHARS)
    return out


def _during(dep: Departure, incident: Incident) -> bool:
    """The departure's minute is within ``GAP_MINUTES`` of the incident's records (or the
    incident has no times to tell)."""
    if not incident.first_seen or not incident.last_seen:
        return True
    after = _iso(dep.minute, plus=GAP_MINUTES)[:16] >= incident.first_seen[:16]
    return after and _iso(dep.minute, plus=-GAP_MINUTES)[:16] <= incident.last_seen[:16]


def _judged_from(series: Mapping[str, Mapping[str, Series]]) -> str | None:
    """The first minute with at least ``MIN_BASELINE_RECORDS`` records of the stream
    before it: from then on a line's baseline can judge it."""
    totals: dict[str, int] = {}
    for templates in series.values():
        for s in templates.values():
            for minute, n in s.minutes.items():
                totals[minute] = totals.get(minute, 0) + n
    seen = 0
    for minute in sorted(totals):
        if seen >= MIN_BASELINE_RECORDS:
            return minute
        seen += totals[minute]
    return None


def _iso(minute: str, *, plus: int = 0) -> str:
    return (parse_minute(minute) + timedelta(minutes=plus)).strftime("%Y-%m-%dT%H:%M:%SZ")
