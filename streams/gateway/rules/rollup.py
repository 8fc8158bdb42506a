"""The offline analyzer's answer to a roll-up payload (``streams.report.analysis.rollup``).

No model writes prose offline, so the summary is composed from the incident's own
fields in a fixed order: same payload, same summary. It reads the payload defensively
(a sloppy or hostile payload yields a plainer summary, never an exception).
"""

from __future__ import annotations

from typing import Any

MAX_CAUSE_CHARS = 300
MAX_SUGGESTION_CHARS = 400
MAX_EVENT_CHARS = 200


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
    raw_cause = incident.get("cause")
    if isinstance(raw_cause, str):  # the summary states the cause; evidence is in the report
        raw_cause = raw_cause.split(" Evidence:", 1)[0].rstrip(" .")
    cause = _text(raw_cause, MAX_CAUSE_CHARS)
    if cause:
        sentences.append(f"Likely cause: {_sentence_body(cause)}.")
    suggestion = _first_suggestion(incident.get("suggestions"))
    if suggestion:
        sentences.append(f"Next step: {_sentence_body(suggestion)}.")
    else:
        template = _top_template(incident.get("templates"))
        hint = f" starting with the most frequent template '{template}'" if template else ""
        sentences.append(f"Next step: review the log evidence{hint}.")
    return {"summary": " ".join(sentences)}


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
