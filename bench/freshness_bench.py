"""Freshness: seconds from a service's first failing line to its incident in the report
and to its alert in Alertmanager, under steady background load.

Steps, for each of ``--runs`` runs (every process it starts is stopped on exit, Ctrl-C
and errors included):

1. one ``LocalBroker`` for all runs (jars from ``~/.m2``); per run, a pipeline of its
   own (app id and topics), a real Alertmanager (Debian's ``prometheus-alertmanager``,
   started as tests/integration/test_notifications.py starts it, with the route of
   docs/notifications.md) and one ``retro worker`` pointed at it with
   ``RETRO_NOTIFY__ALERTMANAGER_URL`` (``--no-notify``: neither); every other setting
   is the worker's default (``--set`` changes one);
2. ``--services`` services log steadily (``--rate`` lines/s in all; JSON lines and
   log4j lines, keyed by service; each service calls the next two; one chronic warning
   per service every ten seconds; ``--templates`` more routine lines per service):
   ``--history`` minutes of it stamped in the past (at ``--history-rate``) are sent at
   once, so the baseline has minutes to learn from, then the same load goes on live,
   stamped now, sent by aiokafka from this process;
3. once the worker's report covers everything sent, ``--settle`` more seconds of live
   load went through and no alert is active (a report composed of shares at different
   positions can open some while the worker catches up: they are counted), one
   service starts failing at a random second of its minute: most of its requests end
   in an ERROR with a stack trace, and its two callers log ERRORs naming it (service
   discovery, 502/503, refused connections) instead of their calls to it;
4. timed from the first failing line handed to the producer: (a) the first report
   version whose post-mortem (``derive``, what ``retro report --format json`` prints
   as ``postmortem.incidents[]``) has an incident begun since the fault whose origin is
   that service, read and derived, and (b) the first time Alertmanager's ``GET
   /api/v2/alerts`` shows an active alert of such an incident (its ``origin``
   annotation: a ledger entry keeps the labels it opened with). Where the time goes
   comes from the Kafka timestamps of the first failing record's way through the
   pipeline: its lane record (clean), the first fragment covering it (lanes), the
   first report share covering it (compactor), the first version naming the service,
   the first giving it the notifier's minimum severity, and the ledger change on the
   notifications topic (notifier). Report versions are stored as they arrive and
   derived after the run, so this process spends no CPU meanwhile; ``derive``'s cost
   on each is measured then (a reader pays it, and the notifier for every version).

Run: ``.venv/bin/python bench/freshness_bench.py [--runs 3] [--rate 200] [--history 5]
[--history-rate R] [--templates N] [--no-notify] [--profile S]``. See bench/README.md
("Freshness") for the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from _common import OUT_DIR, REPO, add_tag_argument, cpu_seconds, free_port, machine, table
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from e2e_bench import (
    PIPELINE_TOPICS,
    PROCS,
    base_env,
    check_interrupted,
    code_version,
    command_line,
    finish_profile,
    log,
    on_signal,
    print_profile,
    py_spy,
    retro,
    start_profile,
    stopped_at_exit,
    summarize_profile,
)

from streams.dev import faults
from streams.dev.broker.launcher import LocalBroker
from streams.kafka.connect import stop_consumer
from streams.report.analysis.postmortem import derive
from streams.report.state.model import SEVERITY_WEIGHT
from streams.report.store import LatestReports

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
SERVICES = ("checkout", "catalog", "billing", "pricing", "shipping", "profile", "wallet",
            "loyalty", "booking", "payouts", "ledger", "fulfilment")
TICK = 0.05  # seconds between two sends of the live load
POLL = 0.1  # seconds between two looks at Alertmanager
CHRONIC_EVERY = 10.0  # seconds between a service's chronic warnings: steady, never new
FAIL_SHARE = 0.8  # of the failing service's requests
CALL_SHARE = 0.3  # of a service's lines that are calls to another

# the generated cases' routine lines (streams/dev/faults.py), the first five and two
_ROUTINE = faults._ROUTINE[:5]
_CALL_OK = faults._CALL_OK[:2]
_CHRONIC = ("GC pause of {big} ms exceeded the 200 ms target",
            "Slow query took {big} ms: SELECT * FROM {res} WHERE id = ?")
_CRASH = ("Request processing failed for POST /v1/{res} (request {uuid}): "
          'java.lang.NullPointerException: Cannot invoke "com.example.{svc}.Entry.getId()" '
          'because "entry" is null')
_FRAMES = ("com.example.{svc}.EntryService.apply(EntryService.java:141)",
           "com.example.{svc}.ApiController.post(ApiController.java:57)")
_CALLER_FAILS = (  # two phrasings a caller's client library writes
    ("No instances available for {dst}",
     "HTTP 503 Service Unavailable from {dst} on GET /v1/{res}/{id}"),
    ("upstream {dst} returned 502 Bad Gateway",
     "Connection refused: {dst}/10.0.{net}.{host}:8080"),
)
_RESOURCES = ("items", "accounts", "entries", "carts", "invoices", "quotes")
# words of the extra routine lines (--templates): a few drawn at random make a line
# that shares too little with any other to be mined into the same template
_WORD_TEXT = """
    account adjust allocate archive assemble audit balance batch bundle cancel capture
    charge checkpoint claim collect commit compile confirm convert credit cursor debit
    decode deliver dispatch draft enqueue enrich escrow export fetch flush forward grant
    hydrate import index invoice journal ledger lease mailbox manifest merge notify offer
    parcel pledge prefetch quota rebate reconcile refund register release render replay
    reserve resolve route sample schedule settle shard snapshot stage tariff ticket
    transfer validate voucher warm"""
_WORDS = tuple(_WORD_TEXT.split())


# --- the workload -----------------------------------------------------------------------------


@dataclass
class Line:
    service: str
    text: bytes
    failing: bool = False  # a line of the fault (the service's own error or a caller's)


class Workload:
    """Services logging steadily, and optionally one of them failing.

    Each service calls the next two (in the order of ``names``); the failing service's
    callers are the two before it. Even services write JSON lines, odd ones log4j
    lines (with a service of their own from the message key, as a file or container
    name gives one).
    """

    def __init__(self, names: list[str], rate: float, seed: int, templates: int = 0) -> None:
        self.names = names
        self.rate = rate
        self.rng = random.Random(seed)
        n = len(names)
        self.calls = {s: [names[(i + 1) % n], names[(i + 2) % n]] for i, s in enumerate(names)}
        self.failing: str | None = None
        self.next_chronic = {s: i * CHRONIC_EVERY / n for i, s in enumerate(names)}
        self.phrasing = {s: _CALLER_FAILS[i % len(_CALLER_FAILS)] for i, s in enumerate(names)}
        self.routine = {s: (*_ROUTINE, *extra_lines(s, templates)) for s in names}

    def callers_of(self, service: str) -> list[str]:
        return [s for s, dst in self.calls.items() if service in dst]

    def lines(self, start: datetime, end: datetime, elapsed_from: float) -> list[Line]:
        """The lines logged in [start, end): ``rate`` a second, plus the chronic ones
        due (``elapsed_from``: seconds of the workload's life at ``start``)."""
        span = (end - start).total_seconds()
        count = int(self.rate * span + self.rng.random())
        out: list[tuple[datetime, Line]] = []
        for k in range(count):
            when = start + timedelta(seconds=span * k / max(count, 1))
            out.append((when, self._line(self.rng.choice(self.names), when)))
        for service in self.names:
            while self.next_chronic[service] < elapsed_from + span:
                at = start + timedelta(seconds=max(self.next_chronic[service] - elapsed_from, 0))
                i = self.names.index(service)  # one chronic line a service, always alike
                text = self._fill(_CHRONIC[i % len(_CHRONIC)], service,
                                  res=_RESOURCES[i % len(_RESOURCES)])
                out.append((at, Line(service, self._format(service, at, "WARN", text))))
                self.next_chronic[service] += CHRONIC_EVERY
        out.sort(key=lambda x: x[0])
        return [line for _, line in out]

    def _line(self, service: str, when: datetime) -> Line:
        rng = self.rng
        if service == self.failing and rng.random() < FAIL_SHARE:
            text = self._fill(_CRASH, service)
            frames = [f.format(svc=service) for f in _FRAMES]
            return Line(service, self._format(service, when, "ERROR", text, frames), True)
        if rng.random() < CALL_SHARE:
            dst = rng.choice(self.calls[service])
            if dst == self.failing:
                text = self._fill(rng.choice(self.phrasing[service]), service, dst=dst)
                return Line(service, self._format(service, when, "ERROR", text), True)
            text = self._fill(rng.choice(_CALL_OK), service, dst=dst)
        else:
            text = self._fill(rng.choice(self.routine[service]), service)
        return Line(service, self._format(service, when, "INFO", text))

    def _fill(self, template: str, service: str, **known: str) -> str:
        rng = self.rng
        values = {"res": rng.choice(_RESOURCES), "id": str(rng.randint(1000, 99999)),
                  "ms": str(rng.randint(2, 180)), "big": str(rng.randint(600, 4000)),
                  "n": str(rng.randint(1, 5000)), "uuid": str(uuid.UUID(int=rng.getrandbits(128))),
                  "net": str(rng.randint(0, 9)), "host": str(rng.randint(2, 250)),
                  "svc": service}
        return template.format(**(values | known))

    def _format(self, service: str, when: datetime, level: str, text: str,
                frames: list[str] | None = None) -> bytes:
        logger = f"com.example.{service}.ApiController"
        stamp = f"{when:%Y-%m-%dT%H:%M:%S}.{when.microsecond // 1000:03d}Z"
        if self.names.index(service) % 2 == 0:
            obj: dict[str, Any] = {"timestamp": stamp, "level": level, "service": service,
                                   "logger": logger, "message": text}
            if frames:
                obj["stack_trace"] = "\n".join(f"\tat {f}" for f in frames)
            return json.dumps(obj, separators=(",", ":")).encode()
        stamp = f"{when:%Y-%m-%d %H:%M:%S},{when.microsecond // 1000:03d}"
        thread = f"http-nio-8080-exec-{when.microsecond % 10 + 1}"
        head = f"{stamp} {level:<5} [{thread}] {logger} - {text}"
        return "\n".join([head, *(f"\tat {f}" for f in frames or ())]).encode()


def extra_lines(service: str, count: int) -> list[str]:
    """``count`` routine lines of ``service`` beside the usual five, the same every run."""
    rng = random.Random(f"{service}-lines")
    return [" ".join(rng.sample(_WORDS, rng.randint(3, 7))) + " done in {ms} ms"
            for _ in range(count)]


def write_file(path: Path, names: list[str], rate: float, minutes: float, failing: str,
               fail_after: float, seed: int = 1, templates: int = 0) -> Path:
    """The workload as one file per service (for ``retro postmortem``): ``minutes`` of
    load, ``failing`` failing from ``fail_after`` seconds in to the end."""
    work = Workload(names, rate, seed, templates)
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes)
    path.mkdir(parents=True, exist_ok=True)
    files = {s: (path / f"{s}.log").open("wb") for s in names}
    t = 0.0
    while t < minutes * 60:
        if t >= fail_after:
            work.failing = failing
        for line in work.lines(start + timedelta(seconds=t), start + timedelta(seconds=t + 1), t):
            files[line.service].write(line.text + b"\n")
        t += 1.0
    for f in files.values():
        f.close()
    return path


