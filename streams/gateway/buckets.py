"""A token bucket for provider quotas: requests per minute and tokens per minute.

Concurrency alone does not keep a client under a per-minute quota: fast calls at a
modest concurrency can still exceed it. Each model call takes 1 from the RPM
bucket and ``prompt + max output`` tokens from the TPM bucket before it is sent;
a ``Retry-After`` from the provider empties the bucket and blocks it for that long,
so every caller backs off, not just the one that saw the 429.

The bucket refills at its rate whatever the provider's own window holds, so after a
burst it admits calls the provider will refuse. The provider's last word caps it:
``follow_remaining`` takes the ``x-ratelimit-remaining-*`` count of an answer, and
until that count's reset time the bucket admits at most that count minus what was
taken since the answer and minus the calls still in flight that were sent after the
answered one (the provider may not have counted them yet)::

    async with rpm.hold(1) as ticket:      # taken, and in flight until the block ends
        result = await backend.chat(...)
        rpm.follow_remaining(result.ratelimit["remaining-requests"], reset=1.0,
                             ticket=ticket)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator

from streams.clock import Clock, Sleep

logger = logging.getLogger(__name__)

# a remaining count without a reset time binds for one window of a per-minute quota
REMAINING_DEFAULT_SECONDS = 60.0


class TokenBucket:
    """Refills continuously at ``rate_per_minute``, holds at most ``capacity``.

    Waiters are served first come, first served: a large TPM request is not
    starved by a stream of small ones slipping past it.
    """

    __slots__ = (
        "_blocked_until",
        "_cap",
        "_cap_mark",
        "_cap_until",
        "_changed",
        "_clock",
        "_held",
        "_last",
        "_lock",
        "_sleep",
        "_taken",
        "_takes",
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
        self._taken = 0.0  # everything ever taken
        self._takes = 0  # takes so far; a take's number is its ticket
        self._held: dict[int, float] = {}  # ticket -> amount, for takes in flight (``hold``)
        self._cap: float | None = None  # the provider's remaining count, less the uncounted
        self._cap_mark = 0.0  # ``_taken`` when the count came
        self._cap_until = float("-inf")  # when the count stops binding (its reset)
        self._changed: asyncio.Event | None = None  # set when a new count arrives

    def __repr__(self) -> str:
        return f"TokenBucket(rate_per_minute={self.rate_per_minute}, capacity={self.capacity})"

    @property
    def available(self) -> float:
        """Tokens that could be taken right now (0 while blocked by a penalty), at most
        what the provider's last remaining count still allows."""
        now = self._now()
        self._refill(now)
        if now < self._blocked_until:
            return 0.0
        return max(0.0, min(self._tokens, self._headroom(now)))

    @property
    def headroom(self) -> float:
        """What the provider's last remaining count still allows (inf without one in force)."""
        return self._headroom(self._now())

    def try_acquire(self, amount: float = 1) -> bool:
        """Take ``amount`` if it is there now and nobody is queued ahead; never waits."""
        self._check(amount)
        if self._lock is not None and self._lock.locked():
            return False
        return self._take(amount, self._now())

    async def acquire(self, amount: float = 1) -> int:
        """Wait until ``amount`` tokens are available, then take them; returns the take's
        ticket (for ``follow_remaining``)."""
        self._check(amount)
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            while True:
                now = self._now()
                if self._take(amount, now):
                    return self._takes
                await self._pause(self._wait_time(amount, now), now)

    @contextlib.asynccontextmanager
    async def hold(self, amount: float = 1) -> AsyncIterator[int]:
        """``acquire``, and count the take as in flight until the block ends (answered,
        failed or cancelled); yields its ticket."""
        ticket = await self.acquire(amount)
        self._held[ticket] = amount
        try:
            yield ticket
        finally:
            del self._held[ticket]

    def follow_remaining(self, remaining: float, *, reset: float | None,
                         ticket: int | None = None) -> None:
        """The provider's remaining count, from its answer to the take ``ticket``: for the
        next ``reset`` seconds (None: ``REMAINING_DEFAULT_SECONDS``) the bucket admits at
        most ``remaining`` minus what is taken from now on and minus the held takes after
        ``ticket`` (all held takes without one): sent, or about to be, and maybe not
        counted by the provider when it answered. The latest count replaces the last."""
        now = self._now()
        uncounted = sum(amount for held, amount in self._held.items()
                        if ticket is None or held > ticket)
        self._cap = remaining - uncounted
        self._cap_mark = self._taken
        self._cap_until = now + (REMAINING_DEFAULT_SECONDS if reset is None else max(0.0, reset))
        if self._changed is not None:  # waiters look again: the count may allow more now
            self._changed.set()
            self._changed = None

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
        if self._headroom(now) < amount:
            return False
        self._tokens -= amount
        self._taken += amount
        self._takes += 1
        return True

    def _headroom(self, now: float) -> float:
        if self._cap is None or now >= self._cap_until:
            return math.inf
        return self._cap - (self._taken - self._cap_mark)

    async def _pause(self, seconds: float, now: float) -> None:
        """Sleep ``seconds``, or less when a remaining count is in force and a newer one
        arrives (an answer in flight may say there is room again)."""
        if self._cap is None or now >= self._cap_until:
            await self._sleep(seconds)
            return
        if self._changed is None:
            self._changed = asyncio.Event()
        waits = (asyncio.ensure_future(self._sleep(seconds)),
                 asyncio.ensure_future(self._changed.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

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
        capped = self._cap_until - now if self._headroom(now) < amount else 0.0
        # a floor keeps float rounding from turning into a busy loop
        return max(blocked + deficit * 60.0 / self.rate_per_minute, capped, 1e-3)

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return asyncio.get_running_loop().time()
