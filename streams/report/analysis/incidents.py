"""A day of incidents, each with the service where it began (pure: no I/O, no clock).

Departures (``streams.report.analysis.departures``) become incidents:

1. **Whose departure is it.** A failing line that names a service it called (one of
   the records' services: "no instances available for X", ``http://X:8080/...``, a
   request path ``/api/v1/xservice/...``) counts for that callee, its own service is
   a **caller**. So does a failing line whose requests' traces show that most of
   them failed just after calling one service, when that service departed too (an
   early return there, say): a caller's generic "500" names nothing, its traces do.
   A service that goes quiet or thins out within a minute of a service it calls
   going quiet, thinning out or slowing is a caller of that callee too: a slow
   callee holds its callers' work. The calls are those its lines ever named and
   those its requests' traces showed (``Findings.calls``), followed through callees
   of callees to the nearest service that departed, and on from it while that one
   was held too. A call is timed from its caller's line, so a slow caller (a starved
   CPU, a delayed network) sends late: a callee's slow calls in the minute its
   caller slowed, or the minute after, count for that caller, the callee one of its
   services but not a caller. Every other departure counts for its own service. A
   logger or class is never a service: only names in the records' service field are.
2. **Incidents over time.** Each service's departures form runs: a departure within
   ``GAP_MINUTES`` of the run's last one joins it, a later one opens a new incident.
3. **Weight and severity.** An incident weighs the surprise (-log10 of the tail) of
   its departures: a failing line's in full, a thinning line's or a quiet service's
   at ``SILENT_WEIGHT`` (they are subtler and noisier), its callers' at
   ``CALLER_WEIGHT`` (a caller's thinning or quiet at both). Below ``MIN_WEIGHT`` it is
   noise and dropped. The severity grows with the weight and with callers that
   suffered; calls into the origin timed far slower, and a usual line it stopped
   writing, are its own failure here, as its error lines are.
4. **Unjudged conditions.** Error lines the report began with and that never proved
   chronic (``Findings.standing``), and those begun too soon after it for the baseline
   to judge (``Findings.early``), are one low incident per service (a named callee's
   for the lines that name one), ranked by their records: a log that starts
   mid-incident still names where it was failing, but without a past this is no
   departure, so it never pages and only titles a report without incidents.
5. **The trigger.** A change (deploy, config, restart) logged by the origin or a
   caller in the ``TRIGGER_MINUTES`` before the incident began is named as its likely
   trigger.

The same report gives the same incidents, whatever workers or batches built it: they
are a function of its series alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from streams.records import Severity
from streams.report.analysis.departures import Departure, Findings
from streams.report.state.minutes import parse_minute
from streams.report.state.model import SEVERITY_WEIGHT
from streams.report.state.wording import name_list

GAP_MINUTES = 2
SILENT_WEIGHT = 0.5
WARNING_WEIGHT = 0.5
CALLER_WEIGHT = 0.5
MIN_WEIGHT = 4.0  # one strong departure of a failing line, or of a silent one
TRIGGER_MINUTES = 15
MAX_EVIDENCE = 5
MIN_FAILED_CALLS = 2  # failed requests that link a caller's failure to a callee by trace


@dataclass(frozen=True, slots=True)
class Change:
    """A change a report saw (a deploy, a config change, a restart) and when."""

    service: str
    time: str
    text: str


@dataclass
class DayIncident:
    """One incident of the day: where it began, when, who suffered, and why we think so."""

    origin: str
    started: str  # the minute of its first departure, ISO-8601 UTC
    ended: str  # the end of the minute of its last departure
    weight: float = 0.0
    severity: Severity = "low"
    services: list[str] = field(default_factory=list)  # every service that departed
    callers: list[str] = field(default_factory=list)  # failed calling it, or held by it
    held: list[str] = field(default_factory=list)  # of those, ones that only went quiet
    evidence: list[Departure] = field(default_factory=list)  # the strongest few
    trigger: Change | None = None
    departures: int = 0

    @property
    def own_errors(self) -> bool:
        """Its origin's own lines at ERROR or above departed."""
        return any(d.error and d.service == self.origin for d in self.evidence)

    def suffered(self, failed: str) -> str:
        """Its callers for a sentence: those whose failures named it (``failed``: what
        they did), then those that only went quiet or thinned out with it."""
        failing = [c for c in self.callers if c not in self.held]
        parts = [f"{name_list(failing, 3)} {failed}"] if failing else []
        if self.held:
            parts.append(f"{name_list(self.held, 3)}, which call it, went quiet")
        return "; ".join(parts)

    @property
    def unjudged(self) -> bool:
        """Failing when the report began, or soon after: no departure, nothing to judge
        it by."""
        return bool(self.evidence) and self.evidence[0].kind in ("standing", "early")

    @property
    def title(self) -> str:
        lead = self.evidence[0] if self.evidence else None
        if lead is None:
            return f"{self.origin} departed from its baseline"
        if lead.service != self.origin:
            return (f"{self.origin} failing: {lead.service} and {len(self.callers) - 1} more "
                    "callers report it" if len(self.callers) > 1 else
                    f"{self.origin} failing: {lead.service} reports it")
        what = {"new": "a new error", "burst": "a burst of errors",
                "thin": "a usual line thins out", "quiet": "its volume fell",
                "slow": "calls into it slowed",
                "standing": "already failing when the log begins",
                "early": "a new error early in the log"}[lead.kind]
        if lead.kind in ("new", "burst") and not lead.failing:
            what = "an unusual line"
        after = (f" after a change in {self.trigger.service}"
                 if self.trigger is not None else "")
        return f"{self.origin}: {what}{after}"

    def as_json(self) -> dict[str, object]:
        return {
            "title": self.title, "origin": self.origin, "started": self.started,
            "ended": self.ended, "severity": self.severity, "services": self.services,
            "callers": self.callers, "weight": round(self.weight, 1),
            "trigger": None if self.trigger is None else {
                "service": self.trigger.service, "time": self.trigger.time,
                "text": self.trigger.text},
            "evidence": [_evidence_json(d) for d in self.evidence],
        }


