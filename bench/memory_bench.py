"""Memory and time of the compactor's merge over many fragments, and how the report grows.

Fragments come from the real stages, offline: the generated sample, ``--copies``
times under different raw topics (one day's traffic, K times over, so every copy
adds new coordinates to the same report), cleaned, batched by the lane windows,
analyzed by the offline ``rules`` model and cut one fragment per day/all report by
each record's own time, as the lane does. They are then merged in a fresh child
process the way the compactor does it: per fragment, the stored report JSON of the
report the fragment names is parsed, ``streams.report.state.merge.merge`` runs, and the
new JSON is stored.

The child reports its peak RSS before merging (imports and fragments loaded) and
after, so the merge's memory is the difference, measured in the same run; and at
checkpoints the report's JSON size, its covered records and ranges, and the mean
time per merge of the last stretch (a merge copies and re-serializes the whole
report, so its cost follows the report's size).

Run: ``.venv/bin/python bench/memory_bench.py [--records 20000] [--copies 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import add_tag_argument, peak_rss_mib, table, write_result

from streams.batch.answers import place_fragments
from streams.batch.window import Batch, TokenWindow
from streams.clean.cleaner import Cleaner
from streams.dev.sample import write_sample
from streams.gateway.factory import build_gateways
from streams.ingest.reader import iter_records, open_source
from streams.records import Fragment, NormalizedRecord, RawCoord
from streams.report.state.keys import record_place
from streams.report.state.merge import merge
from streams.report.state.model import Report
from streams.settings import Settings

NOW = "2026-11-29T00:00:00Z"  # a fixed updated_at: sizes do not depend on the clock
# one report per UTC day, unsharded: the benches measure whole reports
PLACE = functools.partial(record_place, window="day", group_by="all")


def cleaned_sample(records: int, tmp: Path, settings: Settings) -> list[NormalizedRecord]:
    return cleaned_files(write_sample(tmp / "sample", records=records), settings)


def cleaned_files(paths: list[Path], settings: Settings) -> list[NormalizedRecord]:
    """The records of log files as the clean stage emits them, one raw topic per file."""
    cleaner = Cleaner.from_settings(settings)
    out: list[NormalizedRecord] = []
    for path in paths:
        with open_source(str(path)) as stream:
            chunks = iter_records(stream, max_record_bytes=settings.clean.max_record_bytes)
            for offset, (_line, raw) in enumerate(chunks):
                coord = RawCoord(topic=path.name, partition=0, offset=offset)
                for cleaned in cleaner.clean(raw, coord, path.name):
                    if isinstance(cleaned, NormalizedRecord):
                        out.append(cleaned)
    return out


def recoordinate(records: list[NormalizedRecord], copy: int) -> list[NormalizedRecord]:
    """The same records as if read from another raw topic: new coordinates, same content."""
    out = []
    for r in records:
        raw = RawCoord(
            topic=f"copy{copy}.{r.raw.topic}", partition=r.raw.partition, offset=r.raw.offset
        )
        out.append(r.model_copy(update={"raw": raw, "id": raw.id}))
    return out


async def fragments_of(
    records: list[NormalizedRecord], settings: Settings, copies: int
) -> tuple[list[Fragment], int]:
    """Fragments of every copy through the lane windows and the offline rules model, cut
    one per report and naming it in ``report_id``, as the lane publishes them."""
    gateways = build_gateways(settings)
    counter = gateways.window_counter(settings.model.name)
    fragments: list[Fragment] = []
    batches = 0
    try:
        for copy in range(copies):
            windows = {
                lane: TokenWindow(
                    lane=lane,  # type: ignore[arg-type]
                    input_budget=ls.input_budget,
                    context_window=ls.context_window,
                    output_reserve=ls.output_reserve,
                    max_records=ls.max_records,
                    max_wait_seconds=ls.max_wait_seconds,
                    counter=counter,
                )
                for lane, ls in (("fast", settings.fast), ("slow", settings.slow))
            }
            todo: list[Batch] = []
            for record in recoordinate(records, copy):
                todo.extend(windows[record.lane].add(record))
            todo.extend(b for w in windows.values() if (b := w.flush("drain")) is not None)
            batches += len(todo)
            outcomes = await asyncio.gather(*(gateways.lane(b.lane).analyze(b) for b in todo))
            for batch, outcome in zip(todo, outcomes, strict=True):
                fragments.extend(place_fragments(outcome.fragments, batch.by_coord(), PLACE))
    finally:
        await gateways.close()
    return fragments, batches


def total_ranges(report: Report) -> int:
    """Offset ranges stored in a report: its ledger is the only interval set it keeps."""
    return sum(len(ranges) for ranges in report.covered.values())


# --- the child: merging only ----------------------------------------------------------------


def merge_child(path: Path, checkpoints: int) -> dict[str, Any]:
    """Merge every fragment of ``path`` like the compactor agent; runs in a fresh process."""
    fragments = [Fragment.model_validate_json(line) for line in path.read_text().splitlines()]
    gc.collect()
    rss_loaded = peak_rss_mib()
    store: dict[str, str] = {}  # the agent's table: report id -> JSON text
    marks = sorted(
        {max(1, round(len(fragments) * (i + 1) / checkpoints)) for i in range(checkpoints)}
    )
    rows: list[dict[str, Any]] = []
    results: dict[str, int] = {}
    stretch_start, stretch_n = time.perf_counter(), 0
    started = stretch_start
    for n, fragment in enumerate(fragments, 1):
        rid = fragment.report_id
        assert rid is not None  # fragments_of names every fragment's report
        stored = store.get(rid)
        current = Report.from_json(stored) if stored else None
        updated, result = merge(current, fragment, report_id=rid, now=NOW)
        results[result] = results.get(result, 0) + 1
        if result != "duplicate":
            store[rid] = updated.to_json()
        stretch_n += 1
        if n in marks:
            now = time.perf_counter()
            biggest = max(store.values(), key=len)
            report = Report.from_json(biggest)
            rows.append(
                {
                    "fragments": n,
                    "reports": len(store),
                    "largest_report_bytes": len(biggest),
                    "largest_report_records": report.record_count,
                    "largest_report_ranges": total_ranges(report),
                    "largest_report_incidents": len(report.incidents),
                    "bytes_per_record": len(biggest) / max(1, report.record_count),
                    "ms_per_merge_in_stretch": (now - stretch_start) / stretch_n * 1000,
                    "peak_rss_mib": peak_rss_mib(),
                }
            )
            stretch_start, stretch_n = time.perf_counter(), 0
    return {
        "fragments": len(fragments),
        "fragment_bytes": path.stat().st_size,
        "merge_seconds": time.perf_counter() - started,
        "results": results,
        "rss_mib_loaded": rss_loaded,
        "peak_rss_mib_end": peak_rss_mib(),
        "store_bytes": sum(len(v) for v in store.values()),
        "checkpoints": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="generated sample size")
    parser.add_argument(
        "--copies", type=int, default=3, help="times the sample is replayed under new raw topics"
    )
    parser.add_argument("--checkpoints", type=int, default=8, help="rows of the growth table")
    parser.add_argument("--merge-child", type=Path, help=argparse.SUPPRESS)
    add_tag_argument(parser)
    args = parser.parse_args(argv)
    if args.merge_child is not None:  # internal: the measuring child process
        print(json.dumps(merge_child(args.merge_child, args.checkpoints)))
        return 0
    if args.copies < 1 or args.checkpoints < 1:
        parser.error("--copies and --checkpoints must be at least 1")

    settings = Settings()  # the offline rules model: no provider needed
    with tempfile.TemporaryDirectory(prefix="memory-bench-") as tmp:
        t = time.perf_counter()
        records = cleaned_sample(args.records, Path(tmp), settings)
        fragments, batches = asyncio.run(fragments_of(records, settings, args.copies))
        made_s = time.perf_counter() - t
        path = Path(tmp) / "fragments.jsonl"
        path.write_text("".join(f.model_dump_json() + "\n" for f in fragments))
        print(
            f"… {len(records):,} records x {args.copies} copies -> {batches} batches -> "
            f"{len(fragments):,} fragments in {made_s:.1f}s; merging in a child process",
            file=sys.stderr,
            flush=True,
        )
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--merge-child",
                str(path),
                "--checkpoints",
                str(args.checkpoints),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if child.returncode != 0:
        print(child.stderr[-3000:], file=sys.stderr)
        return 1
    res = json.loads(child.stdout)
    rows = [
        (
            c["fragments"],
            c["reports"],
            c["largest_report_records"],
            c["largest_report_ranges"],
            c["largest_report_incidents"],
            c["largest_report_bytes"] / 1024,
            c["bytes_per_record"],
            c["ms_per_merge_in_stretch"],
            c["peak_rss_mib"],
        )
        for c in res["checkpoints"]
    ]
    print(
        table(
            (
                "fragments merged",
                "reports",
                "records",
                "ranges",
                "incidents",
                "report KiB",
                "bytes/record",
                "ms/merge (stretch)",
                "peak RSS MiB",
            ),
            rows,
        )
    )
    first, last = res["checkpoints"][0], res["checkpoints"][-1]
    growth = res["peak_rss_mib_end"] - res["rss_mib_loaded"]
    print(
        f"\nmerge child: peak RSS {res['rss_mib_loaded']:.0f} MiB with {res['fragments']:,} "
        f"fragments loaded ({res['fragment_bytes'] / 1024 / 1024:.1f} MiB of JSON), "
        f"{res['peak_rss_mib_end']:.0f} MiB after merging: +{growth:.1f} MiB for the merge"
    )
    print(
        f"merged in {res['merge_seconds']:.1f}s ({res['results']}); last stretch "
        f"{last['ms_per_merge_in_stretch']:.1f} ms/merge = "
        f"{last['ms_per_merge_in_stretch'] / first['ms_per_merge_in_stretch']:.1f}x the first; "
        f"report JSON {last['largest_report_bytes'] / first['largest_report_bytes']:.1f}x "
        f"for {last['largest_report_records'] / first['largest_report_records']:.1f}x records"
    )
    out = write_result(
        "memory_bench",
        {
            "params": {
                "records": args.records,
                "copies": args.copies,
                "checkpoints": args.checkpoints,
            },
            "records_per_copy": len(records),
            "batches": batches,
            "fragments": len(fragments),
            "generate_seconds": made_s,
            "merge": res,
            "merge_rss_growth_mib": growth,
            "parent_peak_rss_mib": peak_rss_mib(),
        },
        args.tag,
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
