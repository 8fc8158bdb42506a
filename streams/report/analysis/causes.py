"""Causes as an engineer counts them, from a report's incidents (pure: no I/O, no clock).

The vocabulary of the post-mortem (``streams.report.analysis.postmortem``): incidents
of one title are one cause across templates and services; deploys, rollbacks, config
changes, scaling, restarts, cleanups and alerts are change events, not incidents;
evidence and entities are capped. Whether an unclassified template is a cause is the
post-mortem's call, by its counts against their baseline
(``streams.report.analysis.baseline``); ``MIN_ANOMALY_RECORDS`` and
``ANOMALY_CEILING`` bound it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from streams.batch.entities import count_entities, top_entities
from streams.gateway.rules.language import affirmed
from streams.report.state.merge import normalize_text
from streams.report.state.model import SEVERITY_WEIGHT, Incident
from streams.report.state.wording import clip, earliest, latest

ChangeKind = Literal[
    "deploy", "rollback", "config", "scale", "restart", "cleanup", "alert", "alert_resolved"
]

MAX_EVIDENCE_TEMPLATES = 3  # per cause
MAX_EXAMPLES = 2  # per evidence template
MAX_ENTITIES = 3
MIN_ANOMALY_RECORDS = 3
ANOMALY_CEILING = "medium"  # an unclassified template is a lead to follow, not a known outage

# change events, matched on an incident's event title and templates; the first match wins;
# a match counts when the line asserts it ("no configuration change required" does not)
_CHANGES: tuple[tuple[ChangeKind, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(rx, re.IGNORECASE))
    for kind, rx in (
        ("alert_resolved", r"\b(?:alert|alarm)s?\b.{0,40}\b(?:resolved|cleared)\b"),
        ("alert", r"\b(?:alert|alarm)s?\b"),
        ("rollback", r"\broll(?:ed|ing)?[ -]?back\b|\brevert|\bdowngrad"),
        ("deploy", r"\bdeploy|\brollout\b|\brelease\b|\bupgrade"),
        ("config", r"\bconfig(?:uration)?s?\b|\bfeature flag"),
        ("scale", r"\bscal(?:e|ed|ing)\b|\breplicas?\b"),
        ("cleanup", r"\bpurg|\bclean(?:ed)?[ -]?up\b|\bfreed\b"),
        # a link or an interface that is up is the network back, no process restarted
        ("restart", r"\brestart|(?<!link )(?<!interface )\bis up\b|\bstarted\b|\bstarting\b"),
    )
)
_SECURITY = re.compile(r"auth|login|password|permission|denied|brute|intrusion|forbidden", re.I)
_SUBJECT = re.compile(r"\s*\(([^()]*)\)\s*$")


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
    entities: list[tuple[str, int]] = field(default_factory=list)
    entities_counted: bool = False  # over all records (else in the evidence examples)
    suggestion: str | None = None
    summary: str | None = None  # the model's roll-up, when there is one
    anomaly: str | None = None  # what its counts say (burst, new) against its baseline
    burst: int | None = None  # records in its burst, when a burst in a longer series

    @property
    def weight(self) -> int:
        """Severity x records; a burst in a longer series weighs its burst's records."""
        return SEVERITY_WEIGHT.get(self.severity, 1) * max(self.burst or self.count, 1)


@dataclass(frozen=True, slots=True)
class Change:
    kind: ChangeKind
    time: str | None
    title: str
    detail: str  # one real line; for an episode, the line most like its causes
    services: tuple[str, ...]
    key: str
    lines: tuple[str, ...] = ()  # a line of each of its (at most 3) templates


# ------------------------------------------------------------------ classification


def change_kind(inc: Incident) -> ChangeKind | None:
    """A change event: a low-severity incident whose title or templates name a change."""
    if SEVERITY_WEIGHT.get(inc.severity, 1) > SEVERITY_WEIGHT["low"]:
        return None  # "deploy failed" with errors is a failure, not a change
    templates = [ev.template for ev in inc.evidence[:3]]
    for kind, pattern in _CHANGES:
        if affirmed(pattern, inc.event, "change") and not _denied(pattern, templates):
            return kind
    if normalize_text(inc.event).startswith(("routine", "unclassified")):
        return None  # a routine template that mentions "started" is not a restart
    for kind, pattern in _CHANGES:
        if any(affirmed(pattern, t, "change") for t in templates):
            return kind
    return None


