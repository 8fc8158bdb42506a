"""`retro review`: what is parked in review, why, and what can be re-driven.

A review parks the records of a batch whose answer could not be used. Review is a
state a record leaves: once a report covers a record (the re-drive loop, a
``retro review --redrive``, or a re-batch after a crash), it is analysed and no
longer parked. This reads the review topic and the reports' coverage and sums up
what is still parked: records per reason (transient reasons are re-driven by the
worker on their own, permanent ones wait for a person), and the newest reviews.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from streams.gateway.reasons import kind_of
from streams.intervals import Coverage
from streams.kafka.readers import read_values
from streams.records import Review
from streams.report.ops.deadletters import _one_line
from streams.report.store import read_latest
from streams.settings import Settings


@dataclass(frozen=True)
class ReviewEntry:
    review: Review
    timestamp_ms: int
    parked: Coverage = field(default_factory=Coverage)  # still covered by no report

    @property
    def when(self) -> str:
        at = datetime.fromtimestamp(self.timestamp_ms / 1000, tz=UTC)
        return at.strftime("%Y-%m-%dT%H:%M:%SZ")

    def to_json(self) -> dict[str, Any]:
        r = self.review
        return {"written_at": self.when, "id": r.id, "lane": r.lane, "reason": r.reason,
                "kind": kind_of(r.reason), "records": len(Coverage.from_json(r.covered)),
                "parked": len(self.parked), "covered": r.covered, "detail": r.detail}


@dataclass
class ReviewSummary:
    topic: str
    reviews: int = 0  # distinct reviews on the topic
    parked: int = 0  # records covered by a review and by no report
    by_reason: dict[str, int] = field(default_factory=dict)  # parked records, most first
    latest: list[ReviewEntry] = field(default_factory=list)  # newest first, parked only
    unreadable: int = 0


def parked_entries(entries: list[ReviewEntry], analysed: Coverage) -> list[ReviewEntry]:
    """Each review with the records it still parks, oldest first.

    A record in two reviews is parked once, under the newest review; a record a report
    covers is parked nowhere. A replayed review (same id) keeps its newest copy.
    """
    unique: dict[str, ReviewEntry] = {}
    for entry in sorted(entries, key=lambda e: e.timestamp_ms):
        unique.pop(entry.review.id, None)
        unique[entry.review.id] = entry
    out: list[ReviewEntry] = []
    assigned = Coverage()
    for entry in reversed(list(unique.values())):
        covered = Coverage.from_json(entry.review.covered)
        own = covered.difference(assigned).difference(analysed)
        assigned = assigned.union(covered)
        out.append(ReviewEntry(entry.review, entry.timestamp_ms, own))
    out.reverse()
    return out


def summarize(entries: list[ReviewEntry], analysed: Coverage, *, topic: str, latest: int = 10,
              unreadable: int = 0) -> ReviewSummary:
    """Parked records per reason and the ``latest`` newest reviews that still park some."""
    parked = parked_entries(entries, analysed)
    by_reason: dict[str, int] = {}
    for entry in parked:
        if entry.parked:
            by_reason[entry.review.reason] = by_reason.get(entry.review.reason, 0) + len(
                entry.parked)
    still = [e for e in reversed(parked) if e.parked]
    return ReviewSummary(
        topic=topic, reviews=len(parked), parked=sum(by_reason.values()),
        by_reason=dict(sorted(by_reason.items(), key=lambda kv: (-kv[1], kv[0]))),
        latest=still[:max(0, latest)], unreadable=unreadable)


def parked_reviews(entries: list[ReviewEntry], analysed: Coverage,
                   reasons: Collection[str] | None = None) -> list[tuple[Review, Coverage]]:
    """Each review of the chosen reasons (all reasons for None) that still parks records,
    with those records: what to re-drive, and where the review says they sit."""
    return [(entry.review, entry.parked) for entry in parked_entries(entries, analysed)
            if entry.parked and (reasons is None or entry.review.reason in reasons)]


def parked_coverage(entries: list[ReviewEntry], analysed: Coverage,
                    reasons: Collection[str] | None = None) -> Coverage:
    """The parked records of the chosen reasons (all reasons for None)."""
    chosen = Coverage()
    for _, parked in parked_reviews(entries, analysed, reasons):
        chosen = chosen.union(parked)
    return chosen


def render_text(summary: ReviewSummary) -> str:
    if not summary.parked:
        return (f"nothing parked in review ({summary.reviews} reviews on {summary.topic}, "
                "every record they cover is in a report)")
    lines = [f"{summary.parked} records parked in review ({summary.reviews} reviews on "
             f"{summary.topic})", "", "by reason:"]
    width = max(len(str(n)) for n in summary.by_reason.values())
    lines += [f"  {n:>{width}}  {reason}  ({kind_of(reason)}"
              f"{': re-driven automatically' if kind_of(reason) == 'transient' else ''})"
              for reason, n in summary.by_reason.items()]
    if summary.unreadable:
        lines.append(f"  ({summary.unreadable} messages on the topic were not reviews)")
    lines += ["", f"latest {len(summary.latest)} (newest first):"]
    for e in summary.latest:
        lines.append(f"  {e.when}  {e.review.id}  {e.review.lane}/{e.review.reason}  "
                     f"{len(e.parked)} parked  {_where(e.parked)}")
        lines.append(f"      {_one_line(e.review.detail)}")
    lines += ["", "re-drive them with `retro review --redrive [--reason R]`"]
    return "\n".join(lines)


def render_json(summary: ReviewSummary) -> str:
    return json.dumps({
        "topic": summary.topic, "reviews": summary.reviews, "parked": summary.parked,
        "by_reason": summary.by_reason, "unreadable": summary.unreadable,
        "latest": [e.to_json() for e in summary.latest]}, indent=2)


async def read_reviews(settings: Settings) -> tuple[list[ReviewEntry], Coverage, int]:
    """(every review with its write time, what reports cover, unreadable messages)."""
    reviews, unreadable = await read_values(settings, settings.topics.review,
                                            Review.model_validate_json)
    entries = [ReviewEntry(review, at) for review, at in reviews]
    analysed = Coverage()
    for report in (await read_latest(settings)).shards().values():
        analysed = analysed.union(Coverage.from_json(report.covered))
    return entries, analysed, unreadable


def _where(covered: Coverage) -> str:
    parts = [f"{tp}@{r[0][0]}-{r[-1][1]}" for tp, r in covered.to_json().items() if r]
    return ", ".join(parts[:3]) + (f" (+{len(parts) - 3} more)" if len(parts) > 3 else "")
