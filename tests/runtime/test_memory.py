"""The stage runtime in memory (``MemoryRun``): it drives a step as a Kafka loop does,
fetch -> take -> tick -> commit, and commits only what the step delivered."""

from __future__ import annotations

from typing import Any

from streams.runtime.memory import MemoryRun, Part, Record
from streams.runtime.step import Context, Fetch, Out, Step

P0, P1 = Part("in", 0), Part("in", 1)


def record(part: Part, offset: int, value: bytes = b"v") -> Record:
    return Record(part.topic, part.partition, offset, key=b"k", value=value)


class Echo(Step):
    """Sends each message on to ``out`` and marks it done once that is delivered; a
    message whose value is ``hold`` is received and never done. Notes every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def begin(self, ctx: Context) -> None:
        self.calls.append(("begin",))

    async def take(self, fetch: Fetch, ctx: Context) -> None:
        self.calls.append(("take", {p: [m.offset for m in ms] for p, ms in fetch.items()}))
        for part, messages in fetch.items():
            for m in messages:
                handle = ctx.track(part, m.offset)
                if m.value != b"hold":
                    await ctx.send([Out("out", m.key, m.value)], done=[handle])

    async def tick(self, ctx: Context) -> None:
        self.calls.append(("tick",))

    async def assigned(self, parts: set[Any], ctx: Context) -> None:
        self.calls.append(("assigned", parts))

    async def drain(self, ctx: Context) -> None:
        self.calls.append(("drain",))
        await ctx.send([Out("out", None, b"last words")])


async def test_a_fetch_is_taken_by_partition_in_order_then_ticked_and_committed() -> None:
    step = Echo()
    run = MemoryRun(step)
    await run.fetch(record(P0, 5), record(P1, 0), record(P0, 6))
    assert step.calls == [("begin",), ("take", {P0: [5, 6], P1: [0]}), ("tick",)]
    assert [o.value for o in run.sent] == [b"v", b"v", b"v"]
    assert run.committed == {P0: 7, P1: 1}  # the next offset to read, as Kafka commits
    assert run.source.owned() == {P0, P1}  # a fetched partition is owned


async def test_a_record_not_done_holds_its_partition_commit_back() -> None:
    run = MemoryRun(Echo())
    await run.fetch(record(P0, 0), record(P0, 1, b"hold"), record(P0, 2), record(P1, 0))
    assert run.committed == {P0: 1, P1: 1}
    assert len(run.sent_to("out")) == 3 and run.sent_to("elsewhere") == []


async def test_a_refused_delivery_fails_the_membership_and_commits_nothing() -> None:
    run = MemoryRun(Echo())
    run.sink.refuse = True
    await run.fetch(record(P0, 0))
    assert run.committed == {} and run.sent == []
    assert run.ctx.failed is not None and "not delivered" in run.ctx.failed


async def test_an_empty_fetch_only_ticks() -> None:
    step = Echo()
    run = MemoryRun(step)
    await run.fetch()
    await run.tick()
    assert step.calls == [("begin",), ("tick",), ("tick",)]
    assert run.committed == {}


async def test_a_partition_that_moves_away_is_forgotten_and_commits_nothing_more() -> None:
    step = Echo()
    run = MemoryRun(step, [P0, P1])
    await run.fetch(record(P0, 0, b"hold"), record(P1, 0, b"hold"))
    await run.assign(P1)
    assert step.calls[-1] == ("assigned", {P1})
    assert run.ctx.commits.acker.waiting() == 1  # P0's held record is dropped, P1's waits
    await run.fetch(record(P1, 1))
    assert run.committed == {}  # P1/0 is still held
    run.ctx.reread(P0, 0)  # a partition not owned is not sought
    run.ctx.reread(P1, 0)
    assert run.source.seeks == [(P1, 0)]


async def test_drain_lets_the_step_finish_and_settles_what_it_sent() -> None:
    step = Echo()
    run = MemoryRun(step)
    await run.drain()
    assert step.calls[-1] == ("drain",)
    assert [o.value for o in run.sent] == [b"last words"]
    assert not run.ctx.in_flight


async def test_partition_counts_are_what_the_source_is_told() -> None:
    run = MemoryRun(Echo())
    run.source.partitions["in"] = 3
    assert run.ctx.partition_count("in") == 3
    assert run.ctx.partition_count("other") == 0
