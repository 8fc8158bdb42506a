"""The lanes step: records to their lane's batches, outcomes keyed by their report,
records done only once what covers them is delivered."""

from __future__ import annotations

import asyncio

import pytest

from streams.batch.answers import review_for
from streams.batch.step import LaneStep, outcome_outs
from streams.batch.window import Batch
from streams.metrics import Metrics
from streams.records import BatchOutcome, Review
from streams.runtime.memory import MemoryRun, Part, Record
from streams.settings import Settings

from helpers import WordCounter, make_fragment, make_record

SETTINGS = Settings(fast={"max_records": 3, "max_wait_seconds": 600})
FAST = SETTINGS.topics.fast


def test_an_outcome_publishes_fragments_under_their_report_and_reviews_by_id() -> None:
    fragment = make_fragment("f-1", {"raw/0": [[0, 1]]}, report_id="2026-11-29/all#0")
    review = Review(id="r-1", lane="fast", reason="invalid_answer", detail="x",
                    covered={"raw/0": [[2, 2]]}, record_ids=["raw/0/2"], model="m",
                    prompt_version="v1")
    out = outcome_outs(BatchOutcome(fragments=[fragment], reviews=[review]),
                       fragments="frag", review="rev")
    assert [(o.topic, o.key) for o in out] == [("frag", b"2026-11-29/all#0"), ("rev", b"r-1")]
    assert b'"covered"' in (out[0].value or b"")


def test_a_fragment_not_placed_in_a_report_is_refused() -> None:
    fragment = make_fragment("f-1", {"raw/0": [[0, 1]]})
    with pytest.raises(ValueError, match="not placed"):
        outcome_outs(BatchOutcome(fragments=[fragment]), fragments="frag", review="rev")


class Reviews:
    """Answers each batch with one review covering it."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []

    async def analyze(self, batch: Batch) -> BatchOutcome:
        self.batches.append(batch)
        return BatchOutcome(reviews=[review_for(batch, reason="test", detail="", model="m",
                                                prompt_version="v1", output=None)])


def _step(analyzer: Reviews) -> LaneStep:
    return LaneStep(SETTINGS, Metrics(), {"fast": analyzer, "slow": analyzer}, WordCounter(),
                    place=lambda record: "day/all")


def _lane_message(offset: int) -> Record:
    return Record(FAST, 0, offset, b"app", make_record(offset).model_dump_json().encode())


def test_records_are_done_once_their_batch_outcome_is_delivered() -> None:
    analyzer = Reviews()

    async def scenario() -> MemoryRun:
        run = MemoryRun(_step(analyzer), [Part(FAST, 0)])
        await run.fetch(_lane_message(0), _lane_message(1))
        assert run.committed == {}  # in the window
        await run.fetch(_lane_message(2))  # the window is full: one batch
        await run.drain()
        return run

    run = asyncio.run(scenario())
    assert [b.record_count for b in analyzer.batches] == [3]
    assert [o.topic for o in run.sent] == [SETTINGS.topics.review]
    assert run.committed == {Part(FAST, 0): 3}


def test_a_lane_message_that_is_not_a_record_becomes_a_dead_letter() -> None:
    async def scenario() -> MemoryRun:
        run = MemoryRun(_step(Reviews()), [Part(FAST, 0)])
        await run.fetch(Record(FAST, 0, 0, b"x", b'{"not": "a record"}'))
        return run

    run = asyncio.run(scenario())
    (letter,) = run.sent_to(SETTINGS.topics.deadletter)
    assert b'"bad_record"' in (letter.value or b"") and b'"offset":0' in (letter.value or b"")
    assert run.committed == {Part(FAST, 0): 1}


def test_an_outcome_that_is_not_delivered_stops_the_step_and_commits_nothing() -> None:
    async def scenario() -> tuple[MemoryRun, LaneStep]:
        step = _step(Reviews())
        run = MemoryRun(step, [Part(FAST, 0)])
        run.sink.refuse = True
        await run.fetch(*(_lane_message(i) for i in range(3)))
        await run.drain()
        return run, step

    run, step = asyncio.run(scenario())
    assert step.failure() is not None and run.ctx.failed is not None
    assert run.committed == {}


def test_a_review_carries_where_its_records_sit_in_the_lanes() -> None:
    """The re-drive reads a review's records back from the lanes by these coordinates."""
    async def scenario() -> MemoryRun:
        run = MemoryRun(_step(Reviews()), [Part(FAST, 0)])
        # lane offsets 7, 8 and 10 hold raw records 0, 1 and 2
        await run.fetch(*(Record(FAST, 0, lane_offset, b"app",
                                 make_record(raw).model_dump_json().encode())
                          for raw, lane_offset in ((0, 7), (1, 8), (2, 10))))
        await run.drain()
        return run

    run = asyncio.run(scenario())
    (sent,) = run.sent_to(SETTINGS.topics.review)
    review = Review.model_validate_json(sent.value or b"")
    assert review.lane_covered == {f"{FAST}/0": [[7, 8], [10, 10]]}
    assert len(review.covered) == 1 and sum(
        b - a + 1 for ranges in review.covered.values() for a, b in ranges) == 3
