"""Adaptive concurrency for model calls: additive increase, multiplicative decrease.

A provider's real capacity is unknown and changes; a fixed worker count either
wastes it or trips 429s. The limiter grows the number of concurrent calls by
``increase`` per success and multiplies it by ``decrease_factor`` on a rate limit,
pausing new calls for ``pause_seconds`` so the provider can recover::

    limiter = AIMDLimiter(start=5, maximum=20)
    async with limiter.slot(priority=0):      # fresh work
        ...
    async with limiter.slot(priority=1):      # a retry waits behind fresh work
        ...

Waiters sit in a heap ordered by (priority, arrival), so within a priority the
order is first come, first served, and retries never starve fresh batches of the
slots they were meant to protect.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from types import TracebackType

from streams.clock import Clock

logger = logging.getLogger(__name__)


class AIMDLimiter:
    """An asyncio concurrency limiter whose limit adapts to rate-limit signals.

    Not thread-safe: use it from one event loop, like every asyncio primitive.
    """

    __slots__ = (
        "_clock",
        "_in_flight",
        "_limit",
        "_paused_until",
        "_seq",
        "_timer",
        "_waiters",
        "decrease_factor",
        "increase",
        "maximum",
        "minimum",
        "pause_seconds",
        "start",
    )

    start: int  #: The limit before any feedback arrived.
    increase: int  #: Added to the limit on each success.
    decrease_factor: float  #: The limit is multiplied by this on a rate limit (0 < f < 1).
    maximum: int  #: The limit never grows above this.
    minimum: int  #: The limit never shrinks below this (at least 1, so work always moves).
    pause_seconds: float  #: New acquisitions wait this long after a decrease.

    def __init__(
        self,
        *,
        start: int = 5,
        increase: int = 1,
        decrease_factor: float = 0.5,
        maximum: int = 20,
        minimum: int = 1,
        pause_seconds: float = 1.0,
        clock: Clock | None = None,
    ) -> None:
        if minimum < 1:
            raise ValueError(f"minimum concurrency must be at least 1, got {minimum}")
        if maximum < minimum:
            raise ValueError(f"maximum concurrency {maximum} is below the minimum {minimum}")
        if not minimum <= start <= maximum:
            raise ValueError(
                f"start concurrency {start} must lie between minimum {minimum} "
                f"and maximum {maximum}"
            )
        if increase < 0:
            raise ValueError(f"increase must not be negative, got {increase}")
        if not 0 < decrease_factor < 1:
            raise ValueError(
                f"decrease_factor must be between 0 and 1 (exclusive), got {decrease_factor}"
            )
        if pause_seconds < 0:
            raise ValueError(f"pause_seconds must not be negative, got {pause_seconds}")
        self.start = start
        self.increase = increase
        self.decrease_factor = decrease_factor
        self.maximum = maximum
        self.minimum = minimum
        self.pause_seconds = pause_seconds
        self._clock = clock
        self._limit = start
        self._in_flight = 0
        self._paused_until = float("-inf")
        self._seq = 0
        # (priority, arrival number, future); the arrival number keeps the order fair
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._timer: asyncio.TimerHandle | None = None

    # -- state -----------------------------------------------------------------

    @property
    def limit(self) -> int:
        """How many calls may be in flight at once right now."""
        return self._limit

    @property
    def in_flight(self) -> int:
        """How many slots are held."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        """How many acquisitions are queued (cancelled ones are removed)."""
        return len(self._waiters)

    @property
    def paused(self) -> bool:
        """True while new acquisitions wait out the pause after a rate limit."""
        return self._now() < self._paused_until

    def __repr__(self) -> str:
        return (
            f"AIMDLimiter(limit={self._limit}, in_flight={self._in_flight}, "
            f"waiting={len(self._waiters)}, range=[{self.minimum}, {self.maximum}])"
        )

    # -- feedback --------------------------------------------------------------

    def on_success(self) -> None:
        """A call succeeded: allow ``increase`` more concurrent calls, up to ``maximum``."""
        self._limit = min(self.maximum, self._limit + self.increase)
        self._dispatch()

    def on_rate_limited(self) -> None:
        """The provider said slow down: shrink the limit and pause new acquisitions.

        Calls that were in flight together tend to come back rate limited together;
        only the first 429 of a pause window shrinks the limit, so a burst halves
        once instead of collapsing the limit to the floor.
        """
        now = self._now()
        if now < self._paused_until:
            return
        before = self._limit
        self._limit = max(self.minimum, int(self._limit * self.decrease_factor))
        self._paused_until = now + self.pause_seconds
        logger.info(
            "rate limited: concurrency %s -> %s, pausing %.2fs",
            before,
            self._limit,
            self.pause_seconds,
        )
        self._dispatch()

    # -- acquire / release ----------------------------------------------------

    def slot(self, priority: int = 0) -> _Slot:
        """An async context manager holding one slot; lower ``priority`` is served first."""
        return _Slot(self, priority)

    async def acquire(self, priority: int = 0) -> None:
        """Take a slot and keep it until :meth:`release`; prefer :meth:`slot`."""
        await self._acquire(priority)

    def release(self) -> None:
        """Give back a slot taken with ``await acquire()``."""
        if self._in_flight <= 0:
            raise RuntimeError("release() called more often than acquire()")
        self._in_flight -= 1
        self._dispatch()

    async def _acquire(self, priority: int) -> None:
        if not self._waiters and not self.paused and self._in_flight < self._limit:
            self._in_flight += 1
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._seq += 1
        entry = (priority, self._seq, fut)
        heapq.heappush(self._waiters, entry)
        self._dispatch()
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # granted, then cancelled before it could run: hand the slot on
                self.release()
            else:
                self._discard(entry)
            raise

    def _discard(self, entry: tuple[int, int, asyncio.Future[None]]) -> None:
        try:
            self._waiters.remove(entry)
        except ValueError:
            return
        heapq.heapify(self._waiters)
        self._dispatch()

    def _dispatch(self) -> None:
        """Hand free slots to the waiters at the head of the heap."""
        remaining = self._paused_until - self._now()
        if remaining > 0:
            if self._waiters and self._timer is None:
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(remaining, self._on_pause_end)
            return
        while self._waiters and self._in_flight < self._limit:
            _, _, fut = heapq.heappop(self._waiters)
            if fut.done():  # cancelled; its task is cleaning up
                continue
            self._in_flight += 1
            fut.set_result(None)

    def _on_pause_end(self) -> None:
        self._timer = None
        self._dispatch()

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        return asyncio.get_running_loop().time()


class _Slot:
    """``async with limiter.slot(priority):`` holds one slot for the block."""

    __slots__ = ("_held", "_limiter", "_priority")

    def __init__(self, limiter: AIMDLimiter, priority: int) -> None:
        self._limiter = limiter
        self._priority = priority
        self._held = False

    async def __aenter__(self) -> None:
        await self._limiter._acquire(self._priority)
        self._held = True

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._held:
            self._held = False
            self._limiter.release()
