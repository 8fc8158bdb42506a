"""The clean agent through a real broker, against a raw aiokafka pass-through in the same run.

Starts a LocalBroker in a temporary state dir, produces the generated sample once
to a raw topic, then measures, each with its own consumer group and output topics:

* pass-through: an aiokafka consumer of the raw topic that produces the same bytes
  to another topic (what moving the records costs, with no cleaning at all);
* ``python -m streams worker --roles clean`` with 1 worker process, and with
  ``--workers K`` (K > 1) also K processes in one consumer group.

One poller (end offsets of the output topics, every ``--poll`` seconds) times all
of them the same way: start-up is launch -> first output record; the steady rate
is the records after the first poll that saw output, over the time until all N
are out. Afterwards every output record's raw coordinate is read back: each raw
record must be routed exactly once (duplicates after a rebalance are reported).

Run: ``.venv/bin/python bench/clean_agent_bench.py [--records 20000] [--partitions 2]
[--workers 2]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _common import (
    REPO,
    add_tag_argument,
    cpu_seconds,
    free_port,
    peak_rss_mib,
    peak_rss_of,
    table,
    write_result,
)
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.dev.broker.launcher import LocalBroker
from streams.dev.sample import write_sample
from streams.ingest.produce import ProduceSummary, produce, source_name
from streams.ingest.reader import iter_records, open_source
from streams.kafka.connect import aiokafka_kwargs, partitions_of, stop_consumer
from streams.kafka.readers import read_topic
from streams.kafka.topics import ensure_topics
from streams.settings import Settings

TOPIC_NAMES = ("raw", "fast", "slow", "deadletter", "fragments", "traces", "review",
               "reports")


@dataclass
class Timing:
    """What the output poller saw for one run (seconds since launch)."""

    name: str
    processes: int
    records: int
    first_output_s: float | None = None  # start-up: launch -> first output seen
    first_count: int = 0  # outputs already there at that poll
    done_s: float | None = None  # launch -> all N out
    routed: dict[str, int] = field(default_factory=dict)  # outputs per topic at the end
    distinct: int = 0
    duplicates: int = 0
    cpu_seconds_steady: float | None = None  # CPU of the measured processes, first -> done
    broker_cpu_seconds_steady: float | None = None
    peak_rss_mib: float | None = None  # largest VmHWM of the measured processes
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (s since launch, out)
    inprocess: dict[str, float] = field(default_factory=dict)

    @property
    def steady_s(self) -> float | None:
        if self.first_output_s is None or self.done_s is None:
            return None
        return self.done_s - self.first_output_s

    @property
    def steady_rate(self) -> float | None:
        steady = self.steady_s
        if not steady:
            return None
        return (self.records - self.first_count) / steady

    @property
    def total_rate(self) -> float | None:
        return self.records / self.done_s if self.done_s else None

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "steady_s": self.steady_s,
            "steady_records_per_second": self.steady_rate,
            "total_records_per_second": self.total_rate,
        }


# --- processes --------------------------------------------------------------------------


def topic_names(prefix: str, raw: str) -> dict[str, str]:
    names = {name: f"{prefix}.{name}" for name in TOPIC_NAMES}
    names["raw"] = raw
    return names


def run_settings(
    bootstrap: str, app_id: str, topics: dict[str, str], partitions: int, state_dir: Path
) -> Settings:
    return Settings(
        kafka={"bootstrap": bootstrap},
        app_id=app_id,
        state_dir=state_dir,
        topics={**topics, "partitions": partitions},
    )


def start_worker(settings: Settings, state_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    state_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "RETRO_KAFKA__BOOTSTRAP": settings.kafka.bootstrap or "",
        "RETRO_STATE_DIR": str(state_dir),
        "RETRO_APP_ID": settings.app_id,
        "RETRO_WEB_PORT": str(free_port()),
        "RETRO_TOPICS__PARTITIONS": str(settings.topics.partitions),
        "RETRO_LOG_LEVEL": "WARNING",
    }
    for name in TOPIC_NAMES:
        env[f"RETRO_TOPICS__{name.upper()}"] = getattr(settings.topics, name)
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "streams", "worker", "--roles", "clean"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=state_dir,
            start_new_session=True,
        )


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the worker's process group (it started its own session), then SIGKILL."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


# --- measuring ----------------------------------------------------------------------------


class OutputPoller:
    """Sums the end offsets of some topics; one metadata client for the whole run."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.consumer = AIOKafkaConsumer(
            **aiokafka_kwargs(settings), group_id=None, enable_auto_commit=False
        )

    async def __aenter__(self) -> OutputPoller:
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await stop_consumer(self.consumer)

    async def partitions(self, topics: list[str]) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t in topics for p in await partitions_of(self.consumer, t)]

    async def counts(self, tps: list[TopicPartition]) -> dict[str, int]:
        ends = await self.consumer.end_offsets(tps)
        out: dict[str, int] = {}
        for tp, end in ends.items():
            out[tp.topic] = out.get(tp.topic, 0) + end
        return out


