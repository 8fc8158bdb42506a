"""The clean loop counts dead letters and routed records once they are delivered.

Counting when a record was cleaned counted every attempt: a fetch read again after a
failed delivery showed 9 dead letters where the topic held 4.
"""

from __future__ import annotations

import asyncio

from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError

from streams.agents.clean import CleanLoop
from streams.clean.cleaner import Cleaner
from streams.metrics import Metrics
from streams.settings import CleanSettings, Settings
from tests.helpers import BatchApiProducer, FakeBatch


class Message:
    def __init__(self, offset: int, value: bytes) -> None:
        self.topic, self.partition, self.offset = "raw", 0, offset
        self.key, self.value, self.timestamp = b"app", value, 1_764_000_000_000


class OneOutageProducer(BatchApiProducer):
    """Fails every send of the first fetch (a broker restart), delivers afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.delivered: list[tuple[str, bytes]] = []
        self.failing = True

    def deliver(self, batch: FakeBatch, topic: str, partition: int) -> Exception | None:
        if self.failing:
            return KafkaTimeoutError()
        self.delivered += [(topic, value) for _, value in batch]
        return None


class Consumer:
    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.seeks: list[int] = []
        self.commits: list[dict] = []

    def assignment(self) -> set[TopicPartition]:
        return {self.tp}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append(offset)

    async def commit(self, offsets: dict) -> None:
        self.commits.append(offsets)


def test_a_fetch_read_again_after_a_failed_delivery_counts_its_dead_letters_once(
        monkeypatch) -> None:
    import streams.agents.clean as clean

    monkeypatch.setattr(clean, "RETRY_SECONDS", 0.0)
    settings = Settings(clean=CleanSettings(max_record_bytes=100))
    metrics = Metrics()
    loop = CleanLoop(settings, Cleaner.from_settings(settings), metrics, group="g-raw")
    tp = TopicPartition("raw", 0)
    fetched = {tp: [Message(0, b"2026-11-28T10:00:00Z INFO ok"), Message(1, b"x" * 500),
                    Message(2, b"y" * 500)]}
    consumer, producer = Consumer(tp), OneOutageProducer()

    def count(name: str, labels: dict[str, str]) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    asyncio.run(loop._handle(consumer, producer, fetched))
    assert consumer.seeks == [0] and consumer.commits == []
    assert count("retro_deadletter_total", {"stage": "clean", "reason": "too_large"}) == 0
    producer.failing = False
    asyncio.run(loop._handle(consumer, producer, fetched))
    dead = [v for t, v in producer.delivered if t == settings.topics.deadletter]
    assert len(dead) == 2
    assert count("retro_deadletter_total", {"stage": "clean", "reason": "too_large"}) == 2
    assert count("retro_records_routed_total", {"lane": "deadletter"}) == 2
    assert count("retro_records_routed_total", {"lane": "fast"}) == 1
    assert consumer.commits == [{tp: 3}]
