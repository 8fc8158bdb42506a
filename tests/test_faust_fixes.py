"""The guard that keeps faust from committing records skipped during a rebalance."""

from __future__ import annotations

from types import SimpleNamespace

from streams import faust_fixes


def test_stale_means_fetched_under_another_generation() -> None:
    assert faust_fixes.is_stale(SimpleNamespace(generation_id=1), 2)
    assert not faust_fixes.is_stale(SimpleNamespace(generation_id=2), 2)
    assert not faust_fixes.is_stale(SimpleNamespace(generation_id=None), 2)


def test_acks_of_stale_messages_are_dropped_not_committed() -> None:
    import faust.streams
    from faust.transport.consumer import Consumer

    faust_fixes.install()
    assert faust.streams._CStreamIterator is None  # the Python iterator acks via Consumer.ack
    class Message:  # hashable, like faust's
        generation_id, acked, topic, partition, offset = 1, False, "t", 0, 7

    stale = Message()
    acked: list[int] = []
    fake = SimpleNamespace(
        app=SimpleNamespace(consumer_generation_id=2),
        _unacked_messages={stale},
        _acked={"tp": acked},
    )
    assert Consumer.ack(fake, stale) is False  # type: ignore[arg-type]
    assert stale.acked and stale not in fake._unacked_messages
    assert acked == []  # nothing for the commit to move past
