"""Drill: the broker stops and starts again mid-stream; no client is stranded.

The session's shared broker must not be restarted, so this test starts a private
LocalBroker of its own. It checks, in order: the restarted broker keeps its address;
the producer rides the outage out and reports what it delivered; the worker's
readiness fails with the reason while liveness stays ok; the worker's log does not
flood; the audit is exact afterwards; and a worker stops within 10 s of SIGTERM while
the broker is down.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _get(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _log_bytes(p) -> int:
    return sum(f.stat().st_size for f in p.state_dir.glob("worker-*.log"))


def test_broker_restart_mid_stream_strands_no_client(pipeline_factory, tmp_path: Path) -> None:
    from streams.dev.broker.launcher import LocalBroker
    from streams.dev.sample import write_sample

    broker = LocalBroker(tmp_path / "private-broker")
    state = broker.start(timeout=120)
    try:
        p = pipeline_factory(RETRO_KAFKA__BOOTSTRAP=state.bootstrap,
                             RETRO_KAFKA__SESSION_TIMEOUT_SECONDS="10")
        paths = [str(x) for x in write_sample(tmp_path / "sample", records=2000,
                                               include_bad=False)]
        p.retro("topics")
        worker = p.start_worker()
        _wait(lambda: _get(p.web_port, "/healthz")[0] == 200
              if _up(p.web_port) else None, 120, "a ready worker")
        producer = subprocess.Popen(
            [sys.executable, "-m", "streams", "produce", "--quiet", "--rate", "100", *paths],
            env={**os.environ, **p.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=p.state_dir)
        time.sleep(5)  # mid-stream

        assert broker.stop()
        outage_started = time.monotonic()
        log_before = _log_bytes(p)
        _, body = _wait(lambda: (lambda r: r if r[0] == 503 else None)(
            _get(p.web_port, "/healthz")), 30, "readiness to fail")
        assert body["status"] == "broker_unreachable" and state.bootstrap in body["reason"]
        assert _get(p.web_port, "/livez")[0] == 200
        time.sleep(max(0.0, 20 - (time.monotonic() - outage_started)))
        outage = time.monotonic() - outage_started
        flood = (_log_bytes(p) - log_before) / outage
        print(f"worker log during a {outage:.0f}s broker outage: {flood:.0f} B/s")
        assert flood < 5_000, f"worker logged {flood:.0f} B/s during the outage"

        again = broker.start(timeout=120)
        assert again.bootstrap == state.bootstrap  # same address: clients find it again
        summary = producer.communicate(timeout=240)[1].decode()
        assert producer.returncode == 0, summary[-3000:]
        assert "failed 0" in summary, summary[-3000:]
        _wait(lambda: _get(p.web_port, "/healthz")[0] == 200, 60, "readiness to recover")

        audit = p.retro("audit", "--wait", "240", check=False, timeout=400)
        result = json.loads(audit.stdout)
        assert result["ok"], (result, p.worker_logs())

        # SIGTERM while the broker is down: the worker must not hang
        assert broker.stop()
        time.sleep(3)
        sent = time.monotonic()
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=60)
        print(f"worker stopped {time.monotonic() - sent:.1f}s after SIGTERM, broker down")
        assert time.monotonic() - sent < 10, p.worker_logs()
    finally:
        broker.stop()


def _up(port: int) -> bool:
    try:
        _get(port, "/livez")
    except OSError:
        return False
    return True


def test_the_producer_gives_up_on_a_broker_that_stays_down_and_says_so(
        pipeline_factory, tmp_path: Path) -> None:
    from streams.dev.broker.launcher import LocalBroker

    broker = LocalBroker(tmp_path / "private-broker")
    state = broker.start(timeout=120)
    try:
        p = pipeline_factory(RETRO_KAFKA__BOOTSTRAP=state.bootstrap,
                             RETRO_KAFKA__DELIVERY_TIMEOUT_SECONDS="5")
        log = tmp_path / "app.log"
        log.write_text("".join(f"2026-11-28T10:00:{i % 60:02d}Z INFO request {i} served\n"
                               for i in range(3000)))
        p.retro("topics")
        producer = subprocess.Popen(
            [sys.executable, "-m", "streams", "produce", "--quiet", "--rate", "200", str(log)],
            env={**os.environ, **p.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=p.state_dir)
        time.sleep(4)
        assert broker.stop()
        stopped = time.monotonic()
        _out, err = producer.communicate(timeout=300)
        took = time.monotonic() - stopped
        summary = err.decode()
        print(f"producer exited {producer.returncode} {took:.0f}s after the broker stopped")
        assert producer.returncode == 74, summary[-3000:]
        line = next(x for x in summary.splitlines() if x.startswith("produced "))
        delivered = int(line.split("delivered ")[1].split(",")[0])
        failed = int(line.split("failed ")[1].split(";")[0].split()[0])
        assert failed > 0 and delivered > 0
        assert "did not reach Kafka" in summary
        assert took < 120, summary[-3000:]
        assert len(summary) < 20_000, "the producer flooded its output"
    finally:
        broker.stop()
