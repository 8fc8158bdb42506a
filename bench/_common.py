"""Helpers shared by the benchmarks: result files, tables, memory, the command line.

Not a benchmark itself. Benchmarks run as scripts (``.venv/bin/python bench/x.py``),
so this module is imported as ``_common`` from the script's own folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import socket
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
OUT_DIR = BENCH_DIR / "out"
SHARED_DATA = REPO.parent / "shared" / "data"


def command_line() -> str:
    """The command that produced this run, as a user would type it from the repo root."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(REPO))
    except ValueError:
        shown = str(script)
    return shlex.join([".venv/bin/python", shown, *sys.argv[1:]])


def machine() -> dict[str, Any]:
    """What the figures were measured on; ratios travel, absolute figures do not."""
    try:
        load = list(os.getloadavg())
    except OSError:
        load = []
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": [round(x, 2) for x in load],
    }


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB.

    ``getrusage(RUSAGE_SELF).ru_maxrss`` is that figure, except that on Linux a
    child started by a big parent inherits the parent's peak at fork (it survives
    exec). ``VmHWM`` in /proc/self/status is the same peak without that carry-over,
    so it is used where /proc exists; getrusage elsewhere (KiB on Linux).
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, IndexError, ValueError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mib() -> float:
    """Resident set size now, from /proc (0.0 where /proc is missing)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / (1024 * 1024)


def add_tag_argument(parser: argparse.ArgumentParser) -> None:
    """``--tag T`` writes ``bench/out/<name>-T.json``, so variants do not overwrite each other."""
    parser.add_argument("--tag", help="suffix of the result file: bench/out/<name>-<tag>.json")


def write_result(name: str, result: dict[str, Any], tag: str | None = None) -> Path:
    """Write ``bench/out/<name>[-<tag>].json`` with the command and machine attached."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    doc = {
        "bench": name,
        "command": command_line(),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        **result,
    }
    path = OUT_DIR / (f"{name}-{tag}.json" if tag else f"{name}.json")
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n")
    return path


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned table: first column left, the others right-aligned."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        parts = [row[0].ljust(widths[0])]
        parts += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), rule, *(line(r) for r in cells[1:])])


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds`` (perf_counter)."""

    __slots__ = ("_start", "seconds")

    def __init__(self) -> None:
        self._start = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._start


def cpu_seconds(pid: int | None) -> float | None:
    """utime + stime of a live process, all threads (Linux /proc), or None."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_cpu() -> tuple[float, float] | None:
    """(busy, all) CPU seconds of the whole machine since boot, summed over its CPUs
    (Linux /proc/stat; iowait counts as idle), or None."""
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user time
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


def peak_rss_of(pid: int) -> float | None:
    """VmHWM (peak resident set) of a live process in MiB: its own, not inherited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
