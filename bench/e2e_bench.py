"""End to end through a real broker: raw logs -> clean -> batch -> compactor -> reports.

The pipeline's records/s (one ``retro worker``, the
offline rules model) as a share of a raw aiokafka consume -> json.dumps -> produce
-> commit loop over the same raw topic, measured in the same run on the same broker.

Steps (every process it starts is stopped on exit, Ctrl-C and errors included):

1. a ``LocalBroker`` in a temporary state dir (jars from ``~/.m2``);
2. >= ``--records`` log records (real logs from ``../shared/data`` topped up with
   ``write_sample``, or only generated ones), sent with ``python -m streams produce
   --quiet --spread 4`` after ``python -m streams topics``, uncompressed as shippers
   send by default (``--raw-codec``);
3. the baseline loop, in this process, with its own group and scratch topic,
   ``--baseline-runs`` times (3) before the pipelines and as many after them: the
   median run is the baseline;
4. with ``--workers K`` > 1, K processes running the workers' steps without a broker
   against one, before and after the pipelines: how far K workers can scale on this
   machine now;
5. ``python -m streams worker`` (``--workers K`` more in a second group), timed until
   the group's lag on every input topic is 0 and ``python -m streams audit`` passes;
   progress over time comes from the fragments the compactor has committed (their
   covered counts) and from each worker's ``/metrics``;
6. optionally ``py-spy record`` of the worker while it runs, summarized by stage,
   package and function.

Run: ``.venv/bin/python bench/e2e_bench.py [--records 100000] [--workers 2]
[--timeout 240] [--out FILE]``. See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import itertools
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

import aiohttp
from _common import (
    OUT_DIR,
    REPO,
    SHARED_DATA,
    add_tag_argument,
    command_line,
    cpu_seconds,
    free_port,
    machine,
    machine_cpu,
    peak_rss_of,
    table,
)
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.dev.broker.launcher import LocalBroker
from streams.dev.sample import count_logical_records, write_multiday, write_sample
from streams.kafka.connect import stop_consumer
from streams.settings import Compression, KafkaSettings

# seconds between audits once the lag says the run may be done (an audit reads the
# ledger in about a second); the first sample with no lag at all is audited at once
AUDIT_EVERY = 3.0
# seconds between samples once the raw topic is committed to its end: the done time
# is known to within this, not within --poll
TAIL_POLL = 0.25
# Topics a pipeline run owns (raw is shared by every run and the baseline).
PIPELINE_TOPICS = ("fast", "slow", "deadletter", "fragments", "traces", "review", "reports")
STAGE_METRIC = re.compile(r'^retro_records_consumed_total\{stage="([^"]+)"\}\s+([0-9.eE+]+)',
                          re.MULTILINE)


def log(message: str) -> None:
    print(f"… {message}", file=sys.stderr, flush=True)


# --- interruption -----------------------------------------------------------------------------
# Ctrl-C or SIGTERM cancels the bench's main task, so every `finally` stops what it
# started. A cancellation can be swallowed on Python 3.11 (asyncio.wait_for, used by
# aiokafka, drops one that races with a completed result), so the loops also check a
# flag; a second signal leaves the event loop at once (main()'s finally still runs).

INTERRUPTS = 0


def on_signal(task: asyncio.Task) -> None:
    global INTERRUPTS
    INTERRUPTS += 1
    if INTERRUPTS > 1:
        raise KeyboardInterrupt
    log("interrupted: stopping everything this bench started")
    task.cancel()


def check_interrupted() -> None:
    if INTERRUPTS:
        raise KeyboardInterrupt


def _interrupt(signum: int, frame: object) -> None:
    """Outside the event loop, SIGTERM takes the way out Ctrl-C takes."""
    raise KeyboardInterrupt


# --- processes ------------------------------------------------------------------------------
# Everything started goes through here, so one `finally` can stop it all, whatever failed.


class Processes:
    def __init__(self) -> None:
        self.running: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], *, env: dict[str, str], log_path: Path,
              cwd: Path = REPO) -> subprocess.Popen:
        """``args`` from ``cwd``: ``python -m streams`` there runs that tree's package."""
        with log_path.open("wb") as out:
            # its own session: SIGTERM to the group reaches anything it forks, and a
            # Ctrl-C on the bench's terminal does not kill it before we measured it
            proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True)
        self.running.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, sig: int = signal.SIGTERM, wait: float = 30) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        if proc in self.running:
            self.running.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self.running):
            self.stop(proc)


PROCS = Processes()


def base_env(bootstrap: str, state_dir: Path) -> dict[str, str]:
    """The caller's environment without its RETRO_* settings (a RETRO_MODEL__BASE_URL
    left in the shell would silently swap the rules model for a remote one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RETRO_")}
    env.update({"RETRO_KAFKA__BOOTSTRAP": bootstrap, "RETRO_STATE_DIR": str(state_dir),
                "RETRO_LOG_LEVEL": "WARNING"})
    return env


def pipeline_env(bootstrap: str, state_dir: Path, prefix: str, topics: dict[str, str],
                 partitions: int) -> dict[str, str]:
    """A pipeline's settings: its app id (with every role, the loops' groups are the app
    id + -raw...) and its topics."""
    env = base_env(bootstrap, state_dir)
    env["RETRO_APP_ID"] = prefix
    env["RETRO_TOPICS__PARTITIONS"] = str(partitions)
    env.update({f"RETRO_TOPICS__{n.upper()}": t for n, t in topics.items()})
    return env


async def retro(env: dict[str, str], *args: str, timeout: float = 600) -> tuple[int, str, str]:
    """``python -m streams ARGS`` as an asyncio subprocess, so followers keep running."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streams", *args, env=env, cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except BaseException:  # timeout, Ctrl-C: never leave it behind
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


# --- input data -------------------------------------------------------------------------------


def make_data(kind: str, records: int, directory: Path) -> tuple[list[str], dict[str, Any]]:
    """Files to produce and a description of them (which are real, which generated)."""
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "multiday":
        paths = write_multiday(directory, records=records, days=4)
        return [str(p) for p in paths], {"kind": "multiday", "generated": records, "real": 0,
                                         "real_files": []}
    real: list[Path] = []
    if kind == "mix" and SHARED_DATA.is_dir():
        real = sorted(p for p in SHARED_DATA.rglob("*.log") if p.is_file())
    real_count = count_logical_records(real) if real else 0
    generated = max(300, records - real_count)  # write_sample's minimum is 300
    paths = [str(p) for p in real]
    paths += [str(p) for p in write_sample(directory / "sample", records=generated)]
    note = {"kind": kind, "generated": generated, "real": real_count,
            "real_files": [str(p.relative_to(SHARED_DATA)) for p in real]}
    if kind == "mix" and not real:
        note["note"] = f"{SHARED_DATA} not found: generated sample only"
    return paths, note


