"""Two builds side by side: a worker of this tree and one of ``--ref``, at the same time.

Single e2e runs drift by 10-20% with the shared machine's speed, more than most changes
to a step are worth. Here both workers read the same raw topic on one broker in the
same minutes, each in a group of its own, so whatever the machine does it does to
both; the figure is each worker's CPU per record over the same window, and their ratio.
Rounds alternate which worker starts first, so neither tree always has the head
start, and the ratio to quote is their median.

Steps (every process it starts is stopped on exit, Ctrl-C and errors included):

1. ``git worktree add`` of ``--ref`` in a temporary dir (removed at the end);
2. a ``LocalBroker``, ``retro topics`` and ``retro produce`` of the data, as in
   ``e2e_bench.py``;
3. each round: ``python -m streams worker`` from each tree (the tree's own ``streams``
   package: it runs from that tree's folder), sampled every ``--poll`` seconds (its
   /proc CPU time and its lanes' consumed records from ``/metrics``) until one has
   passed ``--until`` of the records; the window starts when both have passed 5%.

``--idle SECONDS`` compares the two workers with no input instead: nothing is produced,
and each round is each worker's share of a core over the same SECONDS, after a
warm-up: what a worker costs while its topics are quiet (most of a day, for many).

Run: ``.venv/bin/python bench/ab_bench.py --ref HEAD~1 [--records 300000]
[--rounds 2] [--idle SECONDS]``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import e2e_bench as e2e
from _common import REPO, add_tag_argument, cpu_seconds, free_port, table, write_result

from streams.dev.broker.launcher import LocalBroker

START_SHARE = 0.05  # the window opens once both workers have passed this share
RAW_TOPIC = "ab.logs.raw"  # the one raw topic both workers read


def orders(rounds: int, ref_tree: Path) -> list[list[tuple[str, Path]]]:
    """The trees in starting order, round by round: the first to start alternates."""
    trees = [("this", REPO), ("ref", ref_tree)]
    return [trees if i % 2 == 0 else trees[::-1] for i in range(rounds)]


async def lane_records(http: aiohttp.ClientSession, port: int) -> float | None:
    """Lane records a worker has consumed: cleaned, sent and read back by its lanes."""
    try:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
    except (TimeoutError, aiohttp.ClientError):
        return None  # still starting
    return sum(float(n) for stage, n in e2e.STAGE_METRIC.findall(text)
               if stage.startswith("batch-"))


async def start_worker(bootstrap: str, raw: str, tree: Path, state: Path,
                       partitions: int) -> tuple[subprocess.Popen, int, Path]:
    """A worker of ``tree`` in a group and topics of its own, on the shared raw topic."""
    prefix = f"ab-{uuid.uuid4().hex[:6]}"
    topics = {"raw": raw, **{n: f"{prefix}.{n}" for n in e2e.PIPELINE_TOPICS}}
    env = e2e.pipeline_env(bootstrap, state, prefix, topics, partitions)
    code, out, err = await e2e.retro(env, "topics", timeout=120)
    if code:
        raise RuntimeError(f"`retro topics` failed ({code}): {out}{err}")
    port = free_port()
    proc = e2e.PROCS.start([sys.executable, "-m", "streams", "worker"],
                           env={**env, "RETRO_WEB_PORT": str(port)},
                           log_path=state / "worker.log", cwd=tree)
    return proc, port, state / "worker.log"


Started = list[tuple[str, subprocess.Popen, int, Path]]  # name, process, web port, log


async def start_workers(args: argparse.Namespace, bootstrap: str, raw: str,
                        trees: list[tuple[str, Path]], tmp: Path) -> Started:
    started = []
    for name, tree in trees:
        state = tmp / f"{name}-{uuid.uuid4().hex[:4]}"
        state.mkdir()
        started.append((name, *await start_worker(bootstrap, raw, tree, state,
                                                  args.partitions)))
    return started


def raise_if_exited(started: Started) -> None:
    """A worker that exited ends the round with its log's last lines."""
    for name, proc, _, log in started:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the {name} worker exited ({proc.returncode}):\n{tail}")


