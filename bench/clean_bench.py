"""Offline Cleaner throughput, against a trivial pass over the same bytes in the same run.

For each dataset (the generated sample, then every ``*.log`` of ../shared/data):
records are split once by the project's reader, then timed three ways, best of
``--repeat``:

* trivial: decode UTF-8, ``json.loads`` when the record opens with ``{``, else
  ``str.split()``: the least any cleaner must do;
* cleaner: ``Cleaner.clean`` with default settings, a fresh Cleaner per pass (its
  template miner learns as it goes, so every pass does the same work);
* stages: passes with the Cleaner's parts wrapped in timers; the fastest gives each
  stage's share of the pass (the rest is the cost score and the record model).

Run: ``.venv/bin/python bench/clean_bench.py [--records 20000] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import (
    SHARED_DATA,
    Stopwatch,
    add_tag_argument,
    current_rss_mib,
    peak_rss_mib,
    table,
    write_result,
)

from streams.clean.cleaner import Cleaner
from streams.dev.sample import write_sample
from streams.ingest.reader import iter_records, open_source
from streams.records import DeadLetter, RawCoord
from streams.settings import Settings

STAGES = ("decode", "parse", "redact", "templates", "tokens")


def read_records(paths: list[Path], cap: int) -> list[tuple[str, bytes]]:
    """(source, record bytes) for every logical record of ``paths``, in file order."""
    out: list[tuple[str, bytes]] = []
    for path in paths:
        source = path.name.removesuffix(".log")
        with open_source(str(path)) as stream:
            out.extend((source, raw) for _line, raw in iter_records(stream, max_record_bytes=cap))
    return out


def trivial_pass(records: list[tuple[str, bytes]]) -> int:
    """The baseline: what a loop that only decodes and splits (or json-loads) costs."""
    fields = 0
    for _source, raw in records:
        text = raw.decode("utf-8", "replace")
        if text.startswith("{"):
            try:
                value: Any = json.loads(text)
            except ValueError:
                value = text.split()
        else:
            value = text.split()
        fields += len(value)
    return fields


def clean_pass(cleaner: Cleaner, name: str, records: list[tuple[str, bytes]]) -> dict[str, int]:
    """Clean every record; count lanes and dead letters (outputs are dropped, as after a send)."""
    counts = {"fast": 0, "slow": 0, "deadletter": 0}
    for offset, (source, raw) in enumerate(records):
        for out in cleaner.clean(raw, RawCoord(topic=name, partition=0, offset=offset), source):
            counts["deadletter" if isinstance(out, DeadLetter) else out.lane] += 1
    return counts


class _Timed:
    """Stands in for one of the Cleaner's parts, adding each named method's time to a stage."""

    def __init__(self, target: Any, stage: str, totals: dict[str, float], *methods: str) -> None:
        self._target = target
        for method in methods:
            setattr(self, method, _timer(getattr(target, method), stage, totals))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


def _timer(fn: Callable[..., Any], stage: str, totals: dict[str, float]) -> Callable[..., Any]:
    clock = time.perf_counter

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[stage] += clock() - start

    return timed


def instrumented_cleaner(settings: Settings, totals: dict[str, float]) -> Cleaner:
    cleaner = Cleaner.from_settings(settings)
    cleaner.decode = _timer(cleaner.decode, "decode", totals)  # type: ignore[method-assign]
    cleaner.parser = _Timed(cleaner.parser, "parse", totals, "parse")  # type: ignore[assignment]
    cleaner.redactor = _Timed(  # type: ignore[assignment]
        cleaner.redactor, "redact", totals, "redact", "redact_mapping"
    )
    cleaner.templates = _Timed(cleaner.templates, "templates", totals, "match")  # type: ignore[assignment]
    cleaner.tokens = _Timed(cleaner.tokens, "tokens", totals, "count")  # type: ignore[assignment]
    return cleaner


def bench_dataset(name: str, paths: list[Path], settings: Settings, repeat: int) -> dict[str, Any]:
    cap = settings.clean.max_record_bytes
    with Stopwatch() as read_sw:
        records = read_records(paths, cap)
    n = len(records)
    size = sum(len(raw) for _s, raw in records)

    trivial = []
    for _ in range(repeat):
        with Stopwatch() as sw:
            trivial_pass(records)
        trivial.append(sw.seconds)

    cleaned = []
    counts: dict[str, int] = {}
    for _ in range(repeat):
        cleaner = Cleaner.from_settings(settings)  # built outside the timing: one per worker
        with Stopwatch() as sw:
            counts = clean_pass(cleaner, name, records)
        cleaned.append(sw.seconds)

    staged_seconds, shares = float("inf"), {}
    for _ in range(repeat):  # the fastest instrumented pass gives the shares
        totals = dict.fromkeys(STAGES, 0.0)
        cleaner = instrumented_cleaner(settings, totals)
        with Stopwatch() as staged:
            clean_pass(cleaner, name, records)
        if staged.seconds < staged_seconds:
            staged_seconds = staged.seconds
            shares = {stage: totals[stage] / staged.seconds for stage in STAGES}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))

    best_trivial, best_clean = min(trivial), min(cleaned)
    return {
        "name": name,
        "files": [str(p) for p in paths],
        "records": n,
        "bytes": size,
        "lanes": counts,
        "read_seconds": read_sw.seconds,
        "trivial_seconds": trivial,
        "clean_seconds": cleaned,
        "trivial_us_per_record": best_trivial / n * 1e6,
        "clean_us_per_record": best_clean / n * 1e6,
        "clean_records_per_second": n / best_clean,
        "clean_mib_per_second": size / best_clean / (1024 * 1024),
        "ratio_clean_to_trivial": best_clean / best_trivial,
        "instrumented_seconds": staged_seconds,
        "instrumented_overhead": staged_seconds / best_clean - 1.0,
        "stage_shares": shares,
        "peak_rss_mib_after": peak_rss_mib(),
        "rss_mib_after": current_rss_mib(),
    }


def datasets(
    records: int, tmp: Path, data_dir: Path, use_shared: bool
) -> list[tuple[str, list[Path]]]:
    sample = write_sample(tmp / "sample", records=records)
    out = [(f"sample-{records}", sample)]
    if not use_shared:
        return out
    if not data_dir.is_dir():
        print(f"note: {data_dir} is absent; shared data skipped", file=sys.stderr)
        return out
    for path in sorted(data_dir.rglob("*.log")):
        out.append((short_name(path), [path]))
    return out


def short_name(path: Path) -> str:
    """A table-friendly name: the file name without .log, at most 28 characters."""
    name = path.name.removesuffix(".log")
    return name if len(name) <= 28 else name[:27] + "…"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="generated sample size")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes; the best counts")
    parser.add_argument("--data", type=Path, default=SHARED_DATA, help="shared data folder")
    parser.add_argument("--no-shared", action="store_true", help="only the generated sample")
    add_tag_argument(parser)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    settings = Settings()
    Cleaner.from_settings(settings)  # load the token encoding before any memory figure
    rss_start = peak_rss_mib()
    results = []
    with tempfile.TemporaryDirectory(prefix="clean-bench-") as tmp:
        for name, paths in datasets(args.records, Path(tmp), args.data, not args.no_shared):
            print(f"… {name}", file=sys.stderr, flush=True)
            results.append(bench_dataset(name, paths, settings, args.repeat))

    total_n = sum(r["records"] for r in results)
    total_clean = sum(min(r["clean_seconds"]) for r in results)
    total_trivial = sum(min(r["trivial_seconds"]) for r in results)
    rows = [
        (
            r["name"],
            r["records"],
            r["lanes"]["slow"],
            r["lanes"]["deadletter"],
            r["trivial_us_per_record"],
            r["clean_us_per_record"],
            r["clean_records_per_second"],
            f"{r['ratio_clean_to_trivial']:.0f}x",
            r["peak_rss_mib_after"],
        )
        for r in results
    ]
    rows.append(
        (
            "all",
            total_n,
            sum(r["lanes"]["slow"] for r in results),
            sum(r["lanes"]["deadletter"] for r in results),
            total_trivial / total_n * 1e6,
            total_clean / total_n * 1e6,
            total_n / total_clean,
            f"{total_clean / total_trivial:.0f}x",
            peak_rss_mib(),
        )
    )
    print(
        table(
            (
                "dataset",
                "records",
                "slow",
                "dead",
                "trivial µs/rec",
                "clean µs/rec",
                "clean rec/s",
                "clean/trivial",
                "peak RSS MiB",
            ),
            rows,
        )
    )
    print()
    stage_rows = [
        (
            r["name"],
            *(f"{r['stage_shares'][s]:.0%}" for s in (*STAGES, "other")),
            f"{r['instrumented_overhead']:+.0%}",
        )
        for r in results
    ]
    print("share of the fastest instrumented Cleaner pass per stage (other = cost, record model)")
    print(table(("dataset", *STAGES, "other", "timer cost"), stage_rows))
    print(
        f"\npeak RSS {rss_start:.0f} MiB after imports and the token encoding, "
        f"{peak_rss_mib():.0f} MiB at the end; best of {args.repeat} passes"
    )
    path = write_result(
        "clean_bench",
        {
            "params": {
                "records": args.records,
                "repeat": args.repeat,
                "data": str(args.data),
                "shared": not args.no_shared,
            },
            "peak_rss_mib_start": rss_start,
            "peak_rss_mib_end": peak_rss_mib(),
            "total": {
                "records": total_n,
                "clean_seconds": total_clean,
                "trivial_seconds": total_trivial,
                "ratio_clean_to_trivial": total_clean / total_trivial,
            },
            "datasets": results,
        },
        args.tag,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
