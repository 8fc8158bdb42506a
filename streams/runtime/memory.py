"""The stage runtime in memory: drive a step with lists of messages, no broker.

Steps are tested the way a Kafka loop runs them (fetch -> take -> tick -> commit),
with what they sent, what was committed and what was read again kept in lists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from streams.runtime.context import RunContext
from streams.runtime.step import Out, Step


class Part(NamedTuple):
    """A partition, with the fields of aiokafka's TopicPartition."""

    topic: str
    partition: int


@dataclass(frozen=True)
class Record:
    """A consumed message, with the fields of aiokafka's ConsumerRecord."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


class DeliveryFailed(Exception):
    """A send the memory sink was told to refuse."""


@dataclass
class MemorySink:
    """Delivers at once (or refuses while ``refuse`` is set)."""

    sent: list[Out] = field(default_factory=list)
    refuse: bool = False

    async def queue(self, outs: list[Out]) -> list[asyncio.Future[Any]]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.refuse:
            future.set_exception(DeliveryFailed("refused"))
        else:
            self.sent.extend(outs)
            future.set_result(None)
        return [future]


@dataclass
class MemorySource:
    assigned: set[Any] = field(default_factory=set)
    seeks: list[tuple[Any, int]] = field(default_factory=list)
    partitions: dict[str, int] = field(default_factory=dict)  # topic -> partition count

    def owned(self) -> set[Any]:
        return set(self.assigned)

    def seek(self, part: Any, offset: int) -> None:
        self.seeks.append((part, offset))

    def partition_count(self, topic: str) -> int:
        return self.partitions.get(topic, 0)


class MemoryRun:
    """One membership of a step over partitions held in memory."""

    def __init__(self, step: Step, parts: Iterable[Part] = ()) -> None:
        self.step = step
        self.sink = MemorySink()
        self.source = MemorySource(set(parts))
        self.ctx = RunContext(self.sink, self.source)
        self.committed: dict[Any, int] = {}
        step.begin(self.ctx)

    @property
    def sent(self) -> list[Out]:
        return self.sink.sent

    def sent_to(self, topic: str) -> list[Out]:
        return [o for o in self.sink.sent if o.topic == topic]

    async def assign(self, *parts: Part) -> None:
        """A rebalance: the partitions that moved away are forgotten (none of their
        records is this member's now), as the Kafka loop does."""
        for part in self.source.assigned - set(parts):
            self.ctx.commits.acker.forget(part)
        self.source.assigned = set(parts)
        await self.step.assigned(set(parts), self.ctx)

    async def fetch(self, *records: Record) -> None:
        """One fetch (records grouped by partition, in order), then a commit."""
        fetch: dict[Part, list[Record]] = {}
        for r in records:
            part = Part(r.topic, r.partition)
            self.source.assigned.add(part)
            fetch.setdefault(part, []).append(r)
        if fetch:
            await self.step.take(fetch, self.ctx)
        await self.tick()

    async def tick(self) -> None:
        await self.step.tick(self.ctx)
        await self.settle()

    async def settle(self) -> None:
        """Let deliveries and the step's tasks finish their callbacks, then commit."""
        for _ in range(3):
            await asyncio.sleep(0)
        await self.ctx.delivered()
        self.committed.update(self.ctx.ready())

    async def drain(self) -> None:
        await self.step.drain(self.ctx)
        await self.settle()
