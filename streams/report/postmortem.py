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
* **unclassified** templates are judged by anomaly instead of listed: a template that
  first appears after the window began, or whose rate while active is several times
  its own average over the window, is an anomaly; the rest are folded into a count;
* causes that overlap in time, or follow each other closely in the same service,
  form one **episode**; the most significant episode is the post-mortem's subject.

Everything is bounded by significance, not by input: a few causes, a few evidence
lines each, a short timeline. The full report stays in the JSON and the HTML view.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

from streams.report.keys import parse_time
from streams.report.merge import normalize_text
from streams.report.model import SEVERITY_WEIGHT, Incident, Report

ChangeKind = Literal[
    "deploy", "rollback", "config", "scale", "restart", "cleanup", "alert", "alert_resolved"
]
ActionType = Literal["mitigate", "prevent", "detect"]

MAX_EVIDENCE_TEMPLATES = 3  # per cause
MAX_EXAMPLES = 2  # per evidence template
MAX_EXAMPLE_CHARS = 200
MAX_CHAIN = 6
MAX_TIMELINE = 14
MAX_ACTIONS = 6
MAX_ENTITIES = 3
TRIGGER_LOOKBACK_S = 3600  # a change this long before the first failure may be its trigger
EPISODE_GAP_S = 300  # a cause starting this soon after an episode, in one of its services, joins it
NEW_AFTER_SHARE = 0.1  # a template first seen after this share of the window is "new"
RATE_JUMP = 3.0  # active rate / average rate at which a template counts as a burst
MIN_ANOMALY_RECORDS = 3
DATED_AFTER_S = 20 * 3600  # logs spanning longer than this show dates with their times
FIX_LOOKBACK_S = 3600  # a fix this long before the errors stopped may have stopped them
ANOMALY_CEILING = "medium"  # an unclassified template is a lead to follow, not a known outage

# change events, matched on an incident's event title and templates; the first match wins
_CHANGES: tuple[tuple[ChangeKind, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(rx, re.IGNORECASE))
    for kind, rx in (
        ("alert_resolved", r"\b(?:alert|alarm)s?\b.{0,40}\b(?:resolved|cleared)\b"),
        ("alert", r"\b(?:alert|alarm)s?\b"),
        ("rollback", r"\broll(?:ed|ing)?[ -]?back\b|\brevert|\bdowngrad"),
        ("deploy", r"\bdeploy|\brollout\b|\brelease\b|\bupgrade"),
        ("config", r"\bconfig|\bfeature flag"),
        ("scale", r"\bscal(?:e|ed|ing)\b|\breplicas?\b"),
        ("cleanup", r"\bpurg|\bclean(?:ed)?[ -]?up\b|\bfreed\b"),
        ("restart", r"\brestart|\bis up\b|\bstarted\b|\bstarting\b"),
    )
)
_TRIGGERS: frozenset[str] = frozenset({"deploy", "config", "restart", "scale"})
_MITIGATIONS: frozenset[str] = frozenset(
    {"rollback", "restart", "scale", "config", "cleanup", "alert_resolved"}
)
_LEVEL_WORD = re.compile(r"\b(?:TRACE|DEBUG|INFO|NOTICE|WARN|ERROR|FATAL)\b")
_USERS = re.compile(r"\b(?:users?|customers?|feedback|complain)", re.IGNORECASE)
_SECURITY = re.compile(r"auth|login|password|permission|denied|brute|intrusion|forbidden", re.I)
_SUBJECT = re.compile(r"\s*\(([^()]*)\)\s*$")
_DETECT_WORDS = re.compile(r"\b(?:alert|monitor|dashboard|watch|track|page)\w*", re.IGNORECASE)
_ENTITY = re.compile(
    r"(?P<ip>\b(?:\d{1,3}\.){3}\d{1,3}\b)"
    r"|\b(?:user(?:name)?[=: ]+|for (?:invalid user )?(?=\S+ from ))(?P<user>[A-Za-z_][\w.-]{1,31})"
    r"|\bhost(?:name)?[=: ]+(?P<host>[\w.-]{2,63})"
    r"|(?P<pod>\b[a-z][a-z0-9-]*-[a-z0-9]{8,10}-[a-z0-9]{5}\b)"
)


@dataclass(frozen=True, slots=True)
class Evidence:
    template: str
    count: int
    examples: tuple[str, ...]


