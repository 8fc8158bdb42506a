"""Read reports back from the compacted ``retro.reports`` topic.

The topic is the report store: the latest message per key is the current report.
`retro report`, `retro audit` and every worker's HTTP view read it this way, so any
worker can show every report no matter which worker's compactor owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError

from streams.errors import NotAuthorized
from streams.kafka.connect import aiokafka_kwargs, partitions_of, stop_consumer
from streams.report.state.keys import report_of
from streams.report.state.merge import compose
from streams.report.state.model import Report
from streams.settings import Settings

logger = logging.getLogger(__name__)


def _reader(settings: Settings) -> AIOKafkaConsumer:
    """A group-less consumer for reading topics from the start (views, audit)."""
    return AIOKafkaConsumer(**aiokafka_kwargs(settings), enable_auto_commit=False,
                            group_id=None, auto_offset_reset="earliest")


class LatestReports:
    """The latest message per report id, decoded only when someone asks for it.

    A busy report is published many times, and decoding every version as it passes
    would cost far more than the few a view reads. Only the bytes are kept until a view asks.
    """

    def __init__(self) -> None:
        self._raw: dict[str, bytes] = {}  # by compaction key ("<report id>#<share>")
        self._decoded: dict[str, Report] = {}
        self._keys: dict[str, set[str]] = {}  # report id -> its compaction keys

    def put(self, key: bytes | None, value: bytes | None) -> bool:
        """Keep a message as the latest of its id; False for tombstones and keyless ones."""
        if key is None or value is None:
            return False
        text = key.decode(errors="replace")
        self._raw[text] = value
        self._decoded.pop(text, None)
        self._keys.setdefault(report_of(text), set()).add(text)
        return True

    def _shard(self, key: str) -> Report | None:
        report = self._decoded.get(key)
        if report is not None:
            return report
        value = self._raw.get(key)
        if value is None:
            return None
        try:
            report = Report.from_json(value)
        except ValueError:
            logger.warning("skipping an unreadable report %r", key)
            return None
        self._decoded[key] = report
        return report

    def shards(self) -> dict[str, Report]:
        """Every stored report as it was published: one per compaction key."""
        return {key: r for key in list(self._raw) if (r := self._shard(key)) is not None}

    def get(self, report_id: str) -> Report | None:
        """The report composed from its shares (``streams.report.state.keys.report_of``)."""
        parts = [r for key in sorted(self._keys.get(report_id, ()))
                 if (r := self._shard(key)) is not None]
        return compose(report_id, parts) if parts else None

    def ids(self) -> list[str]:
        """The ids of the reports held, sorted (nothing is decoded)."""
        return sorted(self._keys)

    def values(self) -> list[Report]:
        return [r for rid in sorted(self._keys) if (r := self.get(rid)) is not None]

    def as_dict(self) -> dict[str, Report]:
        return {r.id: r for r in self.values()}

    def __len__(self) -> int:
        return len(self._raw)


async def readable_partitions(consumer: Any, topic: str) -> list[int]:
    """Partition ids of ``topic`` ([] when it does not exist); raises NotAuthorized when
    the broker refuses this user the topic, which a listing of every topic shows as
    missing, so a reader would say "nothing there" instead of "not allowed"."""
    known = await partitions_of(consumer, topic)
    if known:
        return known
    from aiokafka.protocol.metadata import MetadataRequest

    client = consumer._client
    node = client.get_random_node()
    if node is None:
        return []
    answer = await client.send(node, MetadataRequest([topic], allow_auto_topic_creation=False))
    if any(t[1] == topic and t[0] == TopicAuthorizationFailedError.errno
           for t in answer.topics):
        raise not_authorized(topic)
    return []


def not_authorized(topic: str) -> NotAuthorized:
    return NotAuthorized(f"this Kafka user is not authorized to read {topic} "
                         "(deploy/kafkausers.yaml says which user may)")


class _Refusals(logging.Filter):
    def __init__(self, topic: str) -> None:
        super().__init__()
        self.topic = topic

    def filter(self, record: logging.LogRecord) -> bool:
        return f"Not authorized to read from topic {self.topic}." != record.getMessage()


@contextlib.contextmanager
def refusals_raised(topic: str) -> Iterator[None]:
    """While reading ``topic``: a fetch the broker refuses raises NotAuthorized, one
    line, instead of the client's own error after its warning on every fetch."""
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    quiet = _Refusals(topic)
    fetcher.addFilter(quiet)
    try:
        yield
    except TopicAuthorizationFailedError:
        raise not_authorized(topic) from None
    finally:
        fetcher.removeFilter(quiet)


async def read_messages(settings: Settings, topic: str, partitions: set[int] | None = None
                        ) -> AsyncIterator[ConsumerRecord]:
    """Every message of a topic (or of these ``partitions`` of it) from the beginning up
    to its current end; NotAuthorized when this user may not read it."""
    consumer = _reader(settings)
    try:  # a failed start() must still stop the consumer, or asyncio warns "Unclosed"
        await consumer.start()
        tps = [TopicPartition(topic, p) for p in await readable_partitions(consumer, topic)
               if partitions is None or p in partitions]
        if not tps:
            return
        with refusals_raised(topic):
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
                        yield message
                    if await consumer.position(tp) >= ends[tp]:
                        remaining.discard(tp)
    finally:
        await stop_consumer(consumer)


async def read_topic(settings: Settings, topic: str) -> AsyncIterator[tuple[bytes | None, bytes]]:
    """Every (key, value) of a topic from the beginning up to its current end."""
    async for message in read_messages(settings, topic):
        yield message.key, message.value


async def read_latest(settings: Settings) -> LatestReports:
    """The latest message per compaction key of the reports topic."""
    latest = LatestReports()
    async for key, value in read_topic(settings, settings.topics.reports):
        latest.put(key, value)
    return latest


async def read_reports(settings: Settings) -> dict[str, Report]:
    """Latest report per id, composed from its shares."""
    return (await read_latest(settings)).as_dict()


class ReportFollower:
    """Keeps the latest reports in memory by following the topic (for HTTP views)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.reports = LatestReports()
        self.changed = asyncio.Event()
        # set once every version there was at the start has been read: before, a report
        # may lack shares (the notifier waits for it)
        self.caught_up = asyncio.Event()

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
        try:
            await consumer.start()
            partitions = await partitions_of(consumer, topic)
            while not partitions:
                await asyncio.sleep(2)
                partitions = await partitions_of(consumer, topic)
            tps = [TopicPartition(topic, p) for p in partitions]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            while True:
                batch = await consumer.getmany(timeout_ms=1000)
                for messages in batch.values():
                    for message in messages:
                        if self.reports.put(message.key, message.value):
                            self.changed.set()
                if not self.caught_up.is_set() and all(
                        [await consumer.position(tp) >= ends[tp] for tp in tps]):
                    self.caught_up.set()
        finally:
            await stop_consumer(consumer)
