"""BatchSender puts a key on the partition ``send`` would, remembered or not."""

from __future__ import annotations

import asyncio
from collections import Counter

from aiokafka.partitioner import DefaultPartitioner

import streams.kafka.batching as batching
from streams.kafka.batching import BatchSender
from tests.helpers import BatchApiProducer, FakeBatch


class RecordingProducer(BatchApiProducer):
    def __init__(self, partitions: int) -> None:
        super().__init__(partitions)
        self.placed: list[tuple[str, int, bytes | None]] = []

    def deliver(self, batch: FakeBatch, topic: str, partition: int) -> None:
        self.placed += [(topic, partition, key) for key, _ in batch]


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
