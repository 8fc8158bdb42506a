"""`retro produce` on the real broker: lines are sent whole or recorded as too large."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from streams.kafka.readers import read_topic
from streams.records import DeadLetter

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def _values(settings, topic: str) -> list[bytes]:
    return [v async for _k, v in read_topic(settings, topic)]


def test_produce_sends_long_lines_whole_and_dead_letters_what_the_topic_cannot_take(
        pipeline_factory, tmp_path: Path) -> None:
    p = pipeline_factory(RETRO_KAFKA__MAX_MESSAGE_BYTES=str(1024 * 1024))
    long_line = b"2026-11-28T10:00:00Z ERROR " + bytes(range(33, 127)) * 10_600  # ~1 MB
    huge_line = b"2026-11-28T10:00:01Z ERROR " + b"h" * 2_500_000
    small = [f"2026-11-28T10:00:{i:02d}Z INFO request {i} served".encode() for i in range(20)]
    log = tmp_path / "big.log"
    log.write_bytes(b"\n".join([*small[:10], long_line, huge_line, *small[10:]]) + b"\n")

    proc = p.retro("produce", "--quiet", str(log))
    summary = proc.stderr.decode()
    assert "produced 22 records" in summary and "delivered 22, failed 0" in summary, summary
    # the raw topic takes the broker's default (1 MiB + 12): asked of the broker
    assert "1 over the raw topic's 1048588-byte message limit" in summary, summary

    settings = p.settings()
    raw = asyncio.run(_values(settings, settings.topics.raw))
    assert len(raw) == 21
    assert long_line in raw  # sent whole, not cut at 65,537 bytes
    [letter_json] = asyncio.run(_values(settings, settings.topics.deadletter))
    letter = DeadLetter.model_validate_json(letter_json)
    assert (letter.stage, letter.reason) == ("produce", "too_large")
    assert letter.raw_size == len(huge_line)
    assert letter.raw_sha256 == hashlib.sha256(huge_line).hexdigest()
    assert huge_line.decode().startswith(letter.sample) and len(letter.sample) == 16 * 1024
    assert letter.raw.as_tuple() == (str(log), 0, 12)  # file and line

    listed = json.loads(p.retro("deadletter", "--format", "json").stdout)
    assert listed["by_reason"] == {"too_large": 1}
