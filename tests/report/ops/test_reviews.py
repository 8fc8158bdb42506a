"""`retro review`: parked records per reason, newest reviews, what a re-drive sends."""

from __future__ import annotations

import json

from streams.intervals import Coverage
from streams.records import Review
from streams.report.ops.reviews import (
    ReviewEntry,
    parked_coverage,
    parked_reviews,
    render_json,
    render_text,
    summarize,
)


def review(rid: str, reason: str, *ranges: tuple[int, int], part: str = "raw/0") -> Review:
    return Review(id=rid, lane="fast", reason=reason, detail=f"why {rid}",
                  covered={part: [list(r) for r in ranges]}, record_ids=[], model="m",
                  prompt_version="v1")


def cov(part: str, *ranges: tuple[int, int]) -> Coverage:
    return Coverage.from_json({part: [list(r) for r in ranges]})


ENTRIES = [
    ReviewEntry(review("r-a", "model_unavailable", (0, 9)), 1_000),
    ReviewEntry(review("r-b", "schema", (10, 14)), 2_000),
    ReviewEntry(review("r-c", "retry_budget_exhausted", (20, 29)), 3_000),
    ReviewEntry(review("r-a", "model_unavailable", (0, 9)), 4_000),  # replayed after a crash
    ReviewEntry(review("r-d", "malformed_output", (25, 34)), 5_000),  # re-batched, failed again
]


def test_records_a_report_covers_are_no_longer_parked() -> None:
    summary = summarize(ENTRIES, cov("raw/0", (0, 9)), topic="retro.review")
    assert summary.reviews == 4
    # r-a analysed; r-c keeps 20-24, the newer r-d parks 25-34 under its reason
    assert summary.by_reason == {"malformed_output": 10, "retry_budget_exhausted": 5,
                                 "schema": 5}
    assert summary.parked == 20
    assert [e.review.id for e in summary.latest] == ["r-d", "r-c", "r-b"]


def test_nothing_parked_when_reports_cover_every_review() -> None:
    summary = summarize(ENTRIES, cov("raw/0", (0, 40)), topic="retro.review")
    assert summary.parked == 0 and summary.latest == []
    assert render_text(summary).startswith("nothing parked in review (4 reviews")


def test_a_re_drive_sends_only_parked_records_of_the_chosen_reasons() -> None:
    analysed = cov("raw/0", (0, 9))
    assert parked_coverage(ENTRIES, analysed, {"retry_budget_exhausted"}).to_json() == {
        "raw/0": [[20, 24]]}
    assert parked_coverage(ENTRIES, analysed).to_json() == {"raw/0": [[10, 14], [20, 34]]}
    assert len(parked_coverage(ENTRIES, analysed, {"model_unavailable"})) == 0


def test_text_and_json_name_reasons_kinds_and_newest_reviews() -> None:
    summary = summarize(ENTRIES, Coverage(), topic="retro.review", latest=2)
    text = render_text(summary)
    assert "30 records parked in review (4 reviews on retro.review)" in text
    assert "10  model_unavailable  (transient: re-driven automatically)" in text
    assert "5  schema  (permanent)" in text
    assert "r-d  fast/malformed_output  10 parked  raw/0@25-34" in text
    data = json.loads(render_json(summary))
    assert data["parked"] == 30 and len(data["latest"]) == 2
    assert data["latest"][0]["kind"] == "permanent"
    # the replayed r-a counts at its newest copy, once
    assert (data["latest"][1]["id"], data["latest"][1]["parked"]) == ("r-a", 10)


def test_a_re_drive_gets_each_review_with_its_own_parked_records() -> None:
    """Each review says where its records sit in the lanes: the re-drive reads them there."""
    chosen = parked_reviews(ENTRIES, cov("raw/0", (0, 9)),
                            {"retry_budget_exhausted", "malformed_output"})
    assert [(r.id, parked.to_json()) for r, parked in chosen] == [
        ("r-c", {"raw/0": [[20, 24]]}), ("r-d", {"raw/0": [[25, 34]]})]
