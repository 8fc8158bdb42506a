"""The post-mortem a person acts on, derived from a report (pure: no I/O, no clock).

A report counts every record exactly; this module decides what an on-call engineer
reads first, in the shape of the Google SRE post-mortem: title and status, a
three-sentence summary, impact, trigger, detection, the root-cause chain (earliest
anomaly first), mitigation and resolution, a short timeline, action items, what
went well or badly, and data coverage.

How incidents are counted here, from the report's incidents (the model's or the
rules analyzer's, whichever wrote the fragments):

* **causes** group incidents by their event title across templates and services
  ("Timeouts" in two services is one cause);
* **changes** (deploys, rollbacks, config changes, scaling, restarts, cleanups,
  alerts) are not incidents: they are the candidate triggers, detections and
  mitigations of the failures around them;
* **routine** activity folds into one line;
* every failure and **unclassified** template is judged by its **counts per minute
  against its own baseline** (:mod:`streams.report.analysis.baseline`): a burst or a new
  template is an anomaly; steady (chronic) or sporadic errors are listed as chronic,
  below the incident, never as its cause or trigger; in a window too short for a
  baseline, unclassified errors count and warnings fold;
* causes that overlap in time, or follow each other closely in the same service,
  form one **episode**; the most significant episode is the post-mortem's subject,
  unless a departure from the stream's baseline (``incidents.py``) leads: then the
  subject is the causes in that incident's origin and failing callers, cut to its
  minutes, or, where none are, its departures (a log begun mid-failure: the causes of
  the service that was failing); the other episodes are cut the same way, one per
  incident, then what no incident tells;
* in an episode, the service its callers' failures name is the **suspected origin**
  (:mod:`streams.report.analysis.origin`): it leads the chain and the title, its callers'
  errors are impact; high or critical needs errors in several services or a
  user-facing symptom (5xx answers, user reports), else a cause is at most medium.

Everything is bounded by significance, not by input: a few causes, a few evidence
lines each, a short timeline. The full report stays in the JSON and the HTML view.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Literal

from streams.batch.callees import same_service
from streams.report.analysis.baseline import BURST_MINUTES, Verdict, judge, silent_since
from streams.report.analysis.causes import (
    ANOMALY_CEILING,
    MIN_ANOMALY_RECORDS,
    Cause,
    Change,
    as_change,
    cause_rank,
    change_kind,
    group_causes,
    is_unclassified,
    kind_word,
    words,
)
from streams.report.analysis.cuts import (
    CauseRecords,
    Minutes,
    cut,
    dated_by,
    minute_of,
    minutes_of,
)
from streams.report.analysis.departures import ALL_CALLS, ALL_LINES, Findings, Walk
from streams.report.analysis.incidents import (
    OWN_FAILURE,
    DayIncident,
    find_incidents,
    find_unjudged,
)
from streams.report.analysis.incidents import Change as IncidentChange
from streams.report.analysis.origin import Origin, find_origin
from streams.report.state.keys import format_time, parse_time
from streams.report.state.merge import normalize_text
from streams.report.state.minutes import MINUTE_FORMAT, add_minutes, minute_counts, minute_time
from streams.report.state.model import SEVERITY_WEIGHT, Incident, Report
from streams.report.state.wording import (
    Span,
    between,
    clip,
    clock,
    duration,
    latest,
    name_list,
    seconds_between,
)

ActionType = Literal["mitigate", "prevent", "detect"]

MAX_CHAIN = 6
MAX_TIMELINE = 14
MAX_ACTIONS = 6
TRIGGER_LOOKBACK_S = 3600  # a change this long before the first failure may be its trigger
EPISODE_GAP_S = 300  # a cause this soon after an episode, sharing a service, joins it
FIX_LOOKBACK_S = 3600  # a fix this long before the errors stopped may have stopped them
MEASURED_PAST = 2  # minutes of log before a low departure that lets it lead unjudged lines

_TRIGGERS: frozenset[str] = frozenset({"deploy", "config", "restart", "scale"})
_MITIGATIONS: frozenset[str] = frozenset(
    {"rollback", "restart", "scale", "config", "cleanup", "alert_resolved"}
)
_USERS = re.compile(r"\b(?:users?|customers?) (?:report|say|complain)|\bfeedback\b|\bcomplain",
                    re.IGNORECASE)
_DETECT_WORDS = re.compile(r"\b(?:alert|monitor|dashboard|watch|track|page)\w*", re.IGNORECASE)
_LEVEL = re.compile(
    r"\b(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|CRITICAL|FATAL|ALERT|EMERG)\b")
_ERROR_LEVELS = frozenset({"ERROR", "CRITICAL", "FATAL", "ALERT", "EMERG"})
# what users see: server errors answered to them, pages down, their own reports
_USER_FACING = re.compile(
    r"\b(?:HTTP )?5\d\d\b|server errors?\b|service unavailable|bad gateway|gateway timeout"
    r"|internal server error|users? (?:report|see|get)|customer", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Action:
    text: str
    priority: Literal["P0", "P1", "P2"]
    type: ActionType
    why: str


@dataclass(slots=True)
class Episode:
    """Causes that belong to one incident in time, with what started and ended it."""

    causes: list[Cause]  # by first_seen: the root-cause chain, earliest anomaly first
    first_seen: str | None
    last_seen: str | None
    trigger: Change | None = None
    detection: Change | None = None
    mitigations: list[Change] = field(default_factory=list)
    origin: Origin | None = None  # the suspected origin; its callers' errors are impact
    incident: DayIncident | None = None  # the incident its causes were cut to, if any

    @property
    def weight(self) -> int:
        return sum(c.weight for c in self.causes)

    @property
    def top(self) -> Cause:
        return min(self.causes, key=cause_rank)

    @property
    def services(self) -> list[str]:
        """By the records of their causes, most first."""
        records = Counter[str]()
        for c in self.causes:
            for s in c.services:
                records[s] += c.count
        return sorted(records, key=lambda s: (-records[s], s))

    @property
    def records(self) -> int:
        return sum(c.count for c in self.causes)


@dataclass(slots=True)
class PostMortem:
    title: str
    status: str
    summary: list[str]  # three sentences
    episodes: list[Episode]  # most significant first
    causes: list[Cause]  # the top episode's causes by significance, then the others'
    users: list[Cause]  # what users reported, dated or not
    changes: list[Change]
    actions: list[Action]
    went_well: list[str]
    went_badly: list[str]
    timeline: list[tuple[str | None, str]]
    routine_records: int
    routine_templates: list[tuple[str, int]]
    routine_services: int
    folded_unclassified: tuple[int, int]  # (templates, records) judged not anomalous
    records: int
    deadletters: int | None
    review: int | None
    dated: bool = False  # times carry their date: the logs span more than a day
    chronic: list[Cause] = field(default_factory=list)  # steady or sporadic: below incidents
    silent: list[tuple[str, str]] = field(default_factory=list)  # (service, since)
    # departures from the stream's own baseline, most severe first (``incidents.py``)
    incidents: list[DayIncident] = field(default_factory=list)
    chronic_lines: list[tuple[str, str]] = field(default_factory=list)  # (service, template)
    findings: Findings = field(default_factory=Findings)  # the departures behind ``incidents``
    suspected: str = ""  # the summary's sentence on the first episode's suspected origin
    # the incident the post-mortem tells when no error of the logs tells of it (a slowed
    # service, a line it stopped writing): its departures are the chain, every episode
    # is another incident
    lead: DayIncident | None = None

    def when(self, value: str | None) -> str:
        return clock(value, dated=self.dated)


def derive(report: Report, *, deadletters: int | None = None, review: int | None = None,
           walk: Walk | None = None) -> PostMortem:
    """The post-mortem of ``report``; ``deadletters``/``review`` are counted where known.
    ``walk``: the baseline walk kept from this report's last version, so a caller that
    derives every version judges only the new minutes (same result either way)."""
    span = Span(report.first_seen, report.last_seen)
    suggestions = _suggestions_by_incident(report)
    changes: list[Change] = []
    failures: list[Incident] = []
    routine: list[Incident] = []
    unclassified: list[Incident] = []
    users: list[Incident] = []
    for inc in report.incidents:
        kind = change_kind(inc)
        if kind is not None:
            changes.append(as_change(inc, kind))
        elif normalize_text(inc.event).startswith("routine") or inc.severity == "info":
            routine.append(inc)
        elif _USERS.search(inc.event):
            users.append(inc)
        elif is_unclassified(inc):
            unclassified.append(inc)
        else:
            failures.append(inc)
    by_key = {inc.key: inc for inc in report.incidents}
    onsets: dict[int, tuple[str | None, str | None]] = {}
    causes, chronic = _by_counts(group_causes(failures, "failure", suggestions), by_key, span,
                                 onsets)
    anomalies, folded = _judge_unclassified(unclassified, span, suggestions, onsets)
    causes += anomalies
    user_causes = group_causes(users, "users", suggestions)
    changes.sort(key=lambda c: (c.time is None, c.time or "", c.kind))
    _calibrate(causes, user_causes, onsets)
    silent = _silent_services(report, span)
    episodes = _episodes([c for c in causes if c.first_seen], changes)
    known = {*report.services, *report.series}
    for ep in episodes:
        _find_origin(ep, by_key, silent, known)
    undated = [c for c in causes if not c.first_seen]
    ranked = [c for ep in episodes for c in sorted(ep.causes, key=cause_rank)]
    ranked += sorted(undated, key=cause_rank)
    routine_templates = Counter[str]()
    for inc in routine:
        for ev in inc.evidence:
            routine_templates[ev.template] += ev.count
    pm = PostMortem(
        title="No incident found",
        status="no failures in the logs so far",
        summary=[],
        episodes=episodes,
        causes=ranked,
        users=user_causes,
        changes=changes,
        actions=[],
        went_well=[],
        went_badly=[],
        timeline=[],
        routine_records=sum(i.count for i in routine),
        routine_templates=sorted(routine_templates.items(), key=lambda kv: (-kv[1], kv[0]))[:3],
        routine_services=len({s for i in routine for s in i.services}),
        folded_unclassified=(len(folded), sum(i.count for i in folded)),
        records=report.record_count,
        deadletters=deadletters,
        review=review,
        dated=span.dated,
        chronic=sorted(chronic, key=cause_rank),
        silent=silent,
    )
    previous = report.previous
    findings = (walk or Walk()).findings(
        report.series, before=previous.series if previous is not None else None,
        hops=report.hops, hops_before=previous.hops if previous is not None else None,
        calls=[report.calls, *([previous.calls] if previous is not None else [])],
        failed_calls=report.failed_calls, next_lines=report.next_lines,
        next_lines_before=previous.next_lines if previous is not None else None)
    pm.findings = findings
    pm.chronic_lines = findings.chronic
    pm.incidents = find_incidents(findings, [
        IncidentChange(service, c.time, c.detail)
        for c in changes if c.time and c.kind in TRIGGER_KINDS for service in c.services])
    pm.incidents += find_unjudged(findings)
    # the story is told once, after the incidents: the lead decides which one it is
    _lead_with_incident(pm, span,
                        _Sources(CauseRecords(by_key, report.series), silent, known, span,
                                 user_causes))
    return pm


# changes that can start an incident; an alert reports one, a rollback or cleanup ends one
TRIGGER_KINDS = ("deploy", "config", "scale", "restart")


def leading(incidents: list[DayIncident]) -> DayIncident | None:
    """The incident that titles a post-mortem: the most severe, if medium or worse."""
    return next((i for i in incidents
                 if SEVERITY_WEIGHT[i.severity] >= SEVERITY_WEIGHT["medium"]), None)


@dataclass(frozen=True, slots=True)
class _Sources:
    """What an incident's story is told from besides the causes: each cause's records
    (to cut it to an incident), and the services that went silent and those of the
    records (to name an origin)."""

    records: CauseRecords
    silent: list[tuple[str, str]]
    known: set[str]
    span: Span
    users: list[Cause]  # user-facing causes: what lets a part of a cause stay high

    def find_origin(self, ep: Episode) -> None:
        _find_origin(ep, self.records.by_key, self.silent, self.known)

    def judged(self, rest: Cause) -> Cause | None:
        """What is left of a cause once incidents took their parts, judged by its counts
        as a whole cause is (``_by_counts``): None when they are steady or scattered
        (background), dated by its burst when they burst."""
        per, starts = self.records.of(rest)
        verdict = judge(add_minutes(*per.values()), self.span.start, self.span.end)
        if verdict.kind in ("chronic", "sporadic"):
            return None
        if verdict.kind == "burst" and verdict.start and verdict.end:
            last = verdict.end - timedelta(minutes=1)  # the end of its last minute
            rest = replace(dated_by(rest, per, starts, verdict.start.strftime(MINUTE_FORMAT),
                                    last.strftime(MINUTE_FORMAT)),
                           anomaly=verdict.describe(), burst=verdict.burst_count)
            self.records.keep(rest, per, starts)
        return rest


def _lead_with_incident(pm: PostMortem, span: Span, sources: _Sources) -> None:
    """The most severe departure from the baseline leads: its origin titles the
    post-mortem and opens the summary. The story told after it is of the causes in its
    origin and failing callers, cut to its minutes (errors elsewhere are other
    incidents), or, where none are, of its departures alone."""
    top = leading(pm.incidents) or _measured(pm)
    if top is None:
        _lead_with_unjudged(pm, span, sources)
        return
    if not _tell_focused(pm, top, span, sources):
        _tell_episodes(pm, _by_incident(pm.episodes, pm, top, sources))
        _narrate_incident(pm, top, span)
    pm.title = top.title
    _drop_other_suspect(pm, top)
    lead = top.evidence[0]
    callers = f"; {top.suffered('reported failures calling it')}" if top.callers else ""
    trigger = (f", {between(top.trigger.time, top.started)} after a change in "
               f"{top.trigger.service} ({clip(top.trigger.text, 120)})"
               if top.trigger is not None else "")
    others = len(pm.incidents) - 1
    if lead.template in (ALL_LINES, ALL_CALLS):  # the service's own volume or calls
        what = "" if lead.service == top.origin else f"{lead.service}, "
    else:
        what = f"{clip(lead.template, 100)} in {lead.service}, "
    sentence = (f"{top.origin} departed from its baseline at {pm.when(top.started)}"
                f"{trigger} ({top.severity}): {what}{lead.describe()}{callers}."
                + (f" {others} other incident(s) that day are listed below." if others else ""))
    pm.summary = [sentence, *pm.summary]


def _tell_focused(pm: PostMortem, top: DayIncident, span: Span, sources: _Sources) -> bool:
    """Tell the causes of ``top`` (``_focus``) as the post-mortem's story, the other
    episodes' after it; False, telling nothing, when no cause tells of it."""
    found = _focus(pm.episodes, top, pm.incidents, sources)
    if found is None:
        return False
    focus, taken = found
    focus.incident = top
    _attach_changes(focus, pm.changes)
    sources.find_origin(focus)
    _tell_episodes(pm, [focus, *_by_incident(_without(pm.episodes, taken), pm, top, sources)])
    _narrate(pm, span)
    return True


