"""One event, one evidence entry: two workers and a restart mine templates apart.

A template's id holds inside one process only (the miner's state is in memory), so
two workers sharing a source over four partitions, and a worker after a restart,
each give an event the text of the first line they met ("Failed password for root
from <IP> ...") until they have seen enough to generalise ("... for <*> ..."). The
report must still hold one evidence entry per event: the covered texts fold into the
general one (streams/report/state/evidence.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import time
import urllib.request
from collections import Counter

import pytest

from streams.records import Fragment

from helpers import free_port, scraped_sum

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PARTITIONS = 4
ROUND = 6  # lines per partition and round of production
# aiokafka's default (round-robin) assignor gives two members partitions {0, 2} and {1, 3}:
# in the "pairs" phase each worker meets one user name, another than the other worker's
PAIR_USERS = ["root", "admin"]
PAIR_NAMES = ["test", "ftp"]
USERS = ["root", "admin", "guest", "oracle", "alice", "bob", "postgres", "ubuntu"]
# the labelled events: label -> (how its lines start, its general template)
EVENTS = {
    "failed": ("Failed password for ", "Failed password for <*> from <IP> port <NUM> ssh2"),
    "invalid": ("Invalid user ", "Invalid user <*> from <IP> port <NUM>"),
    "accepted": ("Accepted publickey ", "Accepted publickey for deploy from <IP> port <NUM> ssh2"),
    "closed": ("Connection closed ", "Connection closed by <IP> port <NUM> [preauth]"),
}
# failed logins outnumber the rest, as in a brute-force attempt
MIX = {"quiet": ["accepted", "closed"],
       "pairs": ["failed", "invalid", "failed", "accepted", "failed", "closed"]}
MIX["mixed"] = MIX["pairs"]


def _label(text: str) -> str:
    return next(label for label, (start, _) in EVENTS.items() if text.startswith(start))


def _lines(partition: int, start: int, count: int, phase: str,
           rng: random.Random) -> list[str]:
    """sshd lines of one partition: "quiet" has no varying word, "pairs" one user name a
    partition pair, "mixed" any user."""
    out = []
    for i in range(start, start + count):
        if phase == "mixed":
            user, name = rng.choice(USERS), rng.choice(USERS)
        else:
            user, name = PAIR_USERS[partition % 2], PAIR_NAMES[partition % 2]
        stamp = f"2026-11-29T10:{i // 60:02d}:{i % 60:02d}Z"
        ip, port = f"203.0.{partition}.{i % 250 + 1}", 40000 + i
        message = {
            "failed": f"Failed password for {user} from {ip} port {port} ssh2",
            "invalid": f"Invalid user {name} from {ip} port {port}",
            "accepted": f"Accepted publickey for deploy from {ip} port {port} ssh2",
            "closed": f"Connection closed by {ip} port {port} [preauth]",
        }[MIX[phase][i % len(MIX[phase])]]
        out.append(f"{stamp} bastion sshd[{700 + partition}]: {message}")
    return out


def _produce(settings, by_partition: dict[int, list[str]]) -> None:
    """Each partition's lines under its key, as `retro produce --spread 4` keys them; the
    partition is chosen, so the test does not depend on how the keys hash."""
    from aiokafka import AIOKafkaProducer

    from streams.kafka.connect import aiokafka_kwargs

    async def send() -> None:
        producer = AIOKafkaProducer(**aiokafka_kwargs(settings))
        await producer.start()
        try:
            for partition, lines in by_partition.items():
                for line in lines:
                    await producer.send(settings.topics.raw, line.encode(),
                                        key=f"auth.log~{partition}".encode(),
                                        partition=partition)
            await producer.flush()
        finally:
            await producer.stop()

    asyncio.run(send())


def _fragments(settings) -> list[Fragment]:
    from streams.kafka.readers import read_topic

    async def read() -> list[Fragment]:
        return [Fragment.model_validate_json(value)
                async for _, value in read_topic(settings, settings.topics.fragments)]

    return asyncio.run(read())


def _reports(settings) -> dict:
    from streams.report.store import read_reports

    return asyncio.run(read_reports(settings))


def _trickle(settings, lines: dict[int, list[str]], start: int, phase: str, *,
             rng: random.Random, until=lambda: True, rounds: int = 4) -> int:
    """Rounds of a few lines per partition every half second, at least ``rounds`` of them
    and until ``until()`` holds; the index of the next line."""
    deadline = time.monotonic() + 60
    n = 0
    while n < rounds or not until():
        assert time.monotonic() < deadline, "the workers did not consume in 60 s"
        chunk = {q: _lines(q, start, ROUND, phase, rng) for q in range(PARTITIONS)}
        _produce(settings, chunk)
        for q, more in chunk.items():
            lines.setdefault(q, []).extend(more)
        start, n = start + ROUND, n + 1
        time.sleep(0.5)
    return start


def test_two_workers_and_a_restart_end_with_one_evidence_entry_per_event(
        pipeline_factory, wait_until) -> None:
    p = pipeline_factory(RETRO_TOPICS__PARTITIONS=str(PARTITIONS))
    p.retro("topics")
    settings = p.settings()
    ports = [p.web_port, free_port()]

    def worker(i: int) -> subprocess.Popen[bytes]:
        return p.start_worker(RETRO_WEB_PORT=str(ports[i]),
                              RETRO_STATE_DIR=str(p.state_dir / f"w{i}"))

    rng = random.Random(19)
    started = time.monotonic()
    first = worker(0)
    worker(1)
    wait_until(lambda: all(_metrics_up(port) for port in ports), timeout=60, interval=0.5,
               what="both workers up")
    lines: dict[int, list[str]] = {}

    def consumed(port: int) -> float:
        return scraped_sum(port, "retro_records_consumed_total")

    # lines without a varying word until both workers own partitions (and consume)
    nxt = _trickle(settings, lines, 0, "quiet", rng=rng, rounds=1,
                   until=lambda: all(consumed(port) > 0 for port in ports))
    # each worker's miner is born on its own user name, and its batches go out with it
    nxt = _trickle(settings, lines, nxt, "pairs", rng=rng)
    # a restart: the worker's miner starts again from nothing; then every name anywhere
    p.kill(first, signal.SIGTERM)
    worker(0)
    _trickle(settings, lines, nxt, "mixed", rng=rng, until=lambda: consumed(ports[0]) > 0)
    total = sum(len(v) for v in lines.values())

    audit = p.retro("audit", "--wait", "90", check=False, timeout=150)
    result = json.loads(audit.stdout.decode())
    assert result["ok"] and result["raw_records"] == total, (result, p.worker_logs())

    # the miners did disagree: fragments carry more than one text of the failed logins
    texts: dict[str, set[str]] = {}
    for fragment in _fragments(settings):
        for ev in fragment.evidence:
            texts.setdefault(_label(ev.template), set()).add(ev.template)
    assert len(texts["failed"]) > 1 and len(texts["invalid"]) > 1, texts

    (report,) = _reports(settings).values()
    assert report.record_count == total
    expected = Counter(_label(line.split(": ", 1)[1]) for v in lines.values() for line in v)
    counted: Counter[str] = Counter()
    for incident in report.incidents:
        labels = Counter(_label(ev.template) for ev in incident.evidence)
        assert set(labels.values()) == {1}, (incident.event, [e.template for e in
                                                              incident.evidence])
        for ev in incident.evidence:
            counted[_label(ev.template)] += ev.count
            if _label(ev.template) in ("failed", "invalid"):
                assert ev.template == EVENTS[_label(ev.template)][1]
    assert counted == expected
    print(f"template identity: {total} records; fragments named the failed logins "
          f"{sorted(texts['failed'])}, the report one entry; {time.monotonic() - started:.0f} s")


def _metrics_up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2):
            return True
    except OSError:
        return False