async def one_round(args: argparse.Namespace, bootstrap: str, raw: str, n: int,
                    trees: list[tuple[str, Path]], tmp: Path) -> dict[str, Any]:
    started = await start_workers(args, bootstrap, raw, trees, tmp)
    samples: list[tuple[float, list[tuple[float | None, float | None]]]] = []
    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        try:
            while time.monotonic() - t0 < args.timeout:
                await asyncio.sleep(args.poll)
                e2e.check_interrupted()
                row = [(cpu_seconds(proc.pid), await lane_records(http, port))
                       for _, proc, port, _ in started]
                samples.append((time.monotonic() - t0, row))
                raise_if_exited(started)
                if any((done or 0) >= args.until * n for _, done in row):
                    break
        finally:
            for _, proc, _, _ in started:
                e2e.PROCS.stop(proc)
    opened = next((s for s in samples
                   if all((done or 0) >= START_SHARE * n for _, done in s[1])), None)
    if opened is None or opened is samples[-1]:
        raise RuntimeError(f"no steady window within {args.timeout:.0f}s")
    (t_a, row_a), (t_b, row_b) = opened, samples[-1]
    out = {"order": [name for name, *_ in started], "window_s": round(t_b - t_a, 1)}
    for (name, *_), (cpu_a, done_a), (cpu_b, done_b) in zip(started, row_a, row_b,
                                                              strict=True):
        records = (done_b or 0) - (done_a or 0)
        cpu = (cpu_b or 0) - (cpu_a or 0)
        out[name] = {"records": records, "cpu_s": round(cpu, 2),
                     "cpu_us_per_record": round(cpu / records * 1e6, 1),
                     "records_per_second": round(records / (t_b - t_a)),
                     "cores": round(cpu / (t_b - t_a), 2)}
    out["ratio"] = round(out["this"]["cpu_us_per_record"] / out["ref"]["cpu_us_per_record"], 4)
    return out


IDLE_WARMUP_SECONDS = 30.0  # joined every group and past the first polls


async def idle_round(args: argparse.Namespace, bootstrap: str, raw: str,
                     trees: list[tuple[str, Path]], tmp: Path) -> dict[str, Any]:
    """Both workers on empty topics: each one's share of a core over ``--idle`` s."""
    started = await start_workers(args, bootstrap, raw, trees, tmp)
    try:
        await asyncio.sleep(IDLE_WARMUP_SECONDS)
        t_a, before = time.monotonic(), [cpu_seconds(proc.pid) for _, proc, _, _ in started]
        await asyncio.sleep(args.idle)
        t_b, after = time.monotonic(), [cpu_seconds(proc.pid) for _, proc, _, _ in started]
        raise_if_exited(started)
    finally:
        for _, proc, _, _ in started:
            e2e.PROCS.stop(proc)
    out: dict[str, Any] = {"order": [name for name, *_ in started], "window_s": round(t_b - t_a, 1)}
    for (name, *_), cpu_a, cpu_b in zip(started, before, after, strict=True):
        cpu = (cpu_b or 0) - (cpu_a or 0)
        out[name] = {"cpu_s": round(cpu, 2), "cores": round(cpu / (t_b - t_a), 4)}
    out["ratio"] = round(out["this"]["cores"] / out["ref"]["cores"], 4)
    return out


async def idle_bench(args: argparse.Namespace, tmp: Path, bootstrap: str, ref_tree: Path
                     ) -> dict[str, Any]:
    rounds = []
    for i, order in enumerate(orders(args.rounds, ref_tree)):
        rounds.append(await idle_round(args, bootstrap, RAW_TOPIC, order, tmp))
        r = rounds[-1]
        e2e.log(f"round {i + 1}: idle cores this {r['this']['cores']:.4f}, "
                f"ref {r['ref']['cores']:.4f}")
    return {"idle_seconds": args.idle, "rounds": rounds,
            "ratio_median": statistics.median(r["ratio"] for r in rounds)}