def _by_incident(episodes: list[Episode], pm: PostMortem, lead: DayIncident,
                 sources: _Sources) -> list[Episode]:
    """``episodes`` told as the incidents of ``pm`` but its ``lead`` (medium or worse,
    in their order): each one's causes cut to it (``_focus``), then what no incident
    tells. An episode groups causes that overlap in time, so on a busy day one spans
    many incidents."""
    told = []
    for incident in pm.incidents:
        if incident is lead or SEVERITY_WEIGHT[incident.severity] < SEVERITY_WEIGHT["medium"]:
            continue
        found = _focus(episodes, incident, pm.incidents, sources)
        if found is None:
            continue
        ep, taken = found
        _attach_changes(ep, pm.changes)  # no origin guessed: the incident names its own
        ep.incident = incident
        told.append(ep)
        episodes = _without(episodes, taken)
    return [*told, *episodes]


def _tell_episodes(pm: PostMortem, episodes: list[Episode]) -> None:
    """``episodes`` as the post-mortem's, with its causes in their order."""
    pm.episodes = episodes
    undated = [c for c in pm.causes if not c.first_seen]
    pm.causes = [c for ep in pm.episodes for c in sorted(ep.causes, key=cause_rank)]
    pm.causes += undated


def _drop_other_suspect(pm: PostMortem, top: DayIncident) -> None:
    """The episodes' guess at an origin other than the lead's would contradict it."""
    if pm.suspected and pm.episodes and pm.episodes[0].origin is not None \
            and pm.episodes[0].origin.service != top.origin:
        pm.summary.remove(pm.suspected)