# --- Alertmanager -----------------------------------------------------------------------------


def alertmanager_route() -> str:
    """The Alertmanager route of docs/notifications.md, as documented (as the test reads it)."""
    text = (REPO / "docs" / "notifications.md").read_text()
    block = re.search(r"```yaml\n(# alertmanager\.yml.*?)```", text, re.S)
    if block is None:
        raise RuntimeError("docs/notifications.md has no alertmanager.yml block")
    return block[1]


async def start_alertmanager(folder: Path) -> tuple[Any, str]:
    """A real Alertmanager on a loopback port, ready; (process, base URL)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "alertmanager.yml"
    config.write_text(alertmanager_route())
    port = free_port()
    proc = PROCS.start([ALERTMANAGER or "alertmanager", f"--config.file={config}",
                        f"--storage.path={folder / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                       env=dict(os.environ), log_path=folder / "alertmanager.log")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as http:
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(f"{url}/-/ready") as r:
                    if r.status == 200:
                        return proc, url
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("Alertmanager did not start:\n"
                                   + (folder / "alertmanager.log").read_text()[-2000:])
            await asyncio.sleep(0.2)


async def active_alerts(http: aiohttp.ClientSession, url: str | None) -> list[dict[str, Any]]:
    if url is None:
        return []
    async with http.get(f"{url}/api/v2/alerts?active=true") as r:
        alerts = await r.json()
    return [a for a in alerts if a.get("labels", {}).get("alertname") == "RetroIncident"]


def about(alert: dict[str, Any], service: str, since: str) -> bool:
    """Whether an alert tells of an incident of ``service`` that began at minute ``since``
    or later. Its origin annotation is the incident's origin now; its labels keep the
    origin its ledger entry opened with, which may be another service's."""
    notes = alert.get("annotations", {})
    origin = notes.get("origin") or alert["labels"].get("service")
    return origin == service and (notes.get("first_seen") or "")[:16] >= since


