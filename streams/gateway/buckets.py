"""A token bucket for provider quotas: requests per minute and tokens per minute.

Concurrency alone does not keep a client under a per-minute quota: fast calls at a
modest concurrency can still exceed it. Each model call takes 1 from the RPM
bucket and ``prompt + max output`` tokens from the TPM bucket before it is sent;
a ``Retry-After`` from the provider empties the bucket and blocks it for that long,
so every caller backs off, not just the one that saw the 429.
"""

from __future__ import annotations

import asyncio
import logging

from streams.clock import Clock, Sleep

logger = logging.getLogger(__name__)


class TokenBucket:
    """Refills continuously at ``rate_per_minute``, holds at most ``capacity``.

    Waiters are served first come, first served: a large TPM request is not
    starved by a stream of small ones slipping past it.
    """

    __slots__ = (
        "_blocked_until",
        "_clock",
        "_last",
        "_lock",
        "_sleep",
        "_tokens",
        "capacity",
        "rate_per_minute",
        "setting",
    )

    rate_per_minute: float  #: Tokens added per minute.
    capacity: float  #: The most the bucket holds: the largest burst and largest request.
    setting: str | None  #: The setting to name when a request can never fit.

    def __init__(
        self,
        *,
        rate_per_minute: float,
        capacity: float | None = None,
        clock: Clock | None = None,
        sleep: Sleep | None = None,
        setting: str | None = None,
    ) -> None:
        if rate_per_minute <= 0:
            raise ValueError(f"rate_per_minute must be positive, got {rate_per_minute}")
        capacity = rate_per_minute if capacity is None else capacity
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.rate_per_minute = float(rate_per_minute)
        self.capacity = float(capacity)
        self.setting = setting
        self._clock = clock
        self._sleep: Sleep = sleep or asyncio.sleep
        self._tokens = self.capacity
        self._last: float | None = None
        self._blocked_until = float("-inf")
        self._lock: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f"TokenBucket(rate_per_minute={self.rate_per_minute}, capacity={self.capacity})"

    @property
    def available(self) -> float:
        """Tokens that could be taken right now (0 while blocked by a penalty)."""
        now = self._now()
        self._refill(now)
        return 0.0 if now < self._blocked_until else self._tokens

    def try_acquire(self, amount: float = 1) -> bool:
        """Take ``amount`` if it is there now and nobody is queued ahead; never waits."""
        self._check(amount)
        if self._lock is not None and self._lock.locked():
            return False
        return self._take(amount, self._now())

    async def acquire(self, amount: float = 1) -> None:
        """Wait until ``amount`` tokens are available, then take them."""
        self._check(amount)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            while True:
                now = self._now()
                if self._take(amount, now):
                    return
                await self._sleep(self._wait_time(amount, now))

    def set_rate(self, rate_per_minute: float, capacity: float | None = None) -> None:
        """Change the refill rate (and capacity, default: the new rate) from now on.

        What accrued so far is kept at the old rate; tokens above the new capacity are
        dropped, so a shrinking share cannot be spent as one last burst.
        """
        capacity = rate_per_minute if capacity is None else capacity
        if rate_per_minute <= 0 or capacity <= 0:
            raise ValueError(
                f"rate_per_minute and capacity must be positive, got {rate_per_minute}, "
                f"{capacity}"
            )
        if self._last is not None:
            self._refill(self._now())
        self.rate_per_minute = float(rate_per_minute)
        self.capacity = float(capacity)
        self._tokens = min(self._tokens, self.capacity)

    def penalize(self, seconds: float) -> None:
        """Empty the bucket and keep it empty for ``seconds`` (a provider Retry-After)."""
        if seconds <= 0:
            return
        now = self._now()
        self._refill(now)
        self._tokens = 0.0
        self._blocked_until = max(self._blocked_until, now + seconds)
        self._last = now
        logger.debug("bucket %r blocked for %.2fs", self, seconds)

    # -- internals ------------------------------------------------------------

    def _check(self, amount: float) -> None:
        if amount <= 0:
            raise ValueError(f"amount must be positive, got {amount}")
        if amount > self.capacity:
            what = self.setting or "the bucket's capacity or rate_per_minute"
            raise ValueError(
                f"a request for {amount:g} tokens can never fit a bucket of capacity "
                f"{self.capacity:g}; raise {what} or make batches smaller"
            )

    def _take(self, amount: float, now: float) -> bool:
        self._refill(now)
        if now < self._blocked_until or self._tokens < amount:
            return False
        self._tokens -= amount
        return True

    def _refill(self, now: float) -> None:
        if self._last is None:
            self._last = now
            return
        start = max(self._last, self._blocked_until)
        if now > start:
            self._tokens = min(
                self.capacity, self._tokens + (now - start) * self.rate_per_minute / 60.0
            )
        self._last = max(self._last, now)

    def _wait_time(self, amount: float, now: float) -> float:
        blocked = max(0.0, self._blocked_until - now)
        deficit = max(0.0, amount - self._tokens)
        # a floor keeps float rounding from turning into a busy loop
        return max(blocked + deficit * 60.0 / self.rate_per_minute, 1e-3)

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return asyncio.get_running_loop().time()
