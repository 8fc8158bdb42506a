"""Do the clean stage's templates group lines like a log parser? GA and F1-GA per system.

Against the hand-labelled event ids of every loghub sample in ../shared/data
(``X_2k.log`` with ``X_2k.log_structured.csv``), in one run:

* ``retro``: each raw line through ``Cleaner.clean`` (default settings, one Cleaner
  per system, as one worker sees one source); the emitted ``template_id`` is the group.
* ``drain3``: plain drain3 with its default settings, fed the labelled message part
  (the ``Content`` column), its final cluster ids as groups: the baseline a user
  would try first. It gets the header cut for free; retro has to find it.

Grouping accuracy (GA, Zhu et al., ICSE-SEIP 2019): a line is right when the set of
lines sharing its emitted group equals the set sharing its labelled event id. F1-GA
(Khan et al., 2022): precision and recall over groups, a group counting as right
when it is exactly one labelled event's lines.

Also times the clean stage (records/s, best of ``--repeat`` passes) over the same
lines, so a grouping gain is not bought with speed.

With ``--ref REV`` the same systems are also run on that commit's ``streams`` package
(``git archive``, a child process with the same interpreter and libraries), and the
table shows GA and records/s before and after, measured in the same run.

Run: ``.venv/bin/python bench/grouping_bench.py [--data ../shared/data] [--repeat 3] [--ref REV]``
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import REPO, SHARED_DATA, add_tag_argument, table, write_result

from streams.clean.cleaner import Cleaner
from streams.records import DeadLetter, RawCoord
from streams.settings import Settings

# Drain's grouping accuracy on these samples as published (Zhu et al. 2019, table 3)
PUBLISHED_DRAIN = {
    "HDFS": 0.998, "Hadoop": 0.948, "Zookeeper": 0.967, "BGL": 0.963, "Linux": 0.690,
    "Apache": 1.000, "HealthApp": 0.780, "OpenStack": 0.733, "Thunderbird": 0.955,
    "HPC": 0.887, "Windows": 0.997, "Mac": 0.787, "Android": 0.911, "Spark": 0.920,
    "Proxifier": 0.527, "OpenSSH": 0.788,
}


def grouping_accuracy(truth: Sequence[str], found: Sequence[str]) -> tuple[float, float]:
    """(GA, F1-GA) of ``found`` group labels against ``truth``, line by line."""
    by_truth: dict[str, set[int]] = defaultdict(set)
    by_found: dict[str, set[int]] = defaultdict(set)
    for i, (t, f) in enumerate(zip(truth, found, strict=True)):
        by_truth[t].add(i)
        by_found[f].add(i)
    correct_lines = 0
    correct_groups = 0
    truth_sets = {frozenset(s) for s in by_truth.values()}
    for members in by_found.values():
        if frozenset(members) in truth_sets:
            correct_lines += len(members)
            correct_groups += 1
    ga = correct_lines / len(truth) if truth else 0.0
    precision = correct_groups / len(by_found) if by_found else 0.0
    recall = correct_groups / len(by_truth) if by_truth else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return ga, f1


def load_system(folder: Path) -> tuple[list[bytes], list[str], list[str]] | None:
    """The raw lines, their labelled event ids and message parts, or None if absent."""
    logs = sorted(folder.glob("*_2k.log"))
    if not logs:
        return None
    structured = logs[0].with_name(logs[0].name + "_structured.csv")
    if not structured.exists():
        return None
    raw = [line for line in logs[0].read_bytes().split(b"\n") if line.strip()]
    with structured.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if len(rows) != len(raw):
        print(f"{folder.name}: {len(raw)} lines but {len(rows)} labels; skipped",
              file=sys.stderr)
        return None
    return raw, [r["EventId"] for r in rows], [r["Content"] for r in rows]


def retro_groups(name: str, raw: list[bytes], settings: Settings) -> tuple[list[str], int]:
    """Each line's emitted template id (dead letters get a group of their own)."""
    cleaner = Cleaner.from_settings(settings)
    ids: list[str] = []
    dead = 0
    for offset, line in enumerate(raw):
        out = cleaner.clean(line, RawCoord(topic=name, partition=0, offset=offset), name)[0]
        if isinstance(out, DeadLetter):
            dead += 1
            ids.append(f"dead-{offset}")
        else:
            ids.append(out.template_id)
    return ids, dead


def drain3_groups(contents: list[str]) -> list[str]:
    """Plain drain3, default settings, final cluster ids (a second pass reads them)."""
    from drain3 import TemplateMiner
    from drain3.template_miner_config import TemplateMinerConfig

    miner = TemplateMiner(config=TemplateMinerConfig())
    for text in contents:
        miner.add_log_message(text)
    return [str(miner.match(text).cluster_id) if miner.match(text) else "none"
            for text in contents]


def clean_rate(name: str, raw: list[bytes], settings: Settings, repeat: int) -> float:
    """Records/s of ``Cleaner.clean`` over the lines, best of ``repeat`` fresh passes."""
    best = float("inf")
    for _ in range(repeat):
        cleaner = Cleaner.from_settings(settings)
        start = time.perf_counter()
        for offset, line in enumerate(raw):
            cleaner.clean(line, RawCoord(topic=name, partition=0, offset=offset), name)
        best = min(best, time.perf_counter() - start)
    return len(raw) / best


