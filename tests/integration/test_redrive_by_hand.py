"""`retro review --redrive` against the real broker, nothing stubbed.

The compactor parks a fragment the merge refused as a review without lane
coordinates (``rejected_review``): only the raw topic holds its records, so the
re-drive reads them there and cleans them again. A review the batch loop parked names
where its records sit in the lanes and goes back from there. Both kinds in one run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streams.intervals import Coverage
from streams.kafka.readers import read_messages
from streams.records import NormalizedRecord, Review

from helpers import make_fragment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


async def _lane_records(settings) -> list[tuple[str, int, int, NormalizedRecord]]:
    """(lane topic, partition, offset, record) of every lane message."""
    out = []
    for lane in (settings.topics.fast, settings.topics.slow):
        async for m in read_messages(settings, lane):
            out.append((m.topic, m.partition, m.offset,
                        NormalizedRecord.model_validate_json(m.value)))
    return out


async def _send_reviews(settings, reviews: list[Review]) -> None:
    from streams.kafka.connect import produce_all
    from streams.runtime.step import Out

    await produce_all(settings, [Out(settings.topics.review, r.id.encode(),
                                     r.model_dump_json().encode()) for r in reviews])


def test_reviews_with_and_without_lane_coordinates_go_back_to_the_lanes(
        pipeline_factory, wait_until, tmp_path: Path) -> None:
    from streams.report.compactor.step import rejected_review

    p = pipeline_factory()
    log = tmp_path / "app.log"
    log.write_text("".join(f"2026-11-29T10:00:{i:02d}Z ERROR disk full on node {i}\n"
                           for i in range(12)))
    p.retro("produce", "--quiet", str(log))
    settings = p.settings()
    worker = p.start_worker("clean", log_name="worker-clean")

    def cleaned() -> list | None:
        found = asyncio.run(_lane_records(settings))
        return found if len(found) >= 12 else None

    records = wait_until(cleaned, timeout=120, what="the cleaned records on the lanes")
    p.kill(worker)
    assert len(records) == 12, records
    by_raw = sorted(records, key=lambda r: r[3].raw.as_tuple())

    # a fragment the merge refused: its review says only where the raw records are
    rejected = [r for *_, r in by_raw[:5]]
    raw_part = f"{rejected[0].raw.topic}/{rejected[0].raw.partition}"
    unplaced = rejected_review(make_fragment("f-refused", {raw_part: [
        [r.raw.offset, r.raw.offset] for r in rejected]}), "it names no report", "(none)")
    assert unplaced.lane_covered is None
    # a batch's review: the batch loop noted where its records were read in the lanes
    parked = by_raw[5:8]
    placed = Review(
        id="r-placed", lane="fast", reason="malformed_output", detail="still prose",
        covered={raw_part: [[r.raw.offset, r.raw.offset] for *_, r in parked]},
        record_ids=[r.id for *_, r in parked], model="m", prompt_version="v1", output=None,
        lane_covered=Coverage.from_coords([lane for *lane, _ in parked]).to_json())
    asyncio.run(_send_reviews(settings, [unplaced, placed]))

    listing = p.retro("review").stdout.decode()
    assert "8 records parked in review" in listing, listing
    proc = p.retro("review", "--redrive")
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert out.startswith("re-drove 8 parked records (every reason) to the lanes"), (out, err)
    assert "Traceback" not in err and "Unclosed" not in err, err  # no consumer left open

    again = asyncio.run(_lane_records(settings))
    counts: dict[tuple, int] = {}
    for *_, record in again:
        counts[record.raw.as_tuple()] = counts.get(record.raw.as_tuple(), 0) + 1
    twice = sorted(k for k, n in counts.items() if n == 2)
    assert twice == sorted(r.raw.as_tuple() for *_, r in by_raw[:8]), counts
    assert set(counts.values()) == {1, 2} and len(counts) == 12
    # cleaned again from raw, a record is what the clean stage made of it the first time
    first = {r.raw.as_tuple(): r for *_, r in records}
    for *_, record in again:
        assert record.message == first[record.raw.as_tuple()].message


def test_a_topic_read_to_its_end_and_the_latest_value_per_key(pipeline_factory) -> None:
    """The readers of streams.kafka.readers on the real broker: an empty topic reads as
    empty (after a fetch the broker answered), a missing one is not created by asking,
    and a compacted topic gives each key's latest value."""
    import time

    from streams.kafka.connect import produce_all
    from streams.kafka.readers import Metadata, latest_per_key
    from streams.kafka.topics import ensure_topics
    from streams.runtime.step import Out

    p = pipeline_factory()
    settings = p.settings()
    topic = settings.topics.notifications

    async def scenario() -> None:
        await ensure_topics(settings)
        began = time.monotonic()
        assert [m async for m in read_messages(settings, topic)] == []
        assert time.monotonic() - began < 5
        async with Metadata(settings) as metadata:
            assert await metadata.partitions(f"{p.prefix}.missing") == []
            assert f"{p.prefix}.missing" not in await metadata.topics()
            assert await metadata.partitions(topic) == [0, 1]
        await produce_all(settings, [Out(topic, f"k{i % 3}".encode(), f"v{i}".encode())
                                     for i in range(9)])
        latest = await latest_per_key(settings, topic)
        assert {k: m.value for k, m in latest.items()} == {
            b"k0": b"v6", b"k1": b"v7", b"k2": b"v8"}
        home = {m.partition for m in latest.values()}
        only = await latest_per_key(settings, topic, {min(home)})
        assert {m.partition for m in only.values()} == {min(home)}

    asyncio.run(scenario())
