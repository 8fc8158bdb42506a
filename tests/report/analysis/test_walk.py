"""A walk kept from one report version to the next finds what a walk from scratch
finds, on every version, however the report grew."""

from __future__ import annotations

import random

from streams.report.analysis.departures import SETTLE_MINUTES, Findings, Walk, find_departures
from streams.report.state.model import Series

MINUTES = [f"2026-11-29T{m // 60:02d}:{m % 60:02d}" for m in range(150)]


def _poisson(rng: random.Random, mean: float) -> int:
    # sums of Bernoulli draws: close enough to Poisson for a baseline to learn
    return sum(rng.random() < mean / 40 for _ in range(40))


def day(seed: int) -> dict[tuple[str, str], tuple[str, dict[str, int], dict[str, int]]]:
    """(service, template) -> (level, records per minute, callees named): steady
    services with pairs of lines, a line that thins out, a new error naming a callee,
    a service that goes quiet and a line that only starts late."""
    rng = random.Random(seed)
    lines: dict[tuple[str, str], tuple[str, dict[str, int], dict[str, int]]] = {}
    for s in ("api", "cart", "db"):
        for t in range(4):
            rate = rng.choice([3.0, 8.0, 20.0])
            counts = {m: _poisson(rng, rate) for m in MINUTES}
            lines[(s, f"{s} step {t} begins")] = ("INFO", counts, {})
            follows = dict(counts)
            if s == "cart" and t == 1:  # an early return from minute 90 on
                follows.update({m: counts[m] // 4 for m in MINUTES[90:110]})
            lines[(s, f"{s} step {t} ends")] = ("INFO", follows, {})
    lines[("api", "payment to cart failed")] = (
        "ERROR", {m: _poisson(rng, 6.0) for m in MINUTES[60:75]}, {"cart": 40})
    lines[("db", "disk almost full")] = ("WARN", {m: 2 for m in MINUTES[::2]}, {})
    for t in range(4):  # db goes quiet for a while
        for key in ((("db", f"db step {t} begins")), ("db", f"db step {t} ends")):
            lines[key][1].update(dict.fromkeys(MINUTES[120:130], 0))
    lines[("cart", "cache rebuilt")] = ("INFO", {m: 5 for m in MINUTES[100:]}, {})
    return lines


def version(lines: dict[tuple[str, str], tuple[str, dict[str, int], dict[str, int]]],
            upto: int, *, since: int = 0, newest_share: float = 0.5
            ) -> dict[str, dict[str, Series]]:
    """The report of the minutes from ``since`` after ``upto`` minutes, its newest minute
    only partly in."""
    out: dict[str, dict[str, Series]] = {}
    for (service, template), (level, counts, named) in lines.items():
        minutes = {m: n for m in MINUTES[since:upto] if (n := counts.get(m, 0))}
        if upto and MINUTES[upto - 1] in minutes:
            minutes[MINUTES[upto - 1]] = int(minutes[MINUTES[upto - 1]] * newest_share)
        minutes = {m: n for m, n in minutes.items() if n}
        if minutes:
            # the smallest trace ids so far: a later minute's are smaller, so they change
            traces = sorted(f"{1000 - MINUTES.index(m):04x}" for m in minutes)[:3] \
                if level == "ERROR" else []
            out.setdefault(service, {})[template] = Series(
                level=level, minutes=minutes, named=named, traces=traces,
                first_seen=f"{min(minutes)}:07Z")
    return out


def same(a: Findings, b: Findings) -> None:
    assert a.departures == b.departures
    assert a.chronic == b.chronic
    assert a.standing == b.standing
    assert a.early == b.early
    assert a.calls == b.calls
    assert a.minutes == b.minutes


def test_a_kept_walk_finds_what_a_walk_from_scratch_finds_on_every_version() -> None:
    for seed in range(3):
        lines = day(seed)
        walk = Walk()
        kinds = set()
        for upto in range(1, len(MINUTES) + 1, 3):
            series = version(lines, upto)
            found = walk.findings(series)
            same(found, find_departures(series))
            kinds |= {d.kind for d in found.departures}
            # it judged only the minutes still settling and the new ones
            assert walk.judged <= SETTLE_MINUTES + 3
        # the day had something of each kind for the kept walk to get right
        assert kinds >= {"new", "thin", "quiet"}


def test_a_kept_walk_with_the_window_before_finds_what_a_walk_from_scratch_finds() -> None:
    lines = day(3)
    before = version(lines, 80, newest_share=1.0)  # the window before ends at minute 80
    walk = Walk()
    for upto in range(81, len(MINUTES) + 1, 4):
        series = version(lines, upto, since=80)
        same(walk.findings(series, before=before), Walk().findings(series, before=before))
        assert walk.judged <= SETTLE_MINUTES + 4 or upto == 81  # the first walks it all
    # the window before grew (a late record): both walk it again alike
    grown = version(lines, 80, newest_share=1.0)
    grown["api"]["api step 0 begins"].minutes[MINUTES[79]] += 5
    series = version(lines, len(MINUTES), since=80)
    same(walk.findings(series, before=grown), Walk().findings(series, before=grown))
    assert walk.judged == len(MINUTES)


def test_a_late_record_or_a_raised_level_starts_the_walk_over_with_the_same_answer() -> None:
    lines = day(7)
    walk = Walk()
    walk.findings(version(lines, 100))
    # a record arrives for a minute long walked, and another line's level is raised
    late = version(lines, 110)
    old = late["cart"]["cart step 0 begins"]
    late["cart"]["cart step 0 begins"] = Series(
        level=old.level, minutes={**old.minutes, MINUTES[50]: old.minutes[MINUTES[50]] + 40})
    same(walk.findings(late), find_departures(late))
    assert walk.judged == 110
    raised = version(lines, 120)
    raised["db"]["disk almost full"] = Series(
        level="INFO", minutes=raised["db"]["disk almost full"].minutes)
    same(walk.findings(raised), find_departures(raised))
    assert walk.judged == 120
    # and the same version again judges only its settling minutes
    same(walk.findings(raised), find_departures(raised))
    assert walk.judged == SETTLE_MINUTES


def hops(seed: int, upto: int) -> dict[str, dict[str, dict[str, int]]]:
    """Hops into cart (``Report.hops``) up to minute ``upto``: about 6 ms a call, slowed
    32 times from minute 130 to 140."""
    rng = random.Random(seed)
    out: dict[str, dict[str, int]] = {}
    for i, minute in enumerate(MINUTES[:upto]):
        slow = 130 <= i < 140
        bins: dict[str, int] = {}
        for _ in range(8):
            b = str(rng.choice([5, 6, 6, 7]) + (10 if slow else 0))
            bins[b] = bins.get(b, 0) + 1
        out[minute] = bins
    return {"cart": out}


def test_a_kept_walk_with_hops_finds_what_a_walk_from_scratch_finds() -> None:
    lines = day(11)
    walk = Walk()
    kinds = set()
    for upto in range(1, len(MINUTES) + 1, 3):
        series, timed = version(lines, upto), hops(11, upto)
        found = walk.findings(series, hops=timed)
        same(found, find_departures(series, hops=timed))
        kinds |= {d.kind for d in found.departures}
        assert walk.judged <= SETTLE_MINUTES + 3
    assert "slow" in kinds
    # a hop arriving late for a minute long walked starts the walk over, alike
    timed["cart"][MINUTES[20]]["30"] = 1
    same(walk.findings(series, hops=timed), find_departures(series, hops=timed))
    assert walk.judged == upto  # every minute of the version


def next_lines(lines: dict[tuple[str, str], tuple[str, dict[str, int], dict[str, int]]],
               upto: int) -> dict[str, dict[str, dict[str, dict[str, int]]]]:
    """``Report.next_lines`` up to minute ``upto``: each step's end came right after its
    beginning in a request, as often as it was written; the rest of the beginnings had
    nothing after them."""
    out: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    for (service, template), (_, begun, _) in lines.items():
        if not template.endswith(" begins"):
            continue
        ended = lines[(service, template.replace(" begins", " ends"))][1]
        nexts = out.setdefault(service, {}).setdefault(template, {})
        for minute in MINUTES[:upto]:
            k, n = ended.get(minute, 0), begun.get(minute, 0)
            for then, times in ((template.replace(" begins", " ends"), k), ("", n - k)):
                if times:
                    nexts.setdefault(then, {})[minute] = times
    return out


def test_a_kept_walk_with_next_lines_finds_what_a_walk_from_scratch_finds() -> None:
    lines = day(13)
    walk = Walk()
    found_thin = set()
    for upto in range(1, len(MINUTES) + 1, 3):
        series, nexts = version(lines, upto, newest_share=1.0), next_lines(lines, upto)
        found = walk.findings(series, next_lines=nexts)
        same(found, find_departures(series, next_lines=nexts))
        found_thin |= {d.minute for d in found.departures
                       if d.kind == "thin" and d.template == "cart step 1 ends"}
        assert walk.judged <= SETTLE_MINUTES + 3
    # the early return was found, while it lasted
    assert found_thin and found_thin <= set(MINUTES[90:110])
    # a count arriving late for a minute long walked starts the walk over, alike
    nexts["cart"]["cart step 0 begins"][""] = {MINUTES[20]: 1}
    same(walk.findings(series, next_lines=nexts), find_departures(series, next_lines=nexts))
    assert walk.judged == upto
