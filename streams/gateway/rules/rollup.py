"""The offline analyzer's answer to a roll-up payload (``streams.report.analysis.rollup``).

No model writes prose offline, so the summary is composed from the incident's own
fields in a fixed order: same payload, same summary. It reads the payload defensively
(a sloppy or hostile payload yields a plainer summary, never an exception).

The baseline's verdicts (``streams.report.analysis.verdicts``) are read the way the
prompt asks a model to: the lines that are new or departed lead, with observed against
expected records; chronic lines are called background, never a cause; the day incident
they are part of names its origin, and when this incident is a caller's impact of it
the next step starts at that origin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_CAUSE_CHARS = 300
MAX_SUGGESTION_CHARS = 400
MAX_EVENT_CHARS = 200
MAX_VERDICT_TEMPLATE_CHARS = 80
MAX_DEPARTED_SAID = 2  # departed lines a summary names


def summarize_incident(payload: dict[str, Any]) -> dict[str, str]:
    """``{"summary": ...}``: what happened, impact, likely cause, next step (2-4 sentences)."""
    raw = payload.get("incident")
    incident: dict[str, Any] = raw if isinstance(raw, dict) else {}
    event = _text(incident.get("event"), MAX_EVENT_CHARS) or "An unnamed incident"
    severity = _text(incident.get("severity"), 20) or "unknown"
    raw_services = incident.get("services")
    services = [
        " ".join(s.split())
        for s in (raw_services if isinstance(raw_services, list) else [])
        if isinstance(s, str) and s.strip()
    ]
    count = incident.get("count")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        records = f"{count:,} log record" + ("" if count == 1 else "s")
    else:
        records = "an unknown number of log records"
    where = ", ".join(sorted(services)[:5]) + (" and others" if len(services) > 5 else "")
    first = _text(incident.get("first_seen"), 40)
    last = _text(incident.get("last_seen"), 40)
    if first and last and first != last:
        span = f" between {first} and {last}"
    elif first or last:
        span = f" at {first or last}"
    else:
        span = ""

    sentences = [
        f"{_sentence_body(event)} ({severity} severity): {records}"
        + (f" from {where}" if where else "")
        + f"{span}."
    ]
    baseline = read_baseline(incident)
    raw_cause = incident.get("cause")
    if isinstance(raw_cause, str):  # the summary states the cause; evidence is in the report
        raw_cause = raw_cause.split(" Evidence:", 1)[0].rstrip(" .")
    cause = _text(raw_cause, MAX_CAUSE_CHARS)
    if cause:
        sentences.append(f"Likely cause: {_sentence_body(cause)}.")
    said = baseline.sentence()
    if said:
        sentences.append(said)
    suggestion = _first_suggestion(incident.get("suggestions"))
    start = (f"start at {baseline.origin}, where the incident began"
             if baseline.origin and baseline.role in ("caller", "affected") else "")
    if suggestion:
        step = f"{start}; then {_lower_first(suggestion)}" if start else suggestion
        sentences.append(f"Next step: {_sentence_body(step)}.")
    elif start:
        sentences.append(f"Next step: {start}.")
    elif baseline.lead:
        sentences.append(f"Next step: review the log evidence starting with '{baseline.lead}', "
                         "the line that departed from its baseline.")
    else:
        template = _top_template(incident.get("templates"))
        hint = f" starting with the most frequent template '{template}'" if template else ""
        sentences.append(f"Next step: review the log evidence{hint}.")
    return {"summary": " ".join(sentences)}


@dataclass
class BaselineReading:
    """What a roll-up payload's baseline verdicts say, read defensively."""

    departed: list[str] = field(default_factory=list)  # a clause per new or departed line
    chronic: list[str] = field(default_factory=list)  # "'template' in service"
    usual: int = 0  # lines judged within their rates
    origin: str | None = None  # of the most severe day incident its lines are part of
    role: str | None = None  # this incident's: origin, caller, affected
    incident: str = ""  # a clause on that day incident
    lead: str | None = None  # the template of the first new or departed line

    def sentence(self) -> str:
        """One sentence for the summary, or "" when nothing was judged."""
        if self.departed:
            said = "; ".join(self.departed[:MAX_DEPARTED_SAID])
            if len(self.departed) > MAX_DEPARTED_SAID:
                said += f" (and {len(self.departed) - MAX_DEPARTED_SAID} more)"
            if self.chronic:
                said += f", while {_joined(self.chronic)} {_be(self.chronic)} chronic background"
        elif self.chronic:
            said = (f"{_joined(self.chronic)} {_be(self.chronic)} chronic background, present "
                    "all along: not what started an incident")
        elif self.usual:
            said = "none of its lines departed from their usual rates"
        else:
            return ""
        tail = f"; {self.incident}" if self.incident else ""
        return f"Against the stream's baseline, {said}{tail}."

    @property
    def judged(self) -> bool:
        """The verdicts say new, departed or chronic: they outrank a pattern by counts."""
        return bool(self.departed or self.chronic)


