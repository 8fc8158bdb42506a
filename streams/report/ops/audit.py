"""`retro audit`: prove every raw log record ended up exactly once somewhere.

Per partition of every input topic (``RETRO_TOPICS__RAW`` and the topics matching
``RETRO_TOPICS__RAW_PATTERN``), the offsets held are reconciled with those covered
by reports, the review topic and the dead-letter topic. A record ends in one of three
states: *analysed* (a report covers it), *parked* (a review covers it and no report
does) or *dead-lettered*. Review is a state a record leaves: a record re-analysed
after it was parked (a re-drive, or a re-batch after a crash) counts as analysed,
and two reviews of one record are one parked record. Each report share and each
distinct dead-letter id is one claim: a coordinate in two reports, in two dead
letters, or in a dead letter and a report or review is double-counted; one claimed
never is missing.

Counts are of log records, not messages: a message carrying N records is claimed
under its own key, indices 0..N-1 (``streams/intervals.py``), and is complete when
those are claimed exactly once. A message nothing claimed yet counts as one missing
record (its N is known only once a worker read it). A listed input topic that does
not exist, a pattern matching none, or an input holding no records is a *problem*:
the audit is not ok, whatever it reconciled.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from streams.intervals import Coverage, IntervalSet, split_message_key
from streams.kafka.inputs import matching
from streams.kafka.readers import Reader, read_topic
from streams.records import DeadLetter, Review
from streams.report.store import read_latest
from streams.settings import Settings


@dataclass
class AuditResult:
    raw_records: int
    claimed: dict[str, int]  # records analysed (reports) / parked (review) / dead-lettered
    missing: dict[str, list[list[int]]]
    double_counted: dict[str, list[list[int]]]
    foreign: dict[str, list[list[int]]] = field(default_factory=dict)  # claimed, not in raw
    parked_by_reason: dict[str, int] = field(default_factory=dict)  # still in review
    raw_messages: int | None = None  # Kafka messages held by the input topics
    problems: list[str] = field(default_factory=list)  # missing or empty inputs

    @property
    def ok(self) -> bool:
        return not self.missing and not self.double_counted and not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "raw_records": self.raw_records,
                "raw_messages": self.raw_messages, "claimed": self.claimed,
                "analysed": self.claimed.get("reports", 0),
                "parked": self.claimed.get("review", 0),
                "parked_by_reason": self.parked_by_reason,
                "dead_lettered": self.claimed.get("deadletter", 0),
                "missing": self.missing, "double_counted": self.double_counted,
                "claimed_outside_raw": self.foreign, "problems": self.problems}


def reconcile(raw: Coverage, claims: dict[str, list[Coverage]],
              review_reasons: Sequence[str] | None = None,
              problems: list[str] | None = None) -> AuditResult:
    """Pure reconciliation of ``raw`` (message offsets per "topic/partition") with the
    claims of reports, review and dead letter.

    ``claims["reports"]`` holds one coverage per report share, ``claims["review"]`` one
    per distinct review, ``claims["deadletter"]`` one per distinct dead letter.
    ``review_reasons`` (aligned with ``claims["review"]``, oldest first) attributes each
    parked record to the reason of the latest review that covers it.
    """
    double = Coverage()
    analysed = Coverage()
    for claim in claims.get("reports", []):
        double = double.union(analysed.intersection(claim))
        analysed = analysed.union(claim)
    reviews = claims.get("review", [])
    in_review = Coverage()
    for claim in reviews:
        in_review = in_review.union(claim)
    parked = in_review.difference(analysed)
    dead = Coverage()
    for claim in claims.get("deadletter", []):
        double = double.union(dead.intersection(claim))
        dead = dead.union(claim)
    double = double.union(dead.intersection(analysed.union(in_review)))
    seen = analysed.union(in_review).union(dead)
    # raw messages some claim names as carrying many records count by those records
    raw_messages = len(raw)
    raw, whole_too = expected_records(raw, seen)
    by_reason: dict[str, int] = {}
    if review_reasons is not None:
        if len(review_reasons) != len(reviews):
            raise ValueError("review_reasons must name one reason per review claim")
        assigned = Coverage()
        for reason, claim in zip(reversed(review_reasons), reversed(reviews), strict=True):
            own = len(claim.difference(assigned).difference(analysed).intersection(raw))
            if own:
                by_reason[reason] = by_reason.get(reason, 0) + own
            assigned = assigned.union(claim)
    return AuditResult(
        raw_records=len(raw),
        claimed={"reports": len(analysed.intersection(raw)),
                 "review": len(parked.intersection(raw)),
                 "deadletter": len(dead.intersection(raw))},
        missing=raw.difference(seen).to_json(),
        double_counted=double.intersection(raw).union(whole_too).to_json(),
        foreign=seen.difference(raw).difference(whole_too).to_json(),
        parked_by_reason=dict(sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))),
        raw_messages=raw_messages, problems=list(problems or []))


def summary_line(result: AuditResult) -> str:
    """analysed / parked (by reason) / dead-lettered, for stderr."""
    parked = result.claimed.get("review", 0)
    reasons = ", ".join(f"{r} {n:,}" for r, n in result.parked_by_reason.items())
    return (f"{result.raw_records:,} raw records: {result.claimed.get('reports', 0):,} analysed, "
            f"{parked:,} parked in review{f' ({reasons})' if reasons else ''}, "
            f"{result.claimed.get('deadletter', 0):,} dead-lettered, "
            f"{missing_count(result):,} missing, "
            f"{len(Coverage.from_json(result.double_counted)):,} double-counted")


def expected_records(raw: Coverage, seen: Coverage) -> tuple[Coverage, Coverage]:
    """The log records the raw messages hold, as claims name them, and the messages
    claimed both whole and record by record (double-counted).

    A raw message some claim names as carrying N records ("t/p@offset:N") is
    expected as indices 0..N-1 under that key instead of its offset under "t/p".
    """
    parts = raw.parts()
    multi: dict[str, list[int]] = {}
    expected: dict[str, IntervalSet] = {}
    for key in seen.parts():
        split = split_message_key(key)
        if split is None:
            continue
        part, offset, count = split
        if part in parts and offset in parts[part] and count > 0:
            multi.setdefault(part, []).append(offset)
            expected[key] = IntervalSet([(0, count - 1)])
    messages = Coverage({p: IntervalSet.from_values(offsets) for p, offsets in multi.items()})
    whole = raw.difference(messages)
    return whole.union(Coverage(expected)), messages.intersection(seen)


async def raw_coverage(settings: Settings) -> tuple[Coverage, list[str]]:
    """All offsets currently held by the input topics (low to high watermark), and
    what is wrong with the inputs: a listed topic missing, a pattern matching none,
    a topic holding no records."""
    problems: list[str] = []
    async with Reader(settings) as reader:
        found = matching(settings, set(await reader.topics()))
        for topic in settings.topics.raw_topics:
            if topic not in found:
                # a topic this user may not describe is missing from the listing too
                await reader.partitions(topic)  # raises NotAuthorized then
                problems.append(f"input topic {topic} does not exist")
        pattern = settings.topics.raw_pattern
        if pattern and not set(found) - set(settings.topics.raw_topics):
            problems.append(f"no topic matches RETRO_TOPICS__RAW_PATTERN {pattern!r}")
        held: dict[str, list[list[int]]] = {}
        for topic in found:
            mine = {f"{topic}/{partition}": [[begin, end - 1]]
                    for partition, (begin, end) in (await reader.offsets(topic)).items()
                    if end > begin}
            if not mine:
                problems.append(f"input topic {topic} holds no records")
            held.update(mine)
    return Coverage.from_json(held), problems


async def read_reviews(settings: Settings) -> tuple[dict[str, Coverage], list[str]]:
    """Distinct reviews (by id) in topic order, and their reasons in the same order."""
    reviews: dict[str, Coverage] = {}
    reasons: dict[str, str] = {}
    async for _key, value in read_topic(settings, settings.topics.review):
        item = Review.model_validate_json(value)
        reviews.pop(item.id, None)  # a replayed review moves to its latest place
        reviews[item.id] = Coverage.from_json(item.covered)
        reasons[item.id] = item.reason
    return reviews, [reasons[i] for i in reviews]


async def collect_claims(settings: Settings) -> tuple[dict[str, list[Coverage]], list[str]]:
    """The claims of reports, review and dead letter, and the reviews' reasons."""
    # every share of every report is its own claim: shares must never overlap
    reports = (await read_latest(settings)).shards()
    reviews, reasons = await read_reviews(settings)
    dead: dict[str, Coverage] = {}
    async for _key, value in read_topic(settings, settings.topics.deadletter):
        letter = DeadLetter.model_validate_json(value)
        if letter.stage == "produce":  # never reached the raw topic: no raw offset to claim
            continue
        dead[letter.id] = Coverage.from_entries([letter.raw.ledger_entry()])
    return {
        "reports": [Coverage.from_json(r.covered) for r in reports.values()],
        "review": list(reviews.values()),
        "deadletter": list(dead.values()),
    }, reasons


async def audit(settings: Settings) -> AuditResult:
    raw, problems = await raw_coverage(settings)
    claims, reasons = await collect_claims(settings)
    return reconcile(raw, claims, reasons, problems)


async def audit_until_clean(settings: Settings, *, wait_seconds: float,
                            poll_seconds: float = 2.0) -> AuditResult:
    """Audit repeatedly while records are still in flight, up to ``wait_seconds``."""
    deadline = time.monotonic() + wait_seconds
    while True:
        result = await audit(settings)
        if result.ok or time.monotonic() >= deadline or result.double_counted or (
                result.problems and not result.missing):
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
