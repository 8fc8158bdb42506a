"""How long ``retro postmortem FILE...`` takes: a generated 100k-record workload and a Nezha day.

``retro postmortem`` runs the worker's steps in memory (Cleaner, token windows, the
offline rules analyzer, answer validation, placing, merge, the post-mortem), so its
time is what a user with a log file waits for. Each run is the command itself, a
child process started as a user would start it (``python -m streams.cli postmortem
--format json FILE...``, INFO logs off), timed from start to exit: wall seconds, CPU
seconds (user + system, from the child's rusage) and peak RSS.

Workloads:

* ``generated``: ``streams.dev.sample.write_sample(records=--records)``, the README's
  seven formats with Java traces, secrets and three records only fit for dead letters;
  runs anywhere.
* ``nezha-day``: the 2023-01-29 windows of ``../shared/data/nezha-rca-dev`` (twelve
  TrainTicket fault injections, Fluent Bit JSON) joined into one file, as a continuous
  retro would see the day (~75k lines, 60 MB); skipped when the data is absent or with
  ``--no-shared``.

``--ref REV`` (repeatable) also runs REV's ``streams`` and ``schemas`` (``git archive``,
no worktree) on the same files in the same run; every version is set against the first
``--ref``, CPU and wall as ratios, and whether it prints the same report: an
optimization must leave every byte of it as it was. Two refs measure a range of
commits alone while the working tree holds other changes.

Run: ``.venv/bin/python bench/postmortem_bench.py [--records 100000] [--repeat 1]
[--ref REV ...] [--no-tree] [--no-shared]``; profile one workload with
``.venv/bin/py-spy record -f raw -r 50 -o prof.txt -- .venv/bin/python -m streams
postmortem --format json FILE``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

from _common import REPO, SHARED_DATA, add_tag_argument, table, write_result

from streams.dev.sample import write_sample

NEZHA_DAY = "2023-01-29"


def extract(ref: str, into: Path) -> Path:
    """``streams`` and ``schemas`` of ``ref`` under ``into`` (no worktree is registered)."""
    blob = subprocess.run(["git", "archive", "--format=tar", ref, "streams", "schemas"],
                          cwd=REPO, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into


def nezha_day(into: Path, day: str) -> Path | None:
    """The ``day`` windows of the Nezha data joined into one file, or None without them."""
    parts = sorted((SHARED_DATA / "nezha-rca-dev").glob(f"{day}_*.fluentbit.jsonl.gz"))
    if not parts:
        return None
    path = into / f"nezha-{day}.jsonl"
    with path.open("wb") as out:
        for part in parts:
            with gzip.open(part) as lines:
                out.write(lines.read())
    return path


def line_count(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        with path.open("rb") as f:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda f=f: f.read(1 << 20), b""))
    return total


def run_once(root: Path, paths: list[Path], out: Path) -> dict[str, Any]:
    """One ``retro postmortem --format json`` of ``paths`` with the code under ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root), "RETRO_LOG_LEVEL": "WARNING"}
    command = [sys.executable, "-m", "streams.cli", "postmortem", "--format", "json",
               *map(str, paths)]
    with out.open("wb") as stdout, out.with_suffix(".err").open("wb") as stderr:
        started = time.perf_counter()
        proc = subprocess.Popen(command, cwd=root, env=env, stdout=stdout, stderr=stderr)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {proc.returncode}: "
                         f"{out.with_suffix('.err').read_text()[-2000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mib": usage.ru_maxrss / 1024,
            "output_sha256": hashlib.sha256(out.read_bytes()).hexdigest(),
            "output_bytes": out.stat().st_size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000,
                        help="logical records of the generated workload (default 100000)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per workload and version")
    parser.add_argument("--ref", action="append", default=[],
                        help="also run this commit (repeatable); the first is the baseline")
    parser.add_argument("--no-tree", action="store_true",
                        help="run the --ref commits only, not this working tree")
    parser.add_argument("--no-shared", action="store_true", help="skip the Nezha day")
    parser.add_argument("--day", default=NEZHA_DAY, help=f"Nezha day (default {NEZHA_DAY})")
    add_tag_argument(parser)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        workloads: dict[str, list[Path]] = {
            "generated": write_sample(tmp / "generated", records=args.records)}
        day = None if args.no_shared else nezha_day(tmp, args.day)
        if day is not None:
            workloads["nezha-day"] = [day]
        versions = {} if args.no_tree else {"this tree": REPO}
        for i, ref in enumerate(args.ref):
            versions[ref] = extract(ref, tmp / f"ref{i}")
        if not versions:
            parser.error("--no-tree needs a --ref")
        results: dict[str, Any] = {}
        for name, paths in workloads.items():
            lines = line_count(paths)
            results[name] = {"lines": lines, "bytes": sum(p.stat().st_size for p in paths),
                             "versions": {}}
            for label, root in versions.items():
                runs = [run_once(root, paths, tmp / f"{name}-{i}.json")
                        for i in range(args.repeat)]
                results[name]["versions"][label] = {
                    "runs": runs,
                    "wall_s": statistics.median(r["wall_s"] for r in runs),
                    "cpu_s": statistics.median(r["cpu_s"] for r in runs),
                    "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
                    "same_output_every_run": len({r["output_sha256"] for r in runs}) == 1,
                }
            if args.ref:
                ran = results[name]["versions"]
                base = ran[args.ref[0]]["runs"][0]["output_sha256"]
                for v in ran.values():
                    v["same_output_as_first_ref"] = v["runs"][0]["output_sha256"] == base

    rows = []
    for name, res in results.items():
        for label, v in res["versions"].items():
            rows.append([name, label, res["lines"], round(v["wall_s"], 1), round(v["cpu_s"], 1),
                         round(res["lines"] / v["cpu_s"]), round(v["peak_rss_mib"])])
    print(f"median of {args.repeat} run(s) a workload and version")
    print(table(["workload", "code", "lines", "wall s", "CPU s", "lines/CPU s", "peak MiB"],
                rows))
    if args.ref:
        ratios = []
        for name, res in results.items():
            base = res["versions"][args.ref[0]]
            for label, v in res["versions"].items():
                if label != args.ref[0]:
                    ratios.append([name, label, f"{v['cpu_s'] / base['cpu_s']:.2f}",
                                   f"{v['wall_s'] / base['wall_s']:.2f}",
                                   "yes" if v["same_output_as_first_ref"] else "NO"])
        print(f"against {args.ref[0]}:")
        print(table(["workload", "code", "CPU ratio", "wall ratio", "same report"], ratios))
    write_result("postmortem", {"refs": args.ref, "records": args.records,
                                "repeat": args.repeat, "workloads": results}, args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
