"""`retro produce`: send log files to ``retro.logs.raw``, one message per logical record.

Key = source name (so one source keeps its order within a partition); headers carry
the file and first line number so a dead letter can point back at the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from streams.ingest.raw_keys import raw_key
from streams.ingest.reader import RawRecord, iter_raw_records, open_source
from streams.kafka.connect import aiokafka_kwargs, compression_type
from streams.kafka.limits import RECORD_OVERHEAD_BYTES, topic_max_message_bytes, value_limit
from streams.records import DeadLetter, RawCoord
from streams.settings import Settings

logger = logging.getLogger(__name__)


@dataclass
class ProduceSummary:
    """What a run sent, what the broker confirmed, and what it could not take."""

    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    per_source: dict[str, int] = field(default_factory=dict)
    delivered: int = 0  # records the broker confirmed (raw topic or, if too large, dead letter)
    failed: int = 0  # records that never reached the broker, even after retries
    too_large: int = 0  # records over the raw topic's limit: dead-lettered, not sent
    limit: int = 0  # the raw topic's max.message.bytes
    stopped_at: str = ""  # "path:line" where reading stopped because Kafka was gone

    @property
    def ok(self) -> bool:
        return self.failed == 0 and not self.stopped_at

    def line(self) -> str:
        rate = self.records / self.seconds if self.seconds else 0.0
        text = (f"produced {self.records} records ({self.bytes} bytes) from "
                f"{len(self.per_source)} sources in {self.seconds:.2f}s ({rate:.0f} records/s); "
                f"delivered {self.delivered}, failed {self.failed}")
        if self.stopped_at:
            text += f"; stopped reading at {self.stopped_at} (Kafka took nothing)"
        if self.too_large:
            text += (f"; {self.too_large} over the raw topic's {self.limit}-byte message "
                     "limit, recorded as dead letters (stage produce, reason too_large)")
        return text


def source_name(path: str) -> str:
    """The key for a path: its file name without log/gz suffixes ("-" is "stdin")."""
    if path == "-":
        return "stdin"
    name = Path(path).name
    for suffix in (".gz", ".log", ".json", ".txt"):
        name = name.removesuffix(suffix)
    return name or "unknown"


class _Pacer:
    """Keeps the send rate at or under ``rate`` records/s without busy waiting."""

    def __init__(self, rate: float | None) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self.next_at = time.monotonic()

    async def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        if self.next_at > now:
            await asyncio.sleep(self.next_at - now)
        self.next_at = max(self.next_at, now) + self.interval


async def produce(
    paths: list[str],
    settings: Settings,
    *,
    rate: float | None = None,
    source: str | None = None,
    spread: int = 1,
    on_progress: Callable[[int, int], None] | None = None,
    redact: Callable[[str], str] | None = None,
) -> ProduceSummary:
    """Send every logical record of ``paths``; waits until the broker has them all.

    A record over the raw topic's ``max.message.bytes`` is not cut: it becomes a dead
    letter (stage ``produce``, reason ``too_large``, its size, SHA-256 and first bytes).
    ``redact`` (the clean stage's redaction) makes that letter's text sample; without
    it the letter holds no sample. Sends that fail (a broker restart) are retried for
    ``RETRO_KAFKA__DELIVERY_TIMEOUT_SECONDS``; what still fails is counted, not hidden.
    """
    summary = ProduceSummary()
    limit = await topic_max_message_bytes(settings, settings.topics.produce_topic)
    summary.limit = limit
    producer = AIOKafkaProducer(
        **aiokafka_kwargs(settings),
        acks="all",
        enable_idempotence=True,  # broker-side dedup of producer retries
        linger_ms=20,
        max_batch_size=min(256 * 1024, limit),
        max_request_size=limit + RECORD_OVERHEAD_BYTES,
        compression_type=compression_type(settings),
    )
    sender = Sender(producer, retry_seconds=settings.kafka.delivery_timeout_seconds)
    pacer = _Pacer(rate)
    sample_bytes = settings.clean.deadletter_sample_bytes
    started = time.monotonic()
    try:  # stop even when start() fails, or asyncio warns about an unclosed producer
        await producer.start()
        for path in paths:
            name = source or source_name(path)
            header_file = path.encode()
            widest_key = raw_key(name, max(0, spread - 1), spread)
            cap = value_limit(limit, key=widest_key,
                              headers=[("retro-file", header_file), ("retro-line", b"9" * 12)])
            if summary.stopped_at:
                break
            with open_source(path) as stream:
                for record in iter_raw_records(stream, max_record_bytes=cap):
                    if sender.exhausted:  # Kafka is gone: report instead of reading on
                        summary.stopped_at = f"{path}:{record.line}"
                        break
                    await pacer.wait()
                    key = raw_key(name, summary.records, spread)
                    if record.size > cap:
                        letter = oversized_letter(record, path=path, source=name, limit=limit,
                                                  sample_bytes=sample_bytes, redact=redact)
                        summary.too_large += 1
                        await sender.send(settings.topics.deadletter, letter.id.encode(),
                                          letter.model_dump_json().encode())
                    else:
                        await sender.send(
                            settings.topics.produce_topic, key, record.data,
                            headers=[("retro-file", header_file),
                                     ("retro-line", str(record.line).encode())])
                    summary.records += 1
                    summary.bytes += record.size
                    summary.per_source[name] = summary.per_source.get(name, 0) + 1
                    if sender.waiting >= 5000:
                        await sender.flush()
                    if on_progress is not None:
                        on_progress(summary.records, record.size + 1)
        await sender.flush()
    finally:
        summary.delivered, summary.failed = sender.delivered, sender.failed
        with contextlib.suppress(Exception):  # a broker that is gone must not hang the exit
            await asyncio.wait_for(producer.stop(), STOP_SECONDS)
    summary.seconds = time.monotonic() - started
    return summary


def oversized_letter(record: RawRecord, *, path: str, source: str, limit: int,
                     sample_bytes: int,
                     redact: Callable[[str], str] | None = None) -> DeadLetter:
    """The dead letter for a record the raw topic cannot take; it names its file and line.

    Its coordinate is the file (``stdin`` for -), partition 0 and the line number: the
    record never had a raw offset.
    """
    coord = RawCoord(topic="stdin" if path == "-" else path, partition=0, offset=record.line)
    if redact is not None:
        source = redact(source)
    letter = DeadLetter.of(
        record.data, sample_bytes=sample_bytes, redact=redact, id=coord.id, raw=coord,
        source=source,
        stage="produce", reason="too_large",
        detail=(f"record at line {record.line} is {record.size} bytes, over the raw topic's "
                f"{limit}-byte max.message.bytes; it was not sent (the dead letter keeps a "
                "redacted sample of its first bytes, its size and SHA-256). Split such "
                "records at the source or raise the topic's max.message.bytes"))
    # the reader kept only the first bytes: size and hash are the whole record's
    return letter.model_copy(update={"raw_size": record.size,
                                     "raw_sha256": record.sha256 or letter.raw_sha256})


STOP_SECONDS = 10.0  # the producer's own flush on stop, after ours gave up
RETRY_PAUSE_SECONDS = (1.0, 2.0, 4.0, 8.0)  # between retry rounds, then the last one
SEND_WAIT_SECONDS = 10.0  # for the client to take one record (metadata, buffer space)


@dataclass
class _Sent:
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]] | None
    future: asyncio.Future | None = None


class Sender:
    """Sends with delivery futures and retries what failed, for a bounded time.

    A broker restart fails the sends in flight; they are sent again in rounds (1, 2,
    4, 8 s apart), with one log line per round rather than one per record. Trouble
    starts at the first failed or stalled send and ends at the next delivery; once it
    has lasted ``retry_seconds`` the sender is :attr:`exhausted`: nothing waits any
    longer, what is unconfirmed counts as failed and the caller stops reading. A
    record re-sent after a timeout may reach the topic twice: Kafka may have stored
    the first copy.
    """

    def __init__(self, producer: AIOKafkaProducer, *, retry_seconds: float,
                 send_wait_seconds: float = SEND_WAIT_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.producer = producer
        self.retry_seconds = retry_seconds
        self.send_wait_seconds = send_wait_seconds
        self.clock = clock
        self.sleep = sleep
        self.pending: list[_Sent] = []
        self.delivered = 0
        self.failed = 0
        self.trouble_since: float | None = None

    @property
    def waiting(self) -> int:
        return len(self.pending)

    @property
    def exhausted(self) -> bool:
        """Kafka has taken nothing for ``retry_seconds``: stop sending, report."""
        return (self.trouble_since is not None
                and self.clock() - self.trouble_since >= self.retry_seconds)

    def _left(self) -> float | None:
        """Seconds of the retry window still open; None while there is no trouble."""
        if self.trouble_since is None:
            return None
        return max(0.0, self.trouble_since + self.retry_seconds - self.clock())

    def _trouble(self) -> None:
        if self.trouble_since is None:
            self.trouble_since = self.clock()

    def _settled(self, future: asyncio.Future) -> None:
        if future.cancelled():
            return
        if future.exception() is None:
            self.trouble_since = None  # Kafka takes records again
        else:
            self._trouble()

    async def send(self, topic: str, key: bytes, value: bytes,
                   headers: list[tuple[str, bytes]] | None = None) -> None:
        item = _Sent(topic, key, value, headers)
        await self._start(item)
        self.pending.append(item)

    async def _start(self, item: _Sent) -> None:
        left = self._left()
        wait = self.send_wait_seconds if left is None else min(left, self.send_wait_seconds)
        try:
            # send() itself waits for metadata or buffer space while the broker is away
            item.future = await asyncio.wait_for(
                self.producer.send(item.topic, item.value, key=item.key, headers=item.headers),
                timeout=wait)
        except (KafkaError, TimeoutError) as exc:  # no metadata, buffer full: not sent
            self._trouble()
            failed: asyncio.Future = asyncio.get_running_loop().create_future()
            failed.set_exception(exc if isinstance(exc, KafkaError) else KafkaError(
                f"not accepted by the client within {wait:.0f}s"))
            item.future = failed
            return
        item.future.add_done_callback(self._settled)

    async def flush(self) -> None:
        """Wait for every pending send; retry failures; count what stays undelivered.

        Once trouble started, the wait is bounded by the retry window: a round does
        not wait out the client's own request timeout again.
        """
        batch, self.pending = self.pending, []
        round_no = 0
        while batch:
            futures = [i.future for i in batch]
            await asyncio.wait(futures, timeout=self._left())  # type: ignore[arg-type]
            failed = [(i, _failure(i.future)) for i in batch]
            failed = [(i, why) for i, why in failed if why is not None]
            self.delivered += len(batch) - len(failed)
            if not failed:
                return
            self._trouble()
            reason = failed[0][1]
            if self.exhausted:
                self.failed += len(failed)
                for item, _ in failed:
                    if item.future is not None and not item.future.done():
                        item.future.cancel()  # its answer no longer counts
                logger.error("gave up on %s records: Kafka took nothing for %.0fs (last "
                             "error %s); they are not in Kafka, or not confirmed",
                             len(failed), self.retry_seconds, reason)
                return
            pause = RETRY_PAUSE_SECONDS[min(round_no, len(RETRY_PAUSE_SECONDS) - 1)]
            pause = min(pause, self._left() or 0.0)
            round_no += 1
            logger.warning("Kafka did not take %s records (%s); sending them again in %.0fs "
                           "(retry round %s; giving up after %.0fs without a delivery)",
                           len(failed), reason, pause, round_no, self.retry_seconds)
            await self.sleep(pause)
            batch = [i for i, _ in failed]
            for item in batch:
                await self._start(item)


def _failure(future: asyncio.Future | None) -> str | None:
    """Why a send is not delivered (still waiting counts), or None when it is."""
    if future is None or not future.done():
        return "no answer within the retry window"
    if future.cancelled():
        return "cancelled"
    exc = future.exception()
    return repr(exc) if exc is not None else None


def total_bytes(paths: list[str]) -> int | None:
    """Bytes to read, for a progress bar; None when unknown (stdin)."""
    total = 0
    for path in paths:
        if path == "-":
            return None
        total += os.path.getsize(path)
    return total

