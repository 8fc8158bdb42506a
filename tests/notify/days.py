"""Reports whose incidents of the day come from series built by hand: a steady hour of
background in three services, and failures where a test puts them."""

from __future__ import annotations

from collections.abc import Iterable

from streams.report.state.model import Report, Series

RID = "2026-11-29/all"
DAY = [f"2026-11-29T{h:02d}:{m:02d}" for h in (10, 11) for m in range(60)]


def minutes(first: int, last: int, n: int = 6) -> dict[str, int]:
    """``n`` records a minute from ``DAY[first]`` to ``DAY[last]``, both included."""
    return dict.fromkeys(DAY[first:last + 1], n)


def day_report(*, errors: Iterable[tuple[str, str, dict[str, int]]] = (),
               callers: Iterable[tuple[str, str, str, dict[str, int]]] = (),
               until: int = len(DAY) - 1, report_id: str = RID) -> Report:
    """Two hours of background up to ``DAY[until]``, with error lines
    (service, template, minutes) and callers' error lines naming a callee
    (caller, template, callee, minutes); minutes past ``until`` are not seen yet."""
    seen = DAY[:until + 1]
    series: dict[str, dict[str, Series]] = {
        "api": {"GET /orders done": Series(level="INFO", minutes=dict.fromkeys(seen, 40))},
        "db": {"query ok": Series(level="INFO", minutes=dict.fromkeys(seen, 30))},
        "checkout": {"POST /pay done": Series(level="INFO", minutes=dict.fromkeys(seen, 20))},
    }
    for service, template, when in errors:
        series[service][template] = Series(level="ERROR", minutes=_upto(when, seen))
    for caller, template, callee, when in callers:
        counts = _upto(when, seen)
        series[caller][template] = Series(level="ERROR", minutes=counts,
                                          named={callee: sum(counts.values())})
    return Report(id=report_id, version=until, updated_at=f"{seen[-1]}:59.000Z",
                  first_seen=f"{seen[0]}:00.000Z", last_seen=f"{seen[-1]}:59.000Z",
                  services=sorted(series), series=series)


def _upto(when: dict[str, int], seen: list[str]) -> dict[str, int]:
    return {m: n for m, n in when.items() if m in set(seen)}
