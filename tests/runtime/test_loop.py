"""StageLoop on fake aiokafka clients: a failed membership rejoins from the commits and
counts its topics as re-read; commits follow what the step marked done; a held commit
ends the membership; a rebalance delivers before partitions move."""

from __future__ import annotations

import asyncio
from typing import Any

import streams.runtime.loop as loop_module
from streams.metrics import Metrics
from streams.runtime.loop import StageLoop, Subscription
from streams.runtime.memory import Part, Record
from streams.runtime.step import Context, Fetch, Out, Step
from streams.settings import Settings
from tests.helpers import FakeClock


class Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None]] = []
        self.stopped = 0

    async def start(self) -> None: ...

    async def stop(self) -> None:
        self.stopped += 1

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    def create_batch(self) -> list:
        class Batch(list):
            def append(self, *, key: Any, value: Any, timestamp: Any) -> bool:
                super().append((key, value))
                return True
        return Batch()

    async def send_batch(self, batch: list, topic: str, *, partition: int) -> asyncio.Future:
        self.sent += [(topic, value) for _, value in batch]
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future


class Consumer:
    """Hands out the fetches it is given, then stops the loop."""

    def __init__(self, fetches: list[Fetch], loop: StageLoop) -> None:
        self.fetches = list(fetches)
        self.loop = loop
        self.commits: list[dict] = []
        self.parts: set[Any] = set()
        self.stopped = 0
        self.listener: Any = None

    async def start(self) -> None: ...

    async def stop(self) -> None:
        self.stopped += 1

    def subscribe(self, topics: list[str] | None = None, pattern: str | None = None,
                  listener: Any = None) -> None:
        self.listener = listener

    def subscription(self) -> set[str]:
        return {"in-a", "in-b"}

    def assignment(self) -> set[Any]:
        return set(self.parts)

    async def getmany(self, timeout_ms: int, max_records: int) -> Fetch:
        await asyncio.sleep(0)  # deliveries land while a fetch is on its way
        if not self.fetches:
            self.loop._stopping = True  # after one empty poll, which commits what landed
            return {}
        fetch = self.fetches.pop(0)
        self.parts |= set(fetch)
        return fetch

    async def commit(self, offsets: dict) -> None:
        self.commits.append(dict(offsets))


class Echo(Step):
    """Sends each message on to ``out``; fails its first membership if told to."""

    name = "echo loop"

    def __init__(self, fail_first: bool = False) -> None:
        self.fail_first = fail_first
        self.memberships = 0
        self.events: list[str] = []

    def begin(self, ctx: Context) -> None:
        self.memberships += 1

    async def take(self, fetch: Fetch, ctx: Context) -> None:
        if self.fail_first and self.memberships == 1:
            raise RuntimeError("the first membership's output was not delivered")
        for part, messages in fetch.items():
            await ctx.send([Out("out", m.key, m.value) for m in messages],
                           done=[ctx.track(part, messages[-1].offset)])

    async def revoked(self, parts: set[Any], ctx: Context) -> None:
        self.events.append("revoked")


def run_loop(step: Step, fetches: list[list[Fetch]], monkeypatch: Any,
             metrics: Metrics | None = None) -> tuple[StageLoop, list[Consumer], list[Producer]]:
    """Run ``step`` once per list of fetches (one list per membership)."""
    monkeypatch.setattr(loop_module, "RESTART_SECONDS", 0.0)
    loop = StageLoop(step, Settings(), metrics or Metrics(), group="g",
                     subscription=Subscription(topics=["in-a", "in-b"]))
    consumers: list[Consumer] = []
    producers: list[Producer] = []

    def consumer(settings: Settings, group: str, **options: Any) -> Consumer:
        consumers.append(Consumer(fetches[len(consumers)], loop))
        return consumers[-1]

    def producer(settings: Settings) -> Producer:
        producers.append(Producer())
        return producers[-1]

    monkeypatch.setattr(loop_module, "stage_consumer", consumer)
    monkeypatch.setattr(loop_module, "stage_producer", producer)
    asyncio.run(loop.run())
    return loop, consumers, producers


A0 = Part("in-a", 0)


def _fetch(*offsets: int) -> Fetch:
    return {A0: [Record("in-a", 0, o, b"k", f"v{o}".encode()) for o in offsets]}


def test_commits_follow_delivery(monkeypatch) -> None:
    _, (consumer,), (producer,) = run_loop(Echo(), [[_fetch(0, 1), _fetch(2), {}, {}]],
                                           monkeypatch)
    assert producer.sent == [("out", b"v0"), ("out", b"v1"), ("out", b"v2")]
    assert consumer.commits and consumer.commits[-1] == {A0: 3}


def test_a_failed_membership_rejoins_and_counts_its_topics_as_re_read(monkeypatch) -> None:
    metrics = Metrics()
    step = Echo(fail_first=True)
    _, consumers, _ = run_loop(step, [[_fetch(0)], [_fetch(0), {}, {}]], monkeypatch,
                                      metrics)
    assert step.memberships == 2
    assert consumers[0].stopped == 1 and consumers[0].commits == []  # left, nothing committed
    assert consumers[1].commits == [{A0: 1}]  # read again from the commit
    get = metrics.registry.get_sample_value
    assert get("retro_offset_rereads_total", {"topic": "in-a"}) == 1
    assert get("retro_offset_rereads_total", {"topic": "in-b"}) == 1


class Holds(Step):
    """Tracks a record it never finishes: its partition's commit is held back."""

    name = "holding loop"
    held_seconds = 30.0

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.memberships = 0

    def begin(self, ctx: Context) -> None:
        self.memberships += 1

    async def take(self, fetch: Fetch, ctx: Context) -> None:
        for part, messages in fetch.items():
            for m in messages:
                ctx.track(part, m.offset)

    async def tick(self, ctx: Context) -> None:
        self.clock.advance(20)


def test_a_commit_held_back_too_long_ends_the_membership(monkeypatch) -> None:
    from streams.kafka.stall import StallDetector

    clock = FakeClock()

    monkeypatch.setattr(loop_module, "StallDetector",
                        lambda seconds: StallDetector(seconds, clock=clock))
    step = Holds(clock)
    # membership 1: fetched, then two empty polls 20 s apart: held 40 s > 30 s
    _, consumers, _ = run_loop(step, [[_fetch(5), {}, {}], []], monkeypatch)
    assert step.memberships == 2 and consumers[0].stopped == 1


def test_a_rebalance_lets_the_step_deliver_then_commits_and_forgets_moved_parts(
        monkeypatch) -> None:
    class Pending(Echo):
        async def take(self, fetch: Fetch, ctx: Context) -> None:
            for part, messages in fetch.items():
                ctx.track(part, messages[-1].offset)  # in flight when the rebalance comes

    step = Pending()
    loop, (consumer,), _ = run_loop(step, [[_fetch(0)]], monkeypatch)
    assert loop.ctx is not None and loop.ctx.commits.acker.waiting() == 1
    asyncio.run(consumer.listener.on_partitions_assigned({A0}))
    asyncio.run(consumer.listener.on_partitions_revoked({A0}))
    assert step.events == ["revoked"]
    asyncio.run(consumer.listener.on_partitions_assigned(set()))  # A0 moved away
    assert loop.ctx.commits.acker.waiting() == 0  # its record is the next owner's