def _focus(episodes: list[Episode], top: DayIncident, incidents: list[DayIncident],
           sources: _Sources) -> tuple[Episode, dict[int, Cause | None]] | None:
    """The causes that tell of ``top``, cut to its origin and the callers that failed
    calling it (a caller that only went quiet may fail for reasons of its own) and to
    its minutes from the one before it (callers often fail first), with the lines that
    follow them before the next of ``incidents`` in those services; and what is left of
    each cause cut (None: nothing, or background), by the id of the whole, for the
    other episodes to tell."""
    mine = {top.origin, *top.callers} - set(top.held)
    start = minute_of(top.started, -1)
    end = minute_of(top.ended, 0)  # the end of its last minute: the minute after it
    if start is None or end is None:
        return None
    after = [minute_of(i.started, -1) for i in incidents if i.started > top.started
             and mine & {i.origin, *i.callers}]
    until = min((m for m in after if m is not None), default=None)
    where = Minutes(start, end, until, tail_s=EPISODE_GAP_S)
    causes: list[Cause] = []
    rests: dict[int, Cause | None] = {}
    for c in (c for ep in episodes for c in ep.causes if mine & set(c.services)):
        found = cut(c, mine, where, sources.records)
        if found is not None:
            part, rest = found
            causes.append(part)
            rests[id(c)] = None if rest is None else sources.judged(rest)
    causes.sort(key=_in_time)
    if not any(SEVERITY_WEIGHT.get(c.severity, 1) >= SEVERITY_WEIGHT["medium"]
               for c in causes):
        return None
    # a part is high as a whole cause is: bursting in several services, or user-facing
    causes = [replace(c) for c in causes]  # a part may be the whole, told elsewhere too
    _calibrate(causes, sources.users, {}, parts=True)
    return Episode(causes, causes[0].first_seen, latest([c.last_seen for c in causes])), rests