async def watch(
    poller: OutputPoller,
    topics: list[str],
    timing: Timing,
    *,
    launched: float,
    poll: float,
    timeout: float,
    pids: list[int],
    broker_pid: int | None,
    alive: Any = None,
) -> None:
    """Poll until all records are out (or timeout); fill ``timing``."""
    tps = await poller.partitions(topics)
    cpu_first = broker_first = None
    while True:
        counts = await poller.counts(tps)
        total = sum(counts.values())
        now = time.monotonic() - launched
        if total and (not timing.timeline or timing.timeline[-1][1] != total):
            timing.timeline.append((round(now, 3), total))
        if total and timing.first_output_s is None:
            timing.first_output_s, timing.first_count = now, total
            cpu_first = _cpu_sum(pids)
            broker_first = cpu_seconds(broker_pid) if broker_pid else None
        if total >= timing.records:
            timing.done_s = now
            timing.routed = counts
            cpu_done = _cpu_sum(pids)
            if cpu_first is not None and cpu_done is not None:
                timing.cpu_seconds_steady = cpu_done - cpu_first
            broker_done = cpu_seconds(broker_pid) if broker_pid else None
            if broker_first is not None and broker_done is not None:
                timing.broker_cpu_seconds_steady = broker_done - broker_first
            rss = [r for r in (peak_rss_of(p) for p in pids) if r is not None]
            timing.peak_rss_mib = max(rss) if rss else None
            return
        if now > timeout:
            timing.routed = counts
            raise TimeoutError(
                f"{timing.name}: {total} of {timing.records} records out after {now:.0f}s"
            )
        if alive is not None and not alive():
            raise RuntimeError(f"{timing.name}: a worker exited early")
        await asyncio.sleep(poll)


def _cpu_sum(pids: list[int]) -> float | None:
    values = [cpu_seconds(p) for p in pids]
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


async def verify(settings: Settings, topics: list[str], timing: Timing, id_of: Any = None) -> None:
    """Read every output back: each raw record routed exactly once."""
    ids: list[str] = []
    for topic in topics:
        async for _key, value in read_topic(settings, topic):
            ids.append(id_of(value) if id_of else json.loads(value)["id"])
    timing.distinct = len(set(ids))
    timing.duplicates = len(ids) - timing.distinct


async def passthrough(
    settings: Settings, raw: str, out: str, group: str, n: int, timing: Timing
) -> None:
    """The baseline: consume the raw topic, produce the same key/value/headers elsewhere."""
    kwargs = aiokafka_kwargs(settings)
    consumer = AIOKafkaConsumer(
        raw,
        **kwargs,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=True,
        auto_commit_interval_ms=1000,
    )
    producer = AIOKafkaProducer(**kwargs, acks="all")
    started = time.monotonic()
    await producer.start()
    await consumer.start()
    first: float | None = None
    seen = 0
    pending: list[asyncio.Future[Any]] = []
    try:
        while seen < n:
            batches = await consumer.getmany(timeout_ms=1000)
            for messages in batches.values():
                if first is None and messages:
                    first = time.monotonic()
                for m in messages:
                    pending.append(
                        await producer.send(out, key=m.key, value=m.value, headers=list(m.headers))
                    )
                    seen += 1
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
        done = time.monotonic()
        timing.inprocess = {
            "startup_s": (first or done) - started,
            "total_s": done - started,
            "steady_s": done - (first or started),
            "records_per_second": n / (done - (first or started)),
        }
    finally:
        await stop_consumer(consumer)
        await producer.stop()