# --- kafka helpers ------------------------------------------------------------------------------


async def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()


async def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        # a consumer that subscribes to nothing has no metadata of its own (as in
        # streams.kafka.connect.partitions_of)
        cluster = await consumer._client.fetch_all_metadata()
        parts = sorted(cluster.partitions_for_topic(topic) or ())
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in parts])
        return {tp.partition: off for tp, off in ends.items()}
    finally:
        await stop_consumer(consumer)


def topic_bytes(data_dir: Path) -> dict[str, int]:
    """Bytes of record batches on disk per topic: the sizes of the segment ``.log``
    files (index files are preallocated and would overstate). Compacted topics
    (reports, the changelog) are cleaned only in closed segments, and a segment
    closes after an hour or 1 GiB, so in a bench run this is every byte written."""
    sizes: dict[str, int] = {}
    for folder in data_dir.iterdir() if data_dir.is_dir() else ():
        topic, sep, part = folder.name.rpartition("-")
        if not folder.is_dir() or not sep or not part.isdigit():
            continue
        sizes[topic] = sizes.get(topic, 0) + sum(f.stat().st_size for f in folder.glob("*.log"))
    return sizes


# --- the baseline -----------------------------------------------------------------------------


async def raw_loop(bootstrap: str, raw: str, scratch: str, n: int) -> dict[str, Any]:
    """What moving a record costs with no pipeline at all: getmany, one small
    json.dumps per record, a batched send, commit once the batch is delivered (the
    same delivery-before-commit rule the agents follow, the same acks and codec)."""
    consumer = AIOKafkaConsumer(raw, bootstrap_servers=bootstrap, group_id=f"raw-loop-{scratch}",
                                enable_auto_commit=False, auto_offset_reset="earliest")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10,
                                max_batch_size=256 * 1024,
                                compression_type=KafkaSettings().compression)
    launched = time.monotonic()
    cpu0 = time.process_time()
    await producer.start()
    await consumer.start()
    first: float | None = None
    seen = 0
    try:
        while seen < n:
            check_interrupted()
            batches = await consumer.getmany(timeout_ms=1000, max_records=5000)
            if not batches:
                continue
            first = first or time.monotonic()
            pending = []
            offsets = {}
            for tp, messages in batches.items():
                for m in messages:
                    value = json.dumps({"id": f"{m.topic}/{m.partition}/{m.offset}",
                                        "source": (m.key or b"").decode(errors="replace"),
                                        "bytes": len(m.value or b""), "ts": m.timestamp})
                    pending.append(await producer.send(scratch, key=m.key, value=value.encode()))
                offsets[tp] = messages[-1].offset + 1
                seen += len(messages)
            await asyncio.gather(*pending)
            await consumer.commit(offsets)
        done = time.monotonic()
    finally:
        await stop_consumer(consumer)
        await producer.stop()
    first = first or done
    return {"records": seen, "startup_s": first - launched, "steady_s": done - first,
            "total_s": done - launched, "records_per_second": seen / (done - first),
            "total_records_per_second": seen / (done - launched),
            "cpu_seconds": time.process_time() - cpu0}


async def raw_loops(args: argparse.Namespace, bootstrap: str, raw: str, n: int, *,
                    first: int) -> list[dict[str, Any]]:
    """``--baseline-runs`` runs of the raw loop, each with its own group and scratch topic."""
    out = []
    for i in range(first, first + args.baseline_runs):
        check_interrupted()
        scratch = f"e2e.rawloop.{i}"
        await create_topic(bootstrap, scratch, args.partitions)
        out.append(await raw_loop(bootstrap, raw, scratch, n))
    return out


# --- following the pipeline --------------------------------------------------------------------


