"""Roll-up: one model call rewrites an incident's summary once the incident has changed.

The pure half of the feature. The compactor step's background task
(``CompactStep.background``, every ``RETRO_REPORT__ROLLUP_SECONDS``) looks for incidents whose
record count moved since their last summary (``needs_rollup``), builds a prompt from
what the report already holds (``rollup_payload``, ``rollup_messages``), sends it
through the gateway (``Gateway.summarize``), and hands a ``RollupUpdate`` to the
compactor, which folds it in with ``apply_rollup``.

Only redacted report data goes into the prompt and never raw coordinates, like the
batch payload of ``streams.batch.prompt``. ``apply_rollup`` is idempotent and ignores stale
updates, so a late or replayed update can never overwrite a newer summary.

The payload also carries what the report's counts say (``minutes``: how its records
spread over minutes) and what the post-mortem judged from them (``judgement``: new or
bursting vs chronic background, the suspected origin of its episode and whether this
incident is that origin or its callers' impact, the calibrated severity), so the model
writes the summary on the same footing as the post-mortem instead of guessing.

Each template carries the verdict of the stream's own baseline in each of its services
(``baseline``: new, departed as a burst or a thinning line with observed against expected
records, chronic, usual), and the incident's ``baseline`` the day incidents those
departures are part of, with their origin service, callers, start and end
(``streams.report.analysis.verdicts`` says why the roll-up, not the batch prompt, carries
them). Every text is clipped and the payload sheds examples, then templates, until its
prompt fits ``ROLLUP_INPUT_TOKENS``.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from streams.batch.callees import same_service
from streams.gateway.rollup_prompt import (
    MAX_SUMMARY_CHARS,
    ROLLUP_INPUT_TOKENS,
    ROLLUP_KIND,
    rollup_prompt_tokens,
)
from streams.report.analysis.postmortem import PostMortem, derive
from streams.report.analysis.verdicts import Baseline
from streams.report.state.keys import format_time
from streams.report.state.minutes import minute_counts
from streams.report.state.model import Incident, Report

logger = logging.getLogger(__name__)

MAX_TEMPLATES = 5  # evidence templates in a payload, the most frequent first
MAX_TEMPLATE_EXAMPLES = 3
MAX_PAYLOAD_EXAMPLE_CHARS = 500  # per example: keeps a roll-up prompt at a few thousand tokens
MAX_SUGGESTIONS = 5
MAX_EVENT_CHARS = 200
MAX_CAUSE_CHARS = 600
MAX_TEMPLATE_CHARS = 300
MAX_SUGGESTION_CHARS = 300
MAX_WHY_CHARS = 300

# --- what needs a roll-up ---------------------------------------------------------


def needs_rollup(incident: Incident) -> bool:
    """True when the incident changed since its last summary (or never had one)."""
    return incident.summary_count != incident.count


def rollup_payload(
    report_id: str,
    incident: Incident,
    *,
    report: Report | None = None,
    postmortem: PostMortem | None = None,
) -> dict[str, Any]:
    """The JSON the model sees for one incident: report data only, no raw coordinates.

    ``report`` supplies the incident's suggestions (they live on the report, linked by
    incident key) and the post-mortem's judgement of it (derived from the report unless
    ``postmortem`` is given: pass it when summarising several incidents of one report);
    without a report the payload has neither.
    """
    evidence = sorted(incident.evidence, key=lambda e: (-e.count, e.template))[:MAX_TEMPLATES]
    suggestions: list[str] = []
    judgement: dict[str, Any] | None = None
    verdicts: list[list[dict[str, Any]]] = [[] for _ in evidence]
    baseline: dict[str, Any] | None = None
    if report is not None:
        linked = [s for s in report.suggestions if incident.key in s.incidents]
        suggestions = [_cut(s.text, MAX_SUGGESTION_CHARS) for s in linked[:MAX_SUGGESTIONS]]
        pm = postmortem if postmortem is not None else _derived(report)
        if pm is not None:
            judgement = judge_incident(incident, pm)
            verdicts, baseline = _verdicts(report, pm, incident, [ev.template for ev in evidence])
    templates: list[dict[str, Any]] = []
    for ev, said in zip(evidence, verdicts, strict=True):
        entry: dict[str, Any] = {
            "template": _cut(ev.template, MAX_TEMPLATE_CHARS),
            "count": ev.count,
            "examples": [ex[:MAX_PAYLOAD_EXAMPLE_CHARS]
                         for ex in ev.examples[:MAX_TEMPLATE_EXAMPLES]],
        }
        if said:
            entry["baseline"] = said
        templates.append(entry)
    payload: dict[str, Any] = {
        "kind": ROLLUP_KIND,
        "report": report_id,
        "incident": {
            "key": incident.key,
            "event": _cut(incident.event, MAX_EVENT_CHARS),
            "cause": _cut(incident.cause, MAX_CAUSE_CHARS),
            "severity": incident.severity,
            "services": list(incident.services),
            "count": incident.count,
            "first_seen": incident.first_seen,
            "last_seen": incident.last_seen,
            "templates": templates,
            "suggestions": suggestions,
        },
    }
    minutes = minute_spread(incident)
    if minutes is not None:
        payload["incident"]["minutes"] = minutes
    if judgement is not None:
        payload["incident"]["judgement"] = judgement
    if baseline is not None:
        payload["incident"]["baseline"] = baseline
    _fit(payload)
    return payload


def _fit(payload: dict[str, Any]) -> None:
    """Shed examples (the least frequent template's first), then the least frequent
    templates, until the prompt fits ``ROLLUP_INPUT_TOKENS``; the most frequent template
    and every verdict of the templates kept stay."""
    templates = payload["incident"]["templates"]
    while rollup_prompt_tokens(payload) > ROLLUP_INPUT_TOKENS:
        shown = [t for t in reversed(templates) if t["examples"]]
        if shown:
            max(shown, key=lambda t: len(t["examples"]))["examples"].pop()
        elif len(templates) > 1:
            templates.pop()
        else:
            return


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- what the counts and the post-mortem say ------------------------------------------


def minute_spread(incident: Incident) -> dict[str, Any] | None:
    """How the incident's dated records spread over UTC minutes: minutes with records,
    the busiest minute and its records; None without dated records."""
    counts = minute_counts(incident.evidence)
    if not counts:
        return None
    peak = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return {"with_records": len(counts), "first": next(iter(counts)),
            "last": next(reversed(counts)), "peak": peak[0], "peak_records": peak[1]}


def judge_incident(incident: Incident, pm: PostMortem) -> dict[str, Any] | None:
    """What the post-mortem concluded about the cause this incident belongs to: its
    pattern by counts (burst or new: the anomaly; chronic or sporadic: background), the
    test behind it, the calibrated severity, the span of its anomaly, and its role
    against the suspected origin of its episode. None when the post-mortem does not
    count it as a failure (a change, routine, a folded warning)."""
    episode = next((ep for ep in pm.episodes for c in ep.causes if incident.key in c.keys),
                   None)
    cause = next((c for c in [*pm.causes, *pm.chronic] if incident.key in c.keys), None)
    if cause is None:
        return None
    chronic = any(c is cause for c in pm.chronic)
    said = (cause.anomaly or "").split(":", 1)[0].strip()
    pattern = said if said in ("burst", "new", "chronic", "sporadic") else (
        "chronic" if chronic else "unknown")
    out: dict[str, Any] = {
        "pattern": pattern,
        "counts": cause.anomaly or "not judged by counts",
        "severity": cause.severity,
        "anomaly_first_seen": cause.first_seen,
        "anomaly_last_seen": cause.last_seen,
    }
    if chronic:
        out["chronic"] = "background through the window: not this incident's trigger or cause"
    origin = episode.origin if episode is not None else None
    if origin is None:
        out["role"] = "unknown"
        return out
    own = any(same_service(s, origin.service) for s in incident.services)
    out["role"] = "origin" if own else "impact"
    out["suspected_origin"] = {
        "service": origin.service,
        "first_anomaly": origin.first_seen,
        "why": _cut(origin.reason, MAX_WHY_CHARS),
        "callers": [c for c in origin.callers if not same_service(c, origin.service)][:5],
        "logged_own_failure": origin.logged,
    }
    return out


# the last report derived (the object, and its version and count in case it was changed in
# place), and its post-mortem
_LAST: list[tuple[Report, tuple[object, ...], PostMortem | None]] = []


def _derived(report: Report) -> PostMortem | None:
    """The report's post-mortem, derived once for all incidents of one roll-up pass (the
    pass hands the same report object for each); None if deriving fails, so a post-mortem
    bug costs the judgement, never the summary."""
    before = report.previous
    stamp = (report.version, report.record_count, report.updated_at, id(before),
             None if before is None else before.version)
    if _LAST and _LAST[0][0] is report and _LAST[0][1] == stamp:
        return _LAST[0][2]
    try:
        pm: PostMortem | None = derive(report)
    except Exception:  # the summary goes on without the judgement
        logger.exception("post-mortem of report %s failed; roll-up without judgement",
                         report.id)
        pm = None
    _LAST[:] = [(report, stamp, pm)]
    return pm


# the baseline of the last post-mortem read: every incident of one pass reads the same
_BASELINE: list[tuple[PostMortem, Baseline]] = []


def _verdicts(report: Report, pm: PostMortem, incident: Incident, templates: list[str]
              ) -> tuple[list[list[dict[str, Any]]], dict[str, Any] | None]:
    """The baseline's verdicts on ``templates`` and the incident's ``baseline`` block; none
    if reading them fails, so a bug there costs the verdicts, never the summary."""
    try:
        if not (_BASELINE and _BASELINE[0][0] is pm):
            _BASELINE[:] = [(pm, Baseline.of(report.series, pm.findings, pm.incidents))]
        return _BASELINE[0][1].read(incident, templates)
    except Exception:
        logger.exception("baseline verdicts of report %s failed; roll-up without them",
                         report.id)
        return [[] for _ in templates], None


# --- the message to the compactor -------------------------------------------------


class RollupUpdate(BaseModel):
    """A new summary for one incident, as of ``based_on_count`` records."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    report_id: str = Field(min_length=1)
    incident_key: str = Field(min_length=1)
    summary: str = Field(min_length=1, max_length=MAX_SUMMARY_CHARS)
    based_on_count: int = Field(ge=0)
    model: str
    prompt_version: str

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, data: str | bytes | dict[str, Any]) -> RollupUpdate:
        """Raises ``pydantic.ValidationError`` (a ValueError) on a malformed message."""
        if isinstance(data, dict):
            return cls.model_validate(data)
        return cls.model_validate_json(data)


