"""What a report says the on-call should know: its incidents, as the post-mortem sees them.

An incident here is a post-mortem episode (``streams.report.analysis.postmortem``) of medium or
worse: causes that overlap in time, judged against their own baseline, with their
suspected origin. Routine traffic, chronic noise and change events are not incidents,
so they never page anyone. Everything an alert says is built from the episode's titles,
services, times and counts, redacted once more on the way out: never from a log line
(the evidence examples stay in the report).
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.records import Severity
from streams.redact import Redactor
from streams.report.analysis.causes import Cause
from streams.report.analysis.postmortem import EPISODE_GAP_S, Episode, derive, origin_title
from streams.report.state.keys import parse_time
from streams.report.state.model import SEVERITY_WEIGHT, Report
from streams.report.state.wording import clip, name_list

MAX_TEXT = 300  # characters of a title or summary sent out
FAILING = SEVERITY_WEIGHT["medium"]  # a cause this severe identifies its episode


@dataclass(frozen=True, slots=True)
class Alert:
    """One incident of one report version, as it would be notified."""

    report_id: str
    keys: tuple[str, ...]  # report incident keys of its failing causes, root cause first
    service: str  # the suspected origin, else the service of its main cause
    severity: Severity  # its worst cause
    title: str
    summary: str  # one sentence
    origin: str | None  # "<service>, first anomaly at <time>" when the post-mortem names one
    first_seen: str | None
    last_seen: str | None
    ended: bool  # the logs show it ended, or its report's window is over
    closed: bool = False  # its window is over: a later one began and this one stopped growing


def alerts_for(report: Report, *, redactor: Redactor | None = None,
               closed: bool = False) -> list[Alert]:
    """The incidents of ``report``, most significant first. ``closed``: its window is
    over, so whatever was ongoing here goes on (if at all) in the next one."""
    pm = derive(report)
    redactor = redactor or Redactor()
    out = []
    for ep in pm.episodes:
        failing = [c for c in ep.causes if SEVERITY_WEIGHT.get(c.severity, 1) >= FAILING]
        if not failing:
            continue
        keys = tuple(dict.fromkeys(k for c in failing for k in c.keys))
        worst = max(failing, key=lambda c: SEVERITY_WEIGHT.get(c.severity, 1))
        top = ep.top
        service = ep.origin.service if ep.origin is not None else _lead_service(top, ep)
        origin = None
        if ep.origin is not None:
            origin = f"{ep.origin.service}, first anomaly at {ep.origin.first_seen or 'unknown'}"
        out.append(Alert(
            report_id=report.id, keys=keys, service=service,
            severity=worst.severity,  # type: ignore[arg-type]
            title=_safe(origin_title(ep, ep.origin) if ep.origin is not None
                        else f"{top.title} in {name_list(top.services, 2)}", redactor),
            summary=_safe(_sentence(ep, top), redactor),
            origin=_safe(origin, redactor) if origin else None,
            first_seen=ep.first_seen, last_seen=ep.last_seen,
            ended=closed or _ended(ep, report.last_seen), closed=closed))
    return out


def _lead_service(top: Cause, ep: Episode) -> str:
    services = top.services or ep.services
    return services[0] if services else "unknown"


def _sentence(ep: Episode, top: Cause) -> str:
    """The episode in numbers, as the post-mortem's first summary sentence puts it (a
    roll-up speaks of one cause only, so the episode's own words are used)."""
    errors = sum(c.count for c in ep.causes if SEVERITY_WEIGHT.get(c.severity, 1) >= FAILING)
    services = ep.services
    return (f"From {ep.first_seen or 'an unknown time'} to {ep.last_seen or 'now'}, "
            f"{len(services)} service(s) failed ({name_list(services, 3)}): {top.title} "
            f"({top.severity}), with {errors:,} error records in {len(ep.causes)} related "
            f"cause(s).")


def _ended(ep: Episode, report_last_seen: str | None) -> bool:
    """The post-mortem's rule: the report's records go on past the episode's last
    error by more than the gap that would still join a cause to it."""
    last, end = parse_time(ep.last_seen), parse_time(report_last_seen)
    return last is not None and end is not None and (end - last).total_seconds() > EPISODE_GAP_S


def _safe(text: str, redactor: Redactor) -> str:
    """One line, redacted and cut: a title can carry a template of a log line."""
    redacted, _ = redactor.redact(" ".join(text.split()))
    return clip(redacted, MAX_TEXT)