def _in_time(c: Cause) -> tuple[str, int]:
    """Causes in time order, the heavier first at one time: how an episode lists them."""
    return c.first_seen or "", -c.weight


def _without(episodes: list[Episode], taken: dict[int, Cause | None]) -> list[Episode]:
    """The episodes with what is left of the causes ``taken`` from them (by the id of
    the whole), those still significant."""
    out = []
    for ep in episodes:
        kept = (taken.get(id(c), c) for c in ep.causes)  # a stored None: nothing left
        left = sorted((c for c in kept if c is not None), key=_in_time)
        if any(SEVERITY_WEIGHT.get(c.severity, 1) >= SEVERITY_WEIGHT["medium"] for c in left):
            out.append(replace(ep, causes=left, first_seen=left[0].first_seen,
                               last_seen=latest([c.last_seen for c in left])))
    return out


def _narrate_incident(pm: PostMortem, top: DayIncident, span: Span) -> None:
    """The post-mortem of an incident no error of the logs tells of: its departures,
    its callers and its trigger; the error episodes around it are other incidents."""
    pm.lead = top
    end = parse_time(top.ended)
    resolved = (end is not None and span.end is not None
                and (span.end - end).total_seconds() > EPISODE_GAP_S)
    pm.status = (f"resolved in the logs at {pm.when(top.ended)}" if resolved
                 else "ongoing at the end of the logs")
    if resolved:
        over = f"Its departures ended at {pm.when(top.ended)}"
    elif end is not None and span.end is not None and span.end > end:
        over = (f"Its departures ended at {pm.when(top.ended)}, "
                f"{duration((span.end - end).total_seconds())} before the logs end: too "
                "soon to call it over")
    else:
        over = "It was still departing from its baseline when the logs end"
    elsewhere = "; errors of other services at the time are other incidents, below" \
        if pm.episodes else ""
    pm.summary = [f"{over}{elsewhere}."]
    pm.suspected = ""
    lead = top.evidence[0]
    what = {"slow": f"Find what slowed calls into {top.origin}: its pods' CPU (throttling, "
                    "noisy neighbours) and the network to it",
            "thin": f"Find why {top.origin} stopped writing '{clip(lead.template, 80)}' "
                    "after the line before it: an early return or a swallowed exception",
            "quiet": f"Check {top.origin}'s pods and the traffic sent to it: its volume "
                     "fell"}.get(lead.kind, f"Find why {top.origin} departed: "
                                            f"{clip(lead.template, 80)}")
    high = SEVERITY_WEIGHT[top.severity] >= SEVERITY_WEIGHT["high"]
    pm.actions = [Action(what, "P0" if high else "P1", "mitigate", top.title)]
    if top.trigger is not None:
        pm.actions.append(Action(
            f"Check the change in {top.trigger.service} at {pm.when(top.trigger.time)} "
            f"({clip(top.trigger.text, 80)}): it preceded the incident by "
            f"{between(top.trigger.time, top.started)}", "P1", "prevent", "trigger"))
    pm.actions.append(Action(
        f"Alert on {top.origin}'s {'call latency' if lead.kind == 'slow' else 'volume'}"
        ": no alert appears in the logs for this incident", "P1", "detect", "detection"))
    pm.went_well = []
    pm.went_badly = ["No alert in the logs: it shows only as a departure from the "
                     "baseline"]
    if not resolved:
        pm.went_badly.append("Not over in the logs")
    items: list[tuple[str | None, str]] = []
    if top.trigger is not None:
        items.append((top.trigger.time, f"change in {top.trigger.service}: "
                                        f"{clip(top.trigger.text, 80)} - trigger?"))
    for dep in sorted(top.evidence, key=lambda d: (d.minute, d.service)):
        items.append((minute_time(dep.minute), f"{dep.service}: {dep.describe()}"))
    items.append((top.ended, "its last departure's minute ends"))
    items += [_separate(other, pm) for other in pm.episodes[:3]]
    items.sort(key=lambda it: (it[0] is None, it[0] or ""))
    pm.timeline = items[:MAX_TIMELINE]


def _measured(pm: PostMortem) -> DayIncident | None:
    """Where no incident is medium or worse and lines failing since the log began have
    no past to judge them by, a service whose own failure was measured against
    ``MEASURED_PAST`` minutes or more of the log (calls into it slowed, a usual line
    thinned) leads ahead of them; on fewer its rate is as much a guess as theirs."""
    if not any(i.unjudged for i in pm.incidents):
        return None
    minutes = pm.findings.minutes
    return next((i for i in pm.incidents if not i.unjudged and any(
        d.service == i.origin and d.kind in OWN_FAILURE
        and bisect_left(minutes, d.minute) >= MEASURED_PAST for d in i.evidence)), None)