def read_baseline(incident: dict[str, Any]) -> BaselineReading:
    """The verdicts of the incident's templates and its ``baseline`` block."""
    out = BaselineReading()
    block = incident.get("baseline")
    block = block if isinstance(block, dict) else {}
    raw_days = block.get("incidents")
    days = [d for d in raw_days if isinstance(d, dict)] if isinstance(raw_days, list) else []
    raw_templates = incident.get("templates")
    for item in raw_templates if isinstance(raw_templates, list) else []:
        if not isinstance(item, dict):
            continue
        template = _text(item.get("template"), MAX_VERDICT_TEMPLATE_CHARS) or "a line"
        verdicts = item.get("baseline")
        for verdict in verdicts if isinstance(verdicts, list) else []:
            if not isinstance(verdict, dict):
                continue
            service = _text(verdict.get("service"), 60)
            what = f"'{template}'" + (f" in {service}" if service else "")
            said = verdict.get("verdict")
            if said in ("new", "departed"):
                out.departed.append(_departure(what, verdict))
                out.lead = out.lead or template
            elif said == "chronic":
                out.chronic.append(what)
            elif said == "usual":
                out.usual += 1
    services = block.get("services")
    for verdict in services if isinstance(services, list) else []:
        service = _text(verdict.get("service"), 60) if isinstance(verdict, dict) else ""
        if service and verdict.get("kind") == "quiet":
            out.departed.append(_departure(f"{service}'s volume", verdict))
        elif service and verdict.get("kind") == "slow":
            out.departed.append(_departure(f"calls into {service}", verdict))
    if days:
        _day_incident(out, days[0])
    return out


def _departure(what: str, verdict: dict[str, Any]) -> str:
    kind = verdict.get("kind")
    first = _clock(verdict.get("first"))
    since = f" from {first}" if first else ""
    observed, expected = _number(verdict.get("observed")), _number(verdict.get("expected"))
    if verdict.get("verdict") == "new":
        peak = f" (up to {observed:g} a minute)" if observed is not None else ""
        return f"{what} is new{since}{peak}"
    usual = "expected" if kind == "burst" else "usual"
    against = (f" ({observed:g} a minute against {_amount(expected)} {usual})"
               if observed is not None and expected is not None else "")
    verb = {"burst": "burst", "thin": "thinned out", "quiet": "fell", "slow": "slowed"}.get(
        kind if isinstance(kind, str) else "", "departed")
    return f"{what} {verb}{since}{against}"


def _day_incident(out: BaselineReading, day: dict[str, Any]) -> None:
    origin = _text(day.get("origin"), 60)
    if not origin:
        return
    role = day.get("role") if day.get("role") in ("origin", "caller", "affected") else None
    out.origin, out.role = origin, role
    started, ended = _clock(day.get("started")), _clock(day.get("ended"))
    span = f" from {started}" + (f" to {ended}" if ended else "") if started else ""
    severity = _text(day.get("severity"), 20)
    rated = f", {severity} severity" if severity else ""
    raw_callers = day.get("callers")
    callers = [c for c in raw_callers if isinstance(c, str) and c.strip()][:3] if isinstance(
        raw_callers, list) else []
    trigger = day.get("trigger")
    after = ""
    if isinstance(trigger, dict) and _text(trigger.get("service"), 60):
        at = _clock(trigger.get("time"))
        after = (f", after a change in {_text(trigger.get('service'), 60)}"
                 + (f" at {at}" if at else ""))
    if role == "origin":
        heard = f", and {', '.join(callers)} report failures calling it" if callers else ""
        out.incident = f"the incident began here, in {origin}{span}{rated}{after}{heard}"
    else:
        out.incident = (f"these lines are impact of the incident that began in {origin}"
                        f"{span}{rated}{after}")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _amount(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:.0f}"


def _clock(value: Any) -> str:
    """``HH:MM`` of an ISO time or minute, else the text itself (clipped)."""
    text = _text(value, 40)
    return text[11:16] if len(text) >= 16 and text[10] == "T" else text


def _joined(items: list[str]) -> str:
    return ", ".join(items[:2]) + (f" and {len(items) - 2} more" if len(items) > 2 else "")


def _be(items: list[str]) -> str:
    return "is" if len(items) == 1 else "are"


def _lower_first(text: str) -> str:
    return text[0].lower() + text[1:] if len(text) > 1 and text[1].islower() else text


def _first_suggestion(raw: Any) -> str | None:
    for item in raw if isinstance(raw, list) else []:
        text = _text(item, MAX_SUGGESTION_CHARS)
        if text:
            return text
    return None


def _top_template(raw: Any) -> str | None:
    best: tuple[int, str] | None = None
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict):
            continue
        template = _text(item.get("template"), 120)
        count = item.get("count")
        n = count if isinstance(count, int) and not isinstance(count, bool) else 0
        if template and (best is None or n > best[0]):
            best = (n, template)
    return best[1] if best else None


def _text(value: Any, limit: int) -> str:
    """One line of at most ``limit`` characters, or "" for anything but a string."""
    if not isinstance(value, str):
        return ""
    text = " ".join(value.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def _sentence_body(text: str) -> str:
    """Text without its closing punctuation, so the caller can add exactly one period."""
    return text.rstrip(" .;:!") or text
