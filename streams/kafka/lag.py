"""The worker's own view of consumer lag, through one long-lived admin client and consumer.

kafka-exporter (which Strimzi deploys) is the source of truth for lag, since it keeps
reporting after every worker of a group died. The worker adds what the exporter
cannot see: the age of the oldest record a group has not committed (read from the
record at the committed offset), and the committed offsets its stall detector needs.
Clients are started on first use and kept: a fresh admin client and consumer per
measurement cost two connections per broker every 15 s on every pod.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from streams.kafka.connect import aiokafka_kwargs, partition_leaders, stop_consumer
from streams.kafka.inputs import input_topics
from streams.metrics import Metrics
from streams.settings import Settings

logger = logging.getLogger(__name__)

# enough for the first record of a partition; a larger one still comes back whole
PEEK_FETCH_BYTES = 64 * 1024


@dataclass(frozen=True)
class PartitionLag:
    committed: int  # the group's committed offset (0 when it never committed)
    lag: int  # messages between the commit and the log end


def lag_from_offsets(
    committed: Mapping[TopicPartition, int | None], ends: Mapping[TopicPartition, int]
) -> dict[TopicPartition, PartitionLag]:
    """Lag per partition; a partition without a commit counts from 0 (auto reset earliest)."""
    out = {}
    for tp, end in ends.items():
        done = committed.get(tp)
        done = done if done is not None and done >= 0 else 0
        out[tp] = PartitionLag(committed=done, lag=max(0, end - done))
    return out


def oldest_age_by_topic(
    first_timestamps_ms: Mapping[TopicPartition, int], now_ms: float
) -> dict[str, float]:
    """Seconds since the oldest uncommitted record, per topic (max over its partitions)."""
    out: dict[str, float] = {}
    for tp, ts in first_timestamps_ms.items():
        age = max(0.0, (now_ms - ts) / 1000)
        out[tp.topic] = max(out.get(tp.topic, 0.0), age)
    return out


def leader_moves(before: Mapping[TopicPartition, int], now: Mapping[TopicPartition, int]) -> int:
    """Partitions led by another broker now than before (new or leaderless ones are not)."""
    return sum(1 for tp, leader in now.items()
               if leader >= 0 and before.get(tp, -1) >= 0 and before[tp] != leader)


class LagMonitor:
    """Measures lag (and the oldest uncommitted record's age) of consumer groups."""

    def __init__(self, settings: Settings, *, wall_ms: Any = None) -> None:
        self.settings = settings
        self._wall_ms = wall_ms or (lambda: time.time() * 1000)
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._leaders: dict[TopicPartition, int] = {}

    async def _clients(self) -> tuple[AIOKafkaAdminClient, AIOKafkaConsumer]:
        if self._admin is None or self._consumer is None:
            kwargs = aiokafka_kwargs(self.settings)
            admin = AIOKafkaAdminClient(**kwargs)
            consumer = AIOKafkaConsumer(
                **kwargs, group_id=None, enable_auto_commit=False,
                max_partition_fetch_bytes=PEEK_FETCH_BYTES,
            )
            await admin.start()
            try:
                await consumer.start()
            except BaseException:
                await admin.close()
                raise
            self._admin, self._consumer = admin, consumer
        return self._admin, self._consumer

    async def input_topics(self) -> list[str]:
        """The input topics the cluster has now: the listed ones and the pattern's."""
        _, consumer = await self._clients()
        return await input_topics(self.settings, consumer)

    async def lag(self, group: str, topics: list[str],
                  leaders: Mapping[tuple[str, int], int] | None = None,
                  ) -> dict[TopicPartition, PartitionLag]:
        """Committed offset and lag of ``group`` on every partition of ``topics``
        (``leaders``: their partitions as ``partition_leaders`` gave them, if at hand)."""
        admin, consumer = await self._clients()
        committed = await admin.list_consumer_group_offsets(group)
        if leaders is None:
            leaders = await partition_leaders(admin, topics)
        wanted = set(topics)
        tps = [TopicPartition(*tp) for tp in sorted(leaders) if tp[0] in wanted]
        ends = await consumer.end_offsets(tps) if tps else {}
        return lag_from_offsets({tp: m.offset for tp, m in committed.items()}, ends)

    async def oldest_ages(
        self, lags: Mapping[TopicPartition, PartitionLag], *, timeout_ms: int = 2000
    ) -> dict[str, float]:
        """Age in seconds of the oldest uncommitted record per topic; 0 for topics without lag.

        Reads one record at each lagging partition's committed offset. A partition
        whose record is not fetched in time (or was deleted by retention) is skipped.
        """
        ages = {tp.topic: 0.0 for tp in lags}
        behind = {tp: pl.committed for tp, pl in lags.items() if pl.lag > 0}
        if not behind:
            return ages
        _, consumer = await self._clients()
        consumer.assign(list(behind))
        for tp, offset in behind.items():
            consumer.seek(tp, offset)
        first: dict[TopicPartition, int] = {}
        batches = await consumer.getmany(*behind, timeout_ms=timeout_ms)
        for tp, records in batches.items():
            if records and records[0].timestamp is not None:
                first[tp] = records[0].timestamp
        ages.update(oldest_age_by_topic(first, self._wall_ms()))
        return ages

    async def publish(
        self, groups: Mapping[str, list[str]], metrics: Metrics
    ) -> dict[tuple[str, int], tuple[int, int]]:
        """Measure every group on its topics into ``metrics``; (committed, lag) by
        (topic, partition) for the stall detector."""
        offsets: dict[tuple[str, int], tuple[int, int]] = {}
        admin, _ = await self._clients()  # one metadata request for every group's topics
        leaders = await partition_leaders(admin, [t for ts in groups.values() for t in ts])
        for gid, topics in groups.items():
            lags = await self.lag(gid, topics, leaders)
            for tp, pl in lags.items():
                labels = (gid, tp.topic, str(tp.partition))
                metrics.consumer_lag.labels(*labels).set(pl.lag)
                metrics.committed_offset.labels(*labels).set(pl.committed)
                offsets[(tp.topic, tp.partition)] = (pl.committed, pl.lag)
            for topic, age in (await self.oldest_ages(lags)).items():
                metrics.oldest_age.labels(gid, topic).set(age)
            metrics.leader_changes.inc(self._leader_moves(lags, leaders))
        return offsets

    def _leader_moves(self, tps: Iterable[TopicPartition],
                      leaders: Mapping[tuple[str, int], int]) -> int:
        """Leader moves since the last measurement, from fresh metadata of all topics
        (the consumer's own only refreshes the topics it last used)."""
        now = {tp: leaders.get((tp.topic, tp.partition), -1) for tp in tps}
        moved = leader_moves(self._leaders, now)
        self._leaders.update({tp: leader for tp, leader in now.items() if leader >= 0})
        return moved

    async def close(self) -> None:
        if self._consumer is not None:
            await stop_consumer(self._consumer)
        if self._admin is not None:
            await self._admin.close()
        self._admin = self._consumer = None
