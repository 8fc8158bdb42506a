"""Read reports back from the compacted ``retro.reports`` topic.

The topic is the report store: the latest message per key is the current report.
`retro report`, `retro audit` and every worker's HTTP view read it this way, so any
worker can show every report no matter which worker's compactor owns it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.kafka.connect import aiokafka_kwargs, partitions_of, stop_consumer
from streams.report.model import Report
from streams.settings import Settings

logger = logging.getLogger(__name__)


def _reader(settings: Settings) -> AIOKafkaConsumer:
    """A group-less consumer for reading topics from the start (views, audit)."""
    return AIOKafkaConsumer(**aiokafka_kwargs(settings), enable_auto_commit=False,
                            group_id=None, auto_offset_reset="earliest")


def _keep_report(reports: dict[str, Report], key: bytes | None, value: bytes | None) -> bool:
    """Store the report in a message under its id; False for tombstones and junk."""
    if key is None or value is None:
        return False
    try:
        reports[key.decode()] = Report.from_json(value)
    except ValueError:
        logger.warning("skipping an unreadable report %r", key)
        return False
    return True


async def read_topic(settings: Settings, topic: str) -> AsyncIterator[tuple[bytes | None, bytes]]:
    """Every (key, value) of a topic from the beginning up to its current end."""
    consumer = _reader(settings)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in await partitions_of(consumer, topic)]
        if not tps:
            return
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        for tp in tps:
            if ends[tp] > 0 and await consumer.position(tp) >= ends[tp]:
                remaining.discard(tp)
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=1000)
            for tp, messages in batch.items():
                for message in messages:
                    yield message.key, message.value
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
    finally:
        await stop_consumer(consumer)


async def read_reports(settings: Settings) -> dict[str, Report]:
    """Latest report per id."""
    reports: dict[str, Report] = {}
    async for key, value in read_topic(settings, settings.topics.reports):
        _keep_report(reports, key, value)
    return reports


class ReportFollower:
    """Keeps the latest reports in memory by following the topic (for HTTP views)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.reports: dict[str, Report] = {}
        self.changed = asyncio.Event()

    async def run(self) -> None:
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception:  # the view must outlive a broker hiccup
                logger.exception("following %s failed; retrying in 5s",
                                 self.settings.topics.reports)
                await asyncio.sleep(5)

    async def _follow(self) -> None:
        topic = self.settings.topics.reports
        consumer = _reader(self.settings)
        await consumer.start()
        try:
            partitions = await partitions_of(consumer, topic)
            while not partitions:
                await asyncio.sleep(2)
                partitions = await partitions_of(consumer, topic)
            tps = [TopicPartition(topic, p) for p in partitions]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            while True:
                batch = await consumer.getmany(timeout_ms=1000)
                for messages in batch.values():
                    for message in messages:
                        if _keep_report(self.reports, message.key, message.value):
                            self.changed.set()
        finally:
            await stop_consumer(consumer)
