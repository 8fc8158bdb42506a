"""Caches of validated model answers, keyed by batch content, model and prompt.

The value is the answer JSON text, not fragments: a hit is validated again
against the batch at hand, so the analysis of content already seen (same
templates, same prompt version, same model) is reused while the fragments'
coverage is that of the new records. A cache failure is a miss, never an error
for the batch.

With ``RETRO_MODEL__REDIS_URL`` each worker keeps its memory level in front of the
shared Redis level (:class:`TieredCache`): workers and restarts share answers through
Redis, and while Redis is away a worker still has the answers it saw itself.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from cachetools import TTLCache

from streams.clock import Clock
from streams.errors import ConfigError

logger = logging.getLogger(__name__)


class AnswerCache(Protocol):
    """Where the gateway keeps answers; both methods swallow their own I/O errors."""

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value: str) -> None: ...

    async def close(self) -> None: ...


class MemoryCache:
    """An in-process LRU cache whose entries expire after ``ttl_seconds``."""

    __slots__ = ("_data", "max_size", "ttl_seconds")

    def __init__(
        self,
        *,
        ttl_seconds: float,
        max_size: int,
        timer: Clock = time.monotonic,
    ) -> None:
        if ttl_seconds <= 0:
            raise ValueError(f"cache ttl_seconds must be positive, got {ttl_seconds}")
        if max_size < 1:
            raise ValueError(f"cache max_size must be at least 1, got {max_size}")
        self.ttl_seconds = ttl_seconds
        self.max_size = max_size
        self._data: TTLCache = TTLCache(maxsize=max_size, ttl=ttl_seconds, timer=timer)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"MemoryCache(size={len(self._data)}, max_size={self.max_size})"

    async def get(self, key: str) -> str | None:
        return self._data.get(key)

    async def set(self, key: str, value: str) -> None:
        self._data[key] = value

    async def close(self) -> None:
        self._data.clear()


class RedisCache:
    """A cache shared by every worker, for when ``RETRO_MODEL__REDIS_URL`` is set.

    A Redis that does not answer costs a batch at most ``timeout_seconds`` (the
    URL's ``?socket_timeout=`` and ``?socket_connect_timeout=`` win), and after a
    failure the level is skipped for ``retry_after_seconds``: while Redis is away,
    batches neither wait on it nor log a warning each. The next use after that
    connects again, so the level comes back on its own when Redis does.
    """

    __slots__ = (
        "_client",
        "_errors",
        "_skip_until",
        "_timer",
        "_url",
        "prefix",
        "retry_after_seconds",
        "timeout_seconds",
        "ttl_seconds",
    )

    def __init__(
        self,
        url: str,
        ttl_seconds: float,
        *,
        prefix: str = "retro:answer:",
        timeout_seconds: float = 1.0,
        retry_after_seconds: float = 5.0,
        timer: Clock = time.monotonic,
    ) -> None:
        if ttl_seconds <= 0:
            raise ValueError(f"cache ttl_seconds must be positive, got {ttl_seconds}")
        redis_asyncio = _import_redis()
        self._url = url
        self.ttl_seconds = ttl_seconds
        self.prefix = prefix
        self.timeout_seconds = timeout_seconds
        self.retry_after_seconds = retry_after_seconds
        self._timer = timer
        self._skip_until: float | None = None
        self._client: Any = None
        self._errors: tuple[type[BaseException], ...] = (
            redis_asyncio.RedisError,
            OSError,
        )

    def __repr__(self) -> str:
        # the URL may carry a password: never print it
        return f"RedisCache(prefix={self.prefix!r}, ttl_seconds={self.ttl_seconds})"

    def _redis(self) -> Any:
        if self._client is None:
            self._client = _import_redis().from_url(
                self._url,
                decode_responses=True,
                socket_timeout=self.timeout_seconds,
                socket_connect_timeout=self.timeout_seconds,
            )
        return self._client

    def _skipping(self) -> bool:
        if self._skip_until is None:
            return False
        if self._timer() < self._skip_until:
            return True
        self._skip_until = None
        return False

    def _failed(self, what: str, exc: BaseException) -> None:
        self._skip_until = self._timer() + self.retry_after_seconds
        logger.warning(
            "answer cache (Redis) %s failed, skipping it for %gs: %s",
            what,
            self.retry_after_seconds,
            exc,
        )

    async def get(self, key: str) -> str | None:
        if self._skipping():
            return None
        try:
            value = await self._redis().get(self.prefix + key)
        except self._errors as exc:
            self._failed("read", exc)
            return None
        return value if isinstance(value, str) or value is None else str(value)

    async def set(self, key: str, value: str) -> None:
        if self._skipping():
            return
        try:
            await self._redis().set(self.prefix + key, value, ex=max(1, int(self.ttl_seconds)))
        except self._errors as exc:
            self._failed("write", exc)

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            if hasattr(client, "aclose"):  # redis>=5
                await client.aclose()
            else:
                await client.close()


class TieredCache:
    """This worker's memory level in front of a shared level (Redis).

    A read tries memory, then the shared level, and keeps a shared hit in memory; a
    write goes to both. A failing shared level is a miss there, so a worker goes on
    with what its memory holds.
    """

    __slots__ = ("memory", "shared")

    def __init__(self, memory: AnswerCache, shared: AnswerCache) -> None:
        self.memory = memory
        self.shared = shared

    def __repr__(self) -> str:
        return f"TieredCache({self.memory!r}, {self.shared!r})"

    async def get(self, key: str) -> str | None:
        value = await self.memory.get(key)
        if value is None:
            value = await self.shared.get(key)
            if value is not None:
                await self.memory.set(key, value)
        return value

    async def set(self, key: str, value: str) -> None:
        await self.memory.set(key, value)
        await self.shared.set(key, value)

    async def close(self) -> None:
        try:
            await self.shared.close()
        finally:
            await self.memory.close()


def build_cache(*, redis_url: str | None, ttl_seconds: float, max_size: int) -> AnswerCache:
    """Memory in front of Redis when a URL is configured, else memory alone."""
    memory = MemoryCache(ttl_seconds=ttl_seconds, max_size=max_size)
    if redis_url:
        return TieredCache(memory, RedisCache(redis_url, ttl_seconds))
    return memory


def _import_redis() -> Any:
    try:
        import redis.asyncio as redis_asyncio
    except ImportError as exc:
        raise ConfigError(
            "RETRO_MODEL__REDIS_URL is set but the redis client is not installed; "
            "run `pip install retro-stream[redis]` or unset the URL to use the memory cache",
            reason="config",
        ) from exc
    return redis_asyncio
