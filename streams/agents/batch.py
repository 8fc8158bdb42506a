"""The batch agents (fast and slow lane): records -> token-budget batches -> model.

Records are acked only after the fragments or reviews covering them are delivered
(see LaneProcessor); one agent instance per lane per worker, so scaling out means
more partitions and more workers in the consumer group.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from pydantic import ValidationError

from streams.agents.common import ack_when_delivered, new_acker, send, track
from streams.batch.lane import LaneProcessor
from streams.batch.window import TokenWindow
from streams.clean.tokens import TokenCounter
from streams.gateway.gateway import Gateway
from streams.metrics import Metrics
from streams.records import BatchOutcome, DeadLetter, NormalizedRecord, RawCoord
from streams.report.keys import record_place, report_key
from streams.settings import Settings

logger = logging.getLogger(__name__)


def wire_batch(
    app: Any,
    settings: Settings,
    metrics: Metrics,
    topics: dict[str, Any],
    gateways: dict[str, Gateway],
    counter: TokenCounter,
) -> dict[str, LaneProcessor]:
    processors: dict[str, LaneProcessor] = {}
    for lane in ("fast", "slow"):
        processors[lane] = _wire_lane(app, settings, metrics, topics, lane, gateways[lane],
                                      counter)
    return processors


def _wire_lane(app: Any, settings: Settings, metrics: Metrics, topics: dict[str, Any],
               lane: str, gateway: Gateway, counter: TokenCounter) -> LaneProcessor:
    lane_settings = settings.lane(lane)  # type: ignore[arg-type]
    fragments, review, dead = topics["fragments"], topics["review"], topics["deadletter"]

    async def publish(outcome: BatchOutcome) -> None:
        futures = []
        for fragment in outcome.fragments:
            key = report_key(fragment, window=settings.report.window,
                             group_by=settings.report.group_by)
            futures.append(await send(fragments, key=key.encode(),
                                      value=fragment.model_dump_json().encode()))
        for item in outcome.reviews:
            futures.append(await send(review, key=item.id.encode(),
                                      value=item.model_dump_json().encode()))
        await asyncio.gather(*futures)

    acker = new_acker()
    processor = LaneProcessor(
        window=TokenWindow(
            lane=lane, input_budget=lane_settings.input_budget,
            context_window=lane_settings.context_window,
            output_reserve=lane_settings.output_reserve, max_records=lane_settings.max_records,
            max_wait_seconds=lane_settings.max_wait_seconds, counter=counter),
        analyzer=gateway, publish=publish, ack=acker.done,
        model=settings.model.name, prompt_version=settings.model.prompt_version,
        max_inflight_batches=max(2, lane_settings.max_concurrency), metrics=metrics,
        place=functools.partial(record_place, window=settings.report.window,
                                group_by=settings.report.group_by,
                                shards=settings.report.shards))

    records_in = metrics.records_in.labels(f"batch-{lane}")

    async def lane_agent(stream: Any) -> None:
        timer = asyncio.create_task(processor.run_timer())
        try:
            async for event in stream.noack().events():
                records_in.inc()
                handle = track(acker, event)
                try:
                    record = NormalizedRecord.model_validate_json(event.value)
                except ValidationError as exc:
                    letter = _bad_record(event, exc, settings.clean.deadletter_sample_bytes)
                    fut = await send(dead, key=b"", value=letter)
                    ack_when_delivered(fut, acker, handle)
                    continue
                await processor.add(record, handle)
        finally:
            timer.cancel()

    app.agent(topics[lane], name=f"batch-{lane}", concurrency=1)(lane_agent)
    return processor


def _bad_record(event: Any, exc: ValidationError, sample_bytes: int) -> bytes:
    """A lane message that is not a NormalizedRecord (a foreign producer, a bug)."""
    m = event.message
    coord = RawCoord(topic=m.topic, partition=m.partition, offset=m.offset)
    return DeadLetter.of(
        event.value or b"", sample_bytes=sample_bytes,
        id=coord.id, raw=coord, source="unknown", stage="batch", reason="bad_record",
        detail=f"not a normalized record ({exc.error_count()} schema errors); only the clean "
               "agent should write to the lane topics").model_dump_json().encode()
