"""Readiness: a partition with lag whose committed offset stops moving is stalled.

A worker can be alive and still make no progress (a stage loop stuck after a
rebalance, a hung model call). `/healthz` (the readiness probe) answers 503 once any
assigned input partition has had lag and an unchanged committed offset for
``stall_seconds``: the pod leaves the Service and `RetroStreamPartitionStalled` fires.
It is not restarted: `/livez` (liveness) only asks whether the event loop answers,
since a provider that throttles looks like a stall too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from streams.clock import Clock

Partition = tuple[str, int]


@dataclass
class StallDetector:
    stall_seconds: float
    clock: Clock = time.monotonic
    _since: dict[Partition, tuple[int, float]] = field(default_factory=dict)

    def observe(self, committed: dict[Partition, int], lag: dict[Partition, int]) -> None:
        """Record one measurement of committed offsets and lag per partition; a
        partition missing from ``lag`` is no longer watched (it moved to another worker)."""
        now = self.clock()
        for part in set(self._since) - set(lag):
            del self._since[part]
        for part, lag_value in lag.items():
            offset = committed.get(part, -1)
            previous = self._since.get(part)
            if lag_value <= 0 or previous is None or previous[0] != offset:
                self._since[part] = (offset, now)

    def restart(self, part: Partition) -> None:
        """Start the clock again for ``part`` (something was done about it)."""
        if part in self._since:
            self._since[part] = (self._since[part][0], self.clock())

    def stalled(self) -> list[Partition]:
        """Partitions whose committed offset has not moved, with lag, for too long."""
        if self.stall_seconds <= 0:
            return []
        now = self.clock()
        return sorted(p for p, (_, since) in self._since.items()
                      if now - since >= self.stall_seconds)