def _evidence_json(dep: Departure) -> dict[str, object]:
    out: dict[str, object] = {
        "service": dep.service, "template": dep.template, "kind": dep.kind,
        "minute": dep.minute, "observed": dep.observed, "expected": round(dep.expected, 1),
        "traces": list(dep.traces)}
    if dep.failed_after is not None:  # why a caller's failure is its callee's
        callee, requests, traced = dep.failed_after
        out["failed_after"] = {"callee": callee, "requests": requests, "traced": traced}
    return out


def find_incidents(findings: Findings, changes: Sequence[Change] = ()) -> list[DayIncident]:
    """The incidents of ``findings``, most severe first (then the newest)."""
    runs: dict[str, list[list[Departure]]] = {}
    near = _Near(findings)
    for dep in sorted(findings.departures, key=lambda d: (d.minute, d.service, d.template)):
        target, dep = near.target(dep)
        own = runs.setdefault(target, [])
        if own and _minutes_between(own[-1][-1].minute, dep.minute) <= GAP_MINUTES:
            own[-1].append(dep)
        else:
            own.append([dep])
    linked = _linked_by_traces([(origin, run) for origin, service_runs in runs.items()
                                for run in service_runs])
    incidents = [_incident(origin, run, changes, near.downstream) for origin, run in linked]
    kept = [i for i in incidents if i.weight >= MIN_WEIGHT]
    # equal weights: an origin's own errors before mere warnings, then the newest
    return sorted(kept, key=lambda i: (-SEVERITY_WEIGHT[i.severity], -i.weight,
                                       not i.own_errors, _desc(i.started), i.origin))


def find_unjudged(findings: Findings) -> list[DayIncident]:
    """The report's standing and early lines as low incidents, most records first."""
    runs: dict[str, list[Departure]] = {}
    for dep in findings.unjudged:
        runs.setdefault(dep.named[0] if dep.named else dep.service, []).append(dep)
    out: list[tuple[int, DayIncident]] = []
    for origin, run in runs.items():
        own = [d for d in run if d.service == origin]
        first = min(own or run, key=lambda d: d.first_seen or d.minute)
        ranked = sorted(run, key=lambda d: (d.service != origin, -d.observed, d.template))
        out.append((sum(d.observed for d in run), DayIncident(
            origin=origin, started=_began(first),
            ended=_iso(max(d.until or d.minute for d in run), plus=1),
            services=sorted({d.service for d in run} | {origin}),
            callers=sorted({d.service for d in run} - {origin}),
            evidence=ranked[:MAX_EVIDENCE], departures=len(run))))
    return [i for _, i in sorted(out, key=lambda pair: (-pair[0], pair[1].origin))]