class CoverageFollower:
    """Reads a topic of messages that carry ``covered`` (fragments, reviews) and keeps,
    per partition, how many raw records the messages up to each offset cover; so
    "records the compactor has merged" is a lookup at the group's committed offset,
    measured outside the worker and without asking it for anything."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                         enable_auto_commit=False,
                                         max_partition_fetch_bytes=16 * 1024 * 1024)
        self.offsets: dict[int, list[int]] = {}
        self.cumulative: dict[int, list[int]] = {}
        self.by_id: dict[str, int] = {}  # replays of the same id count once
        self.unreadable = 0
        self.task: asyncio.Task | None = None

    async def start(self, partitions: int) -> None:
        await self.consumer.start()
        tps = [TopicPartition(self.topic, p) for p in range(partitions)]
        self.consumer.assign(tps)
        await self.consumer.seek_to_beginning(*tps)
        self.task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await stop_consumer(self.consumer)

    async def _run(self) -> None:
        try:
            await self._follow()
        except Exception as exc:  # progress would freeze silently; the lag still ends it
            log(f"following {self.topic} failed: {exc!r}")

    async def _follow(self) -> None:
        while True:
            batches = await self.consumer.getmany(timeout_ms=500)
            for tp, messages in batches.items():
                offs = self.offsets.setdefault(tp.partition, [])
                cum = self.cumulative.setdefault(tp.partition, [])
                for m in messages:
                    count, ident = self._covered(m.value)
                    if ident is not None:
                        self.by_id[ident] = count
                    offs.append(m.offset)
                    cum.append((cum[-1] if cum else 0) + count)

    def _covered(self, value: bytes | None) -> tuple[int, str | None]:
        try:
            doc = json.loads(value or b"null")
            covered = doc.get("covered") or {}
            # interval sets are inclusive [first, last] pairs per "topic/partition"
            count = sum(b - a + 1 for ranges in covered.values() for a, b in ranges)
            return count, doc.get("id")
        except (ValueError, TypeError, AttributeError):
            self.unreadable += 1  # e.g. a roll-up message: no records of its own
            return 0, None

    def covered_below(self, committed: dict[int, int]) -> int:
        """Records covered by messages at offsets below ``committed`` per partition."""
        total = 0
        for part, upto in committed.items():
            offs = self.offsets.get(part, [])
            i = bisect.bisect_left(offs, upto)
            if i:
                total += self.cumulative[part][i - 1]
        return total

    def distinct_covered(self) -> int:
        return sum(self.by_id.values())


@dataclass
class Sample:
    t: float  # seconds since the workers were launched
    accounted: int  # records merged into reports + in review + dead-lettered (estimate)
    lag: int  # sum over the group's input partitions
    raw_committed: int
    stages: dict[str, float]  # retro_records_consumed_total by stage, summed over workers
    lag_by_topic: dict[str, int] = field(default_factory=dict)
    # CPU seconds so far: the machine's busy and all ("busy", "all"), the workers, the
    # broker and this bench; two samples give the cores each used between them
    cpu: dict[str, float] = field(default_factory=dict)


class Observer:
    """One admin client, one metadata consumer and two followers for the whole run."""

    def __init__(self, bootstrap: str, group: str, topics: dict[str, str], partitions: int,
                 web_ports: list[int]) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.topics = topics
        self.partitions = partitions
        self.web_ports = web_ports
        self.admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        self.meta = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        self.fragments = CoverageFollower(bootstrap, topics["fragments"])
        self.review = CoverageFollower(bootstrap, topics["review"])
        self.http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Observer:
        await self.admin.start()
        await self.meta.start()
        await self.fragments.start(self.partitions)
        await self.review.start(self.partitions)
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.http is not None:
            await self.http.close()
        await self.fragments.stop()
        await self.review.stop()
        await stop_consumer(self.meta)
        await self.admin.close()

    async def committed(self) -> dict[TopicPartition, int]:
        """The worker group's commits, with those of its aiokafka loops: the clean
        loop's (``<group>-raw``) for the raw topic, the batch loop's (``<group>-lanes``)
        for the lanes and the compactor loop's (``<group>-fragments``) for fragments."""
        out: dict[TopicPartition, int] = {}
        for group in (self.group, f"{self.group}-raw", f"{self.group}-lanes",
                      f"{self.group}-fragments"):
            try:
                offsets = await self.admin.list_consumer_group_offsets(group)
            except Exception:  # the group does not exist (yet)
                continue
            out.update({tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0})
        return out

    async def sample(self, launched: float) -> Sample:
        committed = await self.committed()
        # the group's inputs, wherever it commits (a redesign may add topics), never
        # a table changelog (read at recovery, not by the group)
        tps = {TopicPartition(self.topics[n], p) for n in ("raw", "fast", "slow", "fragments")
               for p in range(self.partitions)}
        tps |= {tp for tp in committed if not tp.topic.endswith("-changelog")}
        ends = await self.meta.end_offsets(tps)
        lag_by_topic: dict[str, int] = {}
        for tp in tps:
            lag_by_topic[tp.topic] = lag_by_topic.get(tp.topic, 0) + max(
                0, ends[tp] - committed.get(tp, 0))
        frag = {tp.partition: off for tp, off in committed.items()
                if tp.topic == self.topics["fragments"]}
        dead_tps = [TopicPartition(self.topics["deadletter"], p) for p in range(self.partitions)]
        dead = sum((await self.meta.end_offsets(dead_tps)).values())
        accounted = self.fragments.covered_below(frag) + self.review.distinct_covered() + dead
        raw_committed = sum(off for tp, off in committed.items() if tp.topic == self.topics["raw"])
        return Sample(t=round(time.monotonic() - launched, 3), accounted=accounted,
                      lag=sum(lag_by_topic.values()), raw_committed=raw_committed,
                      stages=await self.stage_counts(), lag_by_topic=lag_by_topic)

    async def stage_counts(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for port in self.web_ports:
            text = await self.get(port, "/metrics")
            for stage, value in STAGE_METRIC.findall(text or ""):
                totals[stage] = totals.get(stage, 0.0) + float(value)
        return totals

    async def get(self, port: int, path: str) -> str | None:
        assert self.http is not None
        try:
            async with self.http.get(f"http://127.0.0.1:{port}{path}") as resp:
                return await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None  # not listening yet, or busy: the next poll tries again

    async def report_sizes(self, port: int, expect: int) -> dict[str, Any] | None:
        """Latest reports as the worker serves them: bytes per covered record. Waits a
        little for its report follower to catch up with the topic."""
        summaries: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = await self.get(port, "/reports")
            summaries = json.loads(text) if text else []
            if sum(s.get("record_count", 0) for s in summaries) >= expect:
                break
            await asyncio.sleep(2)
        if not summaries:
            return None
        size = 0
        for s in summaries[:2000]:
            body = await self.get(port, f"/reports/{s['id']}")
            size += len((body or "").encode())
        covered = sum(s.get("record_count", 0) for s in summaries[:2000])
        largest = max(summaries, key=lambda s: s.get("record_count", 0))
        return {"reports": len(summaries), "bytes": size, "covered_records": covered,
                "bytes_per_record": size / covered if covered else None,
                "largest": {k: largest.get(k) for k in ("id", "record_count", "incidents")}}


# --- profiling --------------------------------------------------------------------------------


def py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


async def start_profile(pid: int, seconds: float, out: Path) -> asyncio.subprocess.Process:
    # --nonblocking: sample without pausing the worker, so it is not slowed by the probe
    return await asyncio.create_subprocess_exec(
        py_spy() or "py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)),
        "--format", "raw", "--rate", "100", "--nonblocking", "--output", str(out),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)


async def finish_profile(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
    try:
        await asyncio.wait_for(proc.wait(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
    if proc.returncode and proc.stderr is not None:
        log(f"py-spy exited {proc.returncode}: {(await proc.stderr.read()).decode()[-500:]}")


FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]+)(?::\d+)?\)$")


ENTRY_FILES = ("streams/__main__.py", "streams/cli.py", "streams/runner.py")


# frames that sit under everything (start-up, event loops, mode's service scaffolding)
PLUMBING = (*ENTRY_FILES, "asyncio/", "<frozen", "threading.py", "selectors.py",
            "mode/worker.py", "mode/services.py", "mode/utils/")


def stage_of(files: list[str]) -> str:
    """Which part of the worker a stack belongs to. The stack is cut below the event
    loop's callback dispatch (asyncio/events.py), leaving the running task: the stage
    whose step is on it (a stage loop, or a task a lane processor started), else its
    outermost project frame, else its outermost library frame (aiokafka's sender)."""
    cut = max((i for i, f in enumerate(files) if f == "asyncio/events.py"), default=-1)
    task = [f for f in files[cut + 1:] if not f.startswith(PLUMBING)]
    if not task:
        return "event loop itself (dispatch, select, wait)"
    for f in task:
        m = re.match(r"streams/(\w+)/(step|lane)\.py", f)
        if m:
            return f"stage {'lanes' if m.group(1) == 'batch' else m.group(1)}"
    for f in task:
        if f.startswith("streams/report/store.py"):
            return "report follower"
        if f.startswith("streams/"):
            return "/".join(f.split("/")[:2]).removesuffix(".py") + " (task of its own)"
    return "/".join(task[0].split("/")[:2]).removesuffix(".py") + " (no project frame)"


def package_of(path: str) -> str:
    parts = path.split("/")
    if parts[0] == "streams" and len(parts) > 1:
        return "/".join(parts[:2]).removesuffix(".py")
    return parts[0].removesuffix(".py")


def summarize_profile(path: Path, top: int = 15) -> dict[str, Any] | None:
    """Own time (leaf frame) and total time (anywhere on the stack, once per stack)
    per function; samples per stage and per package of the leaf. py-spy leaves idle
    threads out by default, so samples are time on the CPU (or waiting for the GIL)."""
    if not path.exists():
        return None
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    stages: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    samples = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = []
        for raw in stack.split(";"):
            m = FRAME.match(raw)
            if m:
                frames.append((m.group("func"), m.group("file")))
        if not frames:
            continue
        samples += count
        names = [f"{func} ({file})" for func, file in frames]
        own[names[-1]] += count
        # once per stack (recursion), and not the frames every stack has
        for name in {n for n, (_, f) in zip(names, frames, strict=True)
                     if not f.startswith(PLUMBING)}:
            total[name] += count
        stages[stage_of([file for _, file in frames])] += count
        packages[package_of(frames[-1][1])] += count

    def share(c: Counter[str], k: int) -> list[tuple[str, int, float]]:
        return [(name, n, n / samples) for name, n in c.most_common(k)]

    return {"samples": samples, "file": str(path), "by_stage": share(stages, 20),
            "own_by_package": share(packages, 15), "own_by_function": share(own, top),
            "total_by_function": share(total, top)}


def print_profile(summary: dict[str, Any], label: str) -> None:
    print(f"\nprofile {label}, {summary['seconds']:.0f}s: {summary['samples']:,} samples of "
          f"the worker at 100/s, {summary['busy_threads']:.2f} threads busy on average "
          f"(raw stacks: {summary['file']})")
    for title, key in (("stage (the running task's outermost frame)", "by_stage"),
                       ("package of the running function (own time)", "own_by_package"),
                       ("function, own time", "own_by_function"),
                       ("function, total time (on the stack)", "total_by_function")):
        rows = [(name[:110], n, f"{s:.1%}") for name, n, s in summary[key]]
        print(f"\n{table((title, 'samples', 'share'), rows)}")


# --- one pipeline run ---------------------------------------------------------------------------


@dataclass
class PipelineRun:
    name: str
    workers: int
    records: int
    timeline: list[Sample] = field(default_factory=list)
    first_progress_s: float | None = None
    done_s: float | None = None
    timed_out: bool = False
    audit: dict[str, Any] = field(default_factory=dict)
    audits_before_done: int = 0
    peak_rss_mib: list[float | None] = field(default_factory=list)
    cpu_seconds: list[float | None] = field(default_factory=list)
    broker_cpu_seconds: float | None = None
    bench_cpu_seconds: float | None = None  # this process: the observer's own cost
    reports: dict[str, Any] | None = None
    topic_bytes: dict[str, int] = field(default_factory=dict)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    waits: list[dict[str, Any]] = field(default_factory=list)  # per worker, with --waits
    launched_at: float = 0.0  # time.monotonic() at launch (shared by every process)
    worker_exit: list[int | None] = field(default_factory=list)

    def progress_at(self, share: float, key: str = "accounted") -> float | None:
        """Seconds since launch when ``share`` of the records had passed ``key``: the
        records accounted for, or a stage's consumed counter (as a share of that
        stage's final count: the lanes each see only part of the records)."""
        if key == "accounted":
            goal = share * self.records
        else:
            goal = share * max((s.stages.get(key, 0) for s in self.timeline), default=0)
        for s in self.timeline:
            value = s.accounted if key == "accounted" else s.stages.get(key, 0)
            if value >= goal:
                return s.t
        return None

    def rate_by_quarter(self, start: float | None, end: float | None,
                        key: str = "accounted") -> list[float] | None:
        """Records/s in each quarter of [start, end]: is the rate flat, even in a run
        cut short by --timeout, where there is no second half to compare."""
        if start is None or end is None or end <= start or not self.timeline:
            return None

        def value_at(t: float) -> float:  # the last sample at or before t
            best = 0.0
            for s in self.timeline:
                if s.t > t:
                    break
                best = s.accounted if key == "accounted" else s.stages.get(key, 0.0)
            return best

        edges = [start + (end - start) * i / 4 for i in range(5)]
        return [(value_at(b) - value_at(a)) / (b - a) for a, b in itertools.pairwise(edges)]

    def summary(self) -> dict[str, Any]:
        last = self.timeline[-1] if self.timeline else None
        # the rate takes what the samples saw by the time they saw it; the audit's
        # count is exact but (on a timeout) comes after the worker's graceful stop
        accounted = self.records if self.done_s is not None else (
            min(self.records, last.accounted) if last else 0)
        audited = self.audit.get("claimed_total")
        done_share = min(self.records, audited if audited is not None else accounted)
        start = self.first_progress_s
        end = self.done_s if self.done_s is not None else (last.t if last else None)
        steady = (end - start) if start is not None and end is not None else None
        half = self.progress_at(0.5)
        first_half = half - start if half is not None and start is not None else None
        second_half = self.done_s - half if half is not None and self.done_s else None
        halves = {}
        for stage in sorted(last.stages) if last else ():
            h, full = self.progress_at(0.5, stage), self.progress_at(1.0, stage)
            if h is not None and start is not None:
                halves[stage] = {"first_half_s": h - start,
                                 "second_half_s": (full - h) if full is not None else None}
        cpu = [c for c in self.cpu_seconds if c is not None]
        idle = [self.steady_idle(waits, start, end) for waits in self.waits]
        return {
            "done": self.done_s is not None, "timed_out": self.timed_out,
            "startup_s": start, "steady_s": steady, "total_s": end,
            "accounted": accounted, "audited": audited,
            "fraction_done": done_share / self.records,
            "records_per_second": accounted / steady if steady else None,
            "total_records_per_second": accounted / end if end else None,
            "first_half_s": first_half, "second_half_s": second_half,
            "second_vs_first_half": (second_half / first_half
                                     if first_half and second_half else None),
            "stage_halves": halves,
            "rate_by_quarter": {key: self.rate_by_quarter(start, end, key)
                                for key in ("accounted", *(sorted(last.stages) if last else ()))},
            "peak_rss_mib": max((r for r in self.peak_rss_mib if r), default=None),
            "worker_cpu_cores": (sum(cpu) / end) if cpu and end else None,
            "broker_cpu_cores": (self.broker_cpu_seconds / end
                                 if self.broker_cpu_seconds is not None and end else None),
            "bench_cpu_cores": (self.bench_cpu_seconds / end
                                if self.bench_cpu_seconds is not None and end else None),
            "steady_idle_share": idle,  # per worker, with --waits
            "steady_cores": self.steady_cores(start, end),
        }

    def steady_cores(self, start: float | None, end: float | None) -> dict[str, float] | None:
        """Cores used in the steady time, from the samples at its two ends: the machine's
        CPUs (``cpus``), how many were busy, and by whom (``other``: anything else on the
        machine, the kernel's own work included). Shows whether the workers were short of
        CPU (the machine busy) or of work (idle cores)."""
        if start is None or end is None or end <= start:
            return None
        first = next((s for s in self.timeline if s.t >= start and s.cpu), None)
        last = next((s for s in reversed(self.timeline) if s.t <= end and s.cpu), None)
        if first is None or last is None or last.t <= first.t:
            return None
        keys = ("busy", "all", "workers", "broker", "bench")
        if not all(k in first.cpu and k in last.cpu for k in keys):
            return None
        seconds = last.t - first.t
        used = {k: (last.cpu[k] - first.cpu[k]) / seconds for k in keys}
        return {"seconds": seconds, "cpus": used["all"], "busy": used["busy"],
                "workers": used["workers"], "broker": used["broker"], "bench": used["bench"],
                "other": used["busy"] - used["workers"] - used["broker"] - used["bench"]}

    def steady_idle(self, waits: dict[str, Any], start: float | None,
                    end: float | None) -> float | None:
        """The share of the steady time [start, end] a worker's event loop sat idle."""
        if start is None or end is None or end <= start:
            return None
        steady = sum(idle for second, idle in waits.get("idle_by_second", ())
                     if start <= second - self.launched_at <= end)
        return steady / (end - start)


def cpu_so_far(worker_pids: list[int], broker_pid: int | None) -> dict[str, float]:
    """``Sample.cpu``: CPU seconds so far of the machine, the workers, the broker and this
    bench; empty where /proc is not there to read."""
    whole = machine_cpu()
    workers = [cpu_seconds(pid) for pid in worker_pids]
    broker = cpu_seconds(broker_pid)
    if whole is None or broker is None or None in workers:
        return {}
    return {"busy": whole[0], "all": whole[1], "workers": sum(w or 0.0 for w in workers),
            "broker": broker, "bench": time.process_time()}


async def run_pipeline(args: argparse.Namespace, ctx: dict[str, Any], workers: int,
                       tmp: Path) -> PipelineRun:
    prefix = f"p{workers}-{uuid.uuid4().hex[:6]}"
    state = tmp / prefix
    state.mkdir()
    topics = {"raw": ctx["raw"], **{n: f"{prefix}.{n}" for n in PIPELINE_TOPICS}}
    env = pipeline_env(ctx["bootstrap"], state, prefix, topics, args.partitions)
    env.update(dict(item.split("=", 1) for item in args.set))
    code, out, err = await retro(env, "topics", timeout=120)  # not timed against the worker
    if code:
        raise RuntimeError(f"`retro topics` failed ({code}): {out}{err}")
    run = PipelineRun(name=f"pipeline x {workers}", workers=workers, records=ctx["n"])
    ports = [free_port() for _ in range(workers)]
    procs: list[subprocess.Popen] = []
    profiles: list[tuple[asyncio.subprocess.Process, Path, float]] = []
    pending_profiles = sorted(args.profile_at) if args.profile and py_spy() else []
    broker_cpu0 = cpu_seconds(ctx["broker_pid"])
    bench_cpu0 = time.process_time()
    async with Observer(ctx["bootstrap"], prefix, topics, args.partitions, ports) as obs:
        launched = run.launched_at = time.monotonic()
        for i, port in enumerate(ports):
            wenv = {**env, "RETRO_WEB_PORT": str(port),
                    "RETRO_STATE_DIR": str(state / f"w{i}")}  # faust datadir per process
            if args.waits:
                wenv["PYTHONPATH"] = os.pathsep.join(
                    p for p in (str(REPO / "bench" / "waits"), env.get("PYTHONPATH")) if p)
                wenv["BENCH_WAITS_OUT"] = str(state / f"waits-{i}.json")
            procs.append(PROCS.start([sys.executable, "-m", "streams", "worker"], env=wenv,
                                     log_path=state / f"worker-{i}.log"))
        last_audit, lag_at_audit = -1e9, -1
        measured = False  # the loop ran to its end (done or timeout), no error
        try:
            while True:
                s = await obs.sample(launched)
                s.cpu = cpu_so_far([p.pid for p in procs], ctx["broker_pid"])
                run.timeline.append(s)
                if run.first_progress_s is None and (s.raw_committed or s.stages.get("clean")):
                    run.first_progress_s = s.t
                while pending_profiles and s.accounted >= pending_profiles[0] * run.records:
                    at = pending_profiles.pop(0)
                    out = ctx["out_dir"] / f"{ctx['stem']}-profile-x{workers}-{at:.2f}.txt"
                    profiles.append((await start_profile(procs[0].pid, args.profile, out), out,
                                     time.monotonic() - launched))
                    log(f"py-spy on worker 0 for {args.profile:.0f}s at {s.accounted:,} records")
                if len(run.timeline) % max(1, int(15 / args.poll)) == 0:
                    log(f"{s.t:.0f}s: {s.accounted:,}/{run.records:,} accounted, "
                        f"stages {({k: int(v) for k, v in s.stages.items()})}, lag {s.lag:,}")
                # done = nothing left to read anywhere and the audit agrees; the lag
                # check is cheap, the audit reads the whole ledger, so it runs only
                # when the lag says we may be done
                caught_up = s.raw_committed >= run.records and (
                    s.lag == 0 or s.accounted >= run.records)
                # re-read records make ``accounted`` overshoot, so a failed audit while
                # some lag is left must not hold back the one when the lag reaches zero
                if caught_up and (s.t - last_audit >= AUDIT_EVERY
                                  or (s.lag == 0 and lag_at_audit != 0)):
                    result = await timed_audit(env)
                    last_audit, lag_at_audit = time.monotonic() - launched, s.lag
                    if result.get("ok"):
                        run.done_s, run.audit = s.t, result
                        break
                    run.audits_before_done += 1
                    log(f"lag 0 but audit not ok yet: {result.get('summary')}")
                if any(p.poll() is not None for p in procs):
                    run.worker_exit = [p.poll() for p in procs]
                    tail = (state / "worker-0.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"a worker exited early ({run.worker_exit}):\n{tail}")
                if s.t > args.timeout:
                    run.timed_out = True
                    log(f"timeout after {s.t:.0f}s: {s.accounted:,} of {run.records:,} "
                        "records accounted for")
                    break
                await asyncio.sleep(min(args.poll, TAIL_POLL)
                                    if s.raw_committed >= run.records else args.poll)
                check_interrupted()
            measured = True
        finally:
            stopped_at = time.monotonic() - launched  # a profile may be cut short by the end
            # measured before anything else asks the worker for work
            run.peak_rss_mib = [peak_rss_of(p.pid) for p in procs]
            run.cpu_seconds = [cpu_seconds(p.pid) for p in procs]
            broker_cpu1 = cpu_seconds(ctx["broker_pid"])
            if broker_cpu0 is not None and broker_cpu1 is not None:
                run.broker_cpu_seconds = broker_cpu1 - broker_cpu0
            run.bench_cpu_seconds = time.process_time() - bench_cpu0
            try:
                for proc, _, _ in profiles:
                    await finish_profile(proc)
                if measured:  # on a timeout: what the worker serves now, without waiting
                    run.reports = await obs.report_sizes(
                        ports[0], (run.audit.get("claimed") or {}).get("reports", 0))
            finally:
                for proc in procs:
                    PROCS.stop(proc)
    for i in range(workers if args.waits else 0):
        with contextlib.suppress(OSError, ValueError):
            run.waits.append(json.loads((state / f"waits-{i}.json").read_text()))
    if run.timed_out:  # the exact partial figure, with the worker stopped
        run.audit = await timed_audit(env)
    for _, path, at in profiles:
        summary = summarize_profile(path)
        if summary:
            summary["started_at_s"] = at
            summary["seconds"] = min(args.profile, stopped_at - at)
            # py-spy leaves idle threads out: samples per second / rate = busy threads
            summary["busy_threads"] = summary["samples"] / (summary["seconds"] * 100)
            run.profiles.append(summary)
    sizes = topic_bytes(ctx["data_dir"])
    run.topic_bytes = {name: sizes.get(topic, 0) for name, topic in topics.items()}
    run.topic_bytes["changelog"] = sum(v for k, v in sizes.items()
                                       if k.startswith(f"{prefix}-") and k.endswith("changelog"))
    return run


async def timed_audit(env: dict[str, str]) -> dict[str, Any]:
    started = time.monotonic()
    code, out, err = await retro(env, "audit", timeout=900)
    seconds = time.monotonic() - started
    try:
        doc = json.loads(out)
    except ValueError:
        return {"ok": False, "exit": code, "seconds": seconds, "summary": (out + err)[-500:]}

    def count(cov: Any) -> int:  # interval sets: {"topic/p": [[first, last], ...]}
        return sum(b - a + 1 for ranges in (cov or {}).values() for a, b in ranges)

    claimed = doc.get("claimed") or {}
    result = {"ok": code == 0 and bool(doc.get("ok")), "exit": code, "seconds": seconds,
              "raw_records": doc.get("raw_records"), "claimed": claimed,
              "claimed_total": sum(claimed.values()) if claimed else None,
              "missing": count(doc.get("missing")),
              "double_counted": count(doc.get("double_counted"))}
    result["summary"] = {k: result[k] for k in ("raw_records", "claimed", "missing",
                                                "double_counted")}
    return result


# --- the whole bench ------------------------------------------------------------------------------


# the worker's own steps (clean, lanes, compactor) on the in-memory runtime over
# generated records, without a broker; prints the wall seconds of that pass alone
STEPS_PASS = """
import asyncio, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, {bench!r})
from steps_bench import one_pass, raw_messages
from streams.runner import tune_gc
from streams.settings import Settings
with tempfile.TemporaryDirectory() as tmp:
    raw = raw_messages({records}, Path(tmp))
tune_gc()
started = time.monotonic()
asyncio.run(one_pass(Settings(), raw))
print(time.monotonic() - started)
"""


async def steps_passes(processes: int, records: int) -> list[float]:
    """Wall seconds of the steps pass in each of ``processes`` copies started together."""
    code = STEPS_PASS.format(bench=str(REPO / "bench"), records=records)
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, cwd=REPO, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL) for _ in range(processes)]
    return [float((await proc.communicate())[0]) for proc in procs]


