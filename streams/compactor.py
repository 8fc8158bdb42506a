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
"""

from __future__ import annotations

import hashlib
import logging
import re
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field

from streams.errors import ValidationFailed
from streams.intervals import Coverage
from streams.records import Fragment, Severity

logger = logging.getLogger(__name__)

Window = Literal["hour", "day", "week"]
GroupBy = Literal["service", "source", "all"]
MergeResult = Literal["applied", "duplicate", "partial"]
CoverageJSON = dict[str, list[list[int]]]

SEVERITY_WEIGHT: dict[str, int] = {"info": 1, "low": 2, "medium": 4, "high": 8, "critical": 16}
MAX_EXAMPLES = 5  # per template evidence
MAX_EXAMPLE_CHARS = 1000  # longer examples are cut, so one stack trace cannot bloat a report
MAX_FRAGMENT_IDS = 50  # recent fragment ids, for display and debugging only
UNDATED = "undated"
# Fields that depend on arrival order or wall clock; report_body leaves them out.
_VOLATILE = {"version", "updated_at", "changes", "fragment_ids", "fragments_applied"}
# Incident fields written by the roll-up timer (streams/rollup.py): they depend on when
# the timer ran, not on the fragments, so report_body leaves them out too.
_VOLATILE_INCIDENT = {"summary", "summary_count"}


class TemplateEvidence(BaseModel):
    """The records of one log template inside an incident, with a few examples."""

    template: str
    covered: CoverageJSON = Field(default_factory=dict)
    examples: list[str] = Field(default_factory=list)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def count(self) -> int:
        return len(Coverage.from_json(self.covered))


class Incident(BaseModel):
    """Records that share a normalized (event, cause) signature."""

    key: str
    event: str
    cause: str
    severity: Severity
    services: list[str] = Field(default_factory=list)
    lanes: list[str] = Field(default_factory=list)
    first_seen: str | None = None
    last_seen: str | None = None
    covered: CoverageJSON = Field(default_factory=dict)
    evidence: list[TemplateEvidence] = Field(default_factory=list)
    # The model-written roll-up (streams/rollup.py) and the record count it was based
    # on; merge keeps both as they are, so a summary lags until the next roll-up.
    summary: str | None = None
    summary_count: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def count(self) -> int:
        return len(Coverage.from_json(self.covered))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def examples(self) -> list[str]:
        return pick_examples(ex for ev in self.evidence for ex in ev.examples)


class Suggestion(BaseModel):
    """One de-duplicated action, ranked by severity weight x records it addresses."""

    key: str
    text: str
    incidents: list[str] = Field(default_factory=list)  # incident keys that suggested it
    severity: Severity = "info"  # the highest severity among those incidents
    records: int = 0  # records covered by those incidents
    score: int = 0  # SEVERITY_WEIGHT[severity] * records


class TimelineEntry(BaseModel):
    time: str | None  # None: the incident has no timestamps
    kind: Literal["first_seen", "last_seen"]
    incident: str
    event: str
    severity: Severity
    services: list[str] = Field(default_factory=list)


class IncidentChange(BaseModel):
    key: str
    event: str
    cause: str
    before: int
    after: int


class ReportChanges(BaseModel):
    """What differs between two versions of a report."""

    from_version: int = 0
    to_version: int = 0
    records_before: int = 0
    records_after: int = 0
    new_incidents: list[IncidentChange] = Field(default_factory=list)
    growing: list[IncidentChange] = Field(default_factory=list)


class Report(BaseModel):
    """The post-mortem of one retro window: ``schemas/report.schema.json``."""

    id: str  # e.g. "2026-11-29/all", from report_key
    version: int = 0
    updated_at: str | None = None
    first_seen: str | None = None
    last_seen: str | None = None
    services: list[str] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)  # "model@prompt_version"
    covered: CoverageJSON = Field(default_factory=dict)
    incidents: list[Incident] = Field(default_factory=list)  # most significant first
    suggestions: list[Suggestion] = Field(default_factory=list)  # highest score first
    timeline: list[TimelineEntry] = Field(default_factory=list)
    changes: ReportChanges = Field(default_factory=ReportChanges)
    fragments_applied: int = 0
    fragment_ids: list[str] = Field(default_factory=list)  # most recent last, bounded

    @computed_field  # type: ignore[prop-decorator]
    @property
    def record_count(self) -> int:
        return len(Coverage.from_json(self.covered))

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, data: str | bytes | dict[str, Any]) -> Report:
        """Load a stored report; derived counts are recomputed, never trusted."""
        if isinstance(data, dict):
            return cls.model_validate(data)
        return cls.model_validate_json(data)

    def incident(self, key: str) -> Incident | None:
        return next((i for i in self.incidents if i.key == key), None)


def report_key(fragment: Fragment, *, window: Window, group_by: GroupBy) -> str:
    """The id of the report a fragment belongs to: "<UTC bucket>/<group>"."""
    if window not in ("hour", "day", "week"):
        raise ValueError(f"report window must be hour, day or week, not {window!r}")
    if group_by not in ("service", "source", "all"):
        raise ValueError(f"report group_by must be service, source or all, not {group_by!r}")
    when = None
    for value in (fragment.timestamp, fragment.window.start, fragment.window.end):
        when = _parse_time(value)
        if when is not None:
            break
    return f"{_bucket(when, window)}/{_group(fragment, group_by)}"


def normalize_text(text: str) -> str:
    """Lowercase, digits collapsed, whitespace collapsed: "Disk 3 full." ~ "disk 12  full"."""
    text = re.sub(r"\d+", "#", text.lower())
    return re.sub(r"\s+", " ", text).strip(" .;:!")


def incident_key(event: str, cause: str) -> str:
    signature = f"{normalize_text(event)}\x1f{normalize_text(cause)}"
    return hashlib.sha256(signature.encode()).hexdigest()[:16]


def suggestion_key(text: str) -> str:
    return hashlib.sha256(normalize_text(text).encode()).hexdigest()[:16]


def pick_examples(texts: Any) -> list[str]:
    """Up to MAX_EXAMPLES distinct examples, shortest first, so arrival order never matters."""
    cleaned = {t[:MAX_EXAMPLE_CHARS] for t in texts if isinstance(t, str) and t.strip()}
    return sorted(cleaned, key=lambda t: (len(t), t))[:MAX_EXAMPLES]


def merge(
    report: Report | None, fragment: Fragment, *, report_id: str, now: str | None = None
) -> tuple[Report, MergeResult]:
    """Fold one fragment into a report; returns the new report and what happened.

    Pure: the input report is not modified. ``now`` defaults to the wall clock and
    only sets ``updated_at``.
    """
    if report is not None and report.id != report_id:
        raise ValueError(f"fragment {fragment.id} is for report {report_id}, not {report.id}")
    base = report if report is not None else Report(id=report_id)
    seen = Coverage.from_json(base.covered)
    offered = _coverage(fragment.covered, fragment.id)
    new = offered.difference(seen)
    if not new:
        logger.debug("fragment %s adds nothing to report %s", fragment.id, report_id)
        return base, "duplicate"
    result: MergeResult = "applied" if len(new) == len(offered) else "partial"
    if result == "partial":
        logger.info(
            "fragment %s overlaps report %s: %s of %s records are new",
            fragment.id,
            report_id,
            len(new),
            len(offered),
        )

    # Shallow copy: every field changed below is replaced, and the one incident and the
    # suggestions that are changed in place are copied first, so ``base`` stays intact
    # without deep-copying a whole day's coverage on every merge.
    out = base.model_copy()
    key = incident_key(fragment.event, fragment.cause)
    incidents = {i.key: i for i in base.incidents}
    touched = incidents.get(key)
    incidents[key] = _absorb(
        touched.model_copy(deep=True) if touched is not None else None, key, fragment, new
    )
    out.covered = seen.union(new).to_json()
    out.incidents = sorted(incidents.values(), key=_incident_rank)
    out.suggestions = _suggestions(
        [s.model_copy() for s in base.suggestions], fragment, key, incidents
    )
    out.timeline = _timeline(out.incidents)
    out.services = sorted({s for i in out.incidents for s in i.services})
    out.models = sorted({*out.models, f"{fragment.model}@{fragment.prompt_version}"})
    out.first_seen = _earliest([i.first_seen for i in out.incidents])
    out.last_seen = _latest([i.last_seen for i in out.incidents])
    out.version = base.version + 1
    out.updated_at = now if now is not None else _format_time(datetime.now(UTC))
    out.fragments_applied = base.fragments_applied + 1
    out.fragment_ids = [*base.fragment_ids, fragment.id][-MAX_FRAGMENT_IDS:]
    out.changes = diff_reports(base, out)
    return out, result


def diff_reports(before: Report | None, after: Report) -> ReportChanges:
    """New and growing incidents between two versions (any two, not only adjacent)."""
    old = {i.key: i.count for i in before.incidents} if before is not None else {}
    new_incidents: list[IncidentChange] = []
    growing: list[IncidentChange] = []
    for inc in after.incidents:
        count = inc.count
        change = IncidentChange(
            key=inc.key, event=inc.event, cause=inc.cause, before=old.get(inc.key, 0), after=count
        )
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


def _absorb(inc: Incident | None, key: str, fragment: Fragment, new: Coverage) -> Incident:
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
    inc.covered = Coverage.from_json(inc.covered).union(new).to_json()

    evidence = {ev.template: ev for ev in inc.evidence}
    claimed = Coverage()
    implicit = []
    for ev in fragment.evidence:
        if not ev.covered:
            implicit.append(ev)
            continue
        part = _coverage(ev.covered, fragment.id).intersection(new)
        claimed = claimed.union(part)
        _add_evidence(evidence, ev.template, part, ev.examples)
    # Evidence without its own coverage (older producers) gets what no template claimed.
    remainder = new.difference(claimed)
    for ev in implicit:
        _add_evidence(evidence, ev.template, remainder, ev.examples)
    inc.evidence = sorted(evidence.values(), key=lambda e: (-e.count, e.template))
    return inc


def _add_evidence(
    evidence: dict[str, TemplateEvidence], template: str, part: Coverage, examples: list[str]
) -> None:
    if not part:
        return
    ev = evidence.setdefault(template, TemplateEvidence(template=template))
    ev.covered = Coverage.from_json(ev.covered).union(part).to_json()
    ev.examples = pick_examples([*ev.examples, *examples])


def _suggestions(
    current: list[Suggestion], fragment: Fragment, key: str, incidents: dict[str, Incident]
) -> list[Suggestion]:
    by_key = {s.key: s for s in current}
    text = _display(fragment.suggestion)
    if text:
        skey = suggestion_key(text)
        s = by_key.setdefault(skey, Suggestion(key=skey, text=text))
        s.text = min(s.text, text, key=_text_order)
        s.incidents = sorted({*s.incidents, key})
    for s in by_key.values():
        if key not in s.incidents:
            continue  # only suggestions of the changed incident can change
        linked = [incidents[k] for k in s.incidents if k in incidents]
        covered = Coverage()
        for inc in linked:
            covered = covered.union(Coverage.from_json(inc.covered))
        s.severity = max((i.severity for i in linked), key=SEVERITY_WEIGHT.__getitem__)
        s.records = len(covered)
        s.score = SEVERITY_WEIGHT[s.severity] * s.records
    # the most severe first, then the widest reach: "No action needed" on 1,000 routine
    # lines must not outrank the fix for a high-severity incident
    return sorted(by_key.values(),
                  key=lambda s: (-SEVERITY_WEIGHT[s.severity], -s.score, s.key))


def _timeline(incidents: list[Incident]) -> list[TimelineEntry]:
    entries = []
    for inc in incidents:
        marks: list[tuple[Literal["first_seen", "last_seen"], str | None]] = [
            ("first_seen", inc.first_seen)
        ]
        if inc.last_seen is not None and inc.last_seen != inc.first_seen:
            marks.append(("last_seen", inc.last_seen))
        for kind, time in marks:
            entries.append(
                TimelineEntry(
                    time=time,
                    kind=kind,
                    incident=inc.key,
                    event=inc.event,
                    severity=inc.severity,
                    services=inc.services,
                )
            )
    return sorted(entries, key=lambda e: (e.time is None, e.time or "", e.kind, e.incident))


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


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        logger.warning("ignoring timestamp %r: not ISO-8601", value)
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _format_time(value: datetime) -> str:
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _canonical_times(values: list[str | None]) -> list[str]:
    parsed = (_parse_time(v) for v in values)
    return [_format_time(p) for p in parsed if p is not None]


def _earliest(values: list[str | None]) -> str | None:
    return min(_canonical_times(values), default=None)


def _latest(values: list[str | None]) -> str | None:
    return max(_canonical_times(values), default=None)


def _bucket(when: datetime | None, window: Window) -> str:
    if when is None:
        return UNDATED
    if window == "hour":
        return when.strftime("%Y-%m-%dT%H")
    if window == "day":
        return when.strftime("%Y-%m-%d")
    iso = when.isocalendar()
    return f"{iso.year}-W{iso.week:02d}"


def _group(fragment: Fragment, group_by: GroupBy) -> str:
    if group_by == "all":
        return "all"
    if group_by == "service":
        value = fragment.service
    else:
        # Fragments carry no source field yet; offline runs use the file name as topic.
        value = getattr(fragment, "source", None) or "+".join(
            sorted({k.rsplit("/", 1)[0] for k in fragment.covered})
        )
    value = re.sub(r"[\s/]+", "_", value.strip())
    return value or "unknown"