def _lead_with_unjudged(pm: PostMortem, span: Span, sources: _Sources) -> None:
    """Without an incident, a log that began mid-failure (or just before one) leads
    with what was failing, and the story is of its causes where they tell of it; the
    reader is told there was no past to judge it by."""
    top = next((i for i in pm.incidents if i.unjudged), None)
    if top is None or not _tell_focused(pm, top, span, sources):
        _narrate(pm, span)  # the most significant episode's story
    if top is None:
        return
    _drop_other_suspect(pm, top)
    lead = top.evidence[0]
    records = sum(d.observed for d in top.evidence)
    pm.title = top.title
    began = ("was already failing when the log begins" if lead.kind == "standing"
             else "began failing soon after the log begins")
    pm.summary = [f"{top.origin} {began}, at "
                  f"{pm.when(top.started)}: {clip(lead.template, 100)} in {lead.service} "
                  f"({records:,} error records); the log has too few earlier minutes to "
                  "tell an incident from background by.", *pm.summary]


# ------------------------------------------------------------------ counts


def _by_counts(causes: list[Cause], by_key: dict[str, Incident], span: Span,
               onsets: dict[int, tuple[str | None, str | None]]
               ) -> tuple[list[Cause], list[Cause]]:
    """Failures judged by their counts: (anomalous or unjudged, chronic or sporadic).

    A burst's cause is dated by the burst, so an episode's impact is the burst's span,
    not the first-to-last of errors that were there all along. ``onsets`` gets each
    kept cause's onset: its burst, or the first minutes of a new template.
    """
    kept: list[Cause] = []
    chronic: list[Cause] = []
    for cause in causes:
        verdict = judge(minutes_of(cause, by_key), span.start, span.end)
        if verdict.kind in ("chronic", "sporadic"):
            cause.anomaly = verdict.describe()
            if SEVERITY_WEIGHT.get(cause.severity, 1) > SEVERITY_WEIGHT["low"]:
                cause.severity = "low"
            chronic.append(cause)
            continue
        if verdict.kind == "burst" and verdict.start and verdict.end:
            cause.first_seen = format_time(verdict.start)
            cause.last_seen = format_time(verdict.end)
            cause.anomaly = verdict.describe()
            cause.burst = verdict.burst_count
        elif verdict.kind == "new":
            cause.anomaly = verdict.describe()
        onsets[id(cause)] = _onset(cause, verdict)
        kept.append(cause)
    return kept, chronic


def _onset(cause: Cause, verdict: Verdict) -> tuple[str | None, str | None]:
    """When a cause's anomaly happened: its burst, or a new template's first minutes
    (a new stream that goes on for weeks does not overlap everything after it)."""
    if verdict.kind == "new" and verdict.start is not None:
        end = verdict.start + timedelta(minutes=BURST_MINUTES)
        return cause.first_seen, format_time(end)
    return cause.first_seen, cause.last_seen


def _judge_unclassified(incidents: list[Incident], span: Span, suggestions: dict[str, str],
                        onsets: dict[int, tuple[str | None, str | None]]
                        ) -> tuple[list[Cause], list[Incident]]:
    """Unclassified templates judged by their counts; the rest folded into a count.

    Bursts and new templates are anomalies. In a window too short for a baseline the
    counts cannot tell, so errors (``ERROR`` and above) count and warnings fold: a
    business warning is not a fault for being frequent in one minute.
    """
    found: list[tuple[float, Cause]] = []
    folded: list[Incident] = []
    for inc in incidents:
        verdict = judge(minute_counts(inc.evidence), span.start, span.end)
        level = _LEVEL.search(inc.event)
        error = level is not None and level.group(0) in _ERROR_LEVELS
        if not (verdict.significant or (verdict.kind == "unjudged" and error
                                        and inc.count >= MIN_ANOMALY_RECORDS)):
            folded.append(inc)
            continue
        cause = group_causes([inc], "anomaly", suggestions)[0]
        template = inc.evidence[0].template if inc.evidence else inc.cause
        cause.title = f"Unusual {level.group(0) if level else 'events'}: {clip(template, 90)}"
        cause.anomaly = (verdict.describe() if verdict.significant else
                         f"{inc.count} error records in a window too short for a baseline")
        if verdict.kind == "burst" and verdict.start and verdict.end:
            cause.first_seen = format_time(verdict.start)
            cause.last_seen = format_time(verdict.end)
            cause.burst = verdict.burst_count
        onsets[id(cause)] = _onset(cause, verdict)
        if SEVERITY_WEIGHT.get(cause.severity, 1) > SEVERITY_WEIGHT[ANOMALY_CEILING]:
            cause.severity = ANOMALY_CEILING  # unusual, not yet a known failure
        if error and SEVERITY_WEIGHT.get(cause.severity, 1) < SEVERITY_WEIGHT["medium"]:
            cause.severity = "medium"
        cause.suggestion = (f"Find out why '{clip(template, 60)}' in "
                            f"{name_list(inc.services, 2)} appeared or jumped "
                            f"({cause.anomaly.split(';')[0]})")
        found.append((verdict.p if verdict.significant else 1.0, cause))
    found.sort(key=lambda sc: (sc[0], -sc[1].count, sc[1].title))
    return [c for _, c in found], folded


def _silent_services(report: Report, span: Span) -> list[tuple[str, str]]:
    """Services that logged steadily, then nothing to the end of the window."""
    out = []
    for service, minutes in sorted(report.service_minutes.items()):
        since = silent_since(minutes, span.start, span.end)
        if since is not None:
            out.append((service, format_time(since)))
    return out


# ------------------------------------------------------------------ origin


