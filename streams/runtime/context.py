"""The part of a runtime both runners share: what is done, what is in flight, what failed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from streams.runtime.acks import AckHandle, Commits
from streams.runtime.step import Out, Part
from streams.runtime.turns import Turns


class Sink(Protocol):
    """Where outputs go: queue them, get one future per queued unit."""

    async def queue(self, outs: list[Out]) -> list[asyncio.Future[Any]]: ...


class Source(Protocol):
    """What a runner owns and can seek."""

    def owned(self) -> set[Any]: ...

    def seek(self, part: Part, offset: int) -> None: ...

    def partition_count(self, topic: str) -> int: ...


class RunContext:
    """One membership's ledger: records received and done, deliveries in flight, and
    the first failure (after which the runner rejoins from the committed offsets)."""

    def __init__(self, sink: Sink, source: Source, turns: Turns | None = None) -> None:
        self.sink = sink
        self.source = source
        self.commits = Commits()
        self.turns = turns or Turns()
        # a step gives a turn once a record: the runner's own coroutine, not one around it
        self.give = self.turns.give
        self.in_flight: set[asyncio.Future[Any]] = set()
        self.failed: str | None = None

    def track(self, part: Part, offset: int) -> AckHandle:
        return self.commits.acker.track(part, (part, offset))

    def done(self, handle: AckHandle) -> None:
        self.commits.acker.done(handle)

    async def send(self, outs: Iterable[Out], *, done: Iterable[AckHandle] = (),
                   on_delivered: Callable[[], None] | None = None) -> Awaitable[None]:
        handles = list(done)
        futures = await self.sink.queue(list(outs))
        delivery = asyncio.gather(*futures)
        self.in_flight.add(delivery)

        def finished(f: asyncio.Future[Any]) -> None:
            self.in_flight.discard(f)
            if f.cancelled():
                return
            exc = f.exception()
            if exc is not None:
                self.fail(f"an output was not delivered: {exc!r}")
                return
            for handle in handles:
                self.commits.acker.done(handle)
            if on_delivered is not None:
                on_delivered()

        delivery.add_done_callback(finished)
        return delivery

    def reread(self, part: Part, offset: int) -> None:
        if part in self.source.owned():
            self.source.seek(part, offset)

    def forget(self, part: Part) -> None:
        self.commits.acker.forget(part)

    def owned(self) -> set[Any]:
        return self.source.owned()

    def partition_count(self, topic: str) -> int:
        return self.source.partition_count(topic)

    def fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why

    async def delivered(self) -> None:
        """Wait for every delivery in flight (failures are noted, not raised)."""
        while self.in_flight:
            await asyncio.gather(*list(self.in_flight), return_exceptions=True)

    def ready(self) -> dict[Any, int]:
        """The offsets to commit now: each owned partition's done prefix."""
        return self.commits.take(self.source.owned())
