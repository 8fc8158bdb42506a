"""Lag arithmetic of the worker's LagMonitor, without a broker."""

from __future__ import annotations

from aiokafka.structs import TopicPartition

from streams.kafka.lag import PartitionLag, lag_from_offsets, leader_moves, oldest_age_by_topic

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def test_lag_counts_from_the_commit_or_from_zero_without_one() -> None:
    lags = lag_from_offsets({A0: 40, A1: -1}, {A0: 100, A1: 7, B0: 0})
    assert lags == {
        A0: PartitionLag(committed=40, lag=60),
        A1: PartitionLag(committed=0, lag=7),  # -1: the group never committed here
        B0: PartitionLag(committed=0, lag=0),
    }


def test_a_commit_past_the_end_is_no_negative_lag() -> None:
    assert lag_from_offsets({A0: 120}, {A0: 100})[A0].lag == 0


def test_oldest_age_is_the_oldest_partition_of_each_topic() -> None:
    ages = oldest_age_by_topic({A0: 10_000, A1: 4_000, B0: 99_000}, now_ms=100_000)
    assert ages == {"a": 96.0, "b": 1.0}
    assert oldest_age_by_topic({A0: 200_000}, now_ms=100_000) == {"a": 0.0}  # clock skew


def test_a_leader_move_counts_once_per_partition_that_changed_leader() -> None:
    a, b, c = (TopicPartition("raw", p) for p in range(3))
    assert leader_moves({}, {a: 1, b: 2}) == 0  # first look: nothing to compare with
    assert leader_moves({a: 1, b: 2, c: 1}, {a: 2, b: 2, c: 3}) == 2
    assert leader_moves({a: 1}, {a: -1}) == 0  # leaderless for now: counted once re-led
    assert leader_moves({a: 1, b: 2}, {a: 1, b: 2}) == 0
