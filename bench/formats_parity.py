"""`retro clean` on every file of ../shared/data, before and after a change to the parsers.

The clean stage of ``--ref`` (default ``main``; any commit) is extracted with ``git
archive`` into a temporary folder and run with the same interpreter as the working
tree, file by file, through the command line (``python -m streams.cli clean FILE``).
Records are compared by id: timestamp, timestamp rule and level must be the same on
every record (the exit status is 1 otherwise); service and format changes are counted
and shown, since improving them is allowed.

Run: ``.venv/bin/python bench/formats_parity.py [--ref main] [--data DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

from _common import REPO, SHARED_DATA, add_tag_argument, table, write_result

MUST_MATCH = ("timestamp", "timestamp_rule", "level")
MAY_CHANGE = ("service", "format")


def extract(ref: str, into: Path) -> Path:
    """The ``streams`` package of ``ref`` under ``into`` (no worktree is registered)."""
    blob = subprocess.run(
        ["git", "archive", "--format=tar", ref, "streams"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into


def clean_file(code_root: Path, path: Path) -> dict[str, dict[str, Any]]:
    """Records of ``retro clean PATH`` run from ``code_root``, keyed by record id."""
    env = {**os.environ, "PYTHONPATH": str(code_root), "RETRO_LOG_LEVEL": "WARNING"}
    proc = subprocess.run(
        [sys.executable, "-m", "streams.cli", "clean", str(path)],
        cwd=code_root,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    out: dict[str, dict[str, Any]] = {}
    for line in proc.stdout.splitlines():
        rec = json.loads(line)
        out[rec["id"]] = rec
    return out


def compare(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per-file counts of equal and differing fields, with the first differences."""
    row: dict[str, Any] = {"records": len(before), "missing": 0, "examples": []}
    for key in MUST_MATCH + MAY_CHANGE:
        row[f"{key}_diff"] = 0
    for rid, old in before.items():
        new = after.get(rid)
        if new is None:
            row["missing"] += 1
            continue
        for key in MUST_MATCH + MAY_CHANGE:
            if old.get(key) != new.get(key):
                row[f"{key}_diff"] += 1
                if key in MUST_MATCH and len(row["examples"]) < 3:
                    row["examples"].append({"id": rid, key: [old.get(key), new.get(key)]})
    row["extra"] = len(set(after) - set(before))
    row["same"] = (
        row["missing"] == 0 and row["extra"] == 0 and not any(row[f"{k}_diff"] for k in MUST_MATCH)
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="main", help="the commit to compare with")
    parser.add_argument("--data", type=Path, default=SHARED_DATA)
    add_tag_argument(parser)
    args = parser.parse_args()
    files = sorted(p for p in args.data.rglob("*.log") if p.is_file())
    if not files:
        print(f"no *.log files under {args.data}", file=sys.stderr)
        return 66
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="retro-parity-") as tmp:
        old_root = extract(args.ref, Path(tmp))
        for path in files:
            name = str(path.relative_to(args.data))
            rows[name] = compare(clean_file(old_root, path), clean_file(REPO, path))
    header = ["file", "records", "same", *(f"{k}_diff" for k in MUST_MATCH + MAY_CHANGE)]
    print(
        table(
            header,
            [[n, r["records"], r["same"], *(r[h] for h in header[3:])] for n, r in rows.items()],
        )
    )
    for name, r in rows.items():
        for ex in r["examples"]:
            print(f"  {name}: {ex}")
    ok = all(r["same"] for r in rows.values())
    print(
        f"{'PASS' if ok else 'FAIL'}: timestamp, rule and level equal on every record vs {args.ref}"
    )
    write_result("formats_parity", {"ref": args.ref, "files": rows, "ok": ok}, tag=args.tag)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
