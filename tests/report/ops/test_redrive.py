"""Re-drive policy: probe gating, backoff, pacing; the re-drive step reads a review's
records back from the lanes, never from the raw topic."""

from __future__ import annotations

import asyncio

import pytest

from streams.clean.cleaner import Cleaner
from streams.intervals import Coverage
from streams.metrics import Metrics
from streams.records import NormalizedRecord, Review
from streams.report.ops.redrive import (
    RedriveGate,
    RedriveStep,
    lane_coverage,
    redrive_fetch,
    to_lanes,
)
from streams.runtime.memory import MemoryRun, Part, Record
from streams.settings import Settings
from streams.tokens import TokenCounter

from helpers import FakeClock, make_record


class ScriptedProbe:
    def __init__(self, answers: list[bool]) -> None:
        self.answers = answers
        self.calls = 0

    async def __call__(self) -> bool:
        self.calls += 1
        return self.answers.pop(0)


async def test_failed_probes_back_off_exponentially_up_to_the_cap_then_reset() -> None:
    clock = FakeClock()
    probe = ScriptedProbe([False] * 6 + [True, False])
    gate = RedriveGate(probe, backoff_base=5.0, backoff_max=60.0, records_per_second=100.0,
                       sleep=clock.sleep, clock=clock)
    results = [await gate.healthy() for _ in range(7)]
    clock.advance(5.0)  # a healthy answer is trusted for one backoff step
    results.append(await gate.healthy())
    assert results == [False] * 6 + [True, False]
    assert clock.slept == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 5.0]  # reset after success
    assert gate.failures == 1 and probe.calls == gate.probes == 8


async def test_pacing_bounds_the_rate_of_re_driven_records() -> None:
    clock = FakeClock()
    gate = RedriveGate(ScriptedProbe([]), backoff_base=1.0, backoff_max=1.0,
                       records_per_second=200.0, sleep=clock.sleep)
    for _ in range(10):
        await gate.pace(100)
    await gate.pace(0)
    assert clock.now == pytest.approx(5.0)  # 1,000 records at 200/s


def test_impossible_gate_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        RedriveGate(ScriptedProbe([]), backoff_base=10, backoff_max=5, records_per_second=1)
    with pytest.raises(ValueError):
        RedriveGate(ScriptedProbe([]), backoff_base=1, backoff_max=5, records_per_second=0)


class Message:
    def __init__(self, offset: int, value: bytes | None) -> None:
        self.offset = offset
        self.value = value


def review_message(offset: int, reason: str, first: int) -> Message:
    review = Review(id=f"r-{offset}", lane="slow", reason=reason, detail="",
                    covered={"raw/0": [[first, first + 9]]}, record_ids=[], model="m",
                    prompt_version="v1")
    return Message(offset, review.model_dump_json().encode())


async def test_a_fetch_re_drives_transient_reviews_and_passes_permanent_ones() -> None:
    clock = FakeClock()
    gate = RedriveGate(ScriptedProbe([True, True]), backoff_base=1.0, backoff_max=8.0,
                       records_per_second=10.0, sleep=clock.sleep, clock=clock)
    sent: list[str] = []

    async def redrive(review: Review) -> int:
        sent.append(review.id)
        return 10

    fetched = {"review/0": [review_message(5, "model_unavailable", 0),
                            review_message(6, "schema", 10),
                            Message(7, b"not a review")],
               "review/1": [review_message(3, "retry_budget_exhausted", 20)]}
    outcome = await redrive_fetch(fetched, gate, redrive)
    assert sent == ["r-5", "r-3"]  # the permanent one stays parked
    assert outcome.done == {"review/0": 8, "review/1": 4} and not outcome.blocked
    assert (outcome.redriven, outcome.skipped) == (20, 1)
    assert clock.now == pytest.approx(2.0)  # 20 records paced at 10/s


async def test_a_failed_probe_stops_the_fetch_before_the_review_it_guards() -> None:
    clock = FakeClock()
    gate = RedriveGate(ScriptedProbe([True, False]), backoff_base=3.0, backoff_max=8.0,
                       records_per_second=1000.0, sleep=clock.sleep, clock=clock)
    sent: list[str] = []

    async def redrive(review: Review) -> int:
        sent.append(review.id)
        clock.advance(3.0)  # past the step a healthy probe is trusted for
        return 0

    fetched = {"review/0": [review_message(0, "timeout", 0), review_message(1, "schema", 10),
                            review_message(2, "model_unavailable", 20),
                            review_message(3, "model_unavailable", 30)],
               "review/1": [review_message(9, "model_unavailable", 40)]}
    outcome = await redrive_fetch(fetched, gate, redrive)
    assert outcome.blocked and sent == ["r-0"]
    # offset 2 and everything after it (both partitions) are read again after the backoff
    assert outcome.done == {"review/0": 2}
    assert clock.slept == [3.0]


# --- the re-drive step: a review's records read back from the lanes ---------------------

SETTINGS = Settings()
FAST, SLOW = SETTINGS.topics.fast, SETTINGS.topics.slow


class LaneTopics:
    """The lane topics in memory, read by offset as ``streams.kafka.readers.Reader.at``
    reads them."""

    def __init__(self, *messages: Record) -> None:
        self.messages = list(messages)
        self.asked: list[dict[str, list[list[int]]]] = []
        self.closed = False

    async def at(self, covered: Coverage) -> list[Record]:
        self.asked.append(covered.to_json())
        parts = covered.parts()
        return [m for m in self.messages
                if m.offset in parts.get(f"{m.topic}/{m.partition}", ())]

    async def close(self) -> None:
        self.closed = True


