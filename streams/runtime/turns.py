"""Taking turns on the worker's one event loop."""

from __future__ import annotations

import asyncio
import time

from streams.clock import Clock

TURN_SECONDS = 0.002


class Turns:
    """Lets the worker's other stages run at least every ``quantum`` seconds of a loop
    over a fetch.

    The stages share one event loop, and a task that never suspends holds it: with
    the clean and batch loops yielding only every 100 records (~25 ms each), a stage
    that suspends between records got one record per round and fell thousands of
    records behind until the input ran dry. A time quantum bounds that wait whatever
    a record costs.
    """

    def __init__(self, quantum: float = TURN_SECONDS, clock: Clock = time.perf_counter) -> None:
        self.quantum = quantum
        self.clock = clock
        self._since = clock()

    async def give(self) -> None:
        """Suspend once if this loop has held the event loop for a quantum."""
        if self.clock() - self._since >= self.quantum:
            await asyncio.sleep(0)
            self._since = self.clock()
