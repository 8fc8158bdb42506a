"""A corpus of secrets through the real pipeline: none of their values leaves the clean
stage, wherever one looks.

Cloud keys with and without a key name, tokens, a JWT, URL passwords, a PEM block,
cards, emails, secrets in the Kafka key (``--source``) and in records that end as dead
letters (too large, binary). The worker runs against the simulated provider, which
records every request; the test then reads what the model received, every topic the
worker writes (values and keys), the worker's log, the HTTP pages and the CLI views.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from streams.kafka.readers import read_topic

from helpers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

# value -> the line that carries it (each value must vanish everywhere)
CORPUS = {
    "AKIAZ7Q3XK5N2RWPLM4T": "aws_access_key_id=AKIAZ7Q3XK5N2RWPLM4T",
    "u8Fq2nV7xK1pR9sT4wY6zB3cD5eG0hJ2kL7mN9pQ": (
        "aws_secret_access_key=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"),
    "Zk3vQ9xLm2Pq8Rt5Wy7Bn4Cd6Fg1Hj0KsTu2VeXa": (
        "rotated credentials, new secret Zk3vQ9xLm2Pq8Rt5Wy7Bn4Cd6Fg1Hj0KsTu2VeXa in use"),
    "Q7wE9rT2yU4iO6pA8sD1fG3hJ5kL0zXcVbN2mQ4w": (
        '{"level":"error","msg":"sts","SecretAccessKey":"Q7wE9rT2yU4iO6pA8sD1fG3hJ5kL0zXcVbN2mQ4w"}'),
    "ghp_4Rf8Tg6Yh2Uj9Ik1Ol3Pz5Xc7Vb0Nm2Qw4Er": (
        "git clone failed with token ghp_4Rf8Tg6Yh2Uj9Ik1Ol3Pz5Xc7Vb0Nm2Qw4Er"),
    "xoxb-2048-4096-Gh7Jk9Lm1Np3Qr5St7Vw": (
        "slack post via xoxb-2048-4096-Gh7Jk9Lm1Np3Qr5St7Vw failed"),
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLXNlY3JldA": (
        "rejected jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLXNlY3JldA"),
    "Pg5ecretW0rd": "connecting to postgres://app:Pg5ecretW0rd@db.internal:5432/orders",
    "Abcd1234Efgh5678Ijkl9012": "request with Authorization: Bearer Abcd1234Efgh5678Ijkl9012",
    "hunter2Correct": "login failed password=hunter2Correct for admin",
    "4539 1488 0343 6467": "payment declined for card 4539 1488 0343 6467",
    "dora.ops@example.org": "paging dora.ops@example.org about the outage",
}
PEM_BODY = "MIIEowIBAAKCAQEAx7Hv2nK9sQ4pL8wR3tY6uB1cD5eF0gH2jK4lM7nP9qS3tV6w"
SOURCE_SECRET = "Src9PassWd"
SOURCE = f"postgres://ingest:{SOURCE_SECRET}@logs-db/app"
BIG_SECRET = "Bx7Kp2Qm9Rt4Vw6Yz1Ac3Df5Gh8Jk0Ln2Pq4St"  # in a record over the size limit
BIN_SECRET = "db_password=Bn7Qz3Xw9Lk2"  # in a binary record (a dead letter too)


def _corpus_file(path: Path) -> None:
    lines = []
    for i, line in enumerate(CORPUS.values()):
        lines.append(f"2026-11-28T10:{i:02d}:00Z ERROR {line}")
    lines.append("2026-11-28T10:30:00Z ERROR tls setup failed, key follows")
    lines.append("-----BEGIN RSA PRIVATE KEY-----")
    lines.append(PEM_BODY)
    lines.append("-----END RSA PRIVATE KEY-----")
    lines.append("2026-11-28T10:31:00Z ERROR dump " + "x" * 3000 + f" token {BIG_SECRET}")
    for i in range(40):  # ordinary lines so batches look like logs
        lines.append(f"2026-11-28T10:{i:02d}:30Z INFO request {i} served in {i + 3} ms")
    data = "\n".join(lines).encode() + b"\n"
    data += b"\x00\x01\x02\x03" * 40 + BIN_SECRET.encode() + b"\x00" * 80 + b"\n"
    path.write_bytes(data)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode("utf-8", errors="replace")


async def _topics_text(settings) -> str:
    t = settings.topics
    parts = []
    for topic in (t.fast, t.slow, t.deadletter, t.fragments, t.review, t.reports):
        async for key, value in read_topic(settings, topic):
            parts.append((key or b"").decode("utf-8", "replace"))
            parts.append(_with_raw_bytes((value or b"").decode("utf-8", "replace")))
    return "\n".join(parts)


def _with_raw_bytes(text: str) -> str:
    """``text`` plus the decoded bytes of any raw_base64 field in it (dead letters)."""
    found = re.findall(r'"raw_base64":\s*"([A-Za-z0-9+/=]*)"', text)
    return "\n".join([text, *(base64.b64decode(b).decode("utf-8", "replace") for b in found)])


def test_no_secret_value_leaves_the_clean_stage(pipeline_factory, tmp_path: Path) -> None:
    port = free_port()
    log = open(tmp_path / "fake-llm.log", "wb")  # noqa: SIM115
    fake = subprocess.Popen([sys.executable, "-m", "streams", "fake-llm", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(f"http://127.0.0.1:{port}/v1/models")
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "fake-llm.log").read_text()
                time.sleep(0.3)
        p = pipeline_factory(RETRO_MODEL__BASE_URL=f"http://127.0.0.1:{port}/v1",
                             RETRO_MODEL__NAME="fake-gpt", RETRO_CLEAN__MAX_RECORD_BYTES="2000",
                             RETRO_LOG_LEVEL="DEBUG")
        corpus = tmp_path / "secrets.log"
        _corpus_file(corpus)
        produced = p.retro("produce", "--quiet", "--source", SOURCE, str(corpus))
        p.start_worker()
        audit = p.retro("audit", "--wait", "240", check=False, timeout=400)
        assert json.loads(audit.stdout)["ok"], (audit.stdout, p.worker_logs())

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_fake/requests",
                                    timeout=10) as r:
            model = r.read().decode()
        assert "[REDACTED:" in model  # the secrets were there, as placeholders
        settings = p.settings()
        topics = asyncio.run(_topics_text(settings))
        report_ids = [r["id"] for r in json.loads(_get(f"http://127.0.0.1:{p.web_port}/reports"))]
        assert report_ids
        pages = [_get(f"http://127.0.0.1:{p.web_port}{path}") for path in (
            "/", "/reports", *(f"/reports/{i}" for i in report_ids),
            *(f"/view/{i}" for i in report_ids))]
        cli = [p.retro("report", "--format", fmt).stdout.decode() for fmt in ("md", "json")]
        cli.append(_with_raw_bytes(
            p.retro("deadletter", "--format", "json", "--raw").stdout.decode()))
        cli.append(p.retro("deadletter").stdout.decode())
        logs = "\n".join(f.read_text(errors="replace")
                         for f in p.state_dir.glob("worker-*.log"))
        places = {"model requests": model, "topics (keys and values)": topics,
                  "HTTP pages": "\n".join(pages), "CLI views": "\n".join(cli),
                  "worker log": logs, "produce output": produced.stderr.decode()}
        values = [*CORPUS, PEM_BODY, SOURCE_SECRET, BIG_SECRET, BIN_SECRET.split("=")[1]]
        leaks = {(v, where) for v in values for where, text in places.items() if v in text}
        assert not leaks, sorted(leaks)
        letters = json.loads(p.retro("deadletter", "--format", "json").stdout)
        assert {e["reason"] for e in letters["latest"]} >= {"too_large", "binary"}, letters
    finally:
        fake.kill()
        fake.wait(timeout=30)