async def parallel_ceiling(workers: int, runs: int = 3, records: int = 20_000) -> dict[str, Any]:
    """How much more of the workers' own work ``workers`` processes get done together than
    one alone, here and now: the most ``workers`` workers could scale to. The cores of a
    shared machine can share caches, a physical core or another tenant, so this is often
    well under ``workers``x."""
    ratios = []
    for _ in range(runs):
        (alone,) = await steps_passes(1, records)
        together = await steps_passes(workers, records)
        ratios.append(workers * alone / max(together))
    return {"processes": workers, "ratios": ratios, "median": statistics.median(ratios)}


async def bench(args: argparse.Namespace, tmp: Path, broker: LocalBroker,
                bootstrap: str, broker_pid: int) -> dict[str, Any]:
    loop, main_task = asyncio.get_running_loop(), asyncio.current_task()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, main_task)
    raw = "e2e.logs.raw"
    env = base_env(bootstrap, tmp / "produce")
    env["RETRO_TOPICS__RAW"] = raw
    env["RETRO_TOPICS__PARTITIONS"] = str(args.partitions)
    env["RETRO_KAFKA__COMPRESSION"] = args.raw_codec
    paths, data = make_data(args.data, args.records, tmp / "data")
    log(f"data: {data['real']:,} real records ({len(data['real_files'])} files) + "
        f"{data['generated']:,} generated ({args.data})")
    code, out, err = await retro(env, "topics", timeout=120)
    if code:
        raise RuntimeError(f"`retro topics` failed ({code}): {out}{err}")
    started = time.monotonic()
    code, out, err = await retro(env, "produce", "--quiet", "--spread", str(args.spread),
                                 *paths, timeout=1800)
    produce_s = time.monotonic() - started
    if code:
        raise RuntimeError(f"`retro produce` failed ({code}):\n{err[-3000:]}")
    line = next((ln for ln in err.splitlines() if ln.startswith("produced")), err.strip())
    log(line)
    m = re.search(r"\((\d+) bytes\)", line)
    raw_value_bytes = int(m.group(1)) if m else None
    per_partition = await end_offsets(bootstrap, raw)
    n = sum(per_partition.values())
    if not n:
        raise RuntimeError(f"nothing arrived in {raw}: {line}")
    ctx = {"raw": raw, "bootstrap": bootstrap, "broker_pid": broker_pid, "n": n,
           "data_dir": broker.data_dir, "out_dir": args.out.parent, "stem": args.out.stem}

    check_interrupted()
    log("baseline: aiokafka consume -> json -> produce -> commit")
    before = await raw_loops(args, bootstrap, raw, n, first=0)
    ceiling = await parallel_ceiling(args.workers) if args.workers > 1 else None
    runs = []
    for k in [1] if args.workers == 1 else [1, args.workers]:
        check_interrupted()
        log(f"pipeline with {k} worker(s)")
        runs.append(await run_pipeline(args, ctx, k, tmp))
    # before and after the pipelines, like the ceiling: the machine's speed drifts by
    # tens of percent within minutes, and the raw loop would otherwise see only one end
    after = await raw_loops(args, bootstrap, raw, n, first=len(before))
    baselines = before + after
    by_speed = sorted(baselines, key=lambda b: b["records_per_second"])
    baseline = {**by_speed[len(by_speed) // 2],  # the median run is the one compared
                "runs_records_per_second": [b["records_per_second"] for b in baselines],
                "runs_before_pipelines": len(before)}
    log(f"baseline: {baseline['records_per_second']:,.0f} rec/s (median of "
        + ", ".join(f"{b['records_per_second']:,.0f}" for b in before) + " before and "
        + ", ".join(f"{b['records_per_second']:,.0f}" for b in after) + " after the pipelines)")
    if ceiling:  # before and after the pipelines: the machine's share moves within minutes
        after = await parallel_ceiling(args.workers)
        ratios = ceiling["ratios"] + after["ratios"]
        ceiling = {**ceiling, "ratios": ratios, "median": statistics.median(ratios)}
        log(f"{args.workers} processes running the steps here do {ceiling['median']:.2f}x the "
            "work of one (" + ", ".join(f"{r:.2f}" for r in ratios) + ")")
    sizes = topic_bytes(broker.data_dir)
    return {"data": data, "records": n, "raw_per_partition": per_partition,
            "produce_s": produce_s, "produce_line": line, "raw_value_bytes": raw_value_bytes,
            "raw_disk_bytes": sizes.get(raw, 0), "baseline": baseline, "runs": runs,
            "parallel_ceiling": ceiling}


def fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def report(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    base = result["baseline"]
    n = result["records"]
    rows = [("raw aiokafka loop", n, fmt(base["startup_s"]), fmt(base["steady_s"]),
             fmt(base["total_s"]), f"{base['records_per_second']:,.0f}", "100%", "-", "-",
             "-", "100%")]
    summaries = []
    for run in result["runs"]:
        s = run.summary()
        summaries.append(s)
        ratio = (s["records_per_second"] / base["records_per_second"]
                 if s["records_per_second"] else None)
        s["vs_raw_loop"] = ratio
        rows.append((run.name, n, fmt(s["startup_s"]), fmt(s["steady_s"]), fmt(s["total_s"]),
                     fmt(s["records_per_second"], ",.0f"), fmt(ratio and ratio * 100, ".2f") + "%",
                     fmt(s["first_half_s"]), fmt(s["second_half_s"]),
                     fmt(s["peak_rss_mib"], ".0f"), f"{s['fraction_done']:.1%}"))
    print()
    print(table(("run", "records", "start-up s", "steady s", "total s", "rec/s", "vs raw loop",
                 "1st half s", "2nd half s", "peak RSS MiB", "done"), rows))

    raw_disk, raw_values = result["raw_disk_bytes"], result["raw_value_bytes"]
    print(f"\nraw: {n:,} records, {raw_values or 0:,} bytes of values "
          f"({raw_disk:,} on disk, {raw_disk / n:,.0f} B/rec); data: "
          f"{result['data']['real']:,} real records from "
          f"{SHARED_DATA if result['data']['real'] else '-'} + "
          f"{result['data']['generated']:,} generated ({args.data})")
    brows = []
    for run, s in zip(result["runs"], summaries, strict=True):
        tb = run.topic_bytes
        written = tb.get("reports", 0) + tb.get("changelog", 0)
        # per record processed, so a run cut short by --timeout compares like with like
        processed = s["fraction_done"] * n
        per_record = written / processed if processed else None
        s["reports_plus_changelog_bytes"] = written
        s["written_bytes_per_record"] = per_record
        s["written_vs_raw_disk"] = per_record / (raw_disk / n) if per_record and raw_disk else None
        s["written_vs_raw_values"] = (per_record / (raw_values / n)
                                      if per_record and raw_values else None)
        rep = run.reports or {}
        s["report_bytes_per_record"] = rep.get("bytes_per_record")
        brows.append((run.name, f"{tb.get('reports', 0) / 2**20:,.1f}",
                      f"{tb.get('changelog', 0) / 2**20:,.1f}", fmt(per_record, ",.0f"),
                      fmt(s["written_vs_raw_disk"], ".2f") + "x",
                      fmt(s["written_vs_raw_values"], ".2f") + "x",
                      fmt(rep.get("bytes_per_record"), ".1f"), rep.get("reports", "-"),
                      fmt(run.audit.get("seconds")), "ok" if run.audit.get("ok") else
                      f"NOT OK (missing {run.audit.get('missing')}, double "
                      f"{run.audit.get('double_counted')})"))
    print()
    print(table(("run", "reports MiB", "changelog MiB", "written B/rec", "vs raw disk",
                 "vs raw values", "report B/rec", "reports", "audit s", "audit"), brows))
    for run, s in zip(result["runs"], summaries, strict=True):
        stages = ", ".join(f"{k} {fmt(v['first_half_s'])}/{fmt(v['second_half_s'])} s"
                           for k, v in s["stage_halves"].items())
        print(f"\n{run.name}: halves per stage (records consumed, 1st/2nd half): {stages}")
        quarters = "; ".join(f"{k} " + "/".join(fmt(r, ",.0f") for r in v)
                             for k, v in s["rate_by_quarter"].items() if v)
        print(f"{run.name}: rec/s in each quarter of the steady time: {quarters}")
        print(f"{run.name}: worker CPU {fmt(s['worker_cpu_cores'], '.2f')} cores, broker "
              f"{fmt(s['broker_cpu_cores'], '.2f')}, this bench (observer) "
              f"{fmt(s['bench_cpu_cores'], '.2f')} over {fmt(s['total_s'])} s; "
              f"second half / first half = {fmt(s['second_vs_first_half'], '.2f')}")
        cores = s["steady_cores"]
        if cores:
            print(f"{run.name}: in {cores['seconds']:.0f} s of the steady time the machine's "
                  f"{cores['cpus']:.1f} cores were {cores['busy'] / cores['cpus']:.0%} busy: "
                  f"workers {cores['workers']:.2f}, broker {cores['broker']:.2f}, this bench "
                  f"{cores['bench']:.2f}, anything else {cores['other']:.2f} cores")
        for i, (waits, idle) in enumerate(zip(run.waits, s["steady_idle_share"], strict=True)):
            if idle is not None:
                print(f"{run.name}: worker {i}'s event loop idle {idle:.0%} of the steady time")
            loops = "; ".join(f"{where} {seconds:.1f} s" for where, seconds in waits["waits"]
                              if where.split("]")[0].endswith(" loop"))
            print(f"{run.name}: worker {i}'s event loop idle {waits['idle_seconds']:.1f} of "
                  f"{waits['seconds']:.1f} s (start and stop included); meanwhile its stage "
                  f"loops waited in: {loops}")
        if run.timed_out:
            print(f"{run.name}: TIMED OUT after {args.timeout:.0f}s: {s['accounted']:,} of "
                  f"{n:,} records accounted for by then, {fmt(s['records_per_second'], ',.0f')}"
                  f" rec/s; the audit after the worker stopped: {s['audited']} "
                  f"({s['fraction_done']:.1%})")
        for prof in run.profiles:
            print_profile(prof, f"{run.name}, from {prof['started_at_s']:.0f}s")
    for run, s in zip(result["runs"], summaries, strict=True):
        print(f"\n{run.name}: end to end {fmt(s['records_per_second'], ',.0f')} rec/s = "
              f"{fmt(s['vs_raw_loop'] and s['vs_raw_loop'] * 100, '.2f')}% of the raw loop "
              f"({base['records_per_second']:,.0f} rec/s); audit {fmt(run.audit.get('seconds'))}"
              f" s; peak RSS {fmt(s['peak_rss_mib'], '.0f')} MiB")
    if len(summaries) > 1 and summaries[0]["records_per_second"]:
        scaling = (summaries[1]["records_per_second"] or 0) / summaries[0]["records_per_second"]
        print(f"\nscaling: {args.workers} workers = {scaling:.2f}x one worker")
        ceiling = result.get("parallel_ceiling")
        if ceiling:
            print(f"the machine's ceiling: {args.workers} processes running the steps = "
                  f"{ceiling['median']:.2f}x one, so the workers reached "
                  f"{scaling / ceiling['median']:.0%} of what the cores allow")
    else:
        scaling = None
    if args.profile and not py_spy():
        print("\nno profile: py-spy not found (`.venv/bin/pip install py-spy`)")
    return {
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "data": result["data"], "records": n, "raw_per_partition": result["raw_per_partition"],
        "produce_s": result["produce_s"], "produce": result["produce_line"],
        "raw_value_bytes": raw_values, "raw_disk_bytes": raw_disk,
        "broker_start_s": result["broker_start_s"], "baseline": base,
        "runs": [{"name": r.name, "workers": r.workers, **s, "audit": r.audit,
                  "audits_before_done": r.audits_before_done, "reports": r.reports,
                  "topic_bytes": r.topic_bytes, "peak_rss_mib_each": r.peak_rss_mib,
                  "cpu_seconds_each": r.cpu_seconds, "profiles": r.profiles, "waits": r.waits,
                  "timeline": [asdict(t) for t in r.timeline]}
                 for r, s in zip(result["runs"], summaries, strict=True)],
        "scaling": scaling, "parallel_ceiling": result.get("parallel_ceiling"),
    }


def code_version() -> dict[str, Any]:
    """Which code was measured: other work may be in progress in the tree (read-only git)."""
    def git(*a: str) -> str:
        proc = subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, check=False)
        return proc.stdout.strip()

    dirty = [ln[3:] for ln in git("status", "--porcelain").splitlines()
             if ln[3:].startswith("streams/")]
    return {"head": git("rev-parse", "--short", "HEAD"), "modified_streams_files": dirty}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000,
                        help="records to produce, at least (default 100000)")
    parser.add_argument("--data", choices=("mix", "sample", "multiday"), default="mix",
                        help="mix: real logs of ../shared/data topped up with the generated "
                             "sample (default); sample: generated only; multiday: "
                             "write_multiday (4 days out of order)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of every topic")
    parser.add_argument("--spread", type=int, default=4, help="retro produce --spread")
    parser.add_argument("--raw-codec", default="none",
                        choices=get_args(Compression),
                        help="the codec `retro produce` writes the raw topic with (default "
                             "none, as shippers send by default; the workers' own topics "
                             "take RETRO_KAFKA__COMPRESSION, zstd unless --set says otherwise)")
    parser.add_argument("--set", action="append", default=[], metavar="RETRO_X=VALUE",
                        help="a setting of the workers (repeatable), e.g. RETRO_MODEL__RPM=6000")
    parser.add_argument("--baseline-runs", type=int, default=3,
                        help="raw-loop runs before the pipelines and as many after; the "
                             "median one is the baseline (default 3)")
    parser.add_argument("--workers", type=int, default=1,
                        help="also run this many workers in one group and compare (default 1)")
    parser.add_argument("--timeout", type=float, default=240.0,
                        help="seconds per pipeline run before partial figures (default 240)")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--profile", type=float, default=30.0,
                        help="seconds of py-spy per profile (0: no profile)")
    parser.add_argument("--profile-at", type=lambda s: [float(x) for x in s.split(",")],
                        default=[0.2], metavar="SHARES",
                        help="start a profile when this share of the records is done "
                             "(comma-separated, default 0.2)")
    parser.add_argument("--waits", action="store_true",
                        help="load bench/waits into each worker: how long its event loop sat "
                             "idle, and what its stage loops waited in meanwhile")
    parser.add_argument("--out", type=Path,
                        help="JSON result (default bench/out/e2e_bench[-TAG].json)")
    add_tag_argument(parser)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (worker logs)")
    args = parser.parse_args(argv)
    if args.records < 300 or args.workers < 1 or args.partitions < 1 or args.spread < 1:
        parser.error("--records >= 300; --workers, --partitions, --spread >= 1")
    # aiokafka logs a retried "coordinator not available" on a fresh broker's first group
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    args.out = (args.out or OUT_DIR / f"e2e_bench{'-' + args.tag if args.tag else ''}.json"
                ).resolve()
    args.out.parent.mkdir(parents=True, exist_ok=True)

    signal.signal(signal.SIGTERM, _interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="e2e-bench-"))
    broker = LocalBroker(tmp / "broker-state")
    with stopped_at_exit(tmp, broker, keep=args.keep):
        return run_all(args, tmp, broker)
    return 130  # interrupted


