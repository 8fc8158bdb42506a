"""What a report version late in the day costs the baseline walk: kept or from scratch.

The notifier derives every version of a growing report. ``Walk`` keeps the walk over
the report's minutes from one version to the next, so a version judges its new minutes
and the few newest again; ``find_departures`` walks the whole report. A generated day
(``--services`` services of ``--lines`` lines each, Poisson counts at rates from 0.5 to
20 a minute, the first line of each a warning) is walked up to ``--minutes`` - 1 and
then the next version, ``--repeat`` times; CPU seconds of each, and whether both find
the same departures.

Run: ``.venv/bin/python bench/walk_bench.py [--minutes 1440] [--services 45]
[--lines 14] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from _common import add_tag_argument, table, write_result

from streams.report.analysis.departures import Walk, find_departures
from streams.report.state.model import Series


def generated_day(minutes: list[str], services: int, lines: int, seed: int = 1
                  ) -> dict[tuple[str, str, str], dict[str, int]]:
    rng = random.Random(seed)
    day = {}
    for s in range(services):
        for t in range(lines):
            rate = rng.choice([0.5, 2.0, 5.0, 20.0])
            counts = {m: n for m in minutes if (n := _poisson(rng, rate))}
            day[(f"svc{s}", f"line {t} of svc{s}", "WARN" if t == 0 else "INFO")] = counts
    return day


def _poisson(rng: random.Random, mean: float) -> int:
    return sum(rng.random() < mean / 60 for _ in range(60))


def version(day: dict[tuple[str, str, str], dict[str, int]], before: str
            ) -> dict[str, dict[str, Series]]:
    """The report holding every minute before ``before``."""
    out: dict[str, dict[str, Series]] = {}
    for (service, template, level), counts in day.items():
        kept = {m: n for m, n in counts.items() if m < before}
        if kept:
            out.setdefault(service, {})[template] = Series(level=level, minutes=kept)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=1440)
    parser.add_argument("--services", type=int, default=45)
    parser.add_argument("--lines", type=int, default=14)
    parser.add_argument("--repeat", type=int, default=3)
    add_tag_argument(parser)
    args = parser.parse_args()
    minutes = [f"2026-11-29T{m // 60:02d}:{m % 60:02d}" for m in range(args.minutes)]
    day = generated_day(minutes, args.services, args.lines)
    earlier, later = version(day, minutes[-2]), version(day, minutes[-1])
    kept, scratch, same = [], [], True
    for _ in range(args.repeat):
        walk = Walk()
        walk.findings(earlier)
        began = time.process_time()
        found = walk.findings(later)
        kept.append(time.process_time() - began)
        began = time.process_time()
        fresh = find_departures(later)
        scratch.append(time.process_time() - began)
        same = same and found.departures == fresh.departures and found.chronic == fresh.chronic
    k, f = statistics.median(kept), statistics.median(scratch)
    print(table(["walk of the next version", "CPU s (median)", "min", "max"], [
        ["kept from the last version", round(k, 3), round(min(kept), 3), round(max(kept), 3)],
        ["from scratch", round(f, 3), round(min(scratch), 3), round(max(scratch), 3)],
    ]))
    print(f"\n{args.services * args.lines} lines, {args.minutes} minutes: kept/scratch "
          f"{k / f:.2f}; same departures and chronic lines: {'yes' if same else 'NO'}")
    path = write_result("walk_bench", {
        "lines": args.services * args.lines,
        "minutes": args.minutes, "kept_s": kept, "scratch_s": scratch, "ratio": k / f,
        "same": same}, args.tag)
    print(f"result: {path}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
