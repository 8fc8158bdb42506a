"""What the simulated provider answers: the rules analysis, written the way the prompt asks.

A real model reads the instructions of ``streams.batch.prompt`` and
``streams.gateway.rollup_prompt``; the fake one reads only the payload, so it plays a
model that follows them, on top of the offline analyzer (``streams.gateway.rules``):

* a batch answer's causes state role and pattern (``'impact of payments, burst: ...'``):
  a finding whose lines name a called service (the phrasings of
  ``streams.report.analysis.origin``) is impact of it, and its event names it in parentheses;
  another failure is the origin; the rest is unknown. The pattern is judged in the
  payload's own span from each finding's count and first/last times;
* severity is calibrated: high or critical stays only for errors in several services
  that overlap in time, or a symptom users see; else it is medium;
* a roll-up answer says origin or impact, and new/burst or chronic, from the payload's
  ``judgement`` (else from a stated cause), with the calibrated severity; where the
  baseline's verdicts judge its lines (new, departed, chronic) or name the day incident
  they are part of, those are said instead, as the prompt ranks them above the judgement.

Pure and deterministic like the analyzer: same payload, same answer.
"""

from __future__ import annotations

import copy
import re
from datetime import UTC, datetime
from typing import Any

from streams.batch.callees import named_services, same_service
from streams.batch.prompt import Pattern, Role, state_cause, stated_cause
from streams.gateway.rules.analyzer import SEVERITIES, analyze
from streams.gateway.rules.rollup import read_baseline, summarize_incident

MIN_SPAN_MINUTES = 10.0  # a shorter input has no rate to compare with: pattern unknown
MIN_PATTERN_RECORDS = 3  # fewer records say nothing about a pattern
NEW_AFTER = 0.25  # first seen after this share of the span: new
BURST_WITHIN = 0.2  # all records within this share of the span (or 5 minutes): burst
BURST_MINUTES = 5.0
CHRONIC_OVER = 0.5  # records from first to last over this share of the span: chronic

_CALL_FAILURE = re.compile(  # a failed call whose callee the line does not name
    r"connection (?:refused|reset|timed out)|no (?:available )?(?:instances?|endpoints?|"
    r"upstreams?)|\bupstream\b|timed out (?:calling|waiting for)|\b5\d\d\b.*\bfrom\b",
    re.IGNORECASE,
)
_USER_FACING = re.compile(
    r"\b(?:HTTP )?5\d\d\b|server errors?\b|service unavailable|bad gateway|gateway timeout"
    r"|internal server error|users? (?:report|see|get)|customer", re.IGNORECASE)
_SUBJECT = re.compile(r"\(([^()]+)\)\s*$")
_FAILING = SEVERITIES.index("medium")


def answer(payload: dict[str, Any]) -> dict[str, Any]:
    """The fake model's answer to a batch or roll-up payload."""
    if payload.get("kind") == "rollup":  # streams.report.analysis.rollup.ROLLUP_KIND
        return summarize(payload)
    return judged(analyze(payload), payload)


# --- batch answers ------------------------------------------------------------------------