@contextlib.contextmanager
def stopped_at_exit(tmp: Path, broker: Any, *, keep: bool) -> Iterator[None]:
    """Every process started here and ``broker`` stopped however the run ends; an
    interrupt is swallowed (the caller returns 130 after the block); ``tmp`` removed
    unless ``keep``."""
    try:
        yield
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; every process this run started is stopped", file=sys.stderr)
    finally:
        PROCS.stop_all()
        broker.stop()
        if keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def run_all(args: argparse.Namespace, tmp: Path, broker: LocalBroker) -> int:
    started = time.monotonic()
    state = broker.start(timeout=120)  # sync: it probes with an event loop of its own
    broker_start_s = time.monotonic() - started
    log(f"broker up in {broker_start_s:.1f}s at {state.bootstrap}")
    try:
        result = asyncio.run(bench(args, tmp, broker, state.bootstrap, state.pid))
    finally:  # closing the loop reset SIGTERM to the default (no finally would run)
        signal.signal(signal.SIGTERM, _interrupt)
    check_interrupted()  # a cancellation swallowed on the way out still ends the run
    result["broker_start_s"] = broker_start_s
    doc = {"bench": "e2e_bench", "command": command_line(),
           "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": machine(), "code": code_version(), **report(result, args)}
    args.out.write_text(json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n")
    print(f"\nwrote {args.out}")
    # 0: all done and audited; 2: partial (a --timeout hit), nothing double-counted;
    # 1: an audit failed otherwise
    if any(r["audit"].get("double_counted") for r in doc["runs"]):
        return 1
    if any(r["timed_out"] for r in doc["runs"]):
        return 2
    return 0 if all(r["audit"].get("ok") for r in doc["runs"]) else 1


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