# --- watching the pipeline --------------------------------------------------------------------


def covers(covered: dict[str, list[list[int]]] | None, coord: tuple[str, int, int]) -> bool:
    topic, partition, offset = coord
    return any(lo <= offset <= hi for lo, hi in (covered or {}).get(f"{topic}/{partition}", ()))


@dataclass
class Watch:
    """What the run saw, with wall-clock times (time.time()) and Kafka timestamps."""

    latest: LatestReports = field(default_factory=LatestReports)
    raw: dict[bytes, bytes] = field(default_factory=dict)  # each share's latest bytes
    at_fault: dict[bytes, bytes] | None = None  # the report shares when the fault began
    versions: list[tuple[float, int, bytes, bytes]] = field(default_factory=list)  # after it
    # the first failing record's way: stage -> (Kafka timestamp s, arrival s)
    path: dict[str, tuple[float, float]] = field(default_factory=dict)
    ledger: dict[str, Any] | None = None  # the first ledger entry of the failing service
    report_messages: int = 0
    lane_messages_after: int = 0


async def follow_reports(bootstrap: str, topic: str, watch: Watch) -> None:
    """Every report share as it is published (bytes only: parsing waits for the end)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                fetch_max_wait_ms=50)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in
                 sorted(await wait_partitions(consumer, topic))]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        while True:
            batch = await consumer.getmany(timeout_ms=200)
            now = time.time()
            for messages in batch.values():
                for m in messages:
                    watch.report_messages += 1
                    if watch.latest.put(m.key, m.value):
                        watch.raw[m.key] = m.value
                    if watch.at_fault is not None and m.key and m.value:
                        watch.versions.append((now, m.timestamp, m.key, m.value))
    finally:
        await stop_consumer(consumer)


async def wait_partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    for _ in range(100):
        parts = consumer.partitions_for_topic(topic)
        if parts:
            return parts
        await consumer._client.force_metadata_update()
        await asyncio.sleep(0.1)
    raise RuntimeError(f"topic {topic} has no partitions")


async def follow_path(bootstrap: str, topics: dict[str, str], coord_of: asyncio.Future,
                      failing: str, since: str, watch: Watch, ready: asyncio.Event) -> None:
    """From the end of the lanes, fragments and notifications topics on (``ready`` once
    positioned): when the first failing record reached each stage, and the notifier's
    first ledger change telling of an incident of the failing service that began at
    minute ``since`` or later."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, fetch_max_wait_ms=50)
    await consumer.start()
    try:
        names = {topics[n]: n for n in ("fast", "slow", "fragments", "notifications")}
        parts = [TopicPartition(t, p) for t in names
                 for p in sorted(await wait_partitions(consumer, t))]
        consumer.assign(parts)
        await consumer.seek_to_end(*parts)
        for tp in parts:  # resolve the end now, so only what comes after is read
            await consumer.position(tp)
        ready.set()
        pending: list[tuple[str, float, float, bytes]] = []
        while True:
            batch = await consumer.getmany(timeout_ms=200)
            now = time.time()
            for tp, messages in batch.items():
                for m in messages:
                    pending.append((names[tp.topic], m.timestamp / 1000, now, m.value or b""))
            if not coord_of.done():
                continue
            coord = coord_of.result()
            for name, ts, arrived, value in pending:
                stage = {"fast": "lane", "slow": "lane"}.get(name, name)
                if stage in watch.path or (stage == "notifications" and watch.ledger):
                    continue
                if stage == "lane":
                    watch.lane_messages_after += 1
                    raw = json.loads(value).get("raw") or {}
                    if (raw.get("topic"), raw.get("partition"), raw.get("offset")) == coord:
                        watch.path["lane"] = (ts, arrived)
                elif stage == "fragments":
                    with contextlib.suppress(ValueError):
                        if covers(json.loads(value).get("covered"), coord):
                            watch.path["fragment"] = (ts, arrived)
                elif value:
                    changes = [c for e in json.loads(value).get("entries", [])
                               for c in e.get("changes", [])
                               if c.get("origin") == failing
                               and (c.get("first_seen") or "")[:16] >= since]
                    if changes:
                        watch.path["ledger"] = (ts, arrived)
                        watch.ledger = changes[0]
            pending.clear()
    finally:
        await stop_consumer(consumer)


