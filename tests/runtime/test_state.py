"""PartitionedState: keys of arriving partitions are read, of leaving ones forgotten,
of kept ones left alone; a failed read leaves the new partitions unloaded."""

from __future__ import annotations

import asyncio

import pytest

from streams.runtime.state import PartitionedState

TOPIC = {"a": (b"1", 0), "b": (b"2", 1), "c": (None, 1)}  # c: a tombstone


async def read(partitions: set[int]) -> list[tuple[str, bytes | None, int]]:
    return [(k, v, p) for k, (v, p) in TOPIC.items() if p in partitions]


def test_arriving_partitions_are_read_and_leaving_ones_forgotten() -> None:
    state: PartitionedState[int] = PartitionedState()

    async def scenario() -> None:
        assert await state.assign({0}, read, int) == {0}
        state.put("a", 5, 0)  # merged on since
        assert await state.assign({0, 1}, read, int) == {1}  # 0 is kept, not read again
        assert state.values == {"a": 5, "b": 2} and state.keys_in({1}) == 1
        assert await state.assign({1}, read, int) == set()
        assert state.values == {"b": 2} and state.loaded == {1}

    asyncio.run(scenario())


def test_a_failed_read_leaves_the_new_partitions_unloaded() -> None:
    state: PartitionedState[int] = PartitionedState()

    async def fails(partitions: set[int]) -> list[tuple[str, bytes | None, int]]:
        raise ConnectionError("the broker went away")

    async def scenario() -> None:
        await state.assign({0}, read, int)
        with pytest.raises(ConnectionError):
            await state.assign({0, 1}, fails, int)
        assert state.loaded == {0} and state.values == {"a": 1}

    asyncio.run(scenario())
