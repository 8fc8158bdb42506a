"""`retro produce` without a broker: oversized records, retried sends, the summary."""

from __future__ import annotations

import asyncio
import hashlib
import io

from aiokafka.errors import KafkaTimeoutError

from streams.ingest.produce import ProduceSummary, Sender, oversized_letter
from streams.ingest.reader import iter_raw_records
from streams.kafka.limits import value_limit
from streams.records import DeadLetter

from helpers import FakeClock


class FlakyProducer:
    """Fails the first ``failures`` sends (as a restarting broker does), then delivers.

    ``refuse_send`` makes ``send`` itself raise, as it does while no metadata is known.
    """

    def __init__(self, failures: int, *, refuse_send: bool = False) -> None:
        self.failures = failures
        self.refuse_send = refuse_send
        self.log: list[bytes] = []

    async def send(self, topic: str, value: bytes, *, key: bytes, headers=None):
        fut = asyncio.get_running_loop().create_future()
        if self.failures > 0:
            self.failures -= 1
            if self.refuse_send:
                raise KafkaTimeoutError()
            fut.set_exception(KafkaTimeoutError())
        else:
            self.log.append(value)
            fut.set_result(None)
        return fut


def test_sends_that_fail_during_a_restart_are_sent_again_and_counted_once() -> None:
    clock = FakeClock()
    producer = FlakyProducer(failures=7)
    sender = Sender(producer, retry_seconds=60, clock=clock, sleep=clock.sleep)

    async def run() -> None:
        for i in range(5):
            await sender.send("raw", b"k", b"v%d" % i)
        await sender.flush()

    asyncio.run(run())
    assert (sender.delivered, sender.failed) == (5, 0)
    assert sorted(producer.log) == [b"v0", b"v1", b"v2", b"v3", b"v4"]
    assert clock.slept == [1.0, 2.0]  # two retry rounds: 5 failed, then 2


def test_a_send_refused_before_it_is_queued_is_retried_too() -> None:
    clock = FakeClock()
    producer = FlakyProducer(failures=2, refuse_send=True)
    sender = Sender(producer, retry_seconds=60, clock=clock, sleep=clock.sleep)

    async def run() -> None:
        for i in range(3):
            await sender.send("raw", b"k", b"v%d" % i)
        await sender.flush()

    asyncio.run(run())
    assert (sender.delivered, sender.failed) == (3, 0)


def test_what_never_gets_through_is_counted_as_failed_within_the_bound() -> None:
    clock = FakeClock()
    producer = FlakyProducer(failures=10**9)
    sender = Sender(producer, retry_seconds=30, clock=clock, sleep=clock.sleep)

    async def run() -> None:
        for i in range(4):
            await sender.send("raw", b"k", b"v%d" % i)
        await sender.flush()

    asyncio.run(run())
    assert (sender.delivered, sender.failed) == (0, 4)
    assert 30 <= sum(clock.slept) <= 30 + 8  # bounded: gave up after the retry window


class SilentProducer:
    """The first send fails; later ones are never answered (a broker that stays away)."""

    def __init__(self) -> None:
        self.sends = 0

    async def send(self, topic: str, value: bytes, *, key: bytes, headers=None):
        self.sends += 1
        fut = asyncio.get_running_loop().create_future()
        if self.sends == 1:
            fut.set_exception(KafkaTimeoutError())
        return fut


def test_a_retry_round_does_not_wait_past_the_retry_window() -> None:
    """Each round waited out the client's request timeout again: a 5 s window took 81 s."""
    clock = FakeClock()
    sender = Sender(SilentProducer(), retry_seconds=1.0, clock=clock, sleep=clock.sleep)

    async def run() -> None:
        await sender.send("raw", b"k", b"v")
        await asyncio.wait_for(sender.flush(), timeout=5)  # real seconds: must not hang

    asyncio.run(run())
    assert (sender.delivered, sender.failed) == (0, 1)


def test_an_oversized_record_becomes_a_produce_dead_letter_with_its_whole_size_and_hash() -> None:
    line = b"2026-11-28T10:00:00Z ERROR " + b"q" * 2_000_000
    cap = value_limit(1_048_576, key=b"big", headers=[("retro-file", b"big.log")])
    [record] = iter_raw_records(io.BytesIO(line + b"\n"), max_record_bytes=cap)
    letter = oversized_letter(record, path="big.log", source="big", limit=1_048_576,
                              sample_bytes=16 * 1024, redact=str.upper)
    again = DeadLetter.model_validate_json(letter.model_dump_json())
    assert again.stage == "produce" and again.reason == "too_large"
    assert again.raw_size == len(line)
    assert again.raw_sha256 == hashlib.sha256(line).hexdigest()
    assert again.sample == line[:16 * 1024].decode().upper()  # through the redaction
    assert again.raw_base64 == ""  # no unredacted bytes
    assert again.raw.as_tuple() == ("big.log", 0, 1)
    assert "1048576-byte" in again.detail and str(len(line)) in again.detail
    assert len(letter.model_dump_json()) < 64 * 1024  # fits any topic


def test_the_value_limit_leaves_room_for_key_headers_and_batch_overhead() -> None:
    limit = value_limit(1_048_576, key=b"k" * 100, headers=[("retro-file", b"f" * 200)])
    assert 1_048_576 - 1024 < limit < 1_048_576 - 300


def test_the_summary_names_delivered_failed_and_oversized_records() -> None:
    s = ProduceSummary(records=10, bytes=100, seconds=1.0, per_source={"a": 10},
                       delivered=9, failed=1, too_large=2, limit=1_048_576)
    assert not s.ok
    assert "delivered 9, failed 1" in s.line()
    assert "2 over the raw topic's 1048576-byte message limit" in s.line()
