"""Answer caches: TTL and size in memory, Redis only when configured and installed.

Against a hand-written Redis client; tests/gateway/test_cache_redis.py runs the same
levels against a real redis-server.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from streams.errors import ConfigError
from streams.gateway.cache import MemoryCache, RedisCache, TieredCache, build_cache

from helpers import FakeClock


async def test_memory_cache_round_trip_and_miss() -> None:
    cache = MemoryCache(ttl_seconds=60, max_size=10)
    assert await cache.get("k") is None
    await cache.set("k", '{"fragments": []}')
    assert await cache.get("k") == '{"fragments": []}'


async def test_memory_cache_entries_expire() -> None:
    timer = FakeClock()
    cache = MemoryCache(ttl_seconds=10, max_size=10, timer=timer)
    await cache.set("k", "v")
    timer.now = 9.9
    assert await cache.get("k") == "v"
    timer.now = 10.1
    assert await cache.get("k") is None


async def test_memory_cache_evicts_least_recently_used() -> None:
    cache = MemoryCache(ttl_seconds=60, max_size=2)
    await cache.set("a", "1")
    await cache.set("b", "2")
    assert await cache.get("a") == "1"  # a is now the most recent
    await cache.set("c", "3")
    assert await cache.get("b") is None
    assert await cache.get("a") == "1"
    assert await cache.get("c") == "3"
    assert len(cache) == 2


def test_memory_cache_settings_are_checked() -> None:
    with pytest.raises(ValueError):
        MemoryCache(ttl_seconds=0, max_size=1)
    with pytest.raises(ValueError):
        MemoryCache(ttl_seconds=1, max_size=0)


def test_build_cache_is_memory_without_a_redis_url() -> None:
    cache = build_cache(redis_url=None, ttl_seconds=5, max_size=3)
    assert isinstance(cache, MemoryCache)


def test_redis_url_without_the_client_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis -> ImportError
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)
    with pytest.raises(ConfigError, match=r"pip install retro-stream\[redis\]"):
        build_cache(redis_url="redis://127.0.0.1:6379/0", ttl_seconds=5, max_size=3)


class _FakeRedisError(Exception):
    pass


class _FakeRedis:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}
        self.ttl: dict[str, Any] = {}
        self.fail = False
        self.closed = False
        self.calls = 0
        self.options: dict[str, Any] = {}

    async def get(self, key: str) -> str | None:
        self.calls += 1
        if self.fail:
            raise _FakeRedisError("connection refused")
        return self.data.get(key)

    async def set(self, key: str, value: str, ex: int | None = None) -> None:
        self.calls += 1
        if self.fail:
            raise _FakeRedisError("connection refused")
        self.data[key] = value
        self.ttl[key] = ex

    async def aclose(self) -> None:
        self.closed = True


@pytest.fixture
def fake_redis(monkeypatch: pytest.MonkeyPatch) -> _FakeRedis:
    client = _FakeRedis()
    module = types.ModuleType("redis.asyncio")
    module.RedisError = _FakeRedisError  # type: ignore[attr-defined]
    def from_url(url: str, **options: Any) -> _FakeRedis:
        client.options = options
        return client

    module.from_url = from_url  # type: ignore[attr-defined]
    package = types.ModuleType("redis")
    package.asyncio = module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "redis", package)
    monkeypatch.setitem(sys.modules, "redis.asyncio", module)
    return client


async def test_redis_cache_prefixes_keys_and_sets_the_ttl(fake_redis: _FakeRedis) -> None:
    cache = build_cache(redis_url="redis://:hunter2@127.0.0.1:6379/0", ttl_seconds=90, max_size=1)
    assert isinstance(cache, TieredCache)
    assert isinstance(cache.shared, RedisCache)
    assert "hunter2" not in repr(cache)
    await cache.set("abc", "answer")
    assert fake_redis.data == {"retro:answer:abc": "answer"}
    assert fake_redis.ttl["retro:answer:abc"] == 90
    assert fake_redis.options["socket_timeout"] == fake_redis.options["socket_connect_timeout"] == 1
    assert await cache.shared.get("abc") == "answer"
    assert await cache.get("other") is None
    await cache.close()
    assert fake_redis.closed


async def test_redis_failures_are_misses_not_errors(fake_redis: _FakeRedis) -> None:
    cache = RedisCache("redis://127.0.0.1:6379/0", 60)
    fake_redis.fail = True
    await cache.set("k", "v")  # logged, not raised
    assert await cache.get("k") is None


async def test_a_failing_redis_is_skipped_for_a_while_then_tried_again(
    fake_redis: _FakeRedis,
) -> None:
    timer = FakeClock()
    cache = RedisCache("redis://127.0.0.1:6379/0", 60, retry_after_seconds=5, timer=timer)
    fake_redis.fail = True
    assert await cache.get("k") is None
    assert fake_redis.calls == 1
    await cache.set("k", "v")  # skipped: no second wait on a Redis that just failed
    assert await cache.get("k") is None
    assert fake_redis.calls == 1
    fake_redis.fail = False
    timer.advance(5)
    await cache.set("k", "v")  # tried again: Redis is back
    assert await cache.get("k") == "v"
    assert fake_redis.calls == 3


async def test_the_memory_level_answers_first_and_keeps_shared_hits(
    fake_redis: _FakeRedis,
) -> None:
    mine = build_cache(redis_url="redis://127.0.0.1:6379/0", ttl_seconds=60, max_size=10)
    other = build_cache(redis_url="redis://127.0.0.1:6379/0", ttl_seconds=60, max_size=10)
    assert isinstance(mine, TieredCache) and isinstance(other, TieredCache)
    await other.set("k", "v")  # another worker's answer, through the shared level
    assert await mine.memory.get("k") is None
    assert await mine.get("k") == "v"
    assert await mine.memory.get("k") == "v"  # kept: the next read does not ask Redis
    calls = fake_redis.calls
    assert await mine.get("k") == "v"
    assert fake_redis.calls == calls


async def test_the_memory_level_answers_while_redis_fails(fake_redis: _FakeRedis) -> None:
    cache = build_cache(redis_url="redis://127.0.0.1:6379/0", ttl_seconds=60, max_size=10)
    await cache.set("seen", "v")
    fake_redis.fail = True
    assert await cache.get("seen") == "v"
    await cache.set("new", "w")  # Redis write fails: memory still has it
    assert await cache.get("new") == "w"
    assert await cache.get("never") is None
