"""The batch loop's pure parts: what it commits and what one batch outcome publishes."""

from __future__ import annotations

from aiokafka import TopicPartition

from streams.agents.batch import lanes_group, outcome_messages
from streams.kafka.acks import Commits
from streams.records import BatchOutcome, Review
from streams.settings import Settings

from helpers import make_fragment

FAST0 = TopicPartition("retro.records.fast", 0)
FAST1 = TopicPartition("retro.records.fast", 1)


def test_commits_only_a_contiguous_prefix_of_done_records() -> None:
    commits = Commits()
    handles = [commits.acker.track(FAST0, (FAST0, offset)) for offset in (10, 11, 12)]
    commits.acker.done(handles[2])  # a later batch finished first
    assert commits.take({FAST0}) == {}
    commits.acker.done(handles[0])
    assert commits.take({FAST0}) == {FAST0: 11}
    commits.acker.done(handles[1])
    assert commits.take({FAST0}) == {FAST0: 13}
    assert commits.take({FAST0}) == {}  # taken once


def test_commits_skip_partitions_no_longer_owned() -> None:
    commits = Commits()
    for tp in (FAST0, FAST1):
        commits.acker.done(commits.acker.track(tp, (tp, 5)))
    assert commits.take({FAST1}) == {FAST1: 6}


def test_an_outcome_publishes_fragments_by_report_and_reviews_by_id() -> None:
    settings = Settings()
    fragment = make_fragment("f-1", {"raw/0": [[0, 1]]}, report_id="2026-11-29/all#0")
    review = Review(id="r-1", lane="fast", reason="invalid_answer", detail="x",
                    covered={"raw/0": [[2, 2]]}, record_ids=["raw/0/2"], model="m",
                    prompt_version="v1")
    out = outcome_messages(BatchOutcome(fragments=[fragment], reviews=[review]), settings)
    assert [(role, key) for role, key, _ in out] == [
        ("fragments", b"2026-11-29/all#0"), ("review", b"r-1")]
    assert b'"covered"' in out[0][2]


def test_the_loop_has_a_group_of_its_own() -> None:
    assert lanes_group("retro-stream-batch") == "retro-stream-batch-lanes"