def measure(loghub: Path, repeat: int, with_drain3: bool = True) -> dict[str, dict[str, Any]]:
    """Per system: GA, F1-GA and clean records/s of this ``streams`` (plain drain3 too)."""
    settings = Settings()
    results: dict[str, dict[str, Any]] = {}
    for folder in sorted(p for p in loghub.iterdir() if p.is_dir()):
        loaded = load_system(folder)
        if loaded is None:
            continue
        raw, truth, contents = loaded
        ids, dead = retro_groups(folder.name, raw, settings)
        ga, f1 = grouping_accuracy(truth, ids)
        dga, df1 = grouping_accuracy(truth, drain3_groups(contents)) if with_drain3 else (0, 0)
        results[folder.name] = {
            "lines": len(raw), "events": len(set(truth)), "retro_groups": len(set(ids)),
            "ga": ga, "f1_ga": f1, "drain3_ga": dga, "drain3_f1_ga": df1,
            "published_drain_ga": PUBLISHED_DRAIN.get(folder.name), "dead_letters": dead,
            "clean_rec_s": clean_rate(folder.name, raw, settings, repeat),
        }
    return results


def measure_ref(ref: str, data: Path, repeat: int) -> dict[str, dict[str, Any]]:
    """The same measurement on commit ``ref``'s ``streams`` package, in a child process.

    ``-S`` keeps the editable install of this tree off the path; the libraries come
    from this interpreter's site-packages.
    """
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", ref, "streams"], cwd=REPO, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        site = sysconfig.get_paths()["purelib"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([tmp, site])}
        out = subprocess.run(
            [sys.executable, "-S", __file__, "--data", str(data), "--repeat", str(repeat),
             "--child"], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def _mean(results: dict[str, dict[str, Any]], key: str) -> float:
    return sum(r[key] for r in results.values()) / len(results)


def _rate_all(results: dict[str, dict[str, Any]]) -> float:
    lines = sum(r["lines"] for r in results.values())
    return lines / sum(r["lines"] / r["clean_rec_s"] for r in results.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, default=SHARED_DATA)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ref", help="also measure this commit's streams (e.g. main~3)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_tag_argument(parser)
    args = parser.parse_args(argv)
    loghub = args.data / "loghub"
    if not loghub.is_dir():
        print(f"no loghub samples under {args.data}; nothing to measure")
        return 0
    if args.child:
        print(json.dumps(measure(loghub, args.repeat, with_drain3=False)))
        return 0
    before = measure_ref(args.ref, args.data, args.repeat) if args.ref else None
    results = measure(loghub, args.repeat)
    if not results:
        print("no labelled samples found")
        return 0
    rows: list[list[Any]] = []
    for name, r in results.items():
        old = before.get(name) if before else None
        rows.append([
            name, r["events"], r["retro_groups"], *([f"{old['ga']:.3f}"] if before else []),
            f"{r['ga']:.3f}", f"{r['f1_ga']:.3f}", f"{r['drain3_ga']:.3f}",
            f"{r['drain3_f1_ga']:.3f}", r["published_drain_ga"] or "-",
            *([f"{old['clean_rec_s']:,.0f}"] if before and old else []),
            f"{r['clean_rec_s']:,.0f}"])
    pub = [r["published_drain_ga"] for r in results.values() if r["published_drain_ga"]]
    rows.append(["mean", "", "", *([f"{_mean(before, 'ga'):.3f}"] if before else []),
                 f"{_mean(results, 'ga'):.3f}", f"{_mean(results, 'f1_ga'):.3f}",
                 f"{_mean(results, 'drain3_ga'):.3f}", f"{_mean(results, 'drain3_f1_ga'):.3f}",
                 f"{sum(pub) / len(pub):.3f}" if pub else "-",
                 *([f"{_rate_all(before):,.0f}"] if before else []),
                 f"{_rate_all(results):,.0f}"])
    headers = ["system", "events", "groups", *(["GA before"] if before else []), "GA", "F1-GA",
               "drain3 GA", "drain3 F1", "published",
               *(["rec/s before"] if before else []), "clean rec/s"]
    print(table(headers, rows))
    summary = {"mean_ga": _mean(results, "ga"), "min_ga": min(r["ga"] for r in results.values()),
               "mean_f1_ga": _mean(results, "f1_ga"),
               "mean_drain3_ga": _mean(results, "drain3_ga"),
               "clean_rec_s_all": _rate_all(results)}
    if before:
        summary["ref"] = args.ref
        summary["ref_mean_ga"] = _mean(before, "ga")
        summary["speed_ratio"] = _rate_all(results) / _rate_all(before)
    path = write_result("grouping_bench", {"systems": results, "ref_systems": before,
                                           "summary": summary}, args.tag)
    print(f"\nmean GA {summary['mean_ga']:.3f} (min {summary['min_ga']:.3f}); "
          f"clean {summary['clean_rec_s_all']:,.0f} rec/s over all"
          + (f", {summary['speed_ratio']:.2f}x of {args.ref}" if before else "")
          + f"; written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
