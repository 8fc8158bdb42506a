"""Reading Kafka outside the stage loops, in one place.

Every command that reads a topic (report, audit, deadletter, review and its re-drive),
the loops that load their state on assignment (the compactor's reports, the
notifier's ledgers), the worker's follower of the reports and the re-drive loop read
through these:

- :meth:`Reader.messages` / :func:`read_messages`: a topic, or some of its
  partitions, from the beginning up to its current end (:func:`read_topic`: its keys
  and values; :func:`read_values`: its values parsed, the unreadable counted);
- :meth:`Reader.at`: the messages at given coordinates (``topic/partition`` ->
  offsets), which the re-drive reads again;
- :func:`latest_per_key` / :class:`LatestPerKey`: the latest message of each key of a
  compacted topic, all of them or those of the partitions a loop owns;
- :func:`follow`: a topic read from its beginning and then as it grows;
- :class:`Metadata`: a topic's partitions, asked with aiokafka's public client.

Each reader is a consumer outside any group. A broker that refuses this user a topic
is never taken for an empty topic: a user who may not even describe it is told so by
the metadata answer (a listing of every topic shows it as missing); one who may
describe it but not read it by the first fetch, which is made even when the topic is
empty. Both raise NotAuthorized, which the command line prints as one line (exit 77).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.protocol.metadata import MetadataRequest

from streams.errors import NotAuthorized
from streams.intervals import Coverage, split_message_key
from streams.kafka.connect import FETCH_WAIT_MS, aiokafka_kwargs, stop_consumer
from streams.settings import Settings

logger = logging.getLogger(__name__)
T = TypeVar("T")

POLL_MS = 200  # one wait for records; an empty fetch answer does not end it earlier
AT_FETCH_TIMEOUT_MS = 2000  # offsets not fetched within this long are skipped
FOLLOW_RETRY_SECONDS = 5.0


def not_authorized(topic: str) -> NotAuthorized:
    return NotAuthorized(f"this Kafka user is not authorized to read {topic} "
                         "(deploy/kafkausers.yaml says which user may)")


class _FetchRefusals(logging.Filter):
    """Drops the warning aiokafka's fetcher logs on every refused fetch of one topic."""

    def __init__(self, topic: str) -> None:
        super().__init__()
        self.message = f"Not authorized to read from topic {topic}."

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != self.message


@contextlib.contextmanager
def refusals_raised(topic: str) -> Iterator[None]:
    """While reading ``topic``: the broker refusing a fetch or an offset request raises
    NotAuthorized, one line, instead of the client's error after its warning on every
    fetch."""
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    quiet = _FetchRefusals(topic)
    fetcher.addFilter(quiet)
    try:
        yield
    except (TopicAuthorizationFailedError, GroupAuthorizationFailedError) as exc:
        raise not_authorized(topic) from exc
    finally:
        fetcher.removeFilter(quiet)