def apply_rollup(
    report: Report, update: RollupUpdate, *, now: str | None = None
) -> tuple[Report, bool]:
    """Fold a summary into a report; (the report, whether it changed).

    Pure: the input report is not modified. Ignored (returned as is, False): another
    report's update, an unknown incident, a stale update (based on fewer records than
    the current summary), an update based on more records than the incident has (it
    was written for another history of this report; taking it would make the incident
    look stale forever), and an update that changes nothing (a replay).
    ``changes`` keeps describing the last merge: a summary is not new data.
    """
    if update.report_id != report.id:
        logger.warning(
            "roll-up for report %s ignored: applied to report %s", update.report_id, report.id
        )
        return report, False
    incident = report.incident(update.incident_key)
    if incident is None:
        logger.info(
            "roll-up for unknown incident %s of report %s ignored",
            update.incident_key,
            report.id,
        )
        return report, False
    if update.based_on_count < (incident.summary_count or 0):
        logger.debug(
            "stale roll-up for incident %s ignored: based on %d records, current summary on %d",
            incident.key,
            update.based_on_count,
            incident.summary_count,
        )
        return report, False
    if update.based_on_count > incident.count:
        logger.warning(
            "roll-up for incident %s ignored: based on %d records, the incident has %d",
            incident.key,
            update.based_on_count,
            incident.count,
        )
        return report, False
    if incident.summary == update.summary and incident.summary_count == update.based_on_count:
        return report, False

    # Shallow copies: only the one incident's scalar fields and the report's
    # incidents list, version and updated_at are replaced.
    changed = incident.model_copy(
        update={"summary": update.summary, "summary_count": update.based_on_count}
    )
    out = report.model_copy()
    out.incidents = [changed if i.key == incident.key else i for i in report.incidents]
    out.version = report.version + 1
    out.updated_at = now if now is not None else _now()
    logger.debug(
        "incident %s of report %s summarised by %s@%s (%d records)",
        incident.key,
        report.id,
        update.model,
        update.prompt_version,
        update.based_on_count,
    )
    return out, True


def _now() -> str:
    return format_time(datetime.now(UTC))
