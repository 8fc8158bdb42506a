"""Ack records in offset order, whatever order their work finishes in.

A Kafka commit is one offset per partition: everything below it counts as done.
Batches finish out of order, so committing each record as its batch completes could
commit past a record still in flight and lose it in a crash. ``OrderedAcker``
releases acks only as a contiguous prefix of what was received on each partition;
``Commits`` turns that prefix into the offsets a stage loop commits.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class AckHandle:
    """One received record: its partition key, its token, and whether it is done."""

    key: Hashable
    token: Any
    done: bool = False


@dataclass
class OrderedAcker:
    """``track`` in arrival order, ``done`` in any order; ``ack`` sees arrival order."""

    ack: Callable[[Any], None]
    _pending: dict[Hashable, deque[AckHandle]] = field(default_factory=dict)

    def track(self, key: Hashable, token: Any) -> AckHandle:
        handle = AckHandle(key, token)
        self._pending.setdefault(key, deque()).append(handle)
        return handle

    def done(self, handle: AckHandle) -> None:
        handle.done = True
        queue = self._pending.get(handle.key)
        while queue and queue[0].done:
            self.ack(queue.popleft().token)
        if queue is not None and not queue:
            del self._pending[handle.key]

    def forget(self, key: Hashable) -> None:
        """Drop every record of ``key`` (a partition that moved to another worker)
        unacked: none of them is committed here, and records received after the
        partition comes back queue afresh instead of behind them."""
        self._pending.pop(key, None)

    def waiting(self) -> int:
        """Records received but not yet acked (done or not)."""
        return sum(len(q) for q in self._pending.values())

    def oldest(self) -> dict[Hashable, AckHandle]:
        """Per key, the first record not acked yet: the one holding its commit back."""
        return {key: queue[0] for key, queue in self._pending.items() if queue}


class Commits:
    """The next offset to commit per partition of an aiokafka loop: each partition's
    contiguous prefix of records whose output is delivered (``acker`` keeps the order;
    its tokens are ``(partition, offset)``)."""

    def __init__(self) -> None:
        self.ready: dict[Any, int] = {}
        self.acker = OrderedAcker(self._acked)

    def _acked(self, token: tuple[Any, int]) -> None:
        tp, offset = token
        self.ready[tp] = offset + 1

    def oldest_pending(self) -> dict[Any, int]:
        """Per partition, the offset of the first record not done yet: where its commit
        waits."""
        return {tp: handle.token[1] for tp, handle in self.acker.oldest().items()}

    def take(self, owned: set[Any]) -> dict[Any, int]:
        ready, self.ready = self.ready, {}
        return {tp: offset for tp, offset in ready.items() if tp in owned}
