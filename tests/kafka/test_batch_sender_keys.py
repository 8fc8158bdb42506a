"""BatchSender puts a key on the partition ``send`` would, remembered or not."""

from __future__ import annotations

import asyncio
from collections import Counter

from aiokafka.partitioner import DefaultPartitioner

import streams.kafka.batching as batching
from streams.kafka.batching import BatchSender


class RecordingProducer:
    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.placed: list[tuple[str, int, bytes | None]] = []

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.partitions))

    def create_batch(self) -> list:
        return _Batch()

    async def send_batch(self, batch: list, topic: str, *, partition: int) -> asyncio.Future:
        self.placed += [(topic, partition, key) for key, _ in batch]
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


class _Batch(list):
    def append(self, *, key: bytes | None, value: bytes, timestamp: None) -> bool:
        super().append((key, value))
        return True


def test_keys_land_where_the_default_partitioner_puts_them_past_the_remembered_limit(
        monkeypatch) -> None:
    monkeypatch.setattr(batching, "KNOWN_KEYS", 5)
    producer = RecordingProducer(partitions=7)
    sender = BatchSender(producer)  # type: ignore[arg-type]
    keys = [f"source-{i % 13}".encode() for i in range(60)]  # repeats, more than 5 distinct

    async def send() -> None:
        await sender.send(("lane", key, b"v") for key in keys)

    asyncio.run(send())
    expected = DefaultPartitioner()
    all_partitions = list(range(7))
    assert Counter(producer.placed) == Counter(
        ("lane", expected(k, all_partitions, all_partitions), k) for k in keys)
    assert len(sender._known) <= 5