def _find_origin(ep: Episode, by_key: Mapping[str, Incident],
                 silent: list[tuple[str, str]], known: set[str]) -> None:
    """Name the suspected origin; the chain stays in order of first anomaly. An origin
    that went silent around the episode is dated by its silence: a hung service's
    last words are not its failure. Only a service of the records (``known``) is an
    origin: a name read from a message that matches none is a word, not a service."""
    texts: dict[int, list[str]] = {}
    traces: dict[int, set[str]] = {}
    failing: dict[int, bool] = {}
    for i, cause in enumerate(ep.causes):
        lines = [cause.title, cause.cause, *cause.subjects]
        ids: set[str] = set()
        for key in cause.keys:
            inc = by_key.get(key)
            if inc is not None:
                lines += [inc.event, *(ev.template for ev in inc.evidence[:5]),
                          *(x for ev in inc.evidence[:5] for x in ev.examples[:2])]
                for ev in inc.evidence:
                    ids.update(ev.traces)
        texts[i] = lines
        traces[i] = ids
        level = _LEVEL.search(cause.title)
        failing[i] = (SEVERITY_WEIGHT.get(cause.severity, 1) >= SEVERITY_WEIGHT["medium"]
                      and (level is None or level.group(0) in _ERROR_LEVELS))
    ep.origin = find_origin(ep.causes, texts, failing, traces=traces)
    if ep.origin is None:
        return
    if ep.origin.service not in known:
        matches = sorted(k for k in known if same_service(k, ep.origin.service))
        ep.origin = replace(ep.origin, service=matches[0]) if len(matches) == 1 else None
        if ep.origin is None:
            return
    start, end = parse_time(ep.first_seen), parse_time(ep.last_seen)
    for service, since in silent:
        when = parse_time(since)
        if (same_service(service, ep.origin.service) and when and start and end
                and start - timedelta(seconds=TRIGGER_LOOKBACK_S) <= when <= end):
            ep.origin = replace(ep.origin, service=service, first_seen=since,
                                reason=f"{ep.origin.reason}; it went silent at {clock(since)}")
            break
    if ep.origin.first_seen and (ep.first_seen is None or ep.origin.first_seen < ep.first_seen):
        ep.first_seen = ep.origin.first_seen


def _calibrate(causes: list[Cause], users: list[Cause],
               onsets: dict[int, tuple[str | None, str | None]], *,
               parts: bool = False) -> None:
    """High or critical only for errors that burst across services, or a user-facing
    symptom: otherwise one source's errors are at most medium. With ``parts`` (causes
    cut to one incident, whose other services' errors are other incidents), a part in
    several services bursts across them by itself."""
    failing = [c for c in causes if SEVERITY_WEIGHT.get(c.severity, 1) >= SEVERITY_WEIGHT["medium"]]
    for c in failing:
        if SEVERITY_WEIGHT.get(c.severity, 1) <= SEVERITY_WEIGHT["medium"]:
            continue
        window = onsets.get(id(c), (c.first_seen, c.last_seen))
        across = (parts and len(c.services) > 1) or any(
            set(d.services) - set(c.services)
            and _overlaps(window, onsets.get(id(d), (d.first_seen, d.last_seen)))
            for d in failing if d is not c)
        facing = _USER_FACING.search(f"{c.title} {c.cause}") is not None or any(
            _overlaps(window, (u.first_seen, u.last_seen)) for u in users)
        if not (across or facing):
            c.severity = "medium"


def _overlaps(a: tuple[str | None, str | None], b: tuple[str | None, str | None]) -> bool:
    """Two time windows overlap, or follow each other within EPISODE_GAP_S."""
    a0, a1 = parse_time(a[0]), parse_time(a[1] or a[0])
    b0, b1 = parse_time(b[0]), parse_time(b[1] or b[0])
    if not (a0 and a1 and b0 and b1):
        return False
    gap = timedelta(seconds=EPISODE_GAP_S)
    return a0 <= b1 + gap and b0 <= a1 + gap


def _for_episode(change: Change, ep: Episode) -> Change:
    """The change with the line that shares most words with the episode's causes, since
    one change incident may hold several alerts or deploys of different times."""
    if len(change.lines) < 2:
        return change
    wanted = set().union(*(words(f"{c.title} {' '.join(c.services)}") for c in ep.causes))
    best = max(change.lines, key=lambda line: (len(words(line) & wanted), -len(line)))
    return replace(change, detail=best)


# ------------------------------------------------------------------ episodes


def _episodes(causes: list[Cause], changes: list[Change]) -> list[Episode]:
    """Causes grouped in time; each significant episode gets its trigger, alert, fixes."""
    episodes: list[Episode] = []
    for cause in sorted(causes, key=_in_time):
        ep = episodes[-1] if episodes else None
        if ep is not None and _joins(ep, cause):
            ep.causes.append(cause)
            ep.last_seen = latest([ep.last_seen, cause.last_seen])
        else:
            episodes.append(Episode([cause], cause.first_seen, cause.last_seen))
    # an episode of only low-severity anomalies is context, not an incident
    significant = [ep for ep in episodes
                   if any(SEVERITY_WEIGHT.get(c.severity, 1) >= SEVERITY_WEIGHT["medium"]
                          for c in ep.causes)]
    used: set[str] = set()
    for ep in significant:  # in time order: a fix of one episode never triggers the next
        _attach_changes(ep, [c for c in changes if c.key not in used])
        used.update(m.key for m in ep.mitigations)
    return sorted(significant, key=lambda ep: (-ep.weight, ep.first_seen or ""))


def _joins(ep: Episode, cause: Cause) -> bool:
    start, end = parse_time(cause.first_seen), parse_time(ep.last_seen)
    if start is None or end is None:
        return False
    gap = (start - end).total_seconds()
    if gap <= 0:
        return True  # overlaps in time
    shared = set(cause.services) & {s for c in ep.causes for s in c.services}
    return gap <= EPISODE_GAP_S and bool(shared)