class Metadata:
    """What the cluster says of its topics, asked with aiokafka's public client (a
    connection of its own, opened by ``async with``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._client: AIOKafkaClient | None = None

    async def __aenter__(self) -> Metadata:
        await self.start()
        return self

    async def start(self) -> None:
        client = AIOKafkaClient(**aiokafka_kwargs(self.settings))
        try:
            await client.bootstrap()
        except BaseException:
            await client.close()
            raise
        self._client = client

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    def _started(self) -> AIOKafkaClient:
        if self._client is None:
            raise RuntimeError("Metadata is used inside `async with`")
        return self._client

    async def topics(self) -> dict[str, list[int]]:
        """Every topic this user may describe, with its partition ids."""
        cluster = await self._started().fetch_all_metadata()
        return {t: sorted(cluster.partitions_for_topic(t) or ()) for t in cluster.topics()}

    async def partitions(self, topic: str) -> list[int]:
        """The partition ids of ``topic``, [] when it does not exist; NotAuthorized when
        the broker refuses this user the topic."""
        client = self._started()
        node = client.get_random_node()
        if node is None:  # a cluster that names no broker has no topic either
            return []
        answer = await client.send(node, MetadataRequest([topic],
                                                         allow_auto_topic_creation=False))
        for error, name, *_, partitions in answer.topics:
            if name != topic:
                continue
            if error == TopicAuthorizationFailedError.errno:
                raise not_authorized(topic)
            return sorted(p[1] for p in partitions) if error == 0 else []
        return []


class Reader:
    """A consumer outside any group that reads from the earliest offset, with the
    metadata it needs; opened at first use, closed by :meth:`close` (or ``async with``).
    One read at a time: each assigns the partitions it reads."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._consumer: AIOKafkaConsumer | None = None
        self._metadata: Metadata | None = None

    async def __aenter__(self) -> Reader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        metadata, self._metadata = self._metadata, None
        try:
            if consumer is not None:
                await stop_consumer(consumer)
        finally:
            if metadata is not None:
                await metadata.close()

    async def _started(self) -> tuple[AIOKafkaConsumer, Metadata]:
        if self._consumer is None or self._metadata is None:
            await self.close()
            consumer = AIOKafkaConsumer(**aiokafka_kwargs(self.settings), group_id=None,
                                        enable_auto_commit=False, auto_offset_reset="earliest",
                                        fetch_max_wait_ms=FETCH_WAIT_MS)
            self._consumer = consumer  # before start(): a failed start is stopped too
            await consumer.start()
            metadata = Metadata(self.settings)
            await metadata.start()
            self._metadata = metadata
        return self._consumer, self._metadata

    async def partitions(self, topic: str) -> list[int]:
        """:meth:`Metadata.partitions` of ``topic``."""
        _, metadata = await self._started()
        return await metadata.partitions(topic)

    async def topics(self) -> dict[str, list[int]]:
        """:meth:`Metadata.topics`."""
        _, metadata = await self._started()
        return await metadata.topics()

    async def offsets(self, topic: str) -> dict[int, tuple[int, int]]:
        """Per partition of ``topic``, the first offset it holds and the one it writes
        next (its low and high watermarks); describing the topic is enough."""
        consumer, _ = await self._started()
        tps = [TopicPartition(topic, p) for p in await self.partitions(topic)]
        if not tps:
            return {}
        with refusals_raised(topic):
            begin = await consumer.beginning_offsets(tps)
            end = await consumer.end_offsets(tps)
        return {tp.partition: (begin[tp], end[tp]) for tp in tps}

    async def messages(self, topic: str, partitions: set[int] | None = None
                       ) -> AsyncIterator[ConsumerRecord]:
        """Every message of ``topic`` (or of these ``partitions`` of it) from the
        beginning up to its current end; NotAuthorized when this user may not read it,
        even when it holds nothing."""
        consumer, _ = await self._started()
        tps = [TopicPartition(topic, p) for p in await self.partitions(topic)
               if partitions is None or p in partitions]
        if not tps:
            return
        with refusals_raised(topic):
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            remaining = set(tps)
            while remaining:
                batch = await consumer.getmany(*remaining, timeout_ms=POLL_MS)
                for messages in batch.values():
                    for message in messages:
                        yield message
                for tp in list(remaining):
                    # done once the broker answered a fetch (it would have refused one
                    # this user may not make) and nothing before the end is left
                    if consumer.highwater(tp) is not None \
                            and await consumer.position(tp) >= ends[tp]:
                        remaining.discard(tp)

    async def at(self, covered: Coverage) -> list[ConsumerRecord]:
        """The messages at ``covered`` (``topic/partition`` -> offset ranges), in order;
        a message carrying many records (``topic/partition@offset:count``) is read whole.

        Offsets no longer on the topic (retention) are skipped with a warning; a topic
        this user may not read raises NotAuthorized.
        """
        out: list[ConsumerRecord] = []
        messages: dict[str, list[list[int]]] = {}
        for key, ranges in covered.to_json().items():
            split = split_message_key(key)
            if split is None:
                messages.setdefault(key, []).extend(ranges)
            else:
                messages.setdefault(split[0], []).append([split[1], split[1]])
        known: dict[str, list[int]] = {}
        for part, ranges in Coverage.from_json(messages).to_json().items():
            topic, _, partition = part.rpartition("/")
            if topic not in known:  # a refused topic would only time out below
                known[topic] = await self.partitions(topic)
            if int(partition) not in known[topic]:
                logger.warning("%s[%s] does not exist; offsets %s could not be read again",
                               topic, partition, ranges)
                continue
            with refusals_raised(topic):
                out.extend(await self._ranges(TopicPartition(topic, int(partition)), ranges))
        return out

    async def _ranges(self, tp: TopicPartition, ranges: list[list[int]]
                      ) -> list[ConsumerRecord]:
        """The messages of one partition at inclusive offset ``ranges``, in order."""
        consumer, _ = await self._started()
        out: list[ConsumerRecord] = []
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        for first, last in ranges:
            last = min(last, end - 1)
            if first > last:
                continue
            consumer.seek(tp, first)
            position = first
            while position <= last:
                batch = await consumer.getmany(tp, timeout_ms=AT_FETCH_TIMEOUT_MS)
                fetched = batch.get(tp, [])
                if not fetched:
                    logger.warning("%s[%s]: offsets %s-%s could not be read again; skipped",
                                   tp.topic, tp.partition, position, last)
                    break
                out.extend(m for m in fetched if first <= m.offset <= last)
                position = fetched[-1].offset + 1
        return out


