"""`retro produce`: send log files to ``retro.logs.raw``, one message per logical record.

Key = source name (so one source keeps its order within a partition); headers carry
the file and first line number so a dead letter can point back at the file.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaProducer

from streams.ingest.keys import raw_key
from streams.ingest.reader import iter_records, open_source
from streams.kafka.connect import aiokafka_kwargs
from streams.settings import Settings


@dataclass
class ProduceSummary:
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    per_source: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        rate = self.records / self.seconds if self.seconds else 0.0
        return (f"produced {self.records} records ({self.bytes} bytes) from "
                f"{len(self.per_source)} sources in {self.seconds:.2f}s ({rate:.0f} records/s)")


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
) -> ProduceSummary:
    """Send every logical record of ``paths``; waits until the broker has them all."""
    summary = ProduceSummary()
    producer = AIOKafkaProducer(
        **aiokafka_kwargs(settings),
        acks="all",
        enable_idempotence=True,  # broker-side dedup of producer retries
        linger_ms=20,
        max_batch_size=256 * 1024,
        compression_type="lz4" if _has_lz4() else None,
    )
    pacer = _Pacer(rate)
    pending: list[asyncio.Future] = []
    try:  # stop even when start() fails, or asyncio warns about an unclosed producer
        await producer.start()
        started = time.monotonic()
        for path in paths:
            name = source or source_name(path)
            header_file = path.encode()
            with open_source(path) as stream:
                for line_no, record in iter_records(
                        stream, max_record_bytes=settings.clean.max_record_bytes):
                    await pacer.wait()
                    fut = await producer.send(
                        settings.topics.produce_topic, value=record,
                        key=raw_key(name, summary.records, spread),
                        headers=[("retro-file", header_file),
                                 ("retro-line", str(line_no).encode())])
                    pending.append(fut)
                    summary.records += 1
                    summary.bytes += len(record)
                    summary.per_source[name] = summary.per_source.get(name, 0) + 1
                    if len(pending) >= 5000:
                        await asyncio.gather(*pending)
                        pending.clear()
                    if on_progress is not None:
                        on_progress(summary.records, len(record) + 1)
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    summary.seconds = time.monotonic() - started
    return summary


def _has_lz4() -> bool:
    try:
        import lz4  # noqa: F401
    except ImportError:
        return False
    return True


def total_bytes(paths: list[str]) -> int | None:
    """Bytes to read, for a progress bar; None when unknown (stdin)."""
    total = 0
    for path in paths:
        if path == "-":
            return None
        total += os.path.getsize(path)
    return total

