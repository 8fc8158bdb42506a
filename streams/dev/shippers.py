"""Real log shippers as private processes writing to Kafka, for captures and live tests.

rsyslog (omkafka), syslog-ng (kafka-c), kcat and the OpenTelemetry Collector are
what puts logs on Kafka in production; running them here, each with its own config,
pid and state files (never the system's syslog), shows what they really write.
Config templates hold ``@NAME@`` placeholders (see bench/shippers/); nothing here
knows a log format. Development tool: production code never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streams.records import NormalizedRecord

RSYSLOG_MODULE_DIRS = (Path("/usr/lib/x86_64-linux-gnu/rsyslog"), Path("/usr/lib/rsyslog"))
STOP_TIMEOUT_SECONDS = 15.0
_PLACEHOLDER = re.compile(r"@([A-Z][A-Z0-9_]*)@")
MARKER = re.compile(r"\bL\d\d\b")
"""Each line of the shipper inputs (tests/fixtures/shippers/input) names itself: L01, L02..."""


@dataclass(frozen=True)
class Captured:
    """One Kafka message as a shipper wrote it."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


def render(template: Path, out: Path, values: Mapping[str, str]) -> Path:
    """``template`` with each ``@NAME@`` replaced by ``values[NAME]``, written to ``out``."""
    text = template.read_text()
    for name, value in values.items():
        text = text.replace(f"@{name}@", value)
    left = sorted(set(_PLACEHOLDER.findall(text)))
    if left:
        raise ValueError(f"{template}: placeholders left unfilled: {left}")
    out.write_text(text)
    return out


# -- where the binaries are -----------------------------------------------------------
def rsyslogd() -> str | None:
    """rsyslogd, when it and its omkafka module (Debian ``rsyslog-kafka``) are installed."""
    binary = shutil.which("rsyslogd") or next(
        (p for p in ("/usr/sbin/rsyslogd",) if os.access(p, os.X_OK)), None)
    has_omkafka = any((d / "omkafka.so").exists() for d in RSYSLOG_MODULE_DIRS)
    return binary if binary and has_omkafka else None


def kcat() -> str | None:
    """kcat (or its old name, kafkacat)."""
    return shutil.which("kcat") or shutil.which("kafkacat")


def syslog_ng_root(candidates: list[Path]) -> Path | None:
    """A folder holding ``usr/sbin/syslog-ng`` and its kafka module (a ``dpkg -x`` target)."""
    for root in candidates:
        if (root / "usr/sbin/syslog-ng").exists() and list(
                root.glob("usr/lib/syslog-ng/*/libkafka.so")):
            return root
    return None


# -- running them -----------------------------------------------------------------------
def start_rsyslog(conf: Path, workdir: Path) -> subprocess.Popen[bytes]:
    """A private ``rsyslogd -n`` with its own config and pid file."""
    binary = rsyslogd()
    if binary is None:
        raise FileNotFoundError("rsyslogd with omkafka is not installed (apt-get install "
                                "rsyslog-kafka)")
    return _spawn([binary, "-n", "-f", str(conf), "-i", str(workdir / "rsyslog.pid")], workdir)


def start_syslog_ng(root: Path, conf: Path, workdir: Path) -> subprocess.Popen[bytes]:
    """syslog-ng unpacked under ``root``, in the foreground, with private state files."""
    module_path = next(root.glob("usr/lib/syslog-ng/*/libkafka.so")).parent
    libs = sorted({str(p.parent) for p in root.glob("**/*.so*") if p.is_file()})
    env = {"LD_LIBRARY_PATH": ":".join([*libs, os.environ.get("LD_LIBRARY_PATH", "")])}
    argv = [str(root / "usr/sbin/syslog-ng"), "-F", "--no-caps",
            f"--cfgfile={conf}", f"--persist-file={workdir / 'syslog-ng.persist'}",
            f"--pidfile={workdir / 'syslog-ng.pid'}", f"--control={workdir / 'syslog-ng.ctl'}",
            f"--module-path={module_path}"]
    return _spawn(argv, workdir, env)


def run_kcat(bootstrap: str, topic: str, path: Path, *, key: str | None = None) -> None:
    """``kcat -P``: one message per line of ``path`` (newline removed), optional fixed key."""
    binary = kcat()
    if binary is None:
        raise FileNotFoundError("kcat is not installed (apt-get install kcat)")
    argv = [binary, "-P", "-b", bootstrap, "-t", topic, "-l", str(path)]
    if key is not None:
        argv += ["-k", key]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def start_otelcol(binary: Path, conf: Path, workdir: Path,
                  env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """A built OpenTelemetry Collector with ``conf``; ``env`` fills its ``${env:...}``."""
    return _spawn([str(binary), "--config", str(conf)], workdir, dict(env))


def _spawn(argv: list[str], workdir: Path,
           env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    log = open(workdir / f"{Path(argv[0]).name}.log", "ab")  # noqa: SIM115 (child keeps it)
    return subprocess.Popen(argv, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})}, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM (shippers flush on it), then SIGKILL after a grace period; the exit code."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=STOP_TIMEOUT_SECONDS)