SILENT = ("thin", "quiet")
HOLDING = ("thin", "quiet", "slow")  # what a callee that holds its callers' work shows
# without an error line still its own failure: calls into it timed far slower, a usual
# line it stopped writing (an early return); a volume drop is not, as less traffic
# sent to it explains one as well
OWN_FAILURE = ("slow", "thin")


def _linked_by_traces(runs: list[tuple[str, list[Departure]]]
                      ) -> list[tuple[str, list[Departure]]]:
    """Runs of different services, near in time, whose failing lines share a trace id
    failed in the same requests, so one called the other: they are one incident. Its
    origin is the run linked to the most others (a dependency is in every caller's
    failed requests, a caller only in its own), then the earliest; the rest are its
    callers. A shared id proves a link, a missing one proves nothing (samples)."""
    ids = [{t for d in run if d.failing and d.service == origin for t in d.traces}
           for origin, run in runs]
    links: dict[int, set[int]] = {i: set() for i in range(len(runs))}
    for i, (a, run_a) in enumerate(runs):
        for j in range(i + 1, len(runs)):
            b, run_b = runs[j]
            if a != b and ids[i] & ids[j] and _overlap(run_a, run_b):
                links[i].add(j)
                links[j].add(i)
    out: list[tuple[str, list[Departure]]] = []
    seen: set[int] = set()
    for i in range(len(runs)):
        if i in seen:
            continue
        group, todo = set(), [i]
        while todo:  # the connected runs
            k = todo.pop()
            if k not in group:
                group.add(k)
                todo.extend(links[k] - group)
        seen |= group
        head = min(group, key=lambda k: (-len(links[k]), runs[k][1][0].minute, runs[k][0]))
        merged = sorted((d for k in group for d in runs[k][1]),
                        key=lambda d: (d.minute, d.service, d.template))
        out.append((runs[head][0], merged))
    return out


def _overlap(a: list[Departure], b: list[Departure]) -> bool:
    return (_minutes_between(a[-1].minute, b[0].minute) <= GAP_MINUTES
            and _minutes_between(b[-1].minute, a[0].minute) <= GAP_MINUTES)


