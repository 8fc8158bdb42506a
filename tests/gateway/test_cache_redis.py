"""The answer cache's shared level on a real Redis: Debian's redis-server, started
by the test on a loopback port (no persistence), with the redis client.

Workers are gateway sets built by ``build_gateways`` with ``RETRO_MODEL__REDIS_URL``
(each its own memory level in front of the same Redis), asking the simulated
provider (FakeLLMServer, in-process, over real HTTP). Skipped with the reason when
redis-server or the redis client is absent (``bash .ci/test`` installs both).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from streams.batch.window import Batch, build_batch
from streams.dev.fakellm import FakeLLMConfig, FakeLLMServer
from streams.gateway.cache import RedisCache, TieredCache, build_cache
from streams.gateway.factory import GatewaySet, build_gateways
from streams.intervals import Coverage
from streams.records import BatchOutcome, NormalizedRecord
from streams.settings import Settings

from helpers import WordCounter, free_port, make_record

REDIS_SERVER = shutil.which("redis-server")
pytestmark = pytest.mark.skipif(
    REDIS_SERVER is None,
    reason="Debian's redis-server is not installed (bash .ci/test installs it as root)",
)
redis_asyncio = pytest.importorskip(
    "redis.asyncio", reason="the redis client is not installed (pip install -e '.[dev]')"
)


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server on a loopback port, without persistence: a restart starts empty."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        log = self.folder / "redis.log"
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", str(self.folder),
             "--logfile", str(log)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while not _answers_ping(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                text = log.read_text() if log.exists() else ""
                raise AssertionError(f"redis-server did not start on {self.port}:\n{text}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Kill it (SIGKILL: it goes away mid-run, as a crashed Redis does)."""
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGCONT)  # in case a test paused it
                self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def pause(self) -> None:
        """SIGSTOP: connections stay open and nothing answers, as a hung Redis."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def provider() -> AsyncIterator[FakeLLMServer]:
    async with FakeLLMServer(FakeLLMConfig(seed=5)) as server:
        yield server


def worker(provider: FakeLLMServer, redis: RedisServer) -> GatewaySet:
    """One worker's gateways: its own memory level, the shared Redis level."""
    settings = Settings(model={"base_url": provider.base_url, "name": "fake-gpt",
                               "redis_url": redis.url, "max_attempts": 1})
    return build_gateways(settings)


def records(first_offset: int, *, topic: str = "retro.logs.raw", words: str = "refused",
            n: int = 12) -> list[NormalizedRecord]:
    """``n`` ERROR records of three templates; the content depends on ``words`` only."""
    return [
        make_record(
            first_offset + i,
            message=f"upstream {i % 3} {words} on node {i % 4}",
            service=("checkout", "payments")[i % 3 % 2],
            template_id=f"t{i % 3}-{words}",
            template=f"upstream {i % 3} {words} on node <*>",
            seconds=i,
            level="ERROR",
            topic=topic,
        )
        for i in range(n)
    ]


def batch_of(recs: list[NormalizedRecord]) -> Batch:
    return build_batch(recs, lane="fast", counter=WordCounter(), max_example_tokens=None,
                       trigger="budget")


def assert_all_covered(recs: list[NormalizedRecord], outcome: BatchOutcome) -> None:
    """Every record in a fragment exactly once, none parked in review."""
    assert outcome.reviews == []
    parts = [Coverage.from_json(f.covered) for f in outcome.fragments]
    union = Coverage()
    for part in parts:
        union = union.union(part)
    assert union == Coverage.from_coords(r.raw.as_tuple() for r in recs)
    assert sum(len(p) for p in parts) == len(recs)


async def test_the_cache_levels_on_a_real_redis(redis_server: RedisServer) -> None:
    cache = build_cache(redis_url=redis_server.url, ttl_seconds=90, max_size=10)
    assert isinstance(cache, TieredCache)
    try:
        assert await cache.get("k") is None
        await cache.set("k", '{"fragments": []}')
        client = redis_asyncio.from_url(redis_server.url, decode_responses=True)
        try:
            assert await client.get("retro:answer:k") == '{"fragments": []}'
            assert 85 <= await client.ttl("retro:answer:k") <= 90
        finally:
            await client.aclose()
    finally:
        await cache.close()


