"""The worker's LagMonitor on the real broker: lag, committed offsets and the age of
the oldest uncommitted record, measured again and again through one pair of clients."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import GroupCoordinatorNotAvailableError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from streams.kafka.lag import LagMonitor
from streams.metrics import Metrics
from streams.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def _scenario(bootstrap: str) -> None:
    topic, group = f"lag-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    settings = Settings(kafka={"bootstrap": bootstrap})
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    await admin.close()
    now_ms = int(time.time() * 1000)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    for i in range(5):  # partition 0: records stamped 100 s, 99 s, ... ago
        stamp = now_ms - (100 - i) * 1000
        await producer.send_and_wait(topic, b"x", partition=0, timestamp_ms=stamp)
    await producer.send_and_wait(topic, b"y", partition=1, timestamp_ms=now_ms - 5000)
    await producer.stop()

    monitor = LagMonitor(settings, wall_ms=lambda: now_ms)
    metrics = Metrics()
    try:
        for _ in range(60):  # a fresh broker creates __consumer_offsets on first use
            try:
                lags = await monitor.lag(group, [topic])
                break
            except GroupCoordinatorNotAvailableError:
                await asyncio.sleep(0.5)
        assert {tp.partition: (pl.committed, pl.lag) for tp, pl in lags.items()} == {
            0: (0, 5), 1: (0, 1)}
        assert await monitor.oldest_ages(lags) == {topic: pytest.approx(100.0)}
        clients = (monitor._admin, monitor._consumer)

        committer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                     enable_auto_commit=False)
        await committer.start()
        committer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        await committer.commit({TopicPartition(topic, 0): OffsetAndMetadata(3, ""),
                                TopicPartition(topic, 1): OffsetAndMetadata(1, "")})
        await committer.stop()

        offsets = await monitor.publish({group: [topic]}, metrics)
        assert offsets == {(topic, 0): (3, 2), (topic, 1): (1, 0)}
        assert (monitor._admin, monitor._consumer) == clients  # the same two clients
        lag0 = metrics.consumer_lag.labels(group, topic, "0")._value.get()
        age = metrics.oldest_age.labels(group, topic)._value.get()
        assert lag0 == 2 and metrics.committed_offset.labels(group, topic, "0")._value.get() == 3
        assert age == pytest.approx(97.0)  # the record at offset 3 is 97 s old
    finally:
        await monitor.close()


def test_lag_and_oldest_age_through_long_lived_clients(kafka_bootstrap: str) -> None:
    asyncio.run(_scenario(kafka_bootstrap))
