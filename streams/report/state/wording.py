"""How a report's times and names read to a person: spans, durations, clipped lines.

Pure helpers over the report's ISO-8601 times (``parse_time``), shared by the analysis,
the views and the notifications.
"""

from __future__ import annotations

from datetime import datetime

from streams.report.state.keys import parse_time

MAX_EXAMPLE_CHARS = 200
DATED_AFTER_S = 20 * 3600  # logs spanning longer than this show dates with their times


class Span:
    def __init__(self, first: str | None, last: str | None) -> None:
        self.start = parse_time(first)
        self.end = parse_time(last)
        self.seconds = ((self.end - self.start).total_seconds()
                        if self.start and self.end else 0.0)
        self.dated = self.seconds > DATED_AFTER_S

    def when(self, value: str | None) -> str:
        return clock(value, dated=self.dated)


def earliest(values: object) -> str | None:
    parsed = [(parse_time(v), v) for v in values if v]  # type: ignore[attr-defined]
    return min((p for p in parsed if p[0] is not None), default=(None, None))[1]


def latest(values: object) -> str | None:
    parsed = [(parse_time(v), v) for v in values if v]  # type: ignore[attr-defined]
    return max((p for p in parsed if p[0] is not None), default=(None, None))[1]


def seconds_between(a: str | None, b: str | None) -> float | None:
    ta, tb = parse_time(a), parse_time(b)
    return (tb - ta).total_seconds() if ta and tb else None


def between(a: str | None, b: str | None) -> str:
    seconds = seconds_between(a, b)
    return duration(max(seconds, 0.0)) if seconds is not None else "an unknown time"


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min" + (f" {seconds % 60} s" if seconds < 600 and seconds % 60
                                         else "")
    if seconds < 2 * 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def clock(value: str | None, *, dated: bool = False) -> str:
    """A time of day; with the date when the logs span more than a day."""
    when: datetime | None = parse_time(value)
    if when is None:
        return "an unknown time"
    return when.strftime("%Y-%m-%d %H:%M:%S" if dated else "%H:%M:%S")


def name_list(items: list[str], limit: int) -> str:
    if not items:
        return "an unnamed service"
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def clip(text: str, limit: int = MAX_EXAMPLE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
