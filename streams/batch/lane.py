"""One lane's pipeline step: records in, batches out, outcomes published, then acked.

Pure asyncio: the batch loop hands every record over with an opaque ack token and
this class decides when a window flushes, runs batches concurrently (bounded, so a
slow model applies backpressure to the consumer instead of piling up memory),
publishes the outcome, and only then acks the records' tokens. A record is
never acked before the fragments or reviews that cover it are on the broker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from streams.batch.answers import Place, place_fragments, review_for
from streams.batch.window import Batch, TokenWindow
from streams.clock import Sleep
from streams.intervals import Coverage
from streams.metrics import Metrics
from streams.records import AnyRecord, BatchOutcome, Review

logger = logging.getLogger(__name__)


class Analyzer(Protocol):
    async def analyze(self, batch: Batch) -> BatchOutcome: ...


Publish = Callable[[BatchOutcome], Awaitable[None]]
Ack = Callable[[Any], None]
LaneCoord = tuple[str, int, int]  # (lane topic, partition, offset) of a lane message


def with_lane_coverage(review: Review, at: Mapping[str, Sequence[LaneCoord]]) -> Review:
    """``review`` with the lane coordinates of its records (``at``: record id -> where
    it was read), so a re-drive reads them back from the lanes; unchanged when one of
    its records was not read from a lane, as a partial place would lose that record."""
    coords: list[LaneCoord] = []
    for record_id in dict.fromkeys(review.record_ids):
        where = at.get(record_id)
        if not where:
            return review
        coords.extend(where)
    if not coords:
        return review
    return review.model_copy(update={"lane_covered": Coverage.from_coords(coords).to_json()})


class LaneProcessor:
    """Feeds a :class:`TokenWindow` and runs its batches through an analyzer."""

    def __init__(
        self,
        *,
        window: TokenWindow,
        analyzer: Analyzer,
        publish: Publish,
        ack: Ack,
        model: str,
        prompt_version: str,
        max_inflight_batches: int = 8,
        metrics: Metrics | None = None,
        place: Place | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if max_inflight_batches < 1:
            raise ValueError("max_inflight_batches must be at least 1")
        self.window = window
        self.analyzer = analyzer
        self.publish = publish
        self.ack = ack
        self.model = model
        self.prompt_version = prompt_version
        self.metrics = metrics
        self.place = place  # a record's report; fragments are cut one per report
        self._sleep = sleep  # the timer's wait; tests pass a fake clock's sleep
        self._tokens: dict[int, list[Any]] = {}  # id(record) -> ack tokens
        self._at: dict[int, list[LaneCoord]] = {}  # id(record) -> where it was read
        self._slots = asyncio.Semaphore(max_inflight_batches)
        self._tasks: set[asyncio.Task[None]] = set()
        self._wakeup = asyncio.Event()
        self.failed: BaseException | None = None

    async def add(self, record: AnyRecord, token: Any = None, *,
                  at: LaneCoord | None = None) -> None:
        """Add one record, read from lane message ``at``; may dispatch batches (and wait
        for a free slot)."""
        batches = self.offer(record, token, at)
        if batches:
            await self.dispatch(batches)

    def offer(self, record: AnyRecord, token: Any = None,
              at: LaneCoord | None = None) -> list[Batch]:
        """``add`` without the dispatch: the batches this record closed, which the caller
        must hand to ``dispatch`` before it offers the next record.

        A plain call, so the batch loop pays for a coroutine only when a batch closes."""
        if self.failed is not None:
            raise self.failed
        # no lock: nothing between here and the dispatch awaits, so the window is never
        # seen half-updated by the timer (an asyncio.Lock here cost 6% of a worker's CPU)
        key = id(record)
        tokens = self._tokens.get(key)
        if tokens is None:
            self._tokens[key] = [token]
        else:
            tokens.append(token)
        if at is not None:
            where = self._at.get(key)
            if where is None:
                self._at[key] = [at]
            else:
                where.append(at)
        batches = self.window.add(record)
        self._wakeup.set()
        return batches

    async def dispatch(self, batches: Sequence[Batch]) -> None:
        """Run the batches ``offer`` closed, oldest first (each waits for a free slot)."""
        for batch in batches:
            await self._dispatch(batch)

    async def flush_due(self) -> float | None:
        """Flush the window if its max wait passed; returns seconds until next due."""
        batch = self.window.flush("wait") if self.window.due() else None
        wait = self.window.seconds_until_due()
        if batch is not None:
            await self._dispatch(batch)
        return wait

    async def run_timer(self) -> None:
        """Flushing on the clock, so a quiet partition still flushes: run as a task.

        The wake-up is cleared *before* the flush: ``flush_due`` may wait minutes for
        a batch slot (a slow or throttled model), and a record added meanwhile must
        wake the next nap, or it waits in the window for a record that never comes
        while its partition's commit is held back.
        """
        while True:
            self._wakeup.clear()
            wait = await self.flush_due()
            await self._nap(wait)

    async def _nap(self, seconds: float | None) -> None:
        """Until ``seconds`` passed (forever for None) or a record arrived."""
        woken = asyncio.ensure_future(self._wakeup.wait())
        waits = {woken}
        if seconds is not None:
            waits.add(asyncio.ensure_future(self._sleep(seconds)))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()

    async def drain(self) -> None:
        """Flush what is pending and wait for every batch in flight."""
        batch = self.window.flush("drain")
        if batch is not None:
            await self._dispatch(batch)
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def _dispatch(self, batch: Batch) -> None:
        if self.metrics is not None:
            self.metrics.batches.labels(batch.lane, batch.trigger).inc()
            self.metrics.batch_records.labels(batch.lane).observe(batch.record_count)
            self.metrics.batch_tokens.labels(batch.lane).observe(batch.estimated_input_tokens)
        records = batch.records
        tokens = [t for r in records for t in self._tokens.pop(id(r), [])]
        # the records' lane coordinates, keyed by record id only if a review needs them
        at: list[tuple[AnyRecord, list[LaneCoord]]] = []
        if self._at:
            pop = self._at.pop
            for r in records:
                where = pop(id(r), None)
                if where is not None:
                    at.append((r, where))
        await self._slots.acquire()
        task = asyncio.create_task(self._run(batch, tokens, at))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: Batch, tokens: list[Any],
                   at: list[tuple[AnyRecord, list[LaneCoord]]]) -> None:
        try:
            try:
                outcome = await self.analyzer.analyze(batch)
                if self.place is not None and outcome.fragments:
                    outcome.fragments = place_fragments(outcome.fragments, batch.by_coord(),
                                                        self.place)
            except Exception as exc:  # a bug must not stall the partition forever
                logger.exception("analyzing a %s batch of %d records failed", batch.lane,
                                 batch.record_count)
                review = review_for(batch, reason="internal_error", detail=repr(exc)[:500],
                                    model=self.model, prompt_version=self.prompt_version,
                                    output=None)
                outcome = BatchOutcome(fragments=[], reviews=[review], calls=0, cache_hits=0)
            if at and outcome.reviews:
                by_id: dict[str, list[LaneCoord]] = {}
                for record, where in at:
                    by_id.setdefault(record.id, []).extend(where)
                outcome.reviews = [with_lane_coverage(r, by_id) for r in outcome.reviews]
            await self.publish(outcome)
        except BaseException as exc:
            # publishing failed: leave the records unacked so they are re-read on restart
            logger.error("publishing a %s batch failed; records stay unacked: %r", batch.lane,
                         exc)
            self.failed = exc
            raise
        finally:
            self._slots.release()
        for token in tokens:
            self.ack(token)