@contextlib.contextmanager
def running(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """Stop ``proc`` on the way out, whatever happened inside."""
    try:
        yield proc
    finally:
        stop(proc)


# -- one shipper, start to finish ------------------------------------------------------
def ship_rsyslog(template: Path, workdir: Path, *, bootstrap: str, input_dir: Path,
                 topics: Mapping[str, str], lines: int, timeout: float = 90.0) -> None:
    """rsyslog reads ``input_dir`` into ``topics`` (placeholder -> topic) until each has
    ``lines`` messages; then it is stopped."""
    conf = render(template, workdir / "rsyslog.conf", {
        "WORK": str(workdir), "INPUT": str(input_dir), "BROKER": bootstrap, **topics})
    with running(start_rsyslog(conf, workdir)) as proc:
        _wait_for(proc, bootstrap, list(topics.values()), lines, timeout)


def ship_syslog_ng(root: Path, template: Path, workdir: Path, *, bootstrap: str,
                   input_dir: Path, topics: Mapping[str, str], lines: int,
                   timeout: float = 90.0) -> None:
    """syslog-ng reads ``input_dir`` into ``topics`` until each has ``lines`` messages."""
    conf = render(template, workdir / "syslog-ng.conf", {
        "INPUT": str(input_dir), "BROKER": bootstrap, **topics})
    with running(start_syslog_ng(root, conf, workdir)) as proc:
        _wait_for(proc, bootstrap, list(topics.values()), lines, timeout)


def _wait_for(proc: subprocess.Popen[bytes], bootstrap: str, topics: list[str], lines: int,
              timeout: float) -> None:
    for topic in topics:
        got = read_messages_sync(bootstrap, topic, min_messages=lines, idle_seconds=0.5,
                                 timeout=timeout)
        if len(got) < lines:
            name = Path(str(proc.args[0])).name  # type: ignore[index]
            raise RuntimeError(f"{name} wrote {len(got)} of {lines} messages to {topic} in "
                               f"{timeout:.0f}s (exit code {proc.poll()}); its log is "
                               f"{name}.log in its work folder")


# -- Kafka side --------------------------------------------------------------------------
@contextlib.contextmanager
def kafka(bootstrap: str | None, state_dir: Path) -> Iterator[str]:
    """``bootstrap`` as given, or a local broker (``retro broker``) in ``state_dir`` for
    the duration."""
    if bootstrap:
        yield bootstrap
        return
    from streams.dev.broker.launcher import LocalBroker

    broker = LocalBroker(state_dir)
    try:
        yield broker.start(timeout=180).bootstrap
    finally:
        broker.stop()


async def create_topics(bootstrap: str, names: list[str], *, partitions: int = 1) -> None:
    """Create ``names`` as a platform team would (the shippers do not create them)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, partitions, 1) for n in names])
    finally:
        await admin.close()


async def read_messages(bootstrap: str, topic: str, *, min_messages: int = 1,
                        idle_seconds: float = 3.0, timeout: float = 60.0) -> list[Captured]:
    """Every message of ``topic``, once at least ``min_messages`` came and then none for
    ``idle_seconds`` (or ``timeout`` passed)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    out: list[Captured] = []
    try:
        deadline = time.monotonic() + timeout
        last_new = time.monotonic()
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                out += [Captured(r.partition, r.offset, r.timestamp, r.key, r.value or b"",
                                 tuple(r.headers or ())) for r in records]
                last_new = time.monotonic()
            if len(out) >= min_messages and time.monotonic() - last_new >= idle_seconds:
                break
    finally:
        await consumer.stop()
    return sorted(out, key=lambda c: (c.partition, c.offset))


def read_messages_sync(bootstrap: str, topic: str, **kwargs: float) -> list[Captured]:
    """:func:`read_messages` for synchronous callers (scripts, tests)."""
    return asyncio.run(read_messages(bootstrap, topic, **kwargs))  # type: ignore[arg-type]


# -- what came out ---------------------------------------------------------------------
def field_errors(records: list[NormalizedRecord], expected: Mapping[str, Mapping[str, str | None]],
                 *, service_from_source: bool = False, copies: int = 1) -> list[str]:
    """How cleaned ``records`` of the marked input lines differ from ``expected``.

    Every marked line must come out ``copies`` times, each with its own event time,
    its level (where ``expected`` names one) and the service the shipper was told;
    with ``service_from_source`` (plain lines, no envelope) that is the record's source.
    """
    by_marker: dict[str, list[NormalizedRecord]] = {}
    wrong: list[str] = []
    for record in records:
        markers = MARKER.findall(record.message)
        if len(markers) != 1:
            wrong.append(f"not one log line per record: {record.message[:200]!r}")
        for marker in markers:
            by_marker.setdefault(marker, []).append(record)
    for marker, want in sorted(expected.items()):
        found = by_marker.get(marker, [])
        if len(found) != copies:
            wrong.append(f"{marker}: {len(found)} records, want {copies}")
        for record in found[:1]:
            got = _instant(record.timestamp) if record.timestamp else None
            if got != _instant(str(want["timestamp"])):
                wrong.append(f"{marker} time {record.timestamp} ({record.timestamp_rule}), "
                             f"want {want['timestamp']}")
            if want["level"] is not None and record.level != want["level"]:
                wrong.append(f"{marker} level {record.level}, want {want['level']}")
            service = record.source if service_from_source else record.service
            if service != want["service"]:
                wrong.append(f"{marker} service {service}, want {want['service']}")
    return wrong


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