async def read_messages(settings: Settings, topic: str, partitions: set[int] | None = None
                        ) -> AsyncIterator[ConsumerRecord]:
    """:meth:`Reader.messages` with a reader of its own."""
    async with Reader(settings) as reader:
        async for message in reader.messages(topic, partitions):
            yield message


async def read_values(settings: Settings, topic: str, parse: Callable[[bytes], T]
                      ) -> tuple[list[tuple[T, int]], int]:
    """Every value of ``topic`` that ``parse`` reads, with its write time (ms), and how
    many it could not (``parse`` raised ValueError: a pydantic ValidationError is one)."""
    values: list[tuple[T, int]] = []
    unreadable = 0
    async for message in read_messages(settings, topic):
        try:
            values.append((parse(message.value or b""), message.timestamp))
        except ValueError:
            unreadable += 1
    return values, unreadable


async def read_topic(settings: Settings, topic: str) -> AsyncIterator[tuple[bytes | None, bytes]]:
    """Every (key, value) of a topic from the beginning up to its current end."""
    async for message in read_messages(settings, topic):
        yield message.key, message.value


async def latest_per_key(settings: Settings, topic: str, partitions: set[int] | None = None
                         ) -> dict[bytes, ConsumerRecord]:
    """The latest message of each key of a compacted topic (or of these ``partitions``
    of it), read to its current end; a tombstone is the latest message of its key too."""
    latest: dict[bytes, ConsumerRecord] = {}
    async for message in read_messages(settings, topic, partitions):
        if message.key is not None:
            latest[message.key] = message
    return latest


_PARTITIONER = DefaultPartitioner()


def partition_of(key: bytes, count: int) -> int:
    """The partition the producer writes ``key`` to on a topic of ``count`` partitions."""
    partitions = list(range(count))
    return int(_PARTITIONER(key, partitions, partitions))


class LatestPerKey:
    """The latest value of each key on given partitions of a compacted topic: the state
    a loop loads for the partitions it is assigned.

    With ``homes``, a key belongs to the partition it has on that other topic (the
    compactor owns partitions of the fragments topic and keeps the reports of their
    keys); the topic is then read whole unless both have as many partitions, which puts
    a key on the same partition of each.
    """

    def __init__(self, settings: Settings, topic: str, *, homes: str | None = None) -> None:
        self.settings = settings
        self.topic = topic
        self.homes = homes

    async def read(self, partitions: set[int]) -> list[tuple[str, bytes | None, int]]:
        """(key, latest value or None for a tombstone, partition) of every key of
        ``partitions``."""
        if self.homes is None:
            latest = await latest_per_key(self.settings, self.topic, partitions)
            return [(key.decode(), m.value, m.partition) for key, m in latest.items()]
        async with Metadata(self.settings) as metadata:
            count = len(await metadata.partitions(self.homes))
            alike = count == len(await metadata.partitions(self.topic))
        latest = await latest_per_key(self.settings, self.topic, partitions if alike else None)
        homes = {key: partition_of(key, count) for key in latest}
        return [(key.decode(), m.value, homes[key]) for key, m in latest.items()
                if homes[key] in partitions]


async def follow(settings: Settings, topic: str, take: Callable[[ConsumerRecord], Any],
                 caught_up: asyncio.Event | None = None) -> None:
    """Read ``topic`` from its beginning and on as it grows, handing each message to
    ``take``; ``caught_up`` is set once every message there was at the start has been
    handed over. Waits for the topic to exist, outlives broker hiccups (a failure is
    logged and the topic read again from the start), and runs until cancelled."""
    while True:
        try:
            async with Reader(settings) as reader:
                await _follow(reader, topic, take, caught_up)
        except asyncio.CancelledError:
            raise
        except Exception:  # a view must outlive a broker hiccup
            logger.exception("following %s failed; retrying in %.0fs", topic,
                             FOLLOW_RETRY_SECONDS)
            await asyncio.sleep(FOLLOW_RETRY_SECONDS)


async def _follow(reader: Reader, topic: str, take: Callable[[ConsumerRecord], Any],
                  caught_up: asyncio.Event | None) -> None:
    partitions = await reader.partitions(topic)
    while not partitions:
        await asyncio.sleep(2)
        partitions = await reader.partitions(topic)
    consumer, _ = await reader._started()
    tps = [TopicPartition(topic, p) for p in partitions]
    with refusals_raised(topic):
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        while True:
            batch = await consumer.getmany(timeout_ms=1000)
            for messages in batch.values():
                for message in messages:
                    take(message)
            if caught_up is not None and not caught_up.is_set() and all(
                    [await consumer.position(tp) >= ends[tp] for tp in tps]):
                caught_up.set()
