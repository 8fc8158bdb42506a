"""A step's keyed state per partition, kept in a compacted topic and loaded on arrival.

The compactor (reports) and the notifier (ledgers) keep the latest value per key of
the partitions they own; a compacted topic holds that state, so a member given a
partition reads its keys from there before it merges into them, and forgets the keys
of partitions that moved away. A partition kept through a rebalance keeps its state:
nobody else owned it in between.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")
# partitions -> (key, latest value or None for a tombstone, home partition) per key
Read = Callable[[set[int]], Awaitable[list[tuple[str, bytes | None, int]]]]


class PartitionedState(Generic[V]):
    """The latest value per key of the loaded partitions, with each key's home."""

    def __init__(self) -> None:
        self.values: dict[str, V] = {}
        self.home: dict[str, int] = {}
        self.loaded: set[int] = set()  # partitions assigned and read

    def clear(self) -> None:
        self.values.clear()
        self.home.clear()
        self.loaded = set()

    def get(self, key: str) -> V | None:
        return self.values.get(key)

    def items(self) -> Iterator[tuple[str, V]]:
        return iter(list(self.values.items()))

    def put(self, key: str, value: V, partition: int) -> None:
        self.values[key] = value
        self.home[key] = partition

    def drop(self, key: str) -> None:
        self.values.pop(key, None)
        self.home.pop(key, None)

    def keys_in(self, partitions: set[int]) -> int:
        return sum(1 for p in self.home.values() if p in partitions)

    async def assign(self, partitions: set[int], read: Read,
                     decode: Callable[[bytes], V]) -> set[int]:
        """Forget the keys of partitions that left, read those that arrived; the
        partitions read. If reading raises, the new partitions stay unloaded."""
        for key in [k for k, p in self.home.items() if p not in partitions]:
            self.drop(key)
        gained = partitions - self.loaded
        self.loaded &= partitions
        if not gained:
            return gained
        for key, value, home in await read(gained):
            if value is None:
                self.drop(key)
            else:
                self.put(key, decode(value), home)
        self.loaded = set(partitions)
        return gained