def _attach_changes(ep: Episode, changes: list[Change]) -> None:
    first, last = parse_time(ep.first_seen), parse_time(ep.last_seen)
    if first is None or last is None:
        return
    failure_start = parse_time(min(
        (c.first_seen for c in ep.causes if c.kind == "failure" and c.first_seen),
        default=ep.first_seen))
    anchor = failure_start or first
    for ch in changes:
        when = parse_time(ch.time)
        if when is None:
            continue
        before = (anchor - when).total_seconds()
        if ch.kind in _TRIGGERS and 0 <= before <= TRIGGER_LOOKBACK_S and (
                ep.trigger is None or when >= parse_time(ep.trigger.time)):  # type: ignore[operator]
            ep.trigger = _for_episode(ch, ep)
        elif ch.kind == "alert" and first <= when <= last and ep.detection is None:
            ep.detection = _for_episode(ch, ep)
        elif ch.kind in _MITIGATIONS and first <= when <= last + timedelta(seconds=600):
            ep.mitigations.append(_for_episode(ch, ep))


# ------------------------------------------------------------------ narration


def _narrate(pm: PostMortem, span: Span) -> None:
    if not pm.episodes:
        pm.summary = [_quiet_summary(pm)]
        if pm.users:
            pm.title = "Users report problems; no failure found in the logs"
        pm.timeline = [(c.time, f"{kind_word(c.kind)}: {c.detail}") for c in pm.changes
                       ][:MAX_TIMELINE]
        return
    ep = pm.episodes[0]
    top = ep.top
    root = ep.causes[0]
    services = ep.services
    where = name_list(services, 3)
    pm.title = f"{top.title} in {name_list(top.services, 2)}"
    origin = _origin_sentence(ep, pm)
    if ep.origin is not None:
        pm.title = _origin_title(ep, ep.origin)
    ended = parse_time(ep.last_seen)
    resolved = (ended is not None and span.end is not None
                and (span.end - ended).total_seconds() > EPISODE_GAP_S)
    pm.status = (f"resolved in the logs at {pm.when(ep.last_seen)}" if resolved
                 else "ongoing at the end of the logs")
    errors = sum(c.count for c in ep.causes
                 if SEVERITY_WEIGHT.get(c.severity, 1) >= SEVERITY_WEIGHT["medium"])
    duration = between(ep.first_seen, ep.last_seen)
    s1 = (f"From {pm.when(ep.first_seen)} to {pm.when(ep.last_seen)} ({duration}), "
          f"{len(services)} service(s) failed ({where}): {top.title} ({top.severity}), "
          f"with {errors:,} error records in {len(ep.causes)} related cause(s).")
    if ep.trigger is not None:
        s2 = (f"It began {between(ep.trigger.time, root.first_seen)} after a "
              f"{kind_word(ep.trigger.kind).lower()} ({ep.trigger.detail}) at "
              f"{pm.when(ep.trigger.time)}; the earliest anomaly was {root.title} "
              f"in {name_list(root.services, 2)}.")
    else:
        s2 = (f"No deploy, config change or restart precedes it in the logs; the earliest "
              f"anomaly was {root.title} in {name_list(root.services, 2)} at "
              f"{pm.when(root.first_seen)}.")
    fixes = _fixes(ep)
    if fixes and resolved:
        s3 = (f"Errors stopped at {pm.when(ep.last_seen)}, "
              f"{between(fixes[0].time, ep.last_seen)} after a "
              f"{kind_word(fixes[0].kind).lower()} ({fixes[0].detail}) at "
              f"{pm.when(fixes[0].time)}.")
    elif resolved:
        s3 = f"Errors stopped at {pm.when(ep.last_seen)} with no mitigation visible in the logs."
    else:
        s3 = "Errors were still occurring when the logs end; no resolution is visible yet."
    pm.suspected = origin
    pm.summary = [s for s in (origin, s1, s2, s3) if s]
    pm.actions = _actions(ep, pm)
    pm.went_well, pm.went_badly = _assessment(ep, pm, resolved)
    pm.timeline = _timeline(pm)


def _origin_title(ep: Episode, origin: Origin) -> str:
    """The origin first: what failed there, and how many callers it took down."""
    affected = [c for c in origin.callers if c != origin.service]
    tail = f" ({len(affected)} caller service(s) affected)" if affected else ""
    own = [c for c in ep.causes if origin.service in c.services]
    failing = [c for c in own if SEVERITY_WEIGHT.get(c.severity, 1) >= SEVERITY_WEIGHT["medium"]]
    own = failing or own
    if own:
        return f"{own[0].title} in {origin.service}{tail}"
    return f"{origin.service} unreachable: {ep.top.title} in its callers{tail}"


origin_title = _origin_title  # an episode's title where alerts name it too


def _origin_sentence(ep: Episode, pm: PostMortem) -> str:
    """The summary's first words: the suspected origin and its first anomaly time."""
    origin = ep.origin
    if origin is None:
        return ""
    callers = [c for c in origin.callers if c != origin.service]
    impact = (f"; errors in {name_list(callers, 3)} are its impact" if callers else "")
    return (f"Suspected origin: {origin.service}, first anomaly at "
            f"{pm.when(origin.first_seen)} ({origin.reason}){impact}.")


def _fixes(ep: Episode) -> list[Change]:
    """Mitigations, the likeliest first: rollbacks, then the latest before errors stopped."""
    end = ep.last_seen or ""
    fixes = [m for m in ep.mitigations if m.kind != "alert_resolved"
             and (seconds_between(m.time, end) or 0.0) <= FIX_LOOKBACK_S]
    return sorted(fixes, key=lambda m: (m.kind != "rollback", (m.time or "") > end,
                                        "" if m.time is None else _invert(m.time)))