# --- one run ----------------------------------------------------------------------------------


class Load:
    """The background load, live: every TICK the lines logged since the last one, stamped
    as they are sent; the first failing line is sent alone and its delivery awaited."""

    def __init__(self, producer: AIOKafkaProducer, topic: str, work: Workload) -> None:
        self.producer = producer
        self.topic = topic
        self.work = work
        self.sent = 0
        self.first_failing_sent: float | None = None  # time.time() as it was handed over
        self.first_failing_acked: float | None = None
        self.coord: asyncio.Future = asyncio.get_running_loop().create_future()
        self.started = 0.0

    async def history(self, start: datetime, end: datetime, rate: float) -> None:
        """The past minutes at once, as a backlog, at ``rate`` lines a second."""
        t, step = start, timedelta(seconds=1)
        live_rate, self.work.rate = self.work.rate, rate
        while t < end:
            for line in self.work.lines(t, min(t + step, end), (t - start).total_seconds()):
                await self.producer.send(self.topic, line.text, key=line.service.encode())
                self.sent += 1
            t += step
        self.work.rate = live_rate
        await self.producer.flush()
        self.started = (end - start).total_seconds()

    async def live(self, since: datetime) -> None:
        prev, elapsed = since, self.started
        while True:
            await asyncio.sleep(TICK)
            now = datetime.now(UTC)
            for line in self.work.lines(prev, now, elapsed):
                if line.failing and self.first_failing_sent is None:
                    self.first_failing_sent = time.time()
                    future = await self.producer.send(self.topic, line.text,
                                                      key=line.service.encode())
                    meta = await future
                    self.first_failing_acked = time.time()
                    self.coord.set_result((meta.topic, meta.partition, meta.offset))
                else:
                    await self.producer.send(self.topic, line.text, key=line.service.encode())
                self.sent += 1
            elapsed += (now - prev).total_seconds()
            prev = now