class _Near:
    """What else departed within a minute of a departure: whose departure it is."""

    def __init__(self, findings: Findings) -> None:
        self.calls = findings.calls
        self.departed: set[tuple[str, str]] = set()  # (service, minute) with own departures
        self.holding: set[tuple[str, str]] = set()  # (service, minute): quiet, thin, slow
        self.silent: set[tuple[str, str]] = set()  # (service, minute): quiet, thin
        self.slow: set[tuple[str, str]] = set()  # (service, minute): calls into it slowed
        # (service, minute) -> callee -> its failing lines that name that callee
        self.naming: dict[tuple[str, str], Counter[str]] = {}
        # (caller, minute) -> callee -> requests that failed in the caller after calling it
        self.failed_calls: dict[tuple[str, str], dict[str, int]] = {}
        for caller, callees in findings.failed_calls.items():
            for callee, minutes in callees.items():
                for minute, n in minutes.items():
                    self.failed_calls.setdefault((caller, minute), {})[callee] = n
        for d in findings.departures:
            self.departed.add((d.service, d.minute))
            if d.kind in HOLDING:
                self.holding.add((d.service, d.minute))
            if d.kind in SILENT:
                self.silent.add((d.service, d.minute))
            if d.kind == "slow":
                self.slow.add((d.service, d.minute))
            if d.failing and d.named:
                self.naming.setdefault((d.service, d.minute), Counter()).update(d.named)
        # (service, minute) of slow departures that count for a caller slowed with them,
        # not for their service: that caller
        self.downstream: dict[tuple[str, str], str] = {}
        for service, minute in sorted(self.slow):
            by = self._slowed_caller(service, minute, {service})
            if by is not None:
                self.downstream[(service, minute)] = by

    def target(self, dep: Departure) -> tuple[str, Departure]:
        """Whose departure ``dep`` is, and ``dep`` with the trace link when that decided.

        A callee its failure names (one that departed itself first, else the one its
        service's other failures name most in the same minutes); a callee those other
        failures name (a caller's generic "500 Internal Server Error" beside its "timed
        out calling X"); the callee most of its failed requests called last, when that
        one departed too; a callee that went silent or slow with it; else its own
        service."""
        around = _around(dep.minute)
        if dep.failing:
            naming: Counter[str] = Counter()
            for m in around:
                naming.update(self.naming.get((dep.service, m), {}))
            named = dep.named or tuple(sorted(naming))
            if named:
                moved = [c for c in named if any((c, m) in self.departed for m in around)]
                # max keeps the first of equals: the failure's own order of names
                return (moved[0] if moved else max(named, key=naming.__getitem__)), dep
            if (traced := self._failed_after(dep.service, around)) is not None:
                return traced[0], replace(dep, failed_after=traced)
        return self._held_by(dep, around), dep

    def _held_by(self, dep: Departure, around: list[str]) -> str:
        """A callee a silent or slow departure went with, else its own service."""
        if dep.kind in SILENT:
            held, by = dep.service, {dep.service}
            # a callee that went quiet or thinned out may be held in turn; a slowed one is
            # where its callers' work waited
            while (nearest := self._holding(held, around, by)) is not None:
                held = nearest
                by.add(held)
                if not any((held, m) in self.silent for m in around):
                    break
            return held
        if dep.kind == "slow":
            return self.downstream.get((dep.service, dep.minute), dep.service)
        return dep.service

    def _failed_after(self, service: str, around: list[str]) -> tuple[str, int, int] | None:
        """(the callee, its requests, all) when most of ``service``'s failed requests in
        ``around`` called that callee last (at least ``MIN_FAILED_CALLS``) and it departed
        itself then: its answer, not ``service``, is where they failed. A callee that did
        not depart is only the last one called by a service failing on its own."""
        counts: dict[str, int] = {}
        for m in around:
            for callee, n in self.failed_calls.get((service, m), {}).items():
                counts[callee] = counts.get(callee, 0) + n
        if not counts:
            return None
        callee = min(counts, key=lambda c: (-counts[c], c))
        if (counts[callee] >= MIN_FAILED_CALLS and 2 * counts[callee] > sum(counts.values())
                and callee != service and any((callee, m) in self.departed for m in around)):
            return callee, counts[callee], sum(counts.values())
        return None

    def _slowed_caller(self, service: str, minute: str, seen: set[str]) -> str | None:
        """A call into ``service`` is timed from its caller's line: a caller that slowed in
        the same minute or the one before (a starved CPU, a delayed network) delays its
        calls out as well as the calls into it. The furthest such caller up, by name."""
        earlier = _around(minute)[:2]
        callers = sorted(c for c, callees in self.calls.items()
                         if service in callees and c not in seen
                         and any((c, m) in self.slow for m in earlier))
        if not callers:
            return None
        seen.update(callers)
        return self._slowed_caller(callers[0], minute, seen) or callers[0]

    def _holding(self, service: str, around: list[str], seen: set[str]) -> str | None:
        """The nearest service ``service`` calls, directly or through others, that went
        quiet, thin or slow in ``around`` (by name among the nearest); none in ``seen``."""
        level = sorted(set(self.calls.get(service, ())) - seen)
        reached = set(seen) | set(level)
        while level:
            for callee in level:
                if any((callee, m) in self.holding for m in around):
                    return callee
            level = sorted({c for s in level for c in self.calls.get(s, ())} - reached)
            reached.update(level)
        return None


def _around(minute: str) -> list[str]:
    when = parse_minute(minute)
    return [(when + timedelta(minutes=d)).strftime("%Y-%m-%dT%H:%M") for d in (-1, 0, 1)]


