"""What a report is: the post-mortem of one retro window (``schemas/report.schema.json``).

The report's ``covered`` interval set is its ledger: which raw records it counts.
Merging adds only records the ledger has not seen, so the stored counts of
incidents and templates stay exact without keeping an interval set for each of
them (which grew with every incident and every interleaving of templates).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    computed_field,
    model_serializer,
)

from streams.intervals import Coverage
from streams.records import Severity

CoverageJSON = dict[str, list[list[int]]]

SEVERITY_WEIGHT: dict[str, int] = {"info": 1, "low": 2, "medium": 4, "high": 8, "critical": 16}
MAX_EXAMPLES = 5  # per template evidence
MAX_TEMPLATES = 20  # evidence templates per incident; the rest are counted as one
OTHER_TEMPLATES = "(other templates)"
# Longer examples are cut, so one stack trace cannot bloat a report; 500 characters keep
# a Java trace's message and first frames (the cut was 1000: bench/report_bytes_bench.py).
MAX_EXAMPLE_CHARS = 500
# Runs of digits and hex digits with a digit in them, signed or not: numbers, ids,
# addresses, hashes.
_VARIABLE = re.compile(r"-?[0-9a-f]*[0-9][0-9a-f]*")


# shapes of recent examples remembered: an incident's held examples are picked again
# with every fragment merged into it (4096 at 500 characters are 2 MB at most)
CACHED_SHAPES = 4096


@functools.lru_cache(maxsize=CACHED_SHAPES)
def example_shape(text: str) -> str:
    """An example with its numbers and hex ids blanked out: two examples of one shape
    repeat each other (one line for another block id, one trace at another address)."""
    return " ".join(_VARIABLE.sub("#", text.lower()).split())


def pick_examples(texts: Any) -> list[str]:
    """Up to MAX_EXAMPLES examples of distinct shapes, shortest first.

    Each shape is shown by its shortest text and the shortest of those are kept, so
    picking from a pick plus more texts equals picking from all of them: arrival order
    never matters. One text a shape: near copies that differed only in ids filled the
    slots (7% of a report's bytes), and the entities already count those values.
    """
    best: dict[str, str] = {}
    for text in texts:
        if not isinstance(text, str) or not text.strip():
            continue
        text = text[:MAX_EXAMPLE_CHARS]
        shape = example_shape(text)
        held = best.get(shape)
        if held is None or (len(text), text) < (len(held), held):
            best[shape] = text
    return sorted(best.values(), key=lambda t: (len(t), t))[:MAX_EXAMPLES]


class TemplateEvidence(BaseModel):
    """The records of one log template inside an incident, with a few examples."""

    template: str
    count: int = 0
    examples: list[str] = Field(default_factory=list)
    # addresses, users, hosts, pods over all its records (the most frequent few)
    entities: dict[str, int] = Field(default_factory=dict)
    # records per UTC minute ("YYYY-MM-DDTHH:MM"), oldest first, so a post-mortem can test a
    # rate against the source's own baseline; undated records are not in it (sum <= count)
    minutes: dict[str, int] = Field(default_factory=dict)
    # trace ids of its records at WARN or above, the smallest few (``MAX_TRACES``), in order:
    # a failure in two services' templates that share an id is one request failing in both
    traces: list[str] = Field(default_factory=list)


class Series(BaseModel):
    """One template of one service over the report's window, whatever incident its
    records went to: the rates the analysis learns a baseline from
    (``streams.report.analysis.departures``). Routine lines count as much as errors:
    a usual line that thins out is as telling as a new error."""

    level: str | None = None  # the highest level among its records
    minutes: dict[str, int] = Field(default_factory=dict)  # dated records per UTC minute
    named: dict[str, int] = Field(default_factory=dict)  # callee names its failures give
    # trace ids of its failing records, the smallest few (``smallest_traces``): a failure
    # of two services that share one is one request failing in both
    traces: list[str] = Field(default_factory=list)
    first_seen: str | None = None  # its earliest record's time: a new line began there
    # minute -> its earliest failing record's time in it: where a failure began, exactly
    starts: dict[str, str] = Field(default_factory=dict)

    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        """Leave out what is still empty: most series name no callee and never fail."""
        data = handler(self)
        for name in ("level", "named", "traces", "first_seen", "starts"):
            if not data.get(name):
                del data[name]
        return data


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
    count: int = 0  # records of the report's ledger attributed to this incident
    evidence: list[TemplateEvidence] = Field(default_factory=list)  # at most MAX_TEMPLATES
    # The model-written roll-up (streams/report/analysis/rollup.py) and the record count it was
    # based on; merge keeps both as they are, so a summary lags until the next roll-up.
    summary: str | None = None
    summary_count: int = 0

    # No return annotation: pydantic would take it for the serialized schema.
    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        """Leave out what is still at its empty default: no roll-up yet, no entities, no
        dated records, no failing trace. Most incidents and templates have none of these,
        and every report repeated them per entry; a reader (or a model) fills the default
        back in, so nothing is lost."""
        data = handler(self)
        if data.get("summary", 0) is None:
            del data["summary"]
        if data.get("summary_count") == 0:
            del data["summary_count"]
        for ev in data.get("evidence", ()):
            for name, empty in (("entities", {}), ("minutes", {}), ("traces", [])):
                if ev.get(name) == empty:
                    del ev[name]
        return data

    @property
    def examples(self) -> list[str]:
        """A few examples over all templates, for readers. Derived from ``evidence`` on
        read, never serialized: stored, it repeated up to MAX_EXAMPLES of its texts."""
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


def timeline_of(incidents: list[Incident]) -> list[TimelineEntry]:
    """Each incident's first sighting, and its last when it differs; undated ones last."""
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


class IncidentChange(BaseModel):
    """An incident's growth; its event and cause are the incident's (``Report.incident``)."""

    key: str
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

    id: str  # e.g. "2026-11-29/all", from record_place
    version: int = 0
    updated_at: str | None = None
    first_seen: str | None = None
    last_seen: str | None = None
    services: list[str] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)  # "model@prompt_version"
    covered: CoverageJSON = Field(default_factory=dict)
    incidents: list[Incident] = Field(default_factory=list)  # most significant first
    suggestions: list[Suggestion] = Field(default_factory=list)  # highest score first
    changes: ReportChanges = Field(default_factory=ReportChanges)
    fragments_applied: int = 0
    fragment_ids: list[str] = Field(default_factory=list)  # most recent last, bounded
    # service -> UTC minute ("YYYY-MM-DDTHH:MM") -> its dated records in the report, routine
    # included: what a service logged per minute, whatever incidents its records went to
    # (an incident's evidence is merged across services by template text)
    service_minutes: dict[str, dict[str, int]] = Field(default_factory=dict)
    # service -> template -> its dated records per minute, level and callees named: every
    # line the report counts, at most MAX_SERIES per service (``streams.report.state.series``)
    series: dict[str, dict[str, Series]] = Field(default_factory=dict)
    # service -> UTC minute -> hop-delay bin (``streams.traces.table.hop_bin``) -> hops
    # into the service that began then: how long its callers' requests took to reach it
    hops: dict[str, dict[str, dict[str, int]]] = Field(default_factory=dict)
    # caller -> callee -> hops from one to the other: the call graph the requests showed
    calls: dict[str, dict[str, int]] = Field(default_factory=dict)
    # caller -> callee -> UTC minute -> requests that failed in the caller after it called
    # the callee last (``streams.traces.table.failed_calls_of``)
    failed_calls: dict[str, dict[str, dict[str, int]]] = Field(default_factory=dict)
    # service -> template -> the template of the service's next line in the request (""
    # when none came) -> UTC minute -> times (``streams.traces.table.next_lines_of``)
    next_lines: dict[str, dict[str, dict[str, dict[str, int]]]] = Field(default_factory=dict)
    hops_covered: CoverageJSON = Field(default_factory=dict)  # the trace marks counted
    # the report of the window before, when a reader holds it: never stored or compared
    _previous: Report | None = PrivateAttr(default=None)

    # No return annotation: pydantic would take it for the serialized schema.
    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        """Leave out ``service_minutes`` and ``series`` while no record is dated (a reader
        fills them back in)."""
        data = handler(self)
        for name in ("service_minutes", "series", "hops", "calls", "failed_calls",
                     "next_lines", "hops_covered"):
            if data.get(name) == {}:
                del data[name]
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def record_count(self) -> int:
        return len(Coverage.from_json(self.covered))

    @property
    def timeline(self) -> list[TimelineEntry]:
        """First and last sightings of the incidents, oldest first. Computed on read from
        ``incidents`` (a stored copy only repeated them; one in an older report is ignored)."""
        return timeline_of(self.incidents)

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, data: str | bytes | dict[str, Any]) -> Report:
        """Load a stored report; derived counts are recomputed, never trusted."""
        if isinstance(data, dict):
            return cls.model_validate(data)
        return cls.model_validate_json(data)

    def follows(self, previous: Report | None) -> None:
        """Remember the report of the window before this one (yesterday's, for a day): its
        last hours are the baseline this window's first hours are judged against."""
        self._previous = previous

    @property
    def previous(self) -> Report | None:
        return self._previous

    def incident(self, key: str) -> Incident | None:
        return next((i for i in self.incidents if i.key == key), None)