def _denied(pattern: re.Pattern[str], templates: list[str]) -> bool:
    """Every template that names the change says it did not happen: a title taken from
    "No configuration change required" names no change."""
    naming = [t for t in templates if pattern.search(t)]
    return bool(naming) and not any(affirmed(pattern, t, "change") for t in naming)


def as_change(inc: Incident, kind: ChangeKind) -> Change:
    """A change and a real line of each of its (at most 3) templates."""
    lines = tuple(clip(ev.examples[0] if ev.examples else ev.template, 160)
                  for ev in inc.evidence[:3])
    detail = lines[0] if lines else inc.event
    return Change(kind, inc.first_seen, inc.event, detail, tuple(inc.services), inc.key, lines)


def words(text: str) -> set[str]:
    """Lowercase words, camelCase split: "HikariPoolExhausted" -> hikari, pool, exhausted."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", text)
    return {w for w in re.findall(r"[a-z]{3,}", spaced.lower())}


def is_unclassified(inc: Incident) -> bool:
    text = normalize_text(f"{inc.event} {inc.cause}")
    return text.startswith("unclassified") or " unclassified " in f" {text} "


def split_title(event: str) -> tuple[str, list[str]]:
    """("Service discovery: no instances ...", ["ts-x"]) from "... (ts-x)": the subject apart."""
    match = _SUBJECT.search(event)
    if not match:
        return event.strip(), []
    subjects = [s.strip() for s in match.group(1).split(",") if s.strip()]
    return event[: match.start()].strip(), subjects


def group_causes(incidents: list[Incident], kind: Literal["failure", "anomaly", "users"],
           suggestions: dict[str, str]) -> list[Cause]:
    groups: dict[str, list[Incident]] = {}
    for inc in incidents:
        groups.setdefault(normalize_text(split_title(inc.event)[0]), []).append(inc)
    return [_cause(members, kind, suggestions) for members in groups.values()]


def _cause(members: list[Incident], kind: Literal["failure", "anomaly", "users"],
           suggestions: dict[str, str]) -> Cause:
    largest = max(members, key=lambda i: (i.count, i.key))
    title, _ = split_title(largest.event)
    subjects = list(dict.fromkeys(s for i in members for s in split_title(i.event)[1]))
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
        first_seen=earliest(i.first_seen for i in members),
        last_seen=latest(i.last_seen for i in members),
        cause=largest.cause.split(" Evidence:", 1)[0].strip(),
        subjects=subjects[:5],
        evidence=[Evidence(t, n, tuple(clip(x) for x in ex[:MAX_EXAMPLES]))
                  for t, (n, ex) in shown],
        suggestion=next((suggestions[i.key] for i in sorted(members, key=lambda i: -i.count)
                         if i.key in suggestions), None),
        summary=largest.summary,
    )
    if kind == "users" or SEVERITY_WEIGHT.get(severity, 1) >= SEVERITY_WEIGHT["medium"] \
            or _SECURITY.search(title):
        counted: dict[str, int] = {}  # over all records, as the batch stage counted them
        for inc in members:
            for ev in inc.evidence:
                for name, n in ev.entities.items():
                    counted[name] = counted.get(name, 0) + n
        if counted:
            cause.entities = list(top_entities(counted, MAX_ENTITIES).items())
            cause.entities_counted = True
        else:  # reports from before entity counts: the evidence examples only
            examples = [x for ev in evidence.values() for x in ev[1]]
            cause.entities = entities_in(examples)
    return cause


def entities_in(texts: list[str], limit: int = MAX_ENTITIES) -> list[tuple[str, int]]:
    """Addresses, users, hosts and pods named in ``texts``, most frequent first."""
    return list(top_entities(count_entities(texts), limit).items())


# ------------------------------------------------------------------ ranking and words


def cause_rank(c: Cause) -> tuple[int, int, str]:
    return (-SEVERITY_WEIGHT.get(c.severity, 1), -c.count, c.title)


def kind_word(kind: str) -> str:
    return {"deploy": "Deploy", "rollback": "Rollback", "config": "Config change",
            "scale": "Scaling", "restart": "Restart", "cleanup": "Cleanup",
            "alert": "Alert", "alert_resolved": "Alert resolved"}.get(kind, kind)
