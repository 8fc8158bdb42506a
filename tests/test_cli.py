"""The `retro` command line, run as a user would (no broker needed here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from streams.cli import select_report
from streams.report.model import Report
from streams.schemas import validator


def test_retro_clean_writes_only_records_on_stdout(tmp_path: Path) -> None:
    from streams.dev.sample import write_sample

    paths = [str(p) for p in write_sample(tmp_path / "s", records=400, include_bad=True)]
    dead = tmp_path / "dead.jsonl"
    proc = subprocess.run([sys.executable, "-m", "streams", "clean", *paths, "--deadletter",
                           str(dead)], capture_output=True, timeout=120, check=True)
    lines = proc.stdout.decode().splitlines()
    check = validator("record")
    for line in lines:
        check.validate(json.loads(line))
    letters = [json.loads(x) for x in dead.read_text().splitlines()]
    assert letters and all(d["reason"] and d["detail"] for d in letters)
    assert len(lines) + len(letters) == 400
    summary = proc.stderr.decode()
    assert "json" in summary and "deadletter" in summary.lower().replace(" ", "").replace(
        "-", "").replace("_", "")


def test_retro_without_a_broker_says_what_to_do(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "streams", "--state-dir", str(tmp_path),
                           "audit"], capture_output=True, timeout=60, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert "retro broker start" in proc.stderr.decode()
    assert "Traceback" not in proc.stderr.decode()


def test_select_report_by_window_and_service() -> None:
    reports = {rid: Report(id=rid, services=svcs) for rid, svcs in [
        ("2026-11-28/all", ["a"]), ("2026-11-29/all", ["a", "b"]), ("undated/all", []),
        ("2026-11-29/b", ["b"])]}
    assert select_report(reports, window=None, service=None).id == "2026-11-29/b"
    assert select_report(reports, window="2026-11-28", service=None).id == "2026-11-28/all"
    assert select_report(reports, window="2026-11-29", service="b").id == "2026-11-29/b"
    assert select_report(reports, window="2026-11-28", service="a").id == "2026-11-28/all"
    assert select_report(reports, window="2025", service=None) is None