async def produce_spread(paths: list[str], settings: Settings, spread: int) -> ProduceSummary:
    """Like ``retro produce``, but keys ``<source>~<i mod spread>`` so partitions even out.

    The clean agent takes the key as the record's source, so sources read e.g.
    ``checkout-api.jsonl~3``: the cleaning work per record is unchanged.
    """
    summary = ProduceSummary()
    producer = AIOKafkaProducer(
        **aiokafka_kwargs(settings),
        acks="all",
        enable_idempotence=True,
        linger_ms=20,
        max_batch_size=256 * 1024,
    )
    await producer.start()
    started = time.monotonic()
    pending: list[asyncio.Future[Any]] = []
    try:
        for path in paths:
            source = source_name(path)
            with open_source(path) as stream:
                for i, (line_no, record) in enumerate(
                    iter_records(stream, max_record_bytes=settings.clean.max_record_bytes)
                ):
                    key = f"{source}~{i % spread}".encode()
                    pending.append(
                        await producer.send(
                            settings.topics.raw,
                            value=record,
                            key=key,
                            headers=[
                                ("retro-file", path.encode()),
                                ("retro-line", str(line_no).encode()),
                            ],
                        )
                    )
                    summary.records += 1
                    summary.bytes += len(record)
                    summary.per_source[source] = summary.per_source.get(source, 0) + 1
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    summary.seconds = time.monotonic() - started
    return summary


