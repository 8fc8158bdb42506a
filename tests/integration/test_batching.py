"""Batched sends on the real broker: same partitions as send(), order kept, big ones too."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from streams.kafka.batching import BatchSender

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


async def _read_all(bootstrap: str, topic: str, expect: int) -> list:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    out: list = []
    try:
        while len(out) < expect:
            batch = await consumer.getmany(timeout_ms=5000)
            if not batch:
                break
            for messages in batch.values():
                out.extend(messages)
    finally:
        await consumer.stop()
    return out


async def _scenario(bootstrap: str) -> None:
    batched, single = f"b{uuid.uuid4().hex[:8]}", f"s{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(t, 3, 1) for t in (batched, single)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_batch_size=16 * 1024,
                                max_request_size=1024 * 1024)
    await producer.start()
    try:
        messages = [(f"k{i % 7}".encode(), f"{i}:".encode() + b"x" * (i % 50)) for i in range(900)]
        messages.append((b"k1", b"big" + b"y" * 100_000))  # over a whole 16 KiB batch
        await asyncio.gather(*await BatchSender(producer).send(
            (batched, k, v) for k, v in messages))
        await asyncio.gather(*[await producer.send(single, v, key=k) for k, v in messages])
    finally:
        await producer.stop()
    got = await _read_all(bootstrap, batched, len(messages))
    want = await _read_all(bootstrap, single, len(messages))
    assert len(got) == len(want) == len(messages)
    where = {(m.key, m.value): m.partition for m in want}
    assert {(m.key, m.value): m.partition for m in got} == where  # same partition per key
    for partition in range(3):  # the order of each partition's run is kept
        assert ([m.value for m in got if m.partition == partition]
                == [m.value for m in want if m.partition == partition])


def test_batched_sends_partition_and_order_like_send(kafka_bootstrap: str) -> None:
    asyncio.run(_scenario(kafka_bootstrap))
