"""What the workers and `retro produce` send reaches the broker's disk compressed as
``RETRO_KAFKA__COMPRESSION`` says, and reads back whole: a shipper's batches may come
in any of Kafka's codecs, and the stage loops read them with the same client."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streams.kafka.connect import stage_producer
from streams.kafka.readers import read_topic
from streams.kafka.topics import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# log lines as services write them: the same words, a counter and an id that change
LINES = [f"2026-11-28T10:{i // 60 % 60:02d}:{i % 60:02d}Z INFO checkout-api request {i} "
         f"served in {i % 97} ms for tenant acme trace {i * 7919:016x}".encode()
         for i in range(3000)]


def on_disk(log_dir: Path, topic: str) -> int:
    """Bytes of ``topic``'s log segments, summed over its partitions."""
    return sum(f.stat().st_size for part in log_dir.glob(f"{topic}-*")
               for f in part.glob("*.log"))


async def values(settings, topic: str) -> list[bytes]:
    return [v async for _k, v in read_topic(settings, topic)]


@pytest.mark.parametrize("codec, at_most", [("lz4", 0.5), ("zstd", 0.5), ("snappy", 0.5),
                                            ("gzip", 0.5), ("none", None)])
def test_produce_sends_batches_compressed_as_set(pipeline_factory, kafka_log_dir: Path,
                                                 tmp_path: Path, codec: str,
                                                 at_most: float | None) -> None:
    p = pipeline_factory(RETRO_KAFKA__COMPRESSION=codec)
    log = tmp_path / "app.log"
    log.write_bytes(b"\n".join(LINES) + b"\n")
    proc = p.retro("produce", "--quiet", str(log))
    assert "delivered 3000, failed 0" in proc.stderr.decode(), proc.stderr.decode()

    settings = p.settings()
    assert sorted(asyncio.run(values(settings, settings.topics.raw))) == sorted(LINES)
    sent = sum(map(len, LINES))
    stored = on_disk(kafka_log_dir, settings.topics.raw)
    if at_most is None:
        assert stored > sent  # each record's own framing on top of its bytes
    else:
        assert stored < at_most * sent, (stored, sent)


def test_the_stage_producer_compresses_what_a_worker_sends(pipeline_factory,
                                                          kafka_log_dir: Path) -> None:
    settings = pipeline_factory().settings()
    assert settings.kafka.compression == "zstd"  # the default

    async def send() -> list[bytes]:
        await ensure_topics(settings)
        producer = stage_producer(settings)
        await producer.start()
        try:
            await asyncio.gather(*[await producer.send(settings.topics.fast, line, key=b"k")
                                   for line in LINES])
        finally:
            await producer.stop()
        return await values(settings, settings.topics.fast)

    assert asyncio.run(send()) == LINES
    assert on_disk(kafka_log_dir, settings.topics.fast) < 0.5 * sum(map(len, LINES))
