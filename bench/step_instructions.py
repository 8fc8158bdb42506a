"""Instructions per record of the clean and lanes steps, counted by callgrind.

Seconds on a shared machine move by 10-20% from run to run; instruction counts of the
same code on the same records do not (within about 0.5%), so a change to a step is
compared on these. The step runs on the in-memory runtime (as ``steps_bench.py``
drives it) over ``--warm`` generated records, then callgrind counts it over the next
``--records``: only the step, not the setup.

Run: ``.venv/bin/python bench/step_instructions.py [--stage clean|lanes|both]
[--records 3000] [--warm 2000]``; needs valgrind (``callgrind_control`` switches the
count on and off around the step). Compare two trees by running it in each.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import add_tag_argument, write_result
from steps_bench import as_records, drive, raw_messages

from streams.batch.step import LaneStep
from streams.clean.cleaner import Cleaner
from streams.clean.step import CleanStep
from streams.gateway.factory import build_gateways
from streams.metrics import Metrics
from streams.report.state.keys import record_place
from streams.runner import tune_gc
from streams.runtime.memory import Part
from streams.settings import Settings

INNER = "STEP_INSTRUCTIONS_CHILD"  # set in the child that valgrind runs


def counting(on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                   check=True, stdout=subprocess.DEVNULL)


async def counted_step(stage: str, warm: int, records: int) -> None:
    """Warm the step up, then run it with callgrind counting."""
    settings = Settings()
    with tempfile.TemporaryDirectory() as tmp:
        raw = raw_messages(warm + records, Path(tmp))
    tune_gc()
    metrics = Metrics()
    clean = CleanStep(settings, Cleaner.from_settings(settings, metrics=metrics), metrics)
    if stage == "clean":
        await drive(clean, raw[:warm], [Part("raw", 0)])
        counting(True)
        await drive(clean, raw[warm:], [Part("raw", 0)])
        counting(False)
        return
    t = settings.topics
    _, cleaned = await drive(clean, raw, [Part("raw", 0)])
    lane_messages = as_records(cleaned.sent, {t.fast, t.slow})
    gateways = build_gateways(settings, metrics=metrics)
    place = lambda r: record_place(r, window="day", group_by="all")  # noqa: E731
    lanes = LaneStep(settings, metrics, {"fast": gateways.fast, "slow": gateways.slow},
                     gateways.window_counter(settings.model.name), place)
    parts = [Part(t.fast, 0), Part(t.slow, 0)]
    cut = len(lane_messages) * warm // len(raw)  # the lane messages of the warm records
    await drive(lanes, lane_messages[:cut], parts)
    counting(True)
    await drive(lanes, lane_messages[cut:], parts)
    counting(False)
    await gateways.close()


def instructions(stage: str, warm: int, records: int) -> int:
    """Run this script's child under callgrind; the instructions it counted."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = {**os.environ, INNER: "1", "PYTHONHASHSEED": "0"}  # same dict orders each run
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                        f"--callgrind-out-file={out}", sys.executable, __file__,
                        "--stage", stage, "--warm", str(warm), "--records", str(records)],
                       env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        totals = [line for line in out.read_text().splitlines() if line.startswith("totals:")]
        return int(totals[0].split()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stage", choices=("clean", "lanes", "both"), default="both")
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--warm", type=int, default=2000)
    add_tag_argument(parser)
    args = parser.parse_args()
    if os.environ.get(INNER):
        asyncio.run(counted_step(args.stage, args.warm, args.records))
        return 0
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        print("needs valgrind (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    result = {}
    for stage in ("clean", "lanes") if args.stage == "both" else (args.stage,):
        per_record = instructions(stage, args.warm, args.records) // args.records
        result[stage] = per_record
        print(f"{stage}: {per_record:,} instructions a record "
              f"({args.records:,} records after {args.warm:,})")
    write_result("step_instructions", {"records": args.records, "warm": args.warm,
                                       "instructions_per_record": result}, args.tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
