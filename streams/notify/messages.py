"""What is sent: Alertmanager alerts (API v2) and Slack-compatible chat messages.

Alertmanager identifies an alert by its label set, so the labels are the ledger's
stable ones, few and of low cardinality: ``alertname="RetroIncident"``, the report, the
incident id, the service it began in (its origin when it opened) and a severity;
callers, times, titles and evidence are annotations. An escalation to a higher
severity is a new label set, as Prometheus rules with tiered severities have it: the
lower one is ended at the escalation, the higher one is active. An open incident is
posted with ``endsAt`` a few refreshes ahead, an ended one with ``endsAt`` at its end;
posting either again is a no-op for Alertmanager.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from streams.notify.ledger import Change, Entry
from streams.report.state.keys import format_time, parse_time
from streams.report.state.model import SEVERITY_WEIGHT
from streams.settings import Settings

ALERTNAME = "RetroIncident"
HORIZON_REFRESHES = 4  # an open alert lapses after this many refreshes missed
_LOOPBACK_FOR = {"", "0.0.0.0", "::", "[::]"}


def report_link(settings: Settings, report_id: str) -> str:
    """The report's HTML view: RETRO_NOTIFY__EXTERNAL_URL, else this worker's address."""
    base = settings.notify.external_url
    if not base:
        host = "127.0.0.1" if settings.web_host in _LOOPBACK_FOR else settings.web_host
        base = f"http://{host}:{settings.web_port}"
    return f"{base.rstrip('/')}/view/{quote(report_id, safe='/')}"


def labels(entry: Entry, severity: str) -> dict[str, str]:
    return {"alertname": ALERTNAME, "report": entry.report_id, "incident": entry.id,
            "service": entry.service, "severity": severity}


def alertmanager_alerts(entry: Entry, *, link: str, now: datetime,
                        refresh_seconds: float) -> list[dict[str, Any]]:
    """The incident's alerts as they stand: one per severity it was notified at."""
    last = entry.changes[-1]
    current = entry.severity
    first = entry.changes[0]
    out = []
    for severity in entry.severities:
        if severity != current:
            ends = _raised_past(entry, severity) or first.at
        elif entry.open:
            ends = format_time(now + timedelta(seconds=HORIZON_REFRESHES * refresh_seconds))
        else:
            ends = last.at
        starts = _earliest(first.first_seen, first.at, ends)
        annotations = {"summary": last.summary, "title": last.title,
                       "origin": last.origin or entry.service,
                       "callers": ", ".join(last.callers),
                       "first_seen": last.first_seen or "", "last_seen": last.last_seen or "",
                       "evidence": "\n".join(last.evidence), "report_url": link}
        out.append({"labels": labels(entry, severity), "annotations": annotations,
                    "startsAt": starts, "endsAt": ends, "generatorURL": link})
    return out


def _raised_past(entry: Entry, severity: str) -> str | None:
    """When the incident was first notified above ``severity``: its alert ended then."""
    weight = SEVERITY_WEIGHT[severity]
    return next((c.at for c in entry.changes if SEVERITY_WEIGHT[c.severity] > weight), None)


def _earliest(*times: str | None) -> str:
    """startsAt must precede endsAt, even for logs stamped ahead of this clock."""
    parsed = [t for t in (parse_time(x) for x in times) if t is not None]
    return format_time(min(parsed)) if parsed else format_time(datetime.now(UTC))


def webhook_message(entry: Entry, n: int, *, link: str) -> dict[str, Any]:
    """The chat message of the incident's ``n``-th change, as Slack's incoming webhooks
    take it (``text`` with ``<url|label>`` links; Mattermost reads the same): what
    changed, its origin, callers and start, and the evidence."""
    change = entry.changes[n]
    before = entry.changes[n - 1] if n else None
    lines = [f"[retro] Incident {_verb(change, before)}: {_esc(change.title)}",
             _esc(change.summary)]
    if change.kind != "ended":
        callers = ", ".join(change.callers) or "none reported"
        lines.append(f"Origin: {_esc(change.origin or entry.service)}, since "
                     f"{change.first_seen or 'unknown'}. Callers failing: {_esc(callers)}.")
        lines += [f"- {_esc(e)}" for e in change.evidence]
    lines.append(f"<{link}|Post-mortem {_esc(entry.report_id)}> (incident {_esc(entry.id)}, "
                 f"service {_esc(entry.service)})")
    return {"text": "\n".join(lines)}


def _verb(change: Change, before: Change | None) -> str:
    if change.kind == "opened":
        return f"opened ({change.severity})"
    if change.kind == "escalated":
        if before is not None and before.severity != change.severity:
            return f"escalated {before.severity} -> {change.severity}"
        new = sorted(set(change.callers) - set(before.callers if before else ()))
        return f"escalated ({change.severity}, more callers failing: {', '.join(new)})"
    if change.why == "gone":
        return "ended (no longer an incident in the logs)"
    if change.why == "merged":
        return "ended (merged into another incident)"
    if change.why == "window closed":
        return "ended with its report window (it goes on in the next window, if at all)"
    return f"ended (last departure at {change.last_seen or 'unknown'})"


def _esc(text: str) -> str:
    """Slack's three control characters; everything else is text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