async def create_topic(settings: Settings, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(**aiokafka_kwargs(settings))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


# --- the runs -------------------------------------------------------------------------------


async def run_passthrough(
    base: Settings, raw: str, prefix: str, n: int, args: argparse.Namespace, broker_pid: int | None
) -> Timing:
    out = f"{prefix}.passthrough"
    await create_topic(base, out, args.partitions)
    timing = Timing(name="aiokafka pass-through", processes=1, records=n)
    async with OutputPoller(base) as poller:
        launched = time.monotonic()
        task = asyncio.create_task(passthrough(base, raw, out, f"{prefix}-passthrough", n, timing))
        try:
            await watch(
                poller,
                [out],
                timing,
                launched=launched,
                poll=args.poll,
                timeout=args.timeout,
                pids=[os.getpid()],
                broker_pid=broker_pid,
            )
        finally:
            await task
    return timing  # same bytes as raw, no coordinate in them: not read back


async def run_agent(
    base: Settings,
    raw: str,
    prefix: str,
    n: int,
    workers: int,
    args: argparse.Namespace,
    state: Path,
    broker_pid: int | None,
) -> Timing:
    topics = topic_names(prefix, raw)
    settings = run_settings(
        base.kafka.bootstrap or "", f"{prefix}-retro", topics, args.partitions, state
    )
    await ensure_topics(settings)  # created up front, so the worker's start-up is not timed on it
    outputs = [topics["fast"], topics["slow"], topics["deadletter"]]
    timing = Timing(name=f"clean agent x {workers}", processes=workers, records=n)
    procs: list[subprocess.Popen[bytes]] = []
    logs = [state / f"{prefix}-worker-{i}.log" for i in range(workers)]
    async with OutputPoller(settings) as poller:
        launched = time.monotonic()
        for i in range(workers):
            procs.append(start_worker(settings, state / f"{prefix}-w{i}", logs[i]))
        try:
            await watch(
                poller,
                outputs,
                timing,
                launched=launched,
                poll=args.poll,
                timeout=args.timeout,
                pids=[p.pid for p in procs],
                broker_pid=broker_pid,
                alive=lambda: all(p.poll() is None for p in procs),
            )
        except (TimeoutError, RuntimeError):
            for log in logs:
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
        finally:
            for proc in procs:
                stop_process(proc)
    await verify(settings, outputs, timing)
    return timing


async def bench(
    args: argparse.Namespace, tmp: Path, bootstrap: str, broker_pid: int | None
) -> dict[str, Any]:
    prefix = f"b{uuid.uuid4().hex[:8]}"
    raw = f"{prefix}.raw"
    base = run_settings(
        bootstrap, f"{prefix}-produce", topic_names(prefix, raw), args.partitions, tmp
    )
    await ensure_topics(base)
    paths = [str(p) for p in write_sample(tmp / "sample", records=args.records)]
    if args.spread_keys:
        summary = await produce_spread(paths, base, args.spread_keys)
    else:
        summary = await produce(paths, base)
    n = summary.records
    print(f"… {summary.line()}", file=sys.stderr)
    async with OutputPoller(base) as poller:
        tps = await poller.partitions([raw])
        ends = await poller.consumer.end_offsets(tps)
    raw_partitions = [ends[tp] for tp in sorted(tps, key=lambda tp: tp.partition)]

    runs: list[Timing] = []
    print("… pass-through", file=sys.stderr, flush=True)
    runs.append(await run_passthrough(base, raw, f"{prefix}p", n, args, broker_pid))
    for k in [1] if args.workers == 1 else [1, args.workers]:
        print(f"… clean agent x {k}", file=sys.stderr, flush=True)
        runs.append(await run_agent(base, raw, f"{prefix}w{k}", n, k, args, tmp, broker_pid))
    return {
        "produce": {
            "records": summary.records,
            "bytes": summary.bytes,
            "seconds": summary.seconds,
            "per_source": summary.per_source,
        },
        "raw_partitions": raw_partitions,
        "runs": runs,
    }


def report(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    runs: list[Timing] = result["runs"]
    base = runs[0].steady_rate or float("nan")
    single = runs[1].steady_rate if len(runs) > 1 else None
    rows = []
    for r in runs:
        steady, steady_n = r.steady_s, r.records - r.first_count
        cpu = r.cpu_seconds_steady
        broker = r.broker_cpu_seconds_steady
        is_agent = r.name.startswith("clean")
        rows.append(
            (
                r.name,
                r.records,
                r.first_output_s or 0.0,
                steady or 0.0,
                r.done_s or 0.0,
                r.steady_rate or 0.0,
                f"{(r.steady_rate or 0) / base:.0%}",
                f"{cpu / steady:.2f}" if cpu is not None and steady else "-",
                f"{cpu / steady_n * 1e6:.0f}" if cpu is not None and steady_n > 0 else "-",
                f"{broker / steady:.2f}" if broker is not None and steady else "-",
                f"{r.peak_rss_mib:.0f}" if r.peak_rss_mib and is_agent else "-",
                f"{r.distinct:,}/{r.duplicates}" if is_agent else "n/a",
            )
        )
    print(
        table(
            (
                "run",
                "records",
                "start-up s",
                "steady s",
                "total s",
                "steady rec/s",
                "vs pass-through",
                "CPU cores",
                "CPU µs/rec",
                "broker cores",
                "RSS MiB",
                "distinct/dup",
            ),
            rows,
        )
    )
    scaling = None
    if len(runs) > 2 and single:
        scaling = (runs[2].steady_rate or 0) / single
        print(
            f"\nscaling: {args.workers} workers = {scaling:.2f}x one worker "
            f"({os.cpu_count()} CPUs, broker and workers on the same machine)"
        )
    parts = result["raw_partitions"]
    keys = f"<source>~<i mod {args.spread_keys}>" if args.spread_keys else "source"
    print(
        f"\nraw records per partition (key = {keys}): {parts}; the largest holds "
        f"{max(parts) / sum(parts):.0%}"
    )
    print(f"routed (1 worker): {runs[1].routed if len(runs) > 1 else {}}")
    ip = runs[0].inprocess
    if ip:
        print(
            f"pass-through measured in-process: {ip['records_per_second']:,.0f} rec/s steady, "
            f"{ip['startup_s']:.2f}s to the first record"
        )
    ok = all(r.distinct == r.records for r in runs[1:])
    print(f"every raw record routed exactly once: {'OK' if ok else 'FAIL'}")
    return {
        "params": {
            "records": args.records,
            "partitions": args.partitions,
            "spread_keys": args.spread_keys,
            "workers": args.workers,
            "poll_s": args.poll,
        },
        "broker_start_s": result["broker_start_s"],
        "produce": result["produce"],
        "raw_partitions": result["raw_partitions"],
        "runs": [r.to_json() for r in runs],
        "agent_vs_passthrough": (single / base) if single else None,
        "scaling": scaling,
        "exactly_once_routing": ok,
        "bench_peak_rss_mib": peak_rss_mib(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="generated sample size")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of every topic")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="also run this many clean workers in one group (scaling)",
    )
    parser.add_argument(
        "--spread-keys",
        type=int,
        default=0,
        metavar="N",
        help="key records <source>~<i mod N> instead of <source>, so "
        "partitions hold even shares (default: off, keys as retro produce)",
    )
    parser.add_argument("--poll", type=float, default=0.05, help="seconds between polls")
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per run")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    add_tag_argument(parser)
    args = parser.parse_args(argv)
    if args.workers < 1 or args.partitions < 1 or args.spread_keys < 0:
        parser.error("--workers and --partitions must be at least 1, --spread-keys >= 0")
    tmp = Path(tempfile.mkdtemp(prefix="clean-agent-bench-"))
    broker = LocalBroker(tmp / "broker-state")
    try:
        started = time.monotonic()
        state = broker.start(timeout=120)  # sync: it runs its own event loop to probe
        broker_start_s = time.monotonic() - started
        print(f"… broker up in {broker_start_s:.1f}s at {state.bootstrap}", file=sys.stderr)
        try:
            result = asyncio.run(bench(args, tmp, state.bootstrap, state.pid))
        finally:
            broker.stop()
        result["broker_start_s"] = broker_start_s
        doc = report(result, args)
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {write_result('clean_agent_bench', doc, args.tag)}")
    return 0 if doc["exactly_once_routing"] else 1


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