async def one_run(args: argparse.Namespace, k: int, tmp: Path, bootstrap: str,
                  worker_pid: list[int]) -> dict[str, Any]:
    rng = random.Random(args.seed + k)
    names = list(SERVICES[:args.services])
    failing = names[k % len(names)]
    work = Workload(names, args.rate, args.seed + k, args.templates)
    prefix = f"fresh{k}-{uuid.uuid4().hex[:6]}"
    state = tmp / prefix
    state.mkdir()
    topics = {n: f"{prefix}.{n}" for n in ("raw", *PIPELINE_TOPICS, "notifications")}
    env = base_env(bootstrap, state)
    env.update({"RETRO_APP_ID": prefix, "RETRO_TOPICS__PARTITIONS": str(args.partitions)})
    env.update({f"RETRO_TOPICS__{n.upper()}": t for n, t in topics.items()})
    code, out, err = await retro(env, "topics", timeout=120)
    if code:
        raise RuntimeError(f"`retro topics` failed ({code}): {out}{err}")
    am_proc, am = (None, None) if args.no_notify else await start_alertmanager(
        state / "alertmanager")
    port = free_port()
    worker_env = {**env, "RETRO_WEB_PORT": str(port), "RETRO_LOG_LEVEL": "INFO"}
    if am is not None:
        worker_env["RETRO_NOTIFY__ALERTMANAGER_URL"] = am
    for item in args.set:
        key, _, value = item.partition("=")
        worker_env[key] = value
    worker = PROCS.start([sys.executable, "-m", "streams", "worker"], env=worker_env,
                         log_path=state / "worker.log")
    worker_pid[:] = [worker.pid]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                                enable_idempotence=True)
    await producer.start()
    watch = Watch()
    tasks: list[asyncio.Task] = []
    result: dict[str, Any] = {"run": k + 1, "failing": failing,
                              "callers": work.callers_of(failing), "prefix": prefix}
    profile = None
    http = aiohttp.ClientSession()
    warmup_alerts: dict[str, dict[str, Any]] = {}

    async def alerts_now() -> list[dict[str, Any]]:
        """The active alerts; those seen before the fault are kept, as warm-up alerts."""
        alerts = await active_alerts(http, am)
        if watch.at_fault is None:
            for a in alerts:
                warmup_alerts.setdefault(a["labels"]["incident"], {
                    "labels": a["labels"], "title": a["annotations"].get("title")})
        return alerts

    try:
        tasks.append(asyncio.create_task(follow_reports(bootstrap, topics["reports"], watch)))
        load = Load(producer, topics["raw"], work)
        now = datetime.now(UTC)
        begin = now.replace(second=0, microsecond=0) - timedelta(minutes=args.history)
        t = time.monotonic()
        await load.history(begin, now, args.history_rate or args.rate)
        result["history_records"] = load.sent
        result["history_send_s"] = round(time.monotonic() - t, 1)
        log(f"run {k + 1}: {load.sent:,} lines of {args.history:g} min of history sent in "
            f"{time.monotonic() - t:.1f}s; live load at {args.rate:g} lines/s")
        tasks.append(asyncio.create_task(load.live(now)))
        # caught up: the report covers every line sent up to a few seconds ago
        t = time.monotonic()
        catching_up = None  # a profile of the worker while it catches up (with --profile)
        while True:
            await asyncio.sleep(2.0)
            check_interrupted()
            if args.profile and catching_up is None and time.monotonic() - t > 30:
                catching_up = await start_profile(worker.pid, args.profile,
                                                  state / "profile-catchup.txt")
            if worker.poll() is not None:
                raise RuntimeError(f"the worker exited ({worker.poll()}):\n"
                                   + (state / "worker.log").read_text()[-3000:])
            await alerts_now()
            wanted = load.sent - int(args.rate * 3)
            reports = [r for r in (watch.latest.get(rid) for rid in watch.latest.ids()) if r]
            covered = sum(r.record_count for r in reports)
            if covered >= wanted:
                break
            if int(time.monotonic() - t) % 30 < 2:
                log(f"run {k + 1}: the report covers {covered:,} of the {wanted:,} lines "
                    f"sent up to 3 s ago")
            if time.monotonic() - t > args.timeout:
                log(f"run {k + 1}: the worker did not catch up in {args.timeout:.0f}s "
                    f"({covered:,} of {wanted:,} covered); no fault this run")
                result.update(caught_up_s=None, covered=covered, wanted=wanted,
                              worker_log_errors=errors_of(state / "worker.log"))
                break
        if catching_up is not None:
            await finish_profile(catching_up)
            result["profile_catchup"] = summarize_profile(state / "profile-catchup.txt")
        if result.get("caught_up_s", 0) is None:
            return result
        result["caught_up_s"] = round(time.monotonic() - t, 1)
        log(f"run {k + 1}: the report covers the history {result['caught_up_s']:.0f}s after "
            f"it was sent; {args.settle:g}s of live load, then {failing} fails")
        await asyncio.sleep(args.settle)
        # no alert open when the fault begins (a report composed of shares at different
        # positions can open some while the worker catches up)
        t = time.monotonic()
        while await alerts_now() and time.monotonic() - t < args.timeout:
            await asyncio.sleep(2.0)
            check_interrupted()
        result["alerts_quiet_after_s"] = round(time.monotonic() - t, 1)
        result["warmup_alerts"] = list(warmup_alerts.values())
        if warmup_alerts:
            log(f"run {k + 1}: {len(warmup_alerts)} alert(s) opened before the fault, the "
                f"last ended {result['alerts_quiet_after_s']:.0f}s after the settling: "
                + "; ".join(f"{a['labels']['incident']} {a['labels']['severity']} "
                            f"({a['title']})" for a in warmup_alerts.values()))
        # the fault begins at a random second of its minute: incidents are per minute
        second = rng.uniform(0, 60) if args.second is None else args.second
        wall = datetime.now(UTC)
        wait = (second - (wall.second + wall.microsecond / 1e6)) % 60
        await asyncio.sleep(wait)
        background = await active_alerts(http, am)
        ready = asyncio.Event()
        # the first failing line may be stamped just before the minute it was sent in
        since = f"{datetime.now(UTC) - timedelta(seconds=1):%Y-%m-%dT%H:%M}"
        tasks.append(asyncio.create_task(
            follow_path(bootstrap, topics, load.coord, failing, since, watch, ready)))
        await ready.wait()
        if args.profile and worker.poll() is None:
            profile = await start_profile(worker.pid, args.profile, state / "profile.txt")
        watch.at_fault = dict(watch.raw)
        work.failing = failing
        while load.first_failing_sent is None:
            await asyncio.sleep(0.01)
        t0 = load.first_failing_sent
        t_alert = None
        alert: dict[str, Any] = {}
        if am is None:  # no notifier: the report versions of --watch seconds
            await asyncio.sleep(max(args.watch - (time.time() - t0), 0))
        while am is not None and time.time() - t0 < args.timeout:
            check_interrupted()
            found = [a for a in await active_alerts(http, am)
                     if about(a, failing, since)]
            if found:
                t_alert, alert = time.time(), found[0]
                break
            await asyncio.sleep(POLL)
        await asyncio.sleep(args.after)  # later versions and the ledger's second write
        others = [a["labels"] for a in await active_alerts(http, am)
                  if not about(a, failing, since)]
        if profile is not None:
            await finish_profile(profile)
            summary = summarize_profile(state / "profile.txt")
            if summary:
                result["profile"] = summary
        wall0 = datetime.fromtimestamp(t0, UTC)
        result.update({
            "fault_second_of_minute": round(wall0.second + wall0.microsecond / 1e6, 1),
            "first_line_acked_s": round(load.first_failing_acked - t0, 3),
            "alert_s": None if t_alert is None else round(t_alert - t0, 2),
            "alert_severity": alert.get("labels", {}).get("severity"),
            "alert_labels": alert.get("labels"),
            "alerts_before_fault": [a["labels"] for a in background],
            "other_alerts_at_end": others,
            "report_id": f"{wall0:%Y-%m-%d}/all",
        })
        min_severity = worker_env.get("RETRO_NOTIFY__MIN_SEVERITY", "high")
        result.update(analyse(watch, failing, since, t0, load.coord.result(),
                              result["report_id"], min_severity))
        last = result.pop("last_version", None)
        if last is not None:  # for a look at derive() afterwards (--keep keeps it)
            (state / "report.json").write_text(last.to_json())
        result["worker_cpu_s"] = cpu_seconds(worker.pid)
        result["lines_sent"] = load.sent
        result["worker_log_errors"] = errors_of(state / "worker.log")
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(producer.stop(), 10)
        await http.close()
        if profile is not None and profile.returncode is None:
            await finish_profile(profile)
        PROCS.stop(worker)
        if am_proc is not None:
            PROCS.stop(am_proc)
    return result


