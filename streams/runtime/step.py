"""What a stage's step sees of the runtime: a fetch in, outputs out, records done.

A step holds a stage's logic (clean, lanes, compactor, re-drive) and no Kafka client:
the runtime (``StageLoop`` on aiokafka, ``MemoryRun`` in tests) fetches, hands each
fetch to :meth:`Step.take`, and commits each partition's prefix of records the step
marked done. A record is marked done once what covers it is delivered, which is what
makes a crash or a rebalance re-read rather than lose it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from streams.runtime.acks import AckHandle


class Message(Protocol):
    """A consumed record (aiokafka's ConsumerRecord has these fields)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None
    headers: Any


Part = Hashable  # a partition: aiokafka's TopicPartition (its .topic and .partition)
Fetch = Mapping[Any, Sequence[Message]]


class Out(NamedTuple):
    """One message a step produces (a tuple: a step builds one per record)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


class Context(Protocol):
    """The runtime as a step uses it."""

    def track(self, part: Part, offset: int) -> AckHandle:
        """Note a record (or the last of a run of records) as received, not done."""
        ...

    def done(self, handle: AckHandle) -> None:
        """The record's output is delivered: its offset may be committed."""
        ...

    async def send(self, outs: Iterable[Out], *, done: Iterable[AckHandle] = (),
                   on_delivered: Callable[[], None] | None = None) -> Awaitable[None]:
        """Queue ``outs``; once all are delivered, mark ``done`` and call
        ``on_delivered``. The awaitable ends at delivery (raises if one failed; the
        runtime then rejoins from the committed offsets)."""
        ...

    def reread(self, part: Part, offset: int) -> None:
        """Not now: read ``part`` again from ``offset`` at a later fetch."""
        ...

    def forget(self, part: Part) -> None:
        """Drop the records of ``part`` not done yet: a rebalance reads every partition
        again from its commit, so a step that lets its held records go gets them back."""
        ...

    def owned(self) -> set[Any]:
        """The partitions this member owns now."""
        ...

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has (0 while unknown)."""
        ...

    async def give(self) -> None:
        """Let the worker's other stages run if this one held the event loop a while."""
        ...


class Step:
    """A stage's logic between fetch and send; a subclass overrides what it needs."""

    name = "step"
    # re-read a partition whose commit one record has held back this long (0: never)
    held_seconds: float = 0.0

    def begin(self, ctx: Context) -> None:
        """A new group membership: start afresh with this context."""

    def background(self, ctx: Context) -> list[Coroutine[Any, Any, None]]:
        """Tasks that run beside the fetches for one membership (timers)."""
        return []

    async def take(self, fetch: Fetch, ctx: Context) -> None:
        """Handle one fetch (partition -> messages in offset order)."""
        raise NotImplementedError

    async def tick(self, ctx: Context) -> None:
        """After each fetch, also an empty one: publish what is due."""

    async def revoked(self, parts: set[Any], ctx: Context) -> None:
        """Partitions are about to move: deliver what can be delivered now."""

    async def assigned(self, parts: set[Any], ctx: Context) -> None:
        """The partitions owned after a rebalance (load their state here)."""

    async def drain(self, ctx: Context) -> None:
        """Shutting down: finish the work in flight (the runtime bounds the wait)."""

    def failure(self) -> str | None:
        """Why the step cannot go on in this membership (the runtime rejoins)."""
        return None
