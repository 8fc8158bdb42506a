"""Injected time: the types of the clock and sleep that timing code takes as arguments.

Rate limits, backoff and stall detection read time through these so tests can pass
a fake clock and a sleep that advances it, instead of waiting on the wall clock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

Clock = Callable[[], float]
"""Seconds from an arbitrary origin, only ever compared (``time.monotonic``)."""

Sleep = Callable[[float], Awaitable[None]]
"""Waits this many seconds (``asyncio.sleep``)."""

__all__ = ["Clock", "Sleep"]
