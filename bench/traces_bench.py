"""What the trace loop holds and costs at a given traffic: open traces, the closed ones it
remembers, memory and CPU per mark.

A ``TraceTable`` (``streams.traces.table``, the trace loop's state for one partition of
the traces topic) is fed generated marks at ``--rate`` marks a second of event time for
``--seconds``, on an injected clock that keeps pace with event time: each request passes
through ``--services`` services, writing ``--lines`` lines in each, over about 200 ms,
and its marks come from four input partitions; in a ``--failing`` share of requests the
last service's last line is a failure (a failed call to cut). Every ``CHECK_SECONDS``
(as the trace step does) the table closes the complete traces and their hops are cut
into updates (with which line followed which, when marks name their templates).
Printed at the end of each rate: the open traces and marks, the closed traces
remembered, the Python heap the table holds (``tracemalloc``, its peak and at the end,
from a second run), the CPU per mark of adding, closing and cutting hops, and of that
the milliseconds a second the checks took.

Run: ``.venv/bin/python bench/traces_bench.py [--rate 1000 --rate 5000] [--seconds 720]
[--failing 0.1]``
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import time
import tracemalloc
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import add_tag_argument, table, write_result

from streams.records import Coord, TraceMark
from streams.traces.step import CHECK_SECONDS
from streams.traces.table import TraceTable, hop_updates

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
INPUTS = 4  # input partitions the marks come from


def named(service: int, line: int) -> dict[str, str]:
    """The mark's template head, for a trace stage whose marks carry one (which line of
    a service follows which is cut from each closed trace too)."""
    if "template" not in TraceMark.__struct_fields__:
        return {}
    return {"template": f"svc-{service} step {line} of request <*>"}


def requests(rate: int, seconds: float, services: int, lines: int, failing: float,
             seed: int = 7) -> Iterator[list[tuple[float, TraceMark]]]:
    """Each second's (arrival second, mark), ``rate`` marks a second (a request's lines
    may arrive after the next second's first ones, as they do)."""
    rng, fails = random.Random(seed), random.Random(seed + 1)
    per_request = services * lines
    every = per_request / rate  # seconds between two requests
    n = 0
    for second in range(math.ceil(seconds)):
        batch = []
        while n * every < second + 1 and n * every < seconds:
            trace = f"{rng.getrandbits(128):032x}"
            failed = fails.random() < failing
            at = n * every
            for s in range(services):
                for k in range(lines):
                    at += rng.uniform(0.002, 0.012)
                    when = T0 + timedelta(seconds=at)
                    offset = n * per_request + s * lines + k
                    part = offset % INPUTS
                    batch.append((at, TraceMark(
                        trace, f"logs/{part}/{offset}", f"svc-{s}", f"svc-{s}.log",
                        when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
                        Coord("logs", part, offset),
                        failed and s == services - 1 and k == lines - 1, **named(s, k))))
            n += 1
        batch.sort(key=lambda x: x[0])
        yield batch


def feed(rate: int, seconds: float, services: int, lines: int, failing: float, *,
         heap: bool) -> dict[str, Any]:
    """One run; with ``heap``, under ``tracemalloc`` (its figures; CPU is taken from a
    run without it, which slows every allocation). Making the marks is not timed."""
    gc.collect()
    if heap:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0] if heap else 0
    tbl = TraceTable(since=-60.0)
    place = lambda m: m.timestamp[:10] + "/all"  # noqa: E731 - one report a day
    marks, now, next_check, peak_open = 0, 0.0, CHECK_SECONDS, 0
    spent = checks = 0.0
    for batch in requests(rate, seconds, services, lines, failing):
        began = time.process_time()
        for at, mark in batch:
            now = max(now, at)
            while now >= next_check:
                check = time.process_time()
                hop_updates(tbl.due(next_check), place)
                checks += time.process_time() - check
                next_check += CHECK_SECONDS
            tbl.add(mark, ("retro.traces", 0, marks), None, now)
            marks += 1
        spent += time.process_time() - began
        peak_open = max(peak_open, len(tbl.open))
    out: dict[str, Any] = {
        "rate": rate, "marks": marks, "seconds": seconds,
        "open_traces_peak": peak_open,
        "open_marks_end": sum(len(t.marks) for t in tbl.open.values()),
        "closed_remembered": len(tbl.closed),
        "cpu_us_per_mark": round(spent / marks * 1e6, 2),
        "check_ms_per_second": round(checks / seconds * 1e3, 1),
    }
    if heap:
        end, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out |= {"heap_mib_end": round((end - base) / 2**20, 1),
                "heap_mib_peak": round((peak - base) / 2**20, 1)}
    return out


def run(rate: int, seconds: float, services: int, lines: int, failing: float
        ) -> dict[str, Any]:
    timed = feed(rate, seconds, services, lines, failing, heap=False)
    held = feed(rate, seconds, services, lines, failing, heap=True)
    return {**timed, "heap_mib_end": held["heap_mib_end"], "heap_mib_peak": held["heap_mib_peak"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, action="append",
                        help="marks a second (repeat for several); default 1000 and 5000")
    parser.add_argument("--seconds", type=float, default=720.0,
                        help="of event time; the closed traces are remembered 10 minutes")
    parser.add_argument("--services", type=int, default=6)
    parser.add_argument("--lines", type=int, default=3)
    parser.add_argument("--failing", type=float, default=0.0,
                        help="share of requests that fail in their last service")
    add_tag_argument(parser)
    args = parser.parse_args()
    rows = [run(rate, args.seconds, args.services, args.lines, args.failing)
            for rate in (args.rate or [1000, 5000])]
    print(table(["marks/s", "open peak", "marks held", "closed kept", "heap MiB",
                 "heap peak MiB", "us/mark", "checks ms/s"],
                [(r["rate"], r["open_traces_peak"], r["open_marks_end"],
                  r["closed_remembered"], r["heap_mib_end"], r["heap_mib_peak"],
                  r["cpu_us_per_mark"], r["check_ms_per_second"]) for r in rows]))
    write_result("traces_bench", {"runs": rows, "services": args.services,
                                  "lines": args.lines, "failing": args.failing}, tag=args.tag)


if __name__ == "__main__":
    main()
