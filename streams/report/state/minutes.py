"""Record counts per UTC minute: how a report keeps rates over time.

A report stores no per-record times, only each template's ``minutes`` (see
``TemplateEvidence``), built in the batch stage from the records' own event
times, and each service's (``Report.service_minutes``), the same counts summed
by the fragments' service. These helpers add, share and read them; keys are
``YYYY-MM-DDTHH:MM`` in UTC, so they sort in time order as text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from streams.report.state.model import TemplateEvidence

MINUTE_FORMAT = "%Y-%m-%dT%H:%M"


def parse_minute(key: str) -> datetime:
    """The start of a minute key as an aware UTC datetime; ValueError if it is not one."""
    return datetime.strptime(key, MINUTE_FORMAT).replace(tzinfo=UTC)


def add_minutes(*counts: Mapping[str, int]) -> dict[str, int]:
    """Counts summed per minute, oldest first, so a report's bytes do not depend on
    the order its fragments came in."""
    out: dict[str, int] = {}
    for part in counts:
        for key, n in part.items():
            out[key] = out.get(key, 0) + n
    return {key: n for key, n in sorted(out.items()) if n}


def add_service_minutes(
    *counts: Mapping[str, Mapping[str, int]],
) -> dict[str, dict[str, int]]:
    """Counts per service summed per minute: services in name order, each oldest first,
    a service without a dated record left out (bytes independent of arrival order)."""
    parts: dict[str, list[Mapping[str, int]]] = {}
    for part in counts:
        for service, minutes in part.items():
            parts.setdefault(service, []).append(minutes)
    summed = ((service, add_minutes(*parts[service])) for service in sorted(parts))
    return {service: minutes for service, minutes in summed if minutes}


def minute_counts(evidence: Iterable[TemplateEvidence]) -> dict[str, int]:
    """Records per minute over several templates (an incident's, or a source's)."""
    return add_minutes(*(ev.minutes for ev in evidence))


def share_minutes(minutes: Mapping[str, int], new: int, offered: int) -> dict[str, int]:
    """A fragment's minute counts for the ``new`` of its ``offered`` records a report
    has not counted yet.

    All new (the usual case): the counts as they are. Part of a replay: which records
    were new is known by coordinates but their minutes are not, so each minute is
    scaled by new/offered and rounded by largest remainder; the total is then exactly
    the dated records' share rounded to nearest, which is ``new`` itself when every
    record has a time, and never more than ``new``. Only the spread over minutes is
    an estimate.
    """
    total = sum(minutes.values())
    offered = max(offered, total)  # a total above the count is never trusted beyond it
    if new <= 0 or not total:
        return {}
    if new >= offered:
        return dict(minutes)
    target = (2 * total * new + offered) // (2 * offered)
    shares = {key: n * new // offered for key, n in minutes.items()}
    # the largest remainders get the units left; ties to the earlier minute, so the
    # result depends on the counts alone
    by_remainder = sorted(minutes, key=lambda key: (-(minutes[key] * new % offered), key))
    for key in by_remainder[: target - sum(shares.values())]:
        shares[key] += 1
    return {key: n for key, n in sorted(shares.items()) if n}


def minute_time(minute: str) -> str:
    """A minute key as the ISO-8601 time of its start, as reports print and sort times."""
    return f"{minute}:00Z"