def _invert(text: str) -> str:
    return "".join(chr(0x10FFFF - ord(ch)) for ch in text)  # a descending sort key


def _quiet_summary(pm: PostMortem) -> str:
    if not pm.records:
        return "No records have been analysed for this window yet."
    users = sum(c.count for c in pm.users)
    said = f"; but {users:,} user report(s) of problems (below)" if users else ""
    return (f"No failure of medium or higher severity in {pm.records:,} records: "
            f"{pm.routine_records:,} routine, {len(pm.causes)} low-severity anomalies, "
            f"{len(pm.changes)} change event(s){said}.")


def _actions(ep: Episode, pm: PostMortem) -> list[Action]:
    top, root = ep.top, ep.causes[0]
    high = SEVERITY_WEIGHT.get(top.severity, 1) >= SEVERITY_WEIGHT["high"]
    out: list[Action] = []
    if top.suggestion:
        out.append(Action(top.suggestion, "P0" if high else "P1",
                          _action_type(top.suggestion, "mitigate"), top.title))
    if ep.trigger is not None and ep.trigger.kind in ("deploy", "config"):
        out.append(Action(
            f"Gate {name_list(list(ep.trigger.services), 2)} {ep.trigger.kind}s on error rate "
            f"(canary, automatic rollback): this one ({ep.trigger.detail}) preceded the "
            f"failures by {between(ep.trigger.time, root.first_seen)}",
            "P1", "prevent", "trigger"))
    if root is not top and root.suggestion:
        out.append(Action(root.suggestion, "P1", _action_type(root.suggestion, "prevent"),
                          f"earliest anomaly: {root.title}"))
    if ep.detection is None:
        out.append(Action(
            f"Alert on {top.title} in {name_list(top.services, 2)}: no alert appears in "
            f"the logs for this incident", "P1", "detect", "detection"))
    else:
        late = seconds_between(root.first_seen, ep.detection.time)
        if late is not None and late > 300:
            out.append(Action(
                f"Alert earlier: the first alert came {duration(late)} after the first "
                f"anomaly ({root.title})", "P2", "detect", "detection"))
    seen = {a.text for a in out}
    for cause in sorted(ep.causes, key=cause_rank):
        if len(out) >= MAX_ACTIONS:
            break
        if cause.suggestion and cause.suggestion not in seen and cause.kind == "failure":
            seen.add(cause.suggestion)
            out.append(Action(cause.suggestion, "P2", _action_type(cause.suggestion, "mitigate"),
                              cause.title))
    return out[:MAX_ACTIONS]


def _action_type(text: str, default: ActionType) -> ActionType:
    return "detect" if _DETECT_WORDS.search(text) else default


def _assessment(ep: Episode, pm: PostMortem, resolved: bool) -> tuple[list[str], list[str]]:
    well: list[str] = []
    badly: list[str] = []
    root = ep.causes[0]
    if ep.detection is not None:
        late = seconds_between(root.first_seen, ep.detection.time) or 0.0
        line = (f"An alert fired at {pm.when(ep.detection.time)}, {duration(max(late, 0))} "
                f"after the first anomaly")
        (well if late <= 300 else badly).append(line)
    else:
        badly.append("No alert in the logs: the incident shows only as errors")
    fixes = _fixes(ep)
    if fixes and resolved:
        well.append(f"The {kind_word(fixes[0].kind).lower()} at {pm.when(fixes[0].time)} was "
                    f"followed by recovery at {pm.when(ep.last_seen)}")
    elif not resolved:
        badly.append("Errors continue to the end of the logs")
    length = seconds_between(ep.first_seen, ep.last_seen)
    if length is not None and length > 900:
        badly.append(f"Impact lasted {duration(length)}")
    if pm.users:
        n = sum(c.count for c in pm.users)
        badly.append(f"Users noticed: {n:,} user report(s) of failures")
    if pm.deadletters:
        badly.append(f"{pm.deadletters:,} record(s) could not be read (dead letters)")
    return well, badly


def _timeline(pm: PostMortem) -> list[tuple[str | None, str]]:
    ep = pm.episodes[0]
    items: list[tuple[str | None, str]] = []
    if ep.trigger is not None:
        items.append((ep.trigger.time, f"{kind_word(ep.trigger.kind)}: {ep.trigger.detail} "
                                       f"({name_list(list(ep.trigger.services), 2)}) - trigger?"))
    for n, cause in enumerate(ep.causes[:MAX_CHAIN]):
        what = "first anomaly" if n == 0 else "then"
        items.append((cause.first_seen, f"{what}: {cause.title} in {name_list(cause.services, 2)} "
                                        f"({cause.severity})"))
    if ep.detection is not None:
        items.append((ep.detection.time, f"detected: {ep.detection.detail}"))
    for ch in ep.mitigations[:3]:
        items.append((ch.time, f"{kind_word(ch.kind)}: {ch.detail}"))
    items.append((ep.last_seen, "last error of this incident"))
    items += [_separate(other, pm) for other in pm.episodes[1:4]]
    items.sort(key=lambda it: (it[0] is None, it[0] or ""))
    return items[:MAX_TIMELINE]


def _separate(ep: Episode, pm: PostMortem) -> tuple[str | None, str]:
    """The timeline's item for another incident: the incident's title where its causes
    were cut to one, and what failed."""
    what = f"{ep.top.title} in {name_list(ep.services, 2)}"
    if ep.incident is not None:
        what = f"{ep.incident.title} ({what})"
    return ep.first_seen, f"separate incident: {what} until {pm.when(ep.last_seen)}"


def _suggestions_by_incident(report: Report) -> dict[str, str]:
    out: dict[str, str] = {}
    for s in report.suggestions:  # most severe first: the first one an incident has wins
        for key in s.incidents:
            out.setdefault(key, s.text)
    return out