def judged(analysis: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """The analyzer's fragments with role, pattern and calibrated severity."""
    fragments = analysis.get("fragments")
    if not isinstance(fragments, list):
        return analysis
    groups = {g.get("ref"): g for g in payload.get("groups") or [] if isinstance(g, dict)}
    span = _span(list(groups.values()))
    found = [_finding(f, [groups[r] for r in f["refs"] if r in groups]) for f in fragments]
    out = []
    for fragment, (calls, times, text) in zip(fragments, found, strict=True):
        severity = fragment["severity"]
        failing = SEVERITIES.index(severity) >= _FAILING
        role: Role = "impact" if calls or (failing and _CALL_FAILURE.search(text)) else (
            "origin" if failing else "unknown")
        pattern = _pattern(times, span) if severity != "info" else "unknown"
        event = fragment["event"]
        if calls and not _SUBJECT.search(event):
            event = f"{event} ({calls})"
        if SEVERITIES.index(severity) > SEVERITIES.index("medium") and not (
                _USER_FACING.search(text) or _across(fragment, times, fragments, found)):
            severity = "medium"
        out.append({**fragment, "event": event, "severity": severity,
                    "cause": state_cause(fragment["cause"], role=role, pattern=pattern,
                                         calls=calls)})
    return {**analysis, "fragments": out}


_Times = tuple[datetime | None, datetime | None, int]


def _finding(fragment: dict[str, Any], groups: list[dict[str, Any]]
             ) -> tuple[str | None, _Times, str]:
    """(the called service its lines name, (first, last, records), its text)."""
    texts = [fragment.get("event", ""), fragment.get("cause", "")]
    for g in groups:
        texts += [str(g.get("template") or ""), *(e for e in g.get("examples") or []
                                                  if isinstance(e, str))]
    service = str(fragment.get("service") or "")
    calls = next((n for n in named_services(texts[2:]) if not same_service(n, service)), None)
    firsts = [t for t in (_time(g.get("first_seen")) for g in groups) if t]
    lasts = [t for t in (_time(g.get("last_seen")) for g in groups) if t]
    count = sum(c for c in (g.get("count") for g in groups) if isinstance(c, int))
    times = (min(firsts) if firsts else None, max(lasts) if lasts else None, count)
    return calls, times, "\n".join(texts)


def _pattern(times: _Times, span: tuple[datetime, datetime] | None) -> Pattern:
    first, last, count = times
    if span is None or first is None or last is None or count < MIN_PATTERN_RECORDS:
        return "unknown"
    minutes = (span[1] - span[0]).total_seconds() / 60
    if minutes < MIN_SPAN_MINUTES:
        return "unknown"
    offset = (first - span[0]).total_seconds() / 60
    length = (last - first).total_seconds() / 60
    if offset >= NEW_AFTER * minutes:
        return "new"
    if length <= max(BURST_MINUTES, BURST_WITHIN * minutes):
        return "burst"
    if length >= CHRONIC_OVER * minutes:
        return "chronic"
    return "unknown"


def _across(fragment: dict[str, Any], times: _Times, fragments: list[dict[str, Any]],
            found: list[tuple[str | None, _Times, str]]) -> bool:
    """Another service fails at the same time (or with no times to tell)."""
    for other, (_, (first, last, _n), _) in zip(fragments, found, strict=True):
        if other is fragment or other["service"] == fragment["service"]:
            continue
        if SEVERITIES.index(other["severity"]) < _FAILING:
            continue
        if None in (times[0], times[1], first, last):
            return True
        if first <= times[1] and times[0] <= last:  # type: ignore[operator]
            return True
    return False


def _span(groups: list[dict[str, Any]]) -> tuple[datetime, datetime] | None:
    firsts = [t for t in (_time(g.get("first_seen")) for g in groups) if t]
    lasts = [t for t in (_time(g.get("last_seen")) for g in groups) if t]
    if not firsts or not lasts:
        return None
    return min(firsts), max(lasts)


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


# --- roll-up answers ---------------------------------------------------------------------


def summarize(payload: dict[str, Any]) -> dict[str, str]:
    """The analyzer's summary, with origin or impact and new or chronic said, and the
    post-mortem's severity."""
    raw = payload.get("incident")
    incident: dict[str, Any] = copy.deepcopy(raw) if isinstance(raw, dict) else {}
    judgement = incident.get("judgement")
    judgement = judgement if isinstance(judgement, dict) else {}
    stated = stated_cause(incident["cause"]) if isinstance(incident.get("cause"), str) else None
    if stated is not None:
        incident["cause"] = stated.text
    if isinstance(judgement.get("severity"), str):
        incident["severity"] = judgement["severity"]
    summary = summarize_incident({**payload, "incident": incident})["summary"]
    baseline = read_baseline(incident)
    if baseline.judged or baseline.origin:  # the summary says them from the baseline
        return {"summary": summary}
    said = _role_clause(incident, judgement, stated)
    pattern = _pattern_clause(judgement, stated)
    extra = "; ".join(x for x in (said, pattern) if x)
    if not extra:
        return {"summary": summary}
    extra = extra[0].upper() + extra[1:] + "."
    head, sep, tail = summary.rpartition(" Next step: ")
    return {"summary": f"{head} {extra}{sep}{tail}" if sep else f"{summary} {extra}"}


def _role_clause(incident: dict[str, Any], judgement: dict[str, Any], stated: Any) -> str:
    origin = judgement.get("suspected_origin")
    origin = origin if isinstance(origin, dict) else {}
    name = origin.get("service") if isinstance(origin.get("service"), str) else None
    when = origin.get("first_anomaly")
    at = f" (first anomaly {when})" if isinstance(when, str) and when else ""
    if judgement.get("role") == "impact" and name:
        return f"these errors are impact: the suspected origin is {name}{at}"
    if judgement.get("role") == "origin" and name:
        callers = [c for c in origin.get("callers") or [] if isinstance(c, str)]
        follow = f"; errors in {', '.join(callers[:3])} follow from it" if callers else ""
        return f"the suspected origin is {name} itself{at}{follow}"
    if stated is not None and stated.role == "impact":
        target = f"a failure in {stated.calls}" if stated.calls else "a failure elsewhere"
        return f"these errors look like impact of {target}"
    if stated is not None and stated.role == "origin":
        services = [s for s in incident.get("services") or [] if isinstance(s, str)]
        return f"the failure looks like it started in {', '.join(services[:2]) or 'it'}"
    return ""


def _pattern_clause(judgement: dict[str, Any], stated: Any) -> str:
    pattern = judgement.get("pattern")
    counts = judgement.get("counts") if isinstance(judgement.get("counts"), str) else ""
    if isinstance(pattern, str) and counts.startswith(f"{pattern}:"):
        counts = counts[len(pattern) + 1:].strip()  # "burst: 40 records ..." says it twice
    if pattern in ("chronic", "sporadic"):
        return f"it is chronic background ({counts}), not this incident's trigger or cause"
    if pattern in ("burst", "new"):
        return f"by its counts it is {pattern} ({counts})"
    if stated is not None and stated.pattern in ("new", "burst"):
        return f"in its batch it looked {stated.pattern}"
    if stated is not None and stated.pattern == "chronic":
        return "in its batch it looked like chronic background"
    return ""
