"""LaneProcessor: windows flush on budget and wall clock; records are acked only
after the outcome covering them is published; failures never lose a record."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from streams.batch.answers import review_for
from streams.batch.lane import LaneProcessor
from streams.batch.window import Batch, TokenWindow
from streams.intervals import Coverage
from streams.records import BatchOutcome

from helpers import FakeClock, WordCounter, make_record


class ReviewEverything:
    """An analyzer that answers every batch with one review covering it."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.batches: list[Batch] = []
        self.delay = delay
        self.fail = fail
        self.running = self.peak = 0

    async def analyze(self, batch: Batch) -> BatchOutcome:
        self.batches.append(batch)
        self.running += 1
        self.peak = max(self.peak, self.running)
        await asyncio.sleep(self.delay)
        self.running -= 1
        if self.fail:
            raise RuntimeError("bug in the analyzer")
        review = review_for(
            batch, reason="test", detail="", model="m", prompt_version="v1", output=None
        )
        return BatchOutcome(fragments=[], reviews=[review], calls=1, cache_hits=0)


def window(max_records: int = 3, wait: float = 0.05,
           clock: Callable[[], float] = time.monotonic) -> TokenWindow:
    return TokenWindow(
        lane="fast",
        input_budget=4000,
        context_window=8192,
        output_reserve=0.3,
        max_records=max_records,
        max_wait_seconds=wait,
        counter=WordCounter(),
        clock=clock,
    )


async def test_acks_follow_publication_never_precede_it() -> None:
    published: list[BatchOutcome] = []
    acked: list[int] = []
    gate = asyncio.Event()

    async def publish(outcome: BatchOutcome) -> None:
        await gate.wait()
        published.append(outcome)

    lane = LaneProcessor(
        window=window(max_records=3),
        analyzer=ReviewEverything(),
        publish=publish,
        ack=acked.append,
        model="m",
        prompt_version="v1",
    )
    for i in range(3):
        await lane.add(make_record(i), token=i)
    await asyncio.sleep(0.01)
    assert acked == [], "acked before the outcome was published"
    gate.set()
    await lane.drain()
    assert sorted(acked) == [0, 1, 2]
    assert len(published) == 1


async def test_a_quiet_partition_flushes_on_the_clock() -> None:
    acked: list[int] = []

    async def publish(outcome: BatchOutcome) -> None:
        return None

    clock = FakeClock()
    analyzer = ReviewEverything()
    lane = LaneProcessor(
        window=window(max_records=100, wait=30.0, clock=clock),
        analyzer=analyzer,
        publish=publish,
        ack=acked.append,
        model="m",
        prompt_version="v1",
        sleep=clock.sleep,
    )
    timer = asyncio.create_task(lane.run_timer())
    try:
        await lane.add(make_record(1), token=1)  # and no further record arrives
        for _ in range(50):  # let the timer task run; no wall time passes
            await asyncio.sleep(0)
        assert clock.slept and clock.now >= 30.0  # it slept the window's wait, once due
        while lane.in_flight:
            await asyncio.sleep(0)
    finally:
        timer.cancel()
    assert acked == [1]
    assert analyzer.batches[0].trigger == "wait"


async def test_an_analyzer_bug_becomes_a_review_not_a_stuck_partition() -> None:
    outcomes: list[BatchOutcome] = []
    acked: list[int] = []

    async def publish(outcome: BatchOutcome) -> None:
        outcomes.append(outcome)

    lane = LaneProcessor(
        window=window(max_records=2),
        analyzer=ReviewEverything(fail=True),
        publish=publish,
        ack=acked.append,
        model="m",
        prompt_version="v1",
    )
    await lane.add(make_record(1), 1)
    await lane.add(make_record(2), 2)
    await lane.drain()
    assert [r.reason for o in outcomes for r in o.reviews] == ["internal_error"]
    assert Coverage.from_json(outcomes[0].reviews[0].covered) == Coverage.from_coords(
        [("retro.logs.raw", 0, 1), ("retro.logs.raw", 0, 2)]
    )
    assert sorted(acked) == [1, 2]