def errors_of(path: Path) -> dict[str, int]:
    """The worker's ERROR lines and late timers, counted by what they say."""
    counts: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        if " ERROR " in line:
            what = line.split(" ERROR ", 1)[1][:90]
        elif "woke up too late" in line:
            what = "a timer woke up too late (the event loop was held)"
        else:
            continue
        counts[what] = counts.get(what, 0) + 1
    return counts


def analyse(watch: Watch, failing: str, since: str, t0: float, coord: tuple[str, int, int],
            report_id: str, min_severity: str) -> dict[str, Any]:
    """The report versions published after the fault began, in order: which first
    covered the first failing record, which first named the failing service as the
    origin of an incident that began at minute ``since`` or later, which first gave
    that incident the notifier's minimum severity, and what ``derive`` cost on each."""
    latest = LatestReports()
    for key, value in (watch.at_fault or {}).items():
        latest.put(key, value)
    out: dict[str, Any] = {"report_versions_after_fault": len(watch.versions)}
    derive_ms: list[float] = []
    covered_at = named_at = severe_at = None
    for arrived, ts, key, value in watch.versions:
        latest.put(key, value)
        if covered_at is None and covers(json.loads(value).get("covered"), coord):
            covered_at = (ts / 1000, arrived)
        if severe_at is not None or covered_at is None:
            continue
        report = latest.get(report_id)
        if report is None:
            continue
        started = time.perf_counter()
        pm = derive(report)
        derive_ms.append((time.perf_counter() - started) * 1000)
        incident = next((i for i in pm.incidents
                         if i.origin == failing and i.started[:16] >= since), None)
        if incident is not None and SEVERITY_WEIGHT[incident.severity] >= SEVERITY_WEIGHT[
                min_severity]:
            severe_at = (ts / 1000, arrived)
        if incident is not None and named_at is None:
            named_at = (ts / 1000, arrived)
            out["derive_ms_named_version"] = round(derive_ms[-1], 1)
            out.update(named_severity=incident.severity, named_title=incident.title,
                       named_started=incident.started, named_weight=round(incident.weight, 1),
                       report_records=report.record_count,
                       report_minutes=len({m for s in report.series.values()
                                           for t in s.values() for m in t.minutes}),
                       other_incidents=[(i.origin, i.severity, i.started) for i in pm.incidents
                                        if i is not incident])
    if latest.get(report_id) is not None:  # the cost of one derive on the last version
        report = latest.get(report_id)
        out["last_version"] = report
        runs = []
        for _ in range(3):
            started = time.perf_counter()
            derive(report)
            runs.append((time.perf_counter() - started) * 1000)
        out["derive_ms_last_version"] = round(min(runs), 1)
    path = dict(watch.path)
    if covered_at is not None:
        path["report"] = covered_at
    if named_at is not None:
        path["named"] = named_at
    if severe_at is not None:
        path["severe"] = severe_at
    # seconds after the first failing line was handed to the producer: the stage's own
    # Kafka timestamp (when it sent), and when this process read it
    out["path_s"] = {stage: round(ts - t0, 2) for stage, (ts, _) in path.items()}
    out["path_read_s"] = {stage: round(arrived - t0, 2) for stage, (_, arrived) in path.items()}
    # a reader has it once the version is read and derived (what `retro report` does)
    out["report_s"] = (None if named_at is None
                       else round(named_at[1] - t0 + out["derive_ms_named_version"] / 1000, 2))
    out["derive_ms_per_version"] = [round(x, 1) for x in derive_ms]
    if watch.ledger:
        out["ledger_first_change"] = watch.ledger
    return out


