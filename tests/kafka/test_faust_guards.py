"""The guards that keep faust from committing records no agent processed.

These tests drive faust's real stream iterator, fetch loop and consumer bookkeeping
(no broker: messages are put straight on the stream's queue, or handed to the fetch
loop by a stand-in for the Kafka client) and look at what faust would commit.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streams.kafka import faust_guards

GENERATION = 3


def _message(offset: int, generation: int = GENERATION) -> Any:
    from faust.types.tuples import ConsumerMessage

    return ConsumerMessage("in", 0, offset, 0.0, 0, [], b"1", b"2", None,
                           generation_id=generation)


class _Harness:
    """A faust app with one stream over topic ``in``, never connected to a broker."""

    def __init__(self) -> None:
        import faust

        self.app = faust.App("faust-fixes-test", broker="kafka://127.0.0.1:1")
        self.app.consumer_generation_id = GENERATION
        self.app.topics._acking_topics.add("in")  # as if subscribed by an agent
        self.stream = self.app.topic("in").stream()
        self.iterator = self.stream.__aiter__()

    async def offer(self, message: Any) -> Any:
        """Put ``message`` on the stream; return the value handed over, or None if skipped."""
        channel = self.stream.channel
        channel.queue.put_nowait(await channel.decode(message))
        return await self._next()

    async def finish(self) -> None:
        """The agent is done with the last value: faust acks it when asked for the next."""
        await self._next()

    async def _next(self) -> Any:
        try:
            return await asyncio.wait_for(self.iterator.__anext__(), 0.5)
        except TimeoutError:  # nothing handed over: the iterator waits for the next message
            self.iterator = self.stream.__aiter__()  # the timeout ended the old one
            return None

    def committable(self) -> list[int]:
        """Offsets faust counts as acked, i.e. that its next commit may move past."""
        from faust.types.tuples import TP

        return list(self.app.consumer._acked[TP("in", 0)])


async def _skip_one_while_suspended(h: _Harness) -> tuple[Any, Any]:
    processed, skipped = _message(0), _message(1)
    h.app.flow_control.resume()
    assert await h.offer(processed) == 2  # the decoded value
    h.app.flow_control.suspend()  # what faust does first when partitions are revoked
    assert await h.offer(skipped) is None
    return processed, skipped


async def test_faust_alone_acks_a_message_it_skipped_while_suspended(monkeypatch) -> None:
    """The hazard: faust acks the skipped record, so the revoke-time commit passes it.

    If this starts failing, faust stopped acking skipped messages upstream and the
    guard becomes belt and braces.
    """
    from faust.transport.consumer import Consumer

    faust_guards.install()
    monkeypatch.setattr(Consumer, "ack", faust_guards.faust_original("ack"))
    h = _Harness()
    _, skipped = await _skip_one_while_suspended(h)
    assert skipped.acked and not skipped.tracked  # never reached the agent
    assert h.committable() == [0, 1]


async def test_guard_keeps_a_skipped_message_out_of_the_commit() -> None:
    faust_guards.install()
    h = _Harness()
    processed, _ = await _skip_one_while_suspended(h)
    assert processed.tracked and processed.acked
    assert h.committable() == [0]  # the commit stops before the skipped record


async def test_guard_drops_acks_of_messages_from_an_older_generation() -> None:
    faust_guards.install()
    h = _Harness()
    h.app.flow_control.resume()
    assert await h.offer(_message(0, generation=GENERATION - 1)) is None
    assert await h.offer(_message(1)) == 2
    await h.finish()
    assert h.committable() == [1]  # faust's seek after the rebalance re-reads offset 0


@pytest.mark.parametrize(("tracked", "generation", "expected"), [
    (True, GENERATION, False), (False, GENERATION, True), (True, GENERATION - 1, True),
    (True, None, False),
])
def test_skipped(tracked: bool, generation: int | None, expected: bool) -> None:
    from types import SimpleNamespace

    message = SimpleNamespace(tracked=tracked, generation_id=generation)
    assert faust_guards.skipped(message, GENERATION) is expected


# -- guard 2: commit only a run that starts at the committed offset -----------------


def _fake_consumer(acked: list[int], committed: int | None, **extra: Any) -> Any:
    from collections import defaultdict
    from types import SimpleNamespace

    from intervaltree import IntervalTree

    return SimpleNamespace(
        _acked=defaultdict(list, {"tp": list(acked)}),
        _acked_index=defaultdict(set, {"tp": set(acked)}),
        _gap=defaultdict(IntervalTree),
        _committed_offset=defaultdict(lambda: None, {"tp": committed}),
        **extra,
    )


@pytest.mark.parametrize(("acked", "committed", "faust_says", "guarded"), [
    ([9, 10], 8, 11, None),      # 8 never acked: faust skips it, the guard waits
    ([8, 9, 10], 8, 11, 11),     # the normal case: both commit 11
    ([1, 2], 0, 3, None),        # committed 0: faust does not even check
    ([5, 8, 9], 8, 6, 10),       # 5 acked before a seek moved the commit to 8
    ([1, 2], None, 3, None),     # committed offset not known yet (before the seek)
])
def test_commit_starts_at_the_committed_offset(acked: list[int], committed: int | None,
                                               faust_says: int | None,
                                               guarded: int | None) -> None:
    from faust.transport.consumer import Consumer

    faust_guards.install()
    assert faust_guards.faust_original("_new_offset")(
        _fake_consumer(acked, committed), "tp") == faust_says
    assert Consumer._new_offset(_fake_consumer(acked, committed), "tp") == guarded


def test_a_partition_the_group_never_committed_follows_fausts_rule() -> None:
    from faust.transport.consumer import Consumer

    faust_guards.install()
    fake = _fake_consumer([4, 5], None, _retro_never_committed={"tp"})
    assert Consumer._new_offset(fake, "tp") == 6


async def test_seek_keeps_a_committed_zero_and_notes_partitions_without_commit() -> None:
    from collections import defaultdict
    from types import SimpleNamespace

    from faust.transport.consumer import Consumer
    from faust.types.tuples import TP

    faust_guards.install()
    a, b, c = TP("in", 0), TP("in", 1), TP("in", 2)

    async def seek_to_committed() -> dict:
        return {a: 0, b: None, c: 7}

    fake = SimpleNamespace(seek_to_committed=seek_to_committed,
                           _read_offset=faust_guards.NoReadOffsets(),
                           _committed_offset=defaultdict(lambda: None))
    await Consumer.perform_seek(fake)  # type: ignore[arg-type]
    assert dict(fake._committed_offset) == {a: 0, c: 7}  # faust itself stores a as None
    assert fake._retro_never_committed == {b}


# -- guard 3: every fetched record reaches the agent -----------------------------------


async def _drain(consumer: Any, batches: list[list[int]], seek_before: int,
                 seek_to: int) -> list[int]:
    """Run faust's fetch loop over ``batches``; just before the batch starting at
    ``seek_before`` is handed over, faust seeks back to ``seek_to`` (a rebalance),
    so that batch is one fetched before the seek and the next is the re-read."""
    from types import SimpleNamespace

    from faust.types.tuples import TP, ConsumerMessage

    tp = TP("in", 0)
    delivered: list[int] = []

    async def callback(message: Any) -> None:
        delivered.append(message.offset)

    fetcher = SimpleNamespace(_stopped=asyncio.Event())
    pending = [list(b) for b in batches]

    async def getmany(timeout: float) -> Any:
        if not pending:
            fetcher._stopped.set()
            return
        batch = pending.pop(0)
        if batch[0] == seek_before:
            consumer._read_offset[tp] = seek_to  # what perform_seek records
        for offset in batch:
            yield tp, ConsumerMessage("in", 0, offset, 0.0, 0, [], b"1", b"2", None,
                                      generation_id=GENERATION)

    consumer.callback = callback
    consumer.getmany = getmany
    await asyncio.wait_for(consumer._drain_messages(fetcher), 10)
    return delivered


# offsets 5-7 read; the commit is at 6 when a rebalance seeks back; a fetch of 9, 10
# made before the seek arrives after it; then the re-read from 6
BATCHES = [[5, 6, 7], [9, 10], [6, 7, 8, 9, 10, 11]]


async def test_faust_alone_never_delivers_records_re_read_after_a_seek() -> None:
    """The hazard: the late batch moves faust's last-read offset to 10, so the re-read
    6-9 is dropped and 8 never reaches an agent; 7-9 are booked as done (a gap)."""
    from collections import defaultdict

    from faust.types.tuples import TP

    faust_guards.install()
    h = _Harness()
    consumer = h.app.consumer
    consumer._read_offset = defaultdict(lambda: None)  # faust's own bookkeeping
    delivered = await _drain(consumer, BATCHES, seek_before=9, seek_to=6)
    assert 8 not in delivered
    assert consumer._gap[TP("in", 0)]  # offsets 7-9 count as acked without an agent


async def test_guard_delivers_every_record_after_a_seek() -> None:
    from faust.types.tuples import TP

    faust_guards.install()
    h = _Harness()
    delivered = await _drain(h.app.consumer, BATCHES, seek_before=9, seek_to=6)
    assert set(range(5, 12)) <= set(delivered)
    assert not h.app.consumer._gap[TP("in", 0)]


# -- re-reading a partition whose commit is held back -----------------------------------


def test_commit_progress_reads_fausts_bookkeeping() -> None:
    """Lag counts only where a commit is held back: in flight or unknown is not stuck."""
    from types import SimpleNamespace

    from faust.types.tuples import TP

    held, busy, unknown, changelog = TP("in", 0), TP("in", 1), TP("in", 2), TP("log", 0)
    waiting = SimpleNamespace(tp=busy, acked=False)
    consumer = SimpleNamespace(
        app=SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda t: t == "in")),
        _unacked_messages=[waiting],
        _committed_offset={held: 5, busy: 7},
        assignment=lambda: {held, busy, unknown, changelog},
        highwater=lambda tp: 9,
    )
    committed, lag = faust_guards.commit_progress(consumer)
    assert committed == {held: 5}
    assert lag == {held: 4, busy: 0, unknown: 0}