async def test_two_workers_share_answers_through_redis(
    redis_server: RedisServer, provider: FakeLLMServer
) -> None:
    first, second = worker(provider, redis_server), worker(provider, redis_server)
    try:
        seen = records(0)
        out = await first.fast.analyze(batch_of(seen))
        assert (out.calls, out.cache_hits) == (1, 0)
        assert_all_covered(seen, out)
        # the same content at other offsets, on the other worker: its memory is empty
        replayed = records(500, topic="retro.logs.other")
        out = await second.fast.analyze(batch_of(replayed))
        assert (out.calls, out.cache_hits) == (0, 1)
        assert_all_covered(replayed, out)  # coverage is the new records', not the cached ones'
        assert provider.stats.requests == 1
    finally:
        await first.close()
        await second.close()


async def test_a_restarted_worker_keeps_the_answers(
    redis_server: RedisServer, provider: FakeLLMServer
) -> None:
    before = worker(provider, redis_server)
    try:
        out = await before.fast.analyze(batch_of(records(0)))
        assert out.calls == 1
    finally:
        await before.close()
    after = worker(provider, redis_server)  # new objects: nothing in memory
    try:
        replayed = records(1000)
        out = await after.fast.analyze(batch_of(replayed))
        assert (out.calls, out.cache_hits) == (0, 1)
        assert_all_covered(replayed, out)
    finally:
        await after.close()
    assert provider.stats.requests == 1


async def test_redis_going_away_degrades_to_memory_and_comes_back(
    redis_server: RedisServer, provider: FakeLLMServer
) -> None:
    gateways = worker(provider, redis_server)
    assert isinstance(gateways.cache, TieredCache)
    shared = gateways.cache.shared
    assert isinstance(shared, RedisCache)
    shared.retry_after_seconds = 0.2  # default 5 s
    try:
        out = await gateways.fast.analyze(batch_of(records(0)))
        assert out.calls == 1

        redis_server.stop()  # mid-run
        replayed = records(100)
        out = await gateways.fast.analyze(batch_of(replayed))
        assert (out.calls, out.cache_hits) == (0, 1)  # from this worker's memory
        assert_all_covered(replayed, out)
        new = records(200, words="timed out")
        out = await gateways.fast.analyze(batch_of(new))
        assert (out.calls, out.cache_hits) == (1, 0)  # asked the model, nothing parked
        assert_all_covered(new, out)
        again = records(300, words="timed out")
        out = await gateways.fast.analyze(batch_of(again))
        assert (out.calls, out.cache_hits) == (0, 1)  # kept in memory though Redis was down

        redis_server.start()  # same port, empty (no persistence)
        await asyncio.sleep(0.3)  # past retry_after_seconds
        back = records(400, words="reset by peer")
        out = await gateways.fast.analyze(batch_of(back))
        assert out.calls == 1
        assert_all_covered(back, out)
    finally:
        await gateways.close()

    # the answer written after Redis came back is there for a new worker
    fresh = worker(provider, redis_server)
    try:
        out = await fresh.fast.analyze(batch_of(records(500, words="reset by peer")))
        assert (out.calls, out.cache_hits) == (0, 1)
        out = await fresh.fast.analyze(batch_of(records(600, words="timed out")))
        assert (out.calls, out.cache_hits) == (1, 0)  # written while Redis was down: lost
    finally:
        await fresh.close()


async def test_a_hung_redis_costs_a_batch_about_its_timeout(
    redis_server: RedisServer, provider: FakeLLMServer
) -> None:
    gateways = worker(provider, redis_server)
    try:
        out = await gateways.fast.analyze(batch_of(records(0)))  # connection now open
        assert out.calls == 1
        redis_server.pause()
        new = records(100, words="timed out")
        started = time.monotonic()
        out = await gateways.fast.analyze(batch_of(new))
        first = time.monotonic() - started
        assert (out.calls, out.cache_hits) == (1, 0)
        assert_all_covered(new, out)
        started = time.monotonic()
        out = await gateways.fast.analyze(batch_of(records(200, words="reset by peer")))
        second = time.monotonic() - started
        assert out.calls == 1
        # one read timeout (1 s; redis-py's own default is 5 s), then the level is
        # skipped: the write and the next batch do not wait on it again (were they
        # to, the next batch would take over 2 s: a read and a write timeout)
        assert first < 3, first
        assert second < 1.5, second
    finally:
        redis_server.resume()
        await gateways.close()