@dataclass(slots=True)
class Cause:
    """Incidents of one cause across templates and services, as an engineer counts them."""

    title: str
    kind: Literal["failure", "anomaly", "users"]
    severity: str
    count: int
    services: list[str]
    keys: list[str]  # the report incidents it stands for
    first_seen: str | None
    last_seen: str | None
    cause: str
    subjects: list[str] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    entities: list[tuple[str, int]] = field(default_factory=list)  # in the evidence examples
    suggestion: str | None = None
    summary: str | None = None  # the model's roll-up, when there is one
    anomaly: str | None = None  # why an unclassified template was judged an anomaly

    @property
    def weight(self) -> int:
        return SEVERITY_WEIGHT.get(self.severity, 1) * max(self.count, 1)


@dataclass(frozen=True, slots=True)
class Change:
    kind: ChangeKind
    time: str | None
    title: str
    detail: str  # one real line; for an episode, the line most like its causes
    services: tuple[str, ...]
    key: str
    lines: tuple[str, ...] = ()  # a line of each of its (at most 3) templates


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

    @property
    def weight(self) -> int:
        return sum(c.weight for c in self.causes)

    @property
    def top(self) -> Cause:
        return min(self.causes, key=_cause_rank)

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

    def when(self, value: str | None) -> str:
        return clock(value, dated=self.dated)


def derive(report: Report, *, deadletters: int | None = None, review: int | None = None
           ) -> PostMortem:
    """The post-mortem of ``report``; ``deadletters``/``review`` are counted where known."""
    span = _Span(report.first_seen, report.last_seen)
    suggestions = _suggestions_by_incident(report)
    changes: list[Change] = []
    failures: list[Incident] = []
    routine: list[Incident] = []
    unclassified: list[Incident] = []
    users: list[Incident] = []
    for inc in report.incidents:
        kind = _change_kind(inc)
        if kind is not None:
            changes.append(_change(inc, kind))
        elif normalize_text(inc.event).startswith("routine") or inc.severity == "info":
            routine.append(inc)
        elif _USERS.search(inc.event):
            users.append(inc)
        elif _is_unclassified(inc):
            unclassified.append(inc)
        else:
            failures.append(inc)
    causes = _group(failures, "failure", suggestions)
    anomalies, folded = _anomalies(unclassified, span, suggestions)
    causes += anomalies
    user_causes = _group(users, "users", suggestions)
    changes.sort(key=lambda c: (c.time is None, c.time or "", c.kind))
    episodes = _episodes([c for c in causes if c.first_seen], changes)
    undated = [c for c in causes if not c.first_seen]
    ranked = [c for ep in episodes for c in sorted(ep.causes, key=_cause_rank)]
    ranked += sorted(undated, key=_cause_rank)
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
    )
    _narrate(pm, span)
    return pm


# ------------------------------------------------------------------ classification


def _change_kind(inc: Incident) -> ChangeKind | None:
    """A change event: a low-severity incident whose title or templates name a change."""
    if SEVERITY_WEIGHT.get(inc.severity, 1) > SEVERITY_WEIGHT["low"]:
        return None  # "deploy failed" with errors is a failure, not a change
    texts = [inc.event, *(ev.template for ev in inc.evidence[:3])]
    for kind, pattern in _CHANGES:
        if pattern.search(inc.event):
            return kind
    if normalize_text(inc.event).startswith(("routine", "unclassified")):
        return None  # a routine template that mentions "started" is not a restart
    for kind, pattern in _CHANGES:
        if any(pattern.search(t) for t in texts[1:]):
            return kind
    return None


def _change(inc: Incident, kind: ChangeKind) -> Change:
    """A change and a real line of each of its (at most 3) templates."""
    lines = tuple(_clip(ev.examples[0] if ev.examples else ev.template, 160)
                  for ev in inc.evidence[:3])
    detail = lines[0] if lines else inc.event
    return Change(kind, inc.first_seen, inc.event, detail, tuple(inc.services), inc.key, lines)


