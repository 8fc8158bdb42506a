"""`retro audit`: prove every raw record ended up exactly once somewhere.

Per raw partition, the offsets in ``retro.logs.raw`` are reconciled with those covered
by reports, the review topic and the dead-letter topic. Each report, each distinct
review id and each distinct dead-letter id is one *claim*; a coordinate claimed
twice is double-counted, one claimed never is missing. Replays of the same review or
dead letter (same id after a crash) are one claim, not two.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams.intervals import Coverage
from streams.kafka.connect import aiokafka_kwargs, partitions_of, stop_consumer
from streams.records import DeadLetter, Review
from streams.report.store import read_latest, read_topic
from streams.settings import Settings


@dataclass
class AuditResult:
    raw_records: int
    claimed: dict[str, int]  # records covered by reports / review / deadletter
    missing: dict[str, list[list[int]]]
    double_counted: dict[str, list[list[int]]]
    foreign: dict[str, list[list[int]]] = field(default_factory=dict)  # claimed, not in raw

    @property
    def ok(self) -> bool:
        return not self.missing and not self.double_counted

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "raw_records": self.raw_records, "claimed": self.claimed,
                "missing": self.missing, "double_counted": self.double_counted,
                "claimed_outside_raw": self.foreign}


def reconcile(raw: Coverage, claims: dict[str, list[Coverage]]) -> AuditResult:
    """Pure reconciliation: ``claims`` maps a destination to its independent claims."""
    seen = Coverage()
    double = Coverage()
    counts: dict[str, int] = {}
    for destination, items in claims.items():
        total = Coverage()
        for claim in items:
            double = double.union(seen.intersection(claim))
            seen = seen.union(claim)
            total = total.union(claim)
        counts[destination] = len(total.intersection(raw))
    return AuditResult(
        raw_records=len(raw), claimed=counts,
        missing=raw.difference(seen).to_json(),
        double_counted=double.intersection(raw).to_json(),
        foreign=seen.difference(raw).to_json())


async def raw_coverage(settings: Settings) -> Coverage:
    """All offsets currently held by the raw topic (low to high watermark)."""
    topic = settings.topics.raw
    consumer = AIOKafkaConsumer(**aiokafka_kwargs(settings), group_id=None,
                                enable_auto_commit=False)
    try:  # a failed start() must still stop the consumer, or asyncio warns "Unclosed"
        await consumer.start()
        parts = await partitions_of(consumer, topic)
        tps = [TopicPartition(topic, p) for p in parts]
        if not tps:
            return Coverage()
        begin = await consumer.beginning_offsets(tps)
        end = await consumer.end_offsets(tps)
        return Coverage.from_json({
            f"{topic}/{tp.partition}": [[begin[tp], end[tp] - 1]]
            for tp in tps if end[tp] > begin[tp]})
    finally:
        await stop_consumer(consumer)


async def collect_claims(settings: Settings) -> dict[str, list[Coverage]]:
    # every share of every report is its own claim: shares must never overlap
    reports = (await read_latest(settings)).shards()
    reviews: dict[str, Coverage] = {}
    async for _key, value in read_topic(settings, settings.topics.review):
        item = Review.model_validate_json(value)
        reviews[item.id] = Coverage.from_json(item.covered)
    dead: dict[str, Coverage] = {}
    async for _key, value in read_topic(settings, settings.topics.deadletter):
        letter = DeadLetter.model_validate_json(value)
        if letter.stage == "produce":  # never reached the raw topic: no raw offset to claim
            continue
        dead[letter.id] = Coverage.from_coords([letter.raw.as_tuple()])
    return {
        "reports": [Coverage.from_json(r.covered) for r in reports.values()],
        "review": list(reviews.values()),
        "deadletter": list(dead.values()),
    }


async def audit(settings: Settings) -> AuditResult:
    return reconcile(await raw_coverage(settings), await collect_claims(settings))


async def audit_until_clean(settings: Settings, *, wait_seconds: float,
                            poll_seconds: float = 2.0) -> AuditResult:
    """Audit repeatedly while records are still in flight, up to ``wait_seconds``."""
    deadline = time.monotonic() + wait_seconds
    while True:
        result = await audit(settings)
        if result.ok or time.monotonic() >= deadline or result.double_counted:
            return result
        await asyncio.sleep(poll_seconds)


def dumps(result: AuditResult) -> str:
    return json.dumps(result.to_json(), indent=2)


def missing_count(result: AuditResult) -> int:
    return len(Coverage.from_json(result.missing))


def missing_hint(result: AuditResult) -> str | None:
    """Why records may be missing, for stderr; None when nothing is missing.

    Records are claimed only once a worker processed them, so the usual reason is
    that none is running or that it has not caught up yet. Asking whether the worker
    groups have members would tell the two apart, but aiokafka 0.14's
    ``describe_consumer_groups`` failed to decode Kafka 4.1's answer when tried.
    """
    count = missing_count(result)
    if not count:
        return None
    return (f"{count} raw records are not accounted for yet: if no `retro worker` is "
            "running, that is why (records count once a worker processed them); start one, "
            "or audit again with --wait 60 while it catches up")