async def bench(args: argparse.Namespace, tmp: Path, bootstrap: str, ref_tree: Path
                ) -> dict[str, Any]:
    raw = RAW_TOPIC
    env = e2e.base_env(bootstrap, tmp / "produce")
    env["RETRO_TOPICS__RAW"] = raw
    env["RETRO_TOPICS__PARTITIONS"] = str(args.partitions)
    paths, data = e2e.make_data(args.data, args.records, tmp / "data")
    code, out, err = await e2e.retro(env, "topics", timeout=120)
    if code:
        raise RuntimeError(f"`retro topics` failed ({code}): {out}{err}")
    code, out, err = await e2e.retro(env, "produce", "--quiet", "--spread", "4", *paths,
                                     timeout=1800)
    if code:
        raise RuntimeError(f"`retro produce` failed ({code}):\n{err[-3000:]}")
    n = sum((await e2e.end_offsets(bootstrap, raw)).values())
    e2e.log(f"{n:,} raw records ({args.data})")
    rounds = []
    for i, order in enumerate(orders(args.rounds, ref_tree)):
        e2e.log(f"round {i + 1}: {order[0][0]} starts first")
        rounds.append(await one_round(args, bootstrap, raw, n, order, tmp))
        e2e.log(f"round {i + 1}: this / ref CPU a record = {rounds[-1]['ratio']:.3f}")
    return {"records": n, "data": data, "rounds": rounds,
            "ratio_median": statistics.median(r["ratio"] for r in rounds)}


def ref_commit(ref: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", ref], cwd=REPO, check=True,
                          capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="the git ref to compare with")
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--data", choices=("mix", "sample", "multiday"), default="sample")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds, each with both workers; the first to start alternates")
    parser.add_argument("--until", type=float, default=0.95,
                        help="a round ends when one worker has passed this share")
    parser.add_argument("--poll", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per round")
    parser.add_argument("--idle", type=float, metavar="SECONDS",
                        help="no input: compare the workers' CPU over SECONDS of quiet topics")
    add_tag_argument(parser)
    args = parser.parse_args()
    commit = ref_commit(args.ref)
    tmp = Path(tempfile.mkdtemp(prefix="ab-bench-"))
    ref_tree = tmp / "ref"
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(ref_tree), commit],
                   cwd=REPO, check=True)
    broker = LocalBroker(tmp / "broker-state")
    try:
        state = broker.start(timeout=120)
        run = idle_bench if args.idle else bench
        result = asyncio.run(run(args, tmp, state.bootstrap, ref_tree))
    except KeyboardInterrupt:
        print("interrupted; every process this run started is stopped", file=sys.stderr)
        return 130
    finally:
        e2e.PROCS.stop_all()
        broker.stop()
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["git", "worktree", "remove", "--force", str(ref_tree)],
                           cwd=REPO, check=True, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    result["ref"] = {"name": args.ref, "commit": commit}
    result["this"] = e2e.code_version()
    if args.idle:
        print(table(["round", "first", "window s", "this % of a core", "ref % of a core",
                     "this / ref"],
                    [[i + 1, r["order"][0], r["window_s"], f"{100 * r['this']['cores']:.2f}",
                      f"{100 * r['ref']['cores']:.2f}", f"{r['ratio']:.3f}"]
                     for i, r in enumerate(result["rounds"])]))
        print(f"\nidle: this tree / {args.ref} ({commit}), CPU: median "
              f"{result['ratio_median']:.3f} of {len(result['rounds'])} rounds")
        print(f"wrote {write_result('ab_bench', result, args.tag)}")
        return 0
    rows = [[i + 1, r["order"][0], r["window_s"], r["this"]["cpu_us_per_record"],
             r["ref"]["cpu_us_per_record"], f"{r['ratio']:.3f}",
             f"{r['this']['cores']:.2f} / {r['ref']['cores']:.2f}"]
            for i, r in enumerate(result["rounds"])]
    print(table(["round", "first", "window s", "this us/rec", "ref us/rec", "this / ref",
                 "cores this / ref"], rows))
    print(f"\nthis tree / {args.ref} ({commit}), CPU a record: median "
          f"{result['ratio_median']:.3f} of {len(rows)} rounds")
    print(f"wrote {write_result('ab_bench', result, args.tag)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