def _words(text: str) -> set[str]:
    """Lowercase words, camelCase split: "HikariPoolExhausted" -> hikari, pool, exhausted."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", text)
    return {w for w in re.findall(r"[a-z]{3,}", spaced.lower())}


def _for_episode(change: Change, ep: Episode) -> Change:
    """The change with the line that shares most words with the episode's causes, since
    one change incident may hold several alerts or deploys of different times."""
    if len(change.lines) < 2:
        return change
    words = set().union(*(_words(f"{c.title} {' '.join(c.services)}") for c in ep.causes))
    best = max(change.lines, key=lambda line: (len(_words(line) & words), -len(line)))
    return replace(change, detail=best)


def _is_unclassified(inc: Incident) -> bool:
    text = normalize_text(f"{inc.event} {inc.cause}")
    return text.startswith("unclassified") or " unclassified " in f" {text} "


def _title(event: str) -> tuple[str, list[str]]:
    """("Service discovery: no instances ...", ["ts-x"]) from "... (ts-x)": the subject apart."""
    match = _SUBJECT.search(event)
    if not match:
        return event.strip(), []
    subjects = [s.strip() for s in match.group(1).split(",") if s.strip()]
    return event[: match.start()].strip(), subjects


def _group(incidents: list[Incident], kind: Literal["failure", "anomaly", "users"],
           suggestions: dict[str, str]) -> list[Cause]:
    groups: dict[str, list[Incident]] = {}
    for inc in incidents:
        groups.setdefault(normalize_text(_title(inc.event)[0]), []).append(inc)
    return [_cause(members, kind, suggestions) for members in groups.values()]


def _cause(members: list[Incident], kind: Literal["failure", "anomaly", "users"],
           suggestions: dict[str, str]) -> Cause:
    largest = max(members, key=lambda i: (i.count, i.key))
    title, _ = _title(largest.event)
    subjects = list(dict.fromkeys(s for i in members for s in _title(i.event)[1]))
    evidence: dict[str, list] = {}
    for inc in members:
        for ev in inc.evidence:
            held = evidence.setdefault(ev.template, [0, []])
            held[0] += ev.count
            held[1] += [x for x in ev.examples if x not in held[1]]
    shown = sorted(evidence.items(), key=lambda kv: (-kv[1][0], kv[0]))[:MAX_EVIDENCE_TEMPLATES]
    severity = max((i.severity for i in members), key=lambda s: SEVERITY_WEIGHT.get(s, 1))
    cause = Cause(
        title=title,
        kind=kind,
        severity=severity,
        count=sum(i.count for i in members),
        services=sorted({s for i in members for s in i.services}),
        keys=sorted(i.key for i in members),
        first_seen=_earliest(i.first_seen for i in members),
        last_seen=_latest(i.last_seen for i in members),
        cause=largest.cause.split(" Evidence:", 1)[0].strip(),
        subjects=subjects[:5],
        evidence=[Evidence(t, n, tuple(_clip(x) for x in ex[:MAX_EXAMPLES]))
                  for t, (n, ex) in shown],
        suggestion=next((suggestions[i.key] for i in sorted(members, key=lambda i: -i.count)
                         if i.key in suggestions), None),
        summary=largest.summary,
    )
    if kind == "users" or SEVERITY_WEIGHT.get(severity, 1) >= SEVERITY_WEIGHT["medium"] \
            or _SECURITY.search(title):
        examples = [x for ev in evidence.values() for x in ev[1]]
        cause.entities = top_entities(examples)
    return cause


def top_entities(texts: list[str], limit: int = MAX_ENTITIES) -> list[tuple[str, int]]:
    """Addresses, users, hosts and pods named in ``texts``, most frequent first."""
    counts = Counter[str]()
    for text in texts:
        for match in _ENTITY.finditer(text):
            name = next(k for k, v in match.groupdict().items() if v)
            value = match.group(name)
            if "REDACTED" in value or value.startswith(("0.", "127.")):
                continue
            counts[f"{name} {value}"] += 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]


def _anomalies(incidents: list[Incident], span: _Span, suggestions: dict[str, str]
               ) -> tuple[list[Cause], list[Incident]]:
    """Unclassified templates judged against their own baseline; the rest folded."""
    found: list[tuple[float, Cause]] = []
    folded: list[Incident] = []
    for inc in incidents:
        why, score = anomaly_of(inc, span)
        if why is None:
            folded.append(inc)
            continue
        cause = _cause([inc], "anomaly", {})
        template = inc.evidence[0].template if inc.evidence else inc.cause
        level = _LEVEL_WORD.search(inc.event)
        cause.title = f"Unusual {level.group(0) if level else 'events'}: {_clip(template, 90)}"
        cause.anomaly = why
        if SEVERITY_WEIGHT.get(cause.severity, 1) > SEVERITY_WEIGHT[ANOMALY_CEILING]:
            cause.severity = ANOMALY_CEILING  # unusual, not yet a known failure
        cause.suggestion = (f"Find out why '{_clip(template, 60)}' in "
                            f"{name_list(inc.services, 2)} appeared or jumped "
                            f"({why.split(';')[0]})")
        found.append((score, cause))
    found.sort(key=lambda sc: (-sc[0], sc[1].title))
    return [c for _, c in found], folded


def anomaly_of(inc: Incident, span: _Span) -> tuple[str | None, float]:
    """(why it is anomalous, score) or (None, 0): new in the window, or a rate jump."""
    first, last = parse_time(inc.first_seen), parse_time(inc.last_seen)
    if first is None or last is None or span.seconds <= 0 or inc.count < MIN_ANOMALY_RECORDS:
        return None, 0.0
    active = max((last - first).total_seconds(), 60.0)
    jump = min(span.seconds / active, 1000.0)  # rate while active / average rate
    offset = (first - span.start).total_seconds() if span.start else 0.0
    new = offset > NEW_AFTER_SHARE * span.seconds
    reasons = []
    if new:
        reasons.append(f"new: first seen {span.when(inc.first_seen)}, "
                       f"{_duration(offset)} into the window")
    if jump >= RATE_JUMP:
        reasons.append(f"rate {jump:.0f}x its average while active "
                       f"({span.when(inc.first_seen)}-{span.when(inc.last_seen)})")
    if not reasons:
        return None, 0.0
    score = SEVERITY_WEIGHT.get(inc.severity, 1) * inc.count * max(jump, 1.0) * (2 if new else 1)
    return "; ".join(reasons), math.log1p(score)


# ------------------------------------------------------------------ episodes


def _episodes(causes: list[Cause], changes: list[Change]) -> list[Episode]:
    """Causes grouped in time; each significant episode gets its trigger, alert, fixes."""
    episodes: list[Episode] = []
    for cause in sorted(causes, key=lambda c: (c.first_seen or "", -c.weight)):
        ep = episodes[-1] if episodes else None
        if ep is not None and _joins(ep, cause):
            ep.causes.append(cause)
            ep.last_seen = _latest([ep.last_seen, cause.last_seen])
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


def _narrate(pm: PostMortem, span: _Span) -> None:
    if not pm.episodes:
        pm.summary = [_quiet_summary(pm)]
        pm.timeline = [(c.time, f"{_kind_word(c.kind)}: {c.detail}") for c in pm.changes
                       ][:MAX_TIMELINE]
        return
    ep = pm.episodes[0]
    top = ep.top
    root = ep.causes[0]
    services = ep.services
    where = name_list(services, 3)
    pm.title = f"{top.title} in {name_list(top.services, 2)}"
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
              f"{_kind_word(ep.trigger.kind).lower()} ({ep.trigger.detail}) at "
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
              f"{_kind_word(fixes[0].kind).lower()} ({fixes[0].detail}) at "
              f"{pm.when(fixes[0].time)}.")
    elif resolved:
        s3 = f"Errors stopped at {pm.when(ep.last_seen)} with no mitigation visible in the logs."
    else:
        s3 = "Errors were still occurring when the logs end; no resolution is visible yet."
    pm.summary = [s1, s2, s3]
    pm.actions = _actions(ep, pm)
    pm.went_well, pm.went_badly = _assessment(ep, pm, resolved)
    pm.timeline = _timeline(pm)


def _fixes(ep: Episode) -> list[Change]:
    """Mitigations, the likeliest first: rollbacks, then the latest before errors stopped."""
    end = ep.last_seen or ""
    fixes = [m for m in ep.mitigations if m.kind != "alert_resolved"
             and (_seconds_between(m.time, end) or 0.0) <= FIX_LOOKBACK_S]
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
        late = _seconds_between(root.first_seen, ep.detection.time)
        if late is not None and late > 300:
            out.append(Action(
                f"Alert earlier: the first alert came {_duration(late)} after the first "
                f"anomaly ({root.title})", "P2", "detect", "detection"))
    seen = {a.text for a in out}
    for cause in sorted(ep.causes, key=_cause_rank):
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
        late = _seconds_between(root.first_seen, ep.detection.time) or 0.0
        line = (f"An alert fired at {pm.when(ep.detection.time)}, {_duration(max(late, 0))} "
                f"after the first anomaly")
        (well if late <= 300 else badly).append(line)
    else:
        badly.append("No alert in the logs: the incident shows only as errors")
    fixes = _fixes(ep)
    if fixes and resolved:
        well.append(f"The {_kind_word(fixes[0].kind).lower()} at {pm.when(fixes[0].time)} was "
                    f"followed by recovery at {pm.when(ep.last_seen)}")
    elif not resolved:
        badly.append("Errors continue to the end of the logs")
    length = _seconds_between(ep.first_seen, ep.last_seen)
    if length is not None and length > 900:
        badly.append(f"Impact lasted {_duration(length)}")
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
        items.append((ep.trigger.time, f"{_kind_word(ep.trigger.kind)}: {ep.trigger.detail} "
                                       f"({name_list(list(ep.trigger.services), 2)}) - trigger?"))
    for n, cause in enumerate(ep.causes[:MAX_CHAIN]):
        what = "first anomaly" if n == 0 else "then"
        items.append((cause.first_seen, f"{what}: {cause.title} in {name_list(cause.services, 2)} "
                                        f"({cause.severity})"))
    if ep.detection is not None:
        items.append((ep.detection.time, f"detected: {ep.detection.detail}"))
    for ch in ep.mitigations[:3]:
        items.append((ch.time, f"{_kind_word(ch.kind)}: {ch.detail}"))
    items.append((ep.last_seen, "last error of this incident"))
    for other in pm.episodes[1:4]:
        items.append((other.first_seen, f"separate incident: {other.top.title} in "
                                        f"{name_list(other.services, 2)} until "
                                        f"{pm.when(other.last_seen)}"))
    items.sort(key=lambda it: (it[0] is None, it[0] or ""))
    return items[:MAX_TIMELINE]


# ------------------------------------------------------------------ helpers


class _Span:
    def __init__(self, first: str | None, last: str | None) -> None:
        self.start = parse_time(first)
        self.end = parse_time(last)
        self.seconds = ((self.end - self.start).total_seconds()
                        if self.start and self.end else 0.0)
        self.dated = self.seconds > DATED_AFTER_S

    def when(self, value: str | None) -> str:
        return clock(value, dated=self.dated)


def _suggestions_by_incident(report: Report) -> dict[str, str]:
    out: dict[str, str] = {}
    for s in report.suggestions:  # most severe first: the first one an incident has wins
        for key in s.incidents:
            out.setdefault(key, s.text)
    return out


def _cause_rank(c: Cause) -> tuple[int, int, str]:
    return (-SEVERITY_WEIGHT.get(c.severity, 1), -c.count, c.title)


def _earliest(values: object) -> str | None:
    parsed = [(parse_time(v), v) for v in values if v]  # type: ignore[attr-defined]
    return min((p for p in parsed if p[0] is not None), default=(None, None))[1]


def _latest(values: object) -> str | None:
    parsed = [(parse_time(v), v) for v in values if v]  # type: ignore[attr-defined]
    return max((p for p in parsed if p[0] is not None), default=(None, None))[1]


def _seconds_between(a: str | None, b: str | None) -> float | None:
    ta, tb = parse_time(a), parse_time(b)
    return (tb - ta).total_seconds() if ta and tb else None


def between(a: str | None, b: str | None) -> str:
    seconds = _seconds_between(a, b)
    return _duration(max(seconds, 0.0)) if seconds is not None else "an unknown time"


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min" + (f" {seconds % 60} s" if seconds < 600 and seconds % 60
                                         else "")
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def clock(value: str | None, *, dated: bool = False) -> str:
    """A time of day; with the date when the logs span more than a day."""
    when: datetime | None = parse_time(value)
    if when is None:
        return "an unknown time"
    return when.strftime("%Y-%m-%d %H:%M:%S" if dated else "%H:%M:%S")


def name_list(items: list[str], limit: int) -> str:
    if not items:
        return "an unnamed service"
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _kind_word(kind: str) -> str:
    return {"deploy": "Deploy", "rollback": "Rollback", "config": "Config change",
            "scale": "Scaling", "restart": "Restart", "cleanup": "Cleanup",
            "alert": "Alert", "alert_resolved": "Alert resolved"}.get(kind, kind)


def _clip(text: str, limit: int = MAX_EXAMPLE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
