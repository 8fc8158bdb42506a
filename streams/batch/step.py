"""The batch stage as a step: lane records -> token-budget batches -> the model.

Both lanes in one step: each record goes to its lane's :class:`LaneProcessor`, whose
outcome (fragments keyed by the report each was cut for, and reviews) is delivered
before the records it covers are marked done. A lane message that is not a
normalized record becomes a dead letter with its coordinates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from streams.batch.answers import Place
from streams.batch.lane import Analyzer, LaneProcessor
from streams.batch.window import TokenWindow
from streams.errors import BadLaneRecord
from streams.metrics import Metrics
from streams.records import BatchOutcome, DeadLetter, RawCoord, read_lane_record
from streams.redact import Redactor
from streams.runtime.step import Context, Fetch, Message, Out, Step
from streams.settings import Settings
from streams.tokens import TokenCounter

logger = logging.getLogger(__name__)

LANES = ("fast", "slow")
# (lane partitions owned, lane topic -> partition count) after each rebalance
OnAssignment = Callable[[list[tuple[str, int]], dict[str, int]], object]


def outcome_outs(outcome: BatchOutcome, *, fragments: str, review: str) -> list[Out]:
    """What one batch outcome publishes: each fragment under the report it was cut for."""
    out = []
    for fragment in outcome.fragments:
        if fragment.report_id is None:
            raise ValueError(f"fragment {fragment.id} was not placed in a report")
        out.append(Out(fragments, fragment.report_id.encode(),
                       fragment.model_dump_json().encode()))
    for item in outcome.reviews:
        out.append(Out(review, item.id.encode(), item.model_dump_json().encode()))
    return out


class LaneStep(Step):
    """Hands each lane record to its lane's processor; done once its outcome is delivered."""

    name = "batch loop"

    def __init__(self, settings: Settings, metrics: Metrics, analyzers: Mapping[str, Analyzer],
                 counter: TokenCounter, place: Place, *,
                 on_assignment: OnAssignment | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.analyzers = analyzers
        self.counter = counter
        self.place = place
        self.on_assignment = on_assignment
        self.redactor = Redactor.from_settings(settings)
        t = settings.topics
        self.lane_of = {t.fast: "fast", t.slow: "slow"}
        self.records_in = {lane: metrics.records_in.labels(f"batch-{lane}") for lane in LANES}
        self.bad_records = metrics.deadletters.labels(stage="batch", reason="bad_record")
        self.processors: dict[str, LaneProcessor] = {}

    def begin(self, ctx: Context) -> None:
        t = self.settings.topics

        async def publish(outcome: BatchOutcome) -> None:
            await (await ctx.send(outcome_outs(outcome, fragments=t.fragments, review=t.review)))

        self.processors = {lane: self._processor(lane, publish, ctx.done) for lane in LANES}

    def _processor(self, lane: str, publish: Any, ack: Any) -> LaneProcessor:
        s = self.settings.lane(lane)  # type: ignore[arg-type]
        return LaneProcessor(
            window=TokenWindow(
                lane=lane, input_budget=s.input_budget, context_window=s.context_window,
                output_reserve=s.output_reserve, max_records=s.max_records,
                max_wait_seconds=s.max_wait_seconds, counter=self.counter),
            analyzer=self.analyzers[lane], publish=publish, ack=ack,
            model=self.settings.model.name, prompt_version=self.settings.model.prompt_version,
            max_inflight_batches=max(2, s.max_concurrency), metrics=self.metrics,
            place=self.place)

    def background(self, ctx: Context) -> list[Any]:
        return [p.run_timer() for p in self.processors.values()]

    async def take(self, fetch: Fetch, ctx: Context) -> None:
        give, track = ctx.give, ctx.track
        for part, messages in fetch.items():
            lane = self.lane_of[part.topic]
            processor = self.processors[lane]
            offer = processor.offer
            self.records_in[lane].inc(len(messages))
            for m in messages:
                await give()  # the compactor and the lanes' batches run
                handle = track(part, m.offset)
                try:
                    record = read_lane_record(m.value or b"")
                except BadLaneRecord as exc:
                    letter = self._bad_record(m, exc)
                    await ctx.send([Out(self.settings.topics.deadletter, b"", letter)],
                                   done=[handle], on_delivered=self.bad_records.inc)
                    continue
                # its lane coordinates go into any review of it: the re-drive reads it there
                batches = offer(record, handle, (m.topic, m.partition, m.offset))
                if batches:
                    await processor.dispatch(batches)

    def failure(self) -> str | None:
        for lane, p in self.processors.items():
            if p.failed is not None:
                return f"publishing a {lane} batch failed: {p.failed!r}"
        return None

    async def assigned(self, parts: set[Any], ctx: Context) -> None:
        """Tell ``on_assignment`` which lane partitions are ours (the quota follows them)."""
        if self.on_assignment is None:
            return
        counts = {t: ctx.partition_count(t) for t in self.lane_of}
        if not all(counts.values()):
            return  # no metadata yet; the next rebalance tells
        self.on_assignment(sorted((p.topic, p.partition) for p in parts), counts)

    async def drain(self, ctx: Context) -> None:
        """Flush the windows and wait for the batches in flight."""
        await asyncio.gather(*(p.drain() for p in self.processors.values()))

    def _bad_record(self, m: Message, exc: BadLaneRecord) -> bytes:
        """A lane message that is not a normalized record (a foreign producer, a bug), with
        a redacted sample like every dead letter."""
        coord = RawCoord(topic=m.topic, partition=m.partition, offset=m.offset)
        return DeadLetter.of(
            m.value or b"", sample_bytes=self.settings.clean.deadletter_sample_bytes,
            redact=lambda text: self.redactor.redact(text)[0], id=coord.id, raw=coord,
            source="unknown", stage="batch", reason="bad_record",
            detail=f"not a normalized record ({exc}); only the clean stage should write to "
                   "the lane topics").model_dump_json().encode()
