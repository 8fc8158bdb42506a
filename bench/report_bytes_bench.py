"""Where the bytes of a served report go: the JSON by field, per report and per record.

Reports are built offline the way the pipeline builds them: log files (the real
logs of ``../shared/data`` unless ``--no-real``, and the generated sample) are
cleaned, batched by the lane windows, analyzed by the offline ``rules`` model, cut
one fragment per day/all report by each record's own time like the lane, and merged
into the report each fragment names with ``streams.report.state.merge``, ``--flush``
fragments at a time like the compactor. Each report is then serialized as the worker's
``/reports/{window}/{group}`` serves it (``json.dumps`` of ``model_dump``, compact),
and its bytes are split by top-level field and, inside incidents and their
evidence, by sub-field (a member's key, value and separator count as its bytes).

Run: ``.venv/bin/python bench/report_bytes_bench.py [--records 50000] [--no-real]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from _common import SHARED_DATA, add_tag_argument, table, write_result
from memory_bench import NOW, cleaned_files, fragments_of

from streams.dev.sample import write_sample
from streams.records import Fragment
from streams.report.state.merge import merge_all
from streams.report.state.model import Report
from streams.settings import Settings


def served(report: Report) -> str:
    """The body of ``/reports/{window}/{group}``: faust's ``web.json`` is compact json.dumps."""
    return json.dumps(report.model_dump(mode="json"), separators=(",", ":"))


def size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def members(doc: dict[str, Any], prefix: str, into: Counter[str]) -> None:
    """Bytes of each member of ``doc`` under ``prefix``: key, colon, value and comma."""
    for key, value in doc.items():
        into[f"{prefix}{key}"] += size(key) + 1 + size(value) + 1


def breakdown(doc: dict[str, Any]) -> Counter[str]:
    """Bytes by field: top level, then incidents.*, then incidents.evidence.*."""
    out: Counter[str] = Counter()
    members(doc, "", out)
    for inc in doc.get("incidents", []):
        members(inc, "incidents.", out)
        for ev in inc.get("evidence", []):
            members(ev, "incidents.evidence.", out)
    return out


def build_reports(fragments: list[Fragment], flush: int) -> list[Report]:
    """Day/all reports, ``flush`` fragments of a report merged at once (one version each)."""
    by_report: dict[str, list[Fragment]] = defaultdict(list)
    for f in fragments:
        assert f.report_id is not None  # fragments_of names every fragment's report
        by_report[f.report_id].append(f)
    reports = []
    for rid, mine in sorted(by_report.items()):
        report: Report | None = None
        for i in range(0, len(mine), flush):
            report, _ = merge_all(report, mine[i : i + flush], report_id=rid, now=NOW)
        if report is not None:
            reports.append(report)
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000, help="generated sample size")
    parser.add_argument("--no-real", action="store_true", help=f"leave out {SHARED_DATA}")
    parser.add_argument("--flush", type=int, default=200, help="fragments merged at once")
    add_tag_argument(parser)
    args = parser.parse_args(argv)

    settings = Settings()  # the offline rules model: no provider needed
    real = [] if args.no_real else sorted(p for p in SHARED_DATA.rglob("*.log") if p.is_file())
    t = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="report-bytes-") as tmp:
        paths = [*real, *write_sample(Path(tmp) / "sample", records=args.records)]
        records = cleaned_files(paths, settings)
    fragments, batches = asyncio.run(fragments_of(records, settings, copies=1))
    reports = build_reports(fragments, args.flush)
    print(f"… {len(records):,} records ({len(real)} real files) -> {batches} batches -> "
          f"{len(fragments):,} fragments -> {len(reports)} reports in "
          f"{time.perf_counter() - t:.1f}s", file=sys.stderr)

    docs = [json.loads(served(r)) for r in reports]
    total = sum(len(served(r)) for r in reports)
    covered = sum(r.record_count for r in reports)
    fields: Counter[str] = Counter()
    for doc in docs:
        fields.update(breakdown(doc))
    n = max(1, len(reports))
    rows = [(name, b / n, b / total * 100, b / max(1, covered))
            for name, b in sorted(fields.items(), key=lambda kv: -kv[1])]
    print(table(("field", "bytes/report", "% of report", "bytes/record"), rows))
    incidents = sum(len(r.incidents) for r in reports)
    print(f"\n{len(reports)} reports, {total:,} bytes ({total / n:,.0f} per report), "
          f"{covered:,} covered records: {total / max(1, covered):.3f} bytes per covered "
          f"record; {incidents / n:.1f} incidents per report")
    out = write_result(
        "report_bytes_bench",
        {"params": {"records": args.records, "real_files": len(real), "flush": args.flush},
         "records": len(records), "fragments": len(fragments), "reports": len(reports),
         "bytes": total, "covered_records": covered, "incidents": incidents,
         "bytes_per_report": total / n, "bytes_per_record": total / max(1, covered),
         "fields": dict(fields)},
        args.tag,
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
