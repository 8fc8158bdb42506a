"""CPU per record of each stage's step, without a broker, against a bare json pass.

The worker's own cost is its steps (clean, lanes with the offline rules model,
compactor) plus the runtime and aiokafka. This bench runs the steps on the in-memory
runtime (``MemoryRun``) over the generated sample, stage after stage as the worker
would see them (raw messages, then the lane messages clean produced, then the
fragments), and reports CPU microseconds per raw record for each step, next to
``json.loads`` + ``json.dumps`` of the same messages (the work of the raw aiokafka
loop ``bench/e2e_bench.py`` compares the worker with, minus Kafka).

Run: ``.venv/bin/python bench/steps_bench.py [--records 100000] [--repeat 3]
[--source NAME]``;
profile a run with ``py-spy record -o steps.svg -- .venv/bin/python bench/steps_bench.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import add_tag_argument, peak_rss_mib, table, write_result

from streams.batch.step import LaneStep
from streams.clean.cleaner import Cleaner
from streams.clean.step import CleanStep
from streams.dev.sample import write_sample
from streams.gateway.factory import build_gateways
from streams.ingest.reader import iter_records, open_source
from streams.metrics import Metrics
from streams.report.compactor.step import CompactStep
from streams.report.state.keys import record_place
from streams.runner import tune_gc
from streams.runtime.memory import MemoryRun, Part, Record
from streams.runtime.step import Out
from streams.settings import Settings

FETCH = 2000  # records per fetch, as the loops take them


class NoReports:
    async def read(self, partitions: set[int]) -> list[tuple[str, bytes | None, int]]:
        return []


def raw_messages(records: int, directory: Path) -> list[Record]:
    out: list[Record] = []
    for path in write_sample(directory, records=records, include_bad=False):
        with open_source(str(path)) as stream:
            for _, data in iter_records(stream):
                out.append(Record("raw", 0, len(out), path.name.encode(), data))
    return out


def as_records(outs: list[Out], topics: set[str]) -> list[Record]:
    """Outputs of one step as the next step's input (one partition per topic)."""
    return [Record(o.topic, 0, i, o.key, o.value) for i, o in enumerate(outs)
            if o.topic in topics]


async def drive(step: Any, messages: list[Record], parts: list[Part]) -> tuple[float, MemoryRun]:
    run = MemoryRun(step)
    await run.assign(*parts)
    started = time.process_time()
    for i in range(0, len(messages), FETCH):
        await run.fetch(*messages[i:i + FETCH])
    await run.drain()
    return time.process_time() - started, run


def json_pass(messages: list[Record]) -> float:
    started = time.process_time()
    for m in messages:
        text = (m.value or b"").decode("utf-8", "replace")
        doc = json.loads(text) if text.startswith("{") else {"line": text}
        json.dumps(doc).encode()
    return time.process_time() - started


async def one_pass(settings: Settings, raw: list[Record]) -> dict[str, float]:
    t = settings.topics
    metrics = Metrics()
    clean_cpu, cleaned = await drive(
        CleanStep(settings, Cleaner.from_settings(settings, metrics=metrics), metrics), raw,
        [Part("raw", 0)])
    lane_msgs = as_records(cleaned.sent, {t.fast, t.slow})
    gateways = build_gateways(settings, metrics=metrics)
    place = lambda r: record_place(r, window="day", group_by="all")  # noqa: E731
    lanes_cpu, lanes = await drive(
        LaneStep(settings, metrics, {"fast": gateways.fast, "slow": gateways.slow},
                 gateways.window_counter(settings.model.name), place),
        lane_msgs, [Part(t.fast, 0), Part(t.slow, 0)])
    await gateways.close()
    fragments = as_records(lanes.sent, {t.fragments})
    compact_cpu, _ = await drive(CompactStep(settings, metrics, NoReports()), fragments,
                                 [Part(t.fragments, 0)])
    return {"clean": clean_cpu, "lanes": lanes_cpu, "compactor": compact_cpu,
            "lane messages": len(lane_msgs), "fragments": len(fragments)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--source", metavar="NAME",
                        help="only the records of the sample file NAME starts (e.g. edge: "
                             "edge.syslog), to see what one format costs")
    add_tag_argument(parser)
    args = parser.parse_args()
    settings = Settings()
    with tempfile.TemporaryDirectory() as tmp:
        raw = raw_messages(args.records, Path(tmp))
    if args.source:
        raw = [m for m in raw if (m.key or b"").decode().startswith(args.source)]
        if not raw:
            parser.error(f"no sample file starts with {args.source!r}")
    n = len(raw)
    tune_gc()  # the collector as `retro worker` sets it, or it scans every held message
    runs = []
    for _ in range(args.repeat):
        cpu = asyncio.run(one_pass(settings, raw))
        cpu["json"] = json_pass(raw)
        runs.append(cpu)
    stages = ["json", "clean", "lanes", "compactor"]
    median = {s: statistics.median(r[s] for r in runs) for s in stages}
    spread = {s: (min(r[s] for r in runs), max(r[s] for r in runs)) for s in stages}
    steps = median["clean"] + median["lanes"] + median["compactor"]
    rows = [[s, round(median[s] / n * 1e6, 1),
             f"{spread[s][0] / n * 1e6:.1f}-{spread[s][1] / n * 1e6:.1f}",
             f"{median[s] / steps:.0%}" if s != "json" else "-"] for s in stages]
    rows.append(["steps together", round(steps / n * 1e6, 1), "-", "100%"])
    print(f"{n} raw records, {runs[0]['lane messages']} lane messages, "
          f"{runs[0]['fragments']} fragments; median of {args.repeat}")
    print(table(["stage", "CPU us/record", "spread", "share of steps"], rows))
    print(f"json pass / steps: {median['json'] / steps:.1%}; peak RSS {peak_rss_mib():.0f} MiB")
    write_result("steps", {"records": n, "runs": runs, "median": median,
                           "json_over_steps": median["json"] / steps,
                           "peak_rss_mib": peak_rss_mib()}, args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