async def test_a_failed_publication_leaves_records_unacked_and_stops_intake() -> None:
    acked: list[int] = []

    async def publish(outcome: BatchOutcome) -> None:
        raise ConnectionError("broker gone")

    lane = LaneProcessor(
        window=window(max_records=1),
        analyzer=ReviewEverything(),
        publish=publish,
        ack=acked.append,
        model="m",
        prompt_version="v1",
    )
    await lane.add(make_record(1), 1)
    await lane.drain()
    assert acked == []
    with pytest.raises(ConnectionError):
        await lane.add(make_record(2), 2)


async def test_in_flight_batches_are_bounded() -> None:
    analyzer = ReviewEverything(delay=0.05)

    async def publish(outcome: BatchOutcome) -> None:
        return None

    lane = LaneProcessor(
        window=window(max_records=1),
        analyzer=analyzer,
        publish=publish,
        ack=lambda t: None,
        model="m",
        prompt_version="v1",
        max_inflight_batches=2,
    )
    for i in range(6):
        await lane.add(make_record(i), i)
    await lane.drain()
    assert analyzer.peak == 2  # bounded, and the bound is used
    assert len(analyzer.batches) == 6


class GatedAnalyzer(ReviewEverything):
    """Holds every batch until ``gate`` opens: a model answering only after long 429 waits."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def analyze(self, batch: Batch) -> BatchOutcome:
        await self.gate.wait()
        return await super().analyze(batch)


async def _spin(times: int = 200) -> None:
    for _ in range(times):  # let the other tasks run; no wall time passes
        await asyncio.sleep(0)


async def test_a_record_added_while_the_timer_waits_for_a_slot_still_flushes() -> None:
    """A slow-lane window must not get stuck while the model answers 429s and 5xx.

    The timer flushed a due window, then waited in ``_dispatch`` for a batch slot
    held by a slow model call. A record that arrived meanwhile set the wake-up event,
    but the timer cleared it after its flush and slept with the wait it had computed
    before that record, i.e. forever (an empty window has no due time). With no
    further record on the lane, the record sat in the window unacked: the commit
    held, and the re-read guard skips a partition with unacked records in flight.
    """
    acked: list[int] = []

    async def publish(outcome: BatchOutcome) -> None:
        return None

    clock = FakeClock()
    analyzer = GatedAnalyzer()
    lane = LaneProcessor(
        window=window(max_records=100, wait=30.0, clock=clock),
        analyzer=analyzer, publish=publish, ack=acked.append,
        model="m", prompt_version="v1", max_inflight_batches=1, sleep=clock.sleep,
    )
    timer = asyncio.create_task(lane.run_timer())
    try:
        await lane.add(make_record(1), token=1)
        await _spin()  # due after 30 s: batch [1] takes the only slot and waits on the model
        assert lane.in_flight == 1 and len(lane.window) == 0
        await lane.add(make_record(2), token=2)
        await _spin()  # due: the timer flushes [2] and waits for the slot
        assert len(lane.window) == 0 and lane.in_flight == 1
        await lane.add(make_record(3), token=3)  # arrives while the timer waits for the slot
        analyzer.gate.set()  # the provider recovers; no further record arrives
        await _spin(2000)
    finally:
        timer.cancel()
    assert sorted(acked) == [1, 2, 3], "a record stayed in the window with nothing to flush it"


def test_lane_coverage_is_set_only_when_every_record_of_the_review_was_placed() -> None:
    from streams.batch.lane import with_lane_coverage
    from streams.records import Review

    review = Review(id="r-1", lane="fast", reason="timeout", detail="", covered={"raw/0": [[0, 2]]},
                    record_ids=["raw/0/0", "raw/0/1", "raw/0/2"], model="m", prompt_version="v1")
    at = {"raw/0/0": [("lanes", 1, 5)], "raw/0/1": [("lanes", 1, 6)],
          "raw/0/2": [("lanes", 0, 9), ("lanes", 1, 7)]}  # the last one twice on the lanes
    placed = with_lane_coverage(review, at)
    assert placed.lane_covered == {"lanes/0": [[9, 9]], "lanes/1": [[5, 7]]}
    assert with_lane_coverage(review, {"raw/0/0": [("lanes", 1, 5)]}).lane_covered is None
    # a review without lane coordinates is the review of before on the wire, and reads back
    assert "lane_covered" not in review.model_dump_json()
    assert Review.model_validate_json(placed.model_dump_json()) == placed
