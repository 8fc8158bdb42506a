"""What a report says the on-call should know: its incidents, one alert each.

An incident here is one of the report's incidents of the day
(``streams.report.analysis.incidents.DayIncident``, the post-mortem's ``incidents``): a
run of departures from the stream's own baseline, with the service where it began
(its origin), the callers whose failures named it, when it started and the evidence.
Chronic noise, routine traffic and change events are no departure, so they page
nobody. An incident has **ended** once the report's records go on
``resolve_after_minutes`` past its last departure, or its report's window is over.

Everything an alert says is built from the incident's services, times, counts and
line templates (the mined form of a line, its values masked), redacted once more on
the way out and cut short: never from a log line (the examples stay in the report).
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.records import Severity
from streams.redact import Redactor
from streams.report.analysis.departures import Departure, Walk
from streams.report.analysis.incidents import DayIncident
from streams.report.analysis.postmortem import derive
from streams.report.state.keys import parse_time
from streams.report.state.model import Report
from streams.report.state.wording import clip, name_list

MAX_TEXT = 300  # characters of a title or summary sent out
MAX_EVIDENCE = 3  # evidence lines an alert carries
MAX_TEMPLATE = 100  # characters of a line template in a piece of evidence
RESOLVE_AFTER_MINUTES = 5.0  # RETRO_NOTIFY__RESOLVE_AFTER_MINUTES by default


@dataclass(frozen=True, slots=True)
class Alert:
    """One incident of one report version, as it would be notified."""

    report_id: str
    service: str  # the incident's origin
    severity: Severity
    started: str  # the minute of its first departure (ISO-8601 UTC)
    last_seen: str  # the end of the minute of its last departure
    title: str
    summary: str  # one sentence: origin, start, callers, trigger
    callers: tuple[str, ...] = ()  # services whose failures named the origin
    services: tuple[str, ...] = ()  # every service that departed in it
    evidence: tuple[str, ...] = ()  # the strongest departures, worded, redacted
    ended: bool = False  # the report's records went on past it, or its window is over
    closed: bool = False  # its window is over: a later one began and this one stopped growing
    # only volume fell: a service gone silent, or one whose records are still on their way
    # (a partition behind the others while a backlog is read)
    silent: bool = False

    def overlaps(self, first_seen: str, last_seen: str) -> bool:
        """Whether it shares a minute with the span ``first_seen``..``last_seen``."""
        return self.started < last_seen and first_seen < self.last_seen


def alerts_for(report: Report, *, redactor: Redactor | None = None, closed: bool = False,
               resolve_after_minutes: float = RESOLVE_AFTER_MINUTES,
               walk: Walk | None = None) -> list[Alert]:
    """The incidents of ``report``, most severe first; never an unjudged one (no
    departure: it was failing when the log began, or began too soon after to judge).
    ``closed``: its window is over, so whatever was ongoing here goes on (if at all) in
    the next one.
    ``walk``: the baseline walk kept from the report's last version."""
    redactor = redactor or Redactor()
    return [_alert(report, inc, redactor, closed=closed,
                   resolved=_resolved(inc, report.last_seen, resolve_after_minutes))
            for inc in derive(report, walk=walk).incidents if not inc.unjudged]


def _alert(report: Report, inc: DayIncident, redactor: Redactor, *, closed: bool,
           resolved: bool) -> Alert:
    return Alert(
        report_id=report.id, service=inc.origin, severity=inc.severity,
        started=inc.started, last_seen=inc.ended,
        title=_safe(inc.title, redactor), summary=_safe(_sentence(inc), redactor),
        callers=tuple(inc.callers), services=tuple(inc.services),
        evidence=tuple(_safe(_evidence(d), redactor) for d in inc.evidence[:MAX_EVIDENCE]),
        ended=closed or resolved, closed=closed,
        silent=all(d.kind == "quiet" for d in inc.evidence))


def _sentence(inc: DayIncident) -> str:
    callers = f"; {inc.suffered('failed calling it')}" if inc.callers else "; no caller reported it"
    trigger = (f"; likely trigger: a change in {inc.trigger.service} at {inc.trigger.time} "
               f"({clip(inc.trigger.text, 80)})" if inc.trigger is not None else "")
    return (f"{inc.origin} departed from its baseline from {inc.started} to {inc.ended} "
            f"({inc.departures} departure(s) in {name_list(inc.services, 3)}){callers}"
            f"{trigger}.")


def _evidence(dep: Departure) -> str:
    return f"{dep.service}: {clip(dep.template, MAX_TEMPLATE)} ({dep.describe()})"


def _resolved(inc: DayIncident, report_last_seen: str | None, after_minutes: float) -> bool:
    """The report's records go on ``after_minutes`` past the incident's last departure."""
    end, last = parse_time(inc.ended), parse_time(report_last_seen)
    return end is not None and last is not None and (
        (last - end).total_seconds() >= after_minutes * 60)


def _safe(text: str, redactor: Redactor) -> str:
    """One line, redacted and cut: a title or template can carry a piece of a log line."""
    redacted, _ = redactor.redact(" ".join(text.split()))
    return clip(redacted, MAX_TEXT)
