"""Which report a fragment belongs to: "<UTC bucket>/<group>", and the time format reports use."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Literal

from streams.records import Fragment

logger = logging.getLogger(__name__)

Window = Literal["hour", "day", "week"]
GroupBy = Literal["service", "source", "all"]
UNDATED = "undated"


def report_key(fragment: Fragment, *, window: Window, group_by: GroupBy) -> str:
    """The id of the report a fragment belongs to: "<UTC bucket>/<group>"."""
    if window not in ("hour", "day", "week"):
        raise ValueError(f"report window must be hour, day or week, not {window!r}")
    if group_by not in ("service", "source", "all"):
        raise ValueError(f"report group_by must be service, source or all, not {group_by!r}")
    when = None
    for value in (fragment.timestamp, fragment.window.start, fragment.window.end):
        when = parse_time(value)
        if when is not None:
            break
    return f"{_bucket(when, window)}/{_group(fragment, group_by)}"


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        logger.warning("ignoring timestamp %r: not ISO-8601", value)
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def format_time(value: datetime) -> str:
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