def _incident(origin: str, run: list[Departure], changes: Sequence[Change],
              downstream: Container[tuple[str, str]]) -> DayIncident:
    """``downstream``: (service, minute) of slow departures that count for a caller."""
    weight = 0.0
    callers: set[str] = set()
    failed: set[str] = set()
    for dep in run:
        if dep.service != origin:
            if (dep.service, dep.minute) not in downstream:
                callers.add(dep.service)
            if dep.failing:
                failed.add(dep.service)
            # a caller's line thinning or its volume falling is subtler still
            weight += CALLER_WEIGHT * (SILENT_WEIGHT if dep.kind in SILENT else 1.0) \
                * dep.surprise
        elif dep.error or dep.kind == "slow":  # its own failure, or its own requests timed
            weight += dep.surprise
        elif dep.failing:  # a warning is the service's own word that it is not a failure
            weight += WARNING_WEIGHT * dep.surprise
        else:
            weight += SILENT_WEIGHT * dep.surprise
    # it began at its origin's first own failure: a caller's quiet minute just before is
    # near, not proof; without a failing line, at its first usual line gone or calls
    # into it timed slower (dated to the minute, where a line is dated to the second);
    # without either (crashed silently), at the first departure that spoke of it
    own = [d for d in run if d.service == origin and d.failing]
    own_silent = [d for d in run if d.service == origin and d.kind in OWN_FAILURE]
    first = (own or own_silent or run)[0]
    last = run[-1].minute
    ranked = sorted(run, key=lambda d: (d.service != origin, not d.failing, -d.surprise,
                                        d.minute, d.template))
    evidence: list[Departure] = []
    for dep in ranked:  # one entry a line: its strongest minute
        if all((d.service, d.template) != (dep.service, dep.template) for d in evidence):
            evidence.append(dep)
        if len(evidence) == MAX_EVIDENCE:
            break
    incident = DayIncident(
        origin=origin, started=_began(first), ended=_iso(last, plus=1), weight=weight,
        services=sorted({d.service for d in run} | {origin}), callers=sorted(callers),
        held=sorted(callers - failed), evidence=evidence, departures=len(run))
    incident.severity = _severity(incident)
    incident.trigger = _trigger(incident, changes)
    return incident


def _began(first: Departure) -> str:
    """When the departure that opened an incident began: a failing line's first record
    in its minute (or, for a new line, in the few minutes before when its silence needed
    them to be sure), else the start of its minute."""
    if first.failing and first.first_seen:
        at = _at(first.first_seen)
        minute = parse_minute(first.minute)
        if minute - timedelta(minutes=GAP_MINUTES) <= at < minute + timedelta(minutes=1):
            return at.strftime("%Y-%m-%dT%H:%M:%SZ")
    return _iso(first.minute)


def _severity(incident: DayIncident) -> Severity:
    own_failing = any(d.service == incident.origin and (d.failing or d.kind in OWN_FAILURE)
                      for d in incident.evidence)
    if incident.weight >= 64 and len(incident.callers) >= 2:
        return "critical"
    if incident.weight >= 24 or (incident.callers and own_failing and incident.weight >= 16):
        return "high"
    if incident.weight >= 8 and (own_failing or incident.callers):
        return "medium"
    return "low"


def _trigger(incident: DayIncident, changes: Sequence[Change]) -> Change | None:
    start = parse_minute(incident.started[:16])
    near = [c for c in changes
            if c.service in (incident.origin, *incident.callers)
            and start - timedelta(minutes=TRIGGER_MINUTES) <= _at(c.time) <= start
            + timedelta(minutes=1)]
    return max(near, key=lambda c: c.time, default=None)


def _at(time: str) -> datetime:
    """A UTC ISO-8601 time to the second."""
    return datetime.strptime(time[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC)


def _minutes_between(a: str, b: str) -> float:
    return (parse_minute(b) - parse_minute(a)).total_seconds() / 60


def _iso(minute: str, *, plus: int = 0) -> str:
    when = parse_minute(minute) + timedelta(minutes=plus)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _desc(iso: str) -> str:
    """Sorts newer first as text."""
    return "".join(chr(0x10FFFF - ord(c)) for c in iso)
