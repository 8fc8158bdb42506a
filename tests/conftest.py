"""Shared fixtures: the real Kafka broker (one per test session) and worker processes.

The broker is the project's own launcher (`retro broker start` code path): a real
Apache Kafka in KRaft mode. Each test gets its own topic names and consumer group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# test modules share tests/helpers.py as ``import helpers``; importlib mode adds no paths
sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import free_port


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's own LocalBroker; None when RETRO_TEST_BOOTSTRAP names another."""
    from streams.dev.broker.launcher import LocalBroker

    if os.environ.get("RETRO_TEST_BOOTSTRAP"):
        yield None
        return
    broker = LocalBroker(tmp_path_factory.mktemp("broker-state"))
    broker.start(timeout=120)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: Any) -> str:
    if kafka_broker is None:
        return os.environ["RETRO_TEST_BOOTSTRAP"]
    state = kafka_broker.status()
    assert state is not None, "the session's broker is not running"
    return state.bootstrap


@pytest.fixture
def kafka_log_dir(kafka_broker: Any) -> Path:
    """Where the session's broker keeps its partitions, to weigh what reached its disk."""
    if kafka_broker is None:
        pytest.skip("RETRO_TEST_BOOTSTRAP names a broker whose disk these tests cannot read")
    return kafka_broker.data_dir


class Pipeline:
    """Settings and environment for one isolated pipeline on the shared broker."""

    def __init__(self, bootstrap: str, state_dir: Path, **extra_env: str) -> None:
        self.prefix = f"t{uuid.uuid4().hex[:8]}"
        self.state_dir = state_dir
        self.web_port = free_port()
        self.env = {
            "RETRO_KAFKA__BOOTSTRAP": bootstrap,
            "RETRO_STATE_DIR": str(state_dir),
            "RETRO_APP_ID": f"{self.prefix}-retro",
            "RETRO_WEB_PORT": str(self.web_port),
            "RETRO_TOPICS__PARTITIONS": "2",
            "RETRO_FAST__MAX_WAIT_SECONDS": "0.5",
            "RETRO_SLOW__MAX_WAIT_SECONDS": "0.5",
            "RETRO_KAFKA__SESSION_TIMEOUT_SECONDS": "10",
            "RETRO_LOG_LEVEL": "INFO",
        }
        for name in ("raw", "fast", "slow", "deadletter", "fragments", "traces", "review",
                     "reports", "notifications"):
            self.env[f"RETRO_TOPICS__{name.upper()}"] = f"{self.prefix}.{name}"
        self.env.update(extra_env)
        self.workers: list[subprocess.Popen[bytes]] = []
        # for a post-mortem of a failed run: `env $(cat pipeline.env) retro audit`
        (state_dir / "pipeline.env").write_text(
            "".join(f"{k}={v}\n" for k, v in sorted(self.env.items())))

    def settings(self):
        from streams.settings import Settings

        with _patched_env(self.env):
            return Settings()

    def retro(self, *args: str, check: bool = True, timeout: float = 300,
              input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        proc = subprocess.run([sys.executable, "-m", "streams", *args],
                              env={**os.environ, **self.env}, capture_output=True,
                              timeout=timeout, input=input, cwd=self.state_dir)
        if check and proc.returncode != 0:
            raise AssertionError(f"retro {' '.join(args)} failed ({proc.returncode}):\n"
                                 f"{proc.stdout.decode()[-3000:]}\n{proc.stderr.decode()[-5000:]}")
        return proc

    def start_worker(self, *roles: str, log_name: str = "worker",
                     **extra_env: str) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "streams", "worker"]
        if roles:
            args += ["--roles", ",".join(roles)]
        log = open(self.state_dir / f"{log_name}-{len(self.workers)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(args, env={**os.environ, **self.env, **extra_env}, stdout=log,
                                stderr=subprocess.STDOUT, cwd=self.state_dir,
                                start_new_session=True)
        self.workers.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        _signal(proc, sig)
        _reap(proc)

    def worker_logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:]
                         for p in sorted(self.state_dir.glob("worker-*.log")))

    def close(self) -> None:
        # every worker is told first, so their shutdowns overlap rather than add up
        running = [proc for proc in self.workers if proc.poll() is None]
        for proc in running:
            _signal(proc, signal.SIGTERM)
        for proc in running:
            _reap(proc)


def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait for a signalled worker; SIGKILL it if it is still there after a minute."""
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        proc.wait(timeout=30)


@contextlib.contextmanager
def _patched_env(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def pipeline_factory(kafka_bootstrap: str, tmp_path: Path):
    made: list[Pipeline] = []

    def make(**extra_env: str) -> Pipeline:
        state = tmp_path / f"p{len(made)}"
        state.mkdir()
        p = Pipeline(kafka_bootstrap, state, **extra_env)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def wait_for(predicate, *, timeout: float, interval: float = 1.0, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail with ``what`` on timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last={last!r}")


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def wait_until():
    """The :func:`wait_for` poller, as a fixture (test modules cannot import conftest)."""
    return wait_for
