"""Per-source parse rates of `retro clean`: timestamp, level and service, before and after.

Two corpora: every ``*.log`` of ../shared/data (one source per file), and generated
lines in 14 documented layouts that ../shared/data does not contain
(``streams.dev.layouts``: logcat, Apache combined, nginx error, Go log, glog,
Python logging, PostgreSQL, Redis, MySQL, journald short-iso, log4j ISO-8601 with
zone, epoch seconds and milliseconds columns, CSV with a time column), one file per
layout. Each corpus goes through ``python -m streams.cli clean`` once per code
version: this tree, and with ``--ref`` another commit's ``streams`` package (git
archive, run with the same interpreter).

Rates are shares of records: ``ts`` with a timestamp, ``level`` with a level,
``svc`` with a service named by the record itself (not the file name the cleaner
falls back to). For generated lines the truth is known: ``ts_ok`` is the share whose
timestamp equals the stated time (to the ms), ``lvl_ok`` the share of lines stating
a level whose level is that one.

Run: ``.venv/bin/python bench/formats_bench.py [--ref main] [--lines 300] [--no-shared]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import REPO, SHARED_DATA, add_tag_argument, table, write_result
from formats_parity import extract

from streams.dev.layouts import LAYOUTS, Line, generate


def clean_all(code_root: Path, paths: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """Records of one ``retro clean PATH...`` run from ``code_root``, per path, in order."""
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    proc = subprocess.run(
        [sys.executable, "-m", "streams.cli", "clean", *map(str, paths)],
        cwd=code_root,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in proc.stdout.splitlines():
        rec = json.loads(line)
        out[rec["raw"]["topic"]].append(rec)
    for recs in out.values():
        recs.sort(key=lambda r: r["raw"]["offset"])
    return out


def rates(records: list[dict[str, Any]], truth: list[Line] | None) -> dict[str, Any]:
    """Shares of records with a timestamp, a level, an own service (and truth matches)."""
    n = len(records) or 1
    row: dict[str, Any] = {
        "records": len(records),
        "ts": sum(r["timestamp"] is not None for r in records) / n,
        "level": sum(r["level"] is not None for r in records) / n,
        "svc": sum(r["service"] != r["source"] for r in records) / n,
    }
    if truth is not None and len(truth) == len(records):
        row["ts_ok"] = (
            sum(r["timestamp"] == t.time for r, t in zip(records, truth, strict=True)) / n
        )
        stated = [(r, t) for r, t in zip(records, truth, strict=True) if t.level is not None]
        row["lvl_ok"] = (
            sum(r["level"] == t.level for r, t in stated) / len(stated) if stated else None
        )
    return row


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", help="also measure this commit (e.g. main) for a before/after")
    parser.add_argument("--lines", type=int, default=300, help="generated lines per layout")
    parser.add_argument("--no-shared", action="store_true", help="skip ../shared/data")
    parser.add_argument("--data", type=Path, default=SHARED_DATA)
    add_tag_argument(parser)
    args = parser.parse_args()
    shared = [] if args.no_shared else sorted(p for p in args.data.rglob("*.log") if p.is_file())
    start = datetime.now(UTC) - timedelta(days=40)  # year-less layouts resolve to this year
    with tempfile.TemporaryDirectory(prefix="retro-formats-") as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        truth: dict[str, list[Line]] = {}
        generated: list[Path] = []
        for layout in LAYOUTS:
            lines = generate(layout, args.lines, start=start)
            path = corpus / f"{layout.name}.log"
            path.write_text("".join(line.text + "\n" for line in lines), encoding="utf-8")
            truth[str(path)] = lines
            generated.append(path)
        versions: dict[str, Path] = {"after": REPO}
        if args.ref:
            versions = {"before": extract(args.ref, Path(tmp) / "before"), **versions}
        results: dict[str, dict[str, dict[str, Any]]] = {}
        for version, root in versions.items():
            out = clean_all(root, shared + generated)
            for path in shared + generated:
                name = path.stem if path in generated else str(path.relative_to(args.data))
                results.setdefault(name, {})[version] = rates(
                    out.get(str(path), []), truth.get(str(path))
                )
    keys = ("ts", "level", "svc", "ts_ok", "lvl_ok")
    header = ["source", "records"] + [f"{k} {v}" for k in keys for v in versions]
    rows = []
    for name, by_version in results.items():
        after = by_version["after"]
        rows.append(
            [name, after["records"]] + [pct(by_version[v].get(k)) for k in keys for v in versions]
        )
    print(table(header, rows))
    write_result(
        "formats_bench",
        {"ref": args.ref, "lines_per_layout": args.lines, "sources": results},
        tag=args.tag,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