def lane_message(topic: str, lane_offset: int, raw_offset: int) -> Record:
    record = make_record(raw_offset, lane="fast" if topic == FAST else "slow")
    return Record(topic, 0, lane_offset, b"app.log", record.model_dump_json().encode())


def placed_review(raw: list[list[int]], lanes: dict[str, list[list[int]]] | None,
                  reason: str = "model_unavailable") -> Review:
    return Review(id=f"r-{raw[0][0]}", lane="fast", reason=reason, detail="",
                  covered={"retro.logs.raw/0": raw}, record_ids=[], model="m",
                  prompt_version="v1", lane_covered=lanes)


def redrive_run(reader: LaneTopics, *reviews: Review
                ) -> tuple[MemoryRun, Metrics]:
    metrics = Metrics()

    async def scenario() -> MemoryRun:
        gate = RedriveGate(ScriptedProbe([True] * 10), backoff_base=1.0, backoff_max=8.0,
                           records_per_second=1e9)
        run = MemoryRun(RedriveStep(SETTINGS, metrics, gate, reader))
        await run.fetch(*(Record(SETTINGS.topics.review, 0, i, r.id.encode(),
                                 r.model_dump_json().encode()) for i, r in enumerate(reviews)))
        await run.drain()
        return run

    return asyncio.run(scenario()), metrics


def test_the_step_sends_a_reviews_lane_messages_back_as_they_are() -> None:
    lanes = LaneTopics(*(lane_message(FAST, 100 + i, i) for i in range(5)),
                       lane_message(SLOW, 7, 5))
    review = placed_review([[1, 3], [5, 5]], {f"{FAST}/0": [[101, 103]], f"{SLOW}/0": [[7, 7]]})
    run, metrics = redrive_run(lanes, review)
    assert lanes.asked == [{f"{FAST}/0": [[101, 103]], f"{SLOW}/0": [[7, 7]]}]
    by_offset = {m.offset: m for m in lanes.messages}
    # the cleaner's own output, byte for byte, to the lane it was read from
    assert [(o.topic, o.key, o.value) for o in run.sent] == [
        (FAST, b"app.log", by_offset[o].value) for o in (101, 102, 103)] + [
        (SLOW, b"app.log", by_offset[7].value)]
    assert run.committed == {Part(SETTINGS.topics.review, 0): 1}
    assert metrics.redriven_records.labels("model_unavailable")._value.get() == 4
    assert lanes.closed


def test_only_records_the_review_covers_go_back_once_each() -> None:
    """A lane offset holding another record, or a record twice on the lanes, does not
    change what the review re-drives: exactly its raw coverage."""
    lanes = LaneTopics(lane_message(FAST, 10, 0), lane_message(FAST, 11, 0),  # twice
                       lane_message(FAST, 12, 99),  # not the review's
                       lane_message(FAST, 13, 1),
                       Record(FAST, 0, 14, b"x", b"not a record"))
    review = placed_review([[0, 2]], {f"{FAST}/0": [[10, 14]]})
    run, _ = redrive_run(lanes, review)
    raws = [NormalizedRecord.model_validate_json(o.value or b"").raw.offset for o in run.sent]
    assert raws == [0, 1]  # raw 2 is no longer on the lanes: it stays parked


def test_a_review_without_lane_coordinates_stays_parked_and_nothing_reads_raw(
        caplog: pytest.LogCaptureFixture) -> None:
    lanes = LaneTopics(lane_message(FAST, 0, 0))
    with caplog.at_level("WARNING"):
        run, _ = redrive_run(lanes, placed_review([[0, 0]], None))
    assert run.sent == [] and lanes.asked == []
    assert run.committed == {Part(SETTINGS.topics.review, 0): 1}  # passed over, not re-read
    assert "as a user who may read the raw topic" in caplog.text


def test_a_review_cannot_make_the_step_read_other_topics() -> None:
    review = placed_review([[0, 0]], {"retro.logs.raw/0": [[0, 0]], f"{FAST}/0": [[4, 4]]})
    assert lane_coverage(review, [FAST, SLOW]) == Coverage.from_json({f"{FAST}/0": [[4, 4]]})


def test_old_reviews_parse_and_new_ones_say_where_their_records_sit() -> None:
    old = (b'{"id":"r-1","lane":"fast","reason":"timeout","detail":"","covered":'
           b'{"retro.logs.raw/0":[[0,1]]},"record_ids":[],"model":"m","prompt_version":"v1"}')
    assert Review.model_validate_json(old).lane_covered is None
    new = placed_review([[0, 1]], {f"{FAST}/0": [[5, 6]]})
    assert Review.model_validate_json(new.model_dump_json()).lane_covered == {
        f"{FAST}/0": [[5, 6]]}


def test_a_raw_message_cleaned_again_goes_back_to_its_lane_unless_it_is_no_valid_record(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-driving an old review cleans its raw messages again; the clean step writes
    records unvalidated, so a record that a bug made invalid stays in review instead
    of failing the re-drive on every attempt."""
    lanes = {"fast": "lanes.fast", "slow": "lanes.slow"}
    message = Record("raw", 0, 3, b"app", b"2026-11-28T10:00:00Z ERROR disk full", None)
    (out,) = to_lanes(Cleaner.from_settings(Settings()), lanes, [message])
    assert out.topic == "lanes.fast"
    assert NormalizedRecord.model_validate_json(out.value).raw.offset == 3
    monkeypatch.setattr(TokenCounter, "count", lambda self, text: "many")  # a bug
    assert to_lanes(Cleaner.from_settings(Settings()), lanes, [message]) == []