# --- main -------------------------------------------------------------------------------------


def spread(values: list[float | None]) -> str:
    """median (min-max) of the measured values, and how many were not measured."""
    got = sorted(v for v in values if v is not None)
    if not got:
        return "-"
    text = f"{statistics.median(got):.1f} ({got[0]:.1f}-{got[-1]:.1f})"
    missing = len(values) - len(got)
    return text + (f", {missing} never" if missing else "")


STAGES = (("lane", "clean stage sent its lane record"),
          ("fragment", "lanes sent the first fragment covering it"),
          ("report", "compactor published a report share covering it"),
          ("named", "first report version naming the service (published)"),
          ("severe", "first version where it has the notifier's minimum severity"),
          ("ledger", "notifier recorded the incident in its ledger"))


async def bench(args: argparse.Namespace, tmp: Path, bootstrap: str) -> list[dict[str, Any]]:
    loop, main_task = asyncio.get_running_loop(), asyncio.current_task()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, main_task)
    runs = []
    for k in range(args.runs):
        result = await one_run(args, k, tmp, bootstrap, [])
        runs.append(result)
        if result["caught_up_s"] is None:
            continue
        log(f"run {k + 1}: {result['failing']} failing from second "
            f"{result['fault_second_of_minute']:.1f} of its minute: in the report after "
            f"{result['report_s']} s, in Alertmanager after {result['alert_s']} s; "
            f"path {result['path_s']}")
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs, each with a pipeline, an "
                        "Alertmanager and a worker of its own (default 3)")
    parser.add_argument("--rate", type=float, default=200.0,
                        help="background lines a second, all services together (default 200)")
    parser.add_argument("--services", type=int, default=6,
                        help=f"services logging (3 to {len(SERVICES)}, default 6)")
    parser.add_argument("--templates", type=int, default=0,
                        help="routine lines of each service beside its usual five (default "
                             "0): a report's cost grows with its lines, a real system has "
                             "hundreds")
    parser.add_argument("--history", type=float, default=5.0,
                        help="minutes of background load stamped in the past, sent at once "
                             "before the live load (default 5)")
    parser.add_argument("--history-rate", type=float,
                        help="lines a second of the history (default: --rate); a long "
                             "history at a low rate has the minutes and lines of a long "
                             "day for fewer records")
    parser.add_argument("--settle", type=float, default=20.0,
                        help="seconds of live load after the worker caught up, before the "
                             "fault (default 20)")
    parser.add_argument("--second", type=float,
                        help="second of the minute the fault begins at (default: random)")
    parser.add_argument("--after", type=float, default=5.0,
                        help="seconds to keep watching after the alert (default 5)")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds to wait for the catch-up, and for the alert (default 180)")
    parser.add_argument("--partitions", type=int, default=4,
                        help="partitions of every topic (default 4, the worker's default)")
    parser.add_argument("--set", action="append", default=[], metavar="RETRO_X=VALUE",
                        help="a setting of the worker (repeatable), e.g. "
                             "RETRO_NOTIFY__MIN_SEVERITY=medium")
    parser.add_argument("--no-notify", action="store_true",
                        help="no Alertmanager and no notifier: the worker's other loops alone")
    parser.add_argument("--watch", type=float, default=20.0,
                        help="with --no-notify: seconds of report versions watched after the "
                             "fault (default 20)")
    parser.add_argument("--profile", type=float, default=0.0,
                        help="seconds of py-spy on the worker from the fault on (default 0: none)")
    parser.add_argument("--seed", type=int, default=1)
    add_tag_argument(parser)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    args = parser.parse_args(argv)
    if not 3 <= args.services <= len(SERVICES) or args.runs < 1 or args.rate <= 0:
        parser.error(f"--services 3..{len(SERVICES)}, --runs >= 1, --rate > 0")
    if ALERTMANAGER is None and not args.no_notify:
        parser.error("prometheus-alertmanager is not installed (Debian package; .ci/test "
                     "installs it)")
    if args.profile and not py_spy():
        parser.error("--profile needs py-spy (.venv/bin/pip install py-spy)")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    out = OUT_DIR / f"freshness_bench{'-' + args.tag if args.tag else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)
    tmp = Path(tempfile.mkdtemp(prefix="freshness-bench-"))
    broker = LocalBroker(tmp / "broker-state")
    runs: list[dict[str, Any]] | None = None
    started_machine, code = machine(), code_version()  # the tree may change meanwhile
    with stopped_at_exit(tmp, broker, keep=args.keep):
        t = time.monotonic()
        state = broker.start(timeout=120)
        log(f"broker up in {time.monotonic() - t:.1f}s at {state.bootstrap}")
        try:
            runs = asyncio.run(bench(args, tmp, state.bootstrap))
        finally:
            signal.signal(signal.SIGTERM, _interrupt)
        check_interrupted()
    if runs is None:
        return 130
    print_result(args, runs)
    doc = {"bench": "freshness_bench", "command": command_line(),
           "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": started_machine, "code": code,
           "settings": {k: v for k, v in vars(args).items() if k != "tag"}, "runs": runs}
    out.write_text(json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n")
    print(f"\nwrote {out}")
    return 0 if all(r.get("report_s") is not None and (r["alert_s"] is not None or args.no_notify)
                    for r in runs) else 1


def print_result(args: argparse.Namespace, runs: list[dict[str, Any]]) -> None:
    for r in runs:
        if r["caught_up_s"] is None:
            print(f"run {r['run']}: the worker did not catch up with the history in "
                  f"{args.timeout:.0f}s ({r['covered']:,} of {r['wanted']:,} lines in the "
                  f"report); its log: {r['worker_log_errors']}")
        if r.get("profile_catchup"):
            print_profile({**r["profile_catchup"], "seconds": args.profile,
                           "busy_threads": r["profile_catchup"]["samples"] / 100 / args.profile},
                          f"run {r['run']} while it caught up with the history")
    runs = [r for r in runs if r["caught_up_s"] is not None]
    if not runs:
        return
    rows = []
    for r in runs:
        p = r["path_s"]
        rows.append((r["run"], r["failing"], r["fault_second_of_minute"],
                     *(p.get(s, "-") for s, _ in STAGES), r["report_s"] or "-",
                     r["alert_s"] or "-", r.get("named_severity", "-"),
                     r.get("derive_ms_named_version", "-")))
    print(table(("run", "failing", "at second", "lane", "fragment", "report", "named",
                 "severe", "ledger", "in report", "in AM", "severity", "derive ms"), rows))
    print()
    summary = [(label, spread([r["path_s"].get(s) for r in runs])) for s, label in STAGES]
    summary += [("in the report (named version read + derive)",
                 spread([r["report_s"] for r in runs])),
                ("in Alertmanager (GET /api/v2/alerts)", spread([r["alert_s"] for r in runs]))]
    print(table(("seconds after the first failing line was sent", "median (min-max)"),
                summary))
    derives = [x for r in runs for x in r["derive_ms_per_version"]]
    if derives:
        print(f"\nderive() on the report versions after the fault: median "
              f"{statistics.median(derives):.0f} ms ({min(derives):.0f}-{max(derives):.0f}), "
              f"{len(derives)} versions; report versions published after the fault: "
              f"{[r['report_versions_after_fault'] for r in runs]}")
    for r in runs:
        if r.get("profile"):
            print_profile({**r["profile"], "seconds": args.profile,
                           "busy_threads": r["profile"]["samples"] / 100 / args.profile},
                          f"run {r['run']}")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    os.chdir(REPO)
    sys.exit(main())
