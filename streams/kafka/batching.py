"""Send many messages as one record batch per partition.

``AIOKafkaProducer.send`` costs a partitioner call, a serializer call and a delivery
future per message, which adds up over a fetch of thousands of cleaned records. The
producer's own batch API (``create_batch`` / ``send_batch``) takes
a whole batch per partition with one future. Keys are partitioned exactly as
``send`` does (the Java-compatible murmur2 default partitioner), so a key still
lands on the partition it always did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

Message = tuple[str, bytes | None, bytes]  # (topic, key, value)
KNOWN_KEYS = 10_000  # partitions remembered per key: murmur2 is pure Python in aiokafka


class BatchSender:
    """Partitions messages by key and sends each partition's run as few batches."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        self._partitioner = DefaultPartitioner()
        self._partitions: dict[str, list[int]] = {}
        self._known: dict[tuple[str, bytes], int] = {}

    async def _partitions_of(self, topic: str) -> list[int]:
        known = self._partitions.get(topic)
        if known is None:
            known = self._partitions[topic] = sorted(await self.producer.partitions_for(topic))
        return known

    def forget_partitions(self) -> None:
        """Read partition counts again (after a topic was given more partitions)."""
        self._partitions.clear()
        self._known.clear()

    def _partition(self, topic: str, key: bytes | None, partitions: list[int]) -> int:
        """``send``'s partition for ``key``; a keyed record's is remembered (a fetch's
        lane keys are a few sources), a record without a key gets a random one each time.
        A sender lives for one fetch, so partitions added to a topic are seen at the next."""
        if key is None:
            return self._partitioner(key, partitions, partitions)
        known = self._known.get((topic, key))
        if known is None:
            if len(self._known) >= KNOWN_KEYS:
                self._known.clear()
            known = self._known[(topic, key)] = self._partitioner(key, partitions, partitions)
        return known

    async def send(self, messages: Iterable[Message]) -> list[asyncio.Future[Any]]:
        """Queue ``messages`` (in order per partition); the delivery futures."""
        runs: dict[tuple[str, int], list[tuple[bytes | None, bytes]]] = {}
        known = self._partitions  # awaited only for a topic not seen yet
        for topic, key, value in messages:
            partitions = known.get(topic)
            if partitions is None:
                partitions = await self._partitions_of(topic)
            partition = self._partition(topic, key, partitions)
            runs.setdefault((topic, partition), []).append((key, value))
        futures: list[asyncio.Future[Any]] = []
        for (topic, partition), run in runs.items():
            batch = self.producer.create_batch()
            filled = 0
            for key, value in run:
                if batch.append(key=key, value=value, timestamp=None) is not None:
                    filled += 1
                    continue
                if filled:  # full: send it and start the next
                    futures.append(await self.producer.send_batch(batch, topic,
                                                                  partition=partition))
                    batch = self.producer.create_batch()
                    filled = 0
                    if batch.append(key=key, value=value, timestamp=None) is not None:
                        filled = 1
                        continue
                # larger than a whole batch: on its own, as send() would
                futures.append(await self.producer.send(topic, value, key=key,
                                                        partition=partition))
            if filled:
                futures.append(await self.producer.send_batch(batch, topic,
                                                              partition=partition))
        return futures
