"""The clean stage on the real broker: every raw offset routed exactly once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from streams.intervals import Coverage
from streams.kafka.readers import read_topic
from streams.records import DeadLetter, NormalizedRecord

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _inputs(tmp_path: Path) -> list[str]:
    from streams.dev.sample import write_sample

    paths = [str(p) for p in write_sample(tmp_path / "sample", records=1500, include_bad=True)]
    for rel in ("loghub/HDFS/HDFS_2k.log", "kafka-broker-incident/kafka1-server.log",
                "nezha-trainticket/trainticket-2023-01-29-0927.docker-json.log"):
        if (SHARED / rel).exists():
            paths.append(str(SHARED / rel))
    return paths


async def _routed(settings) -> dict[str, list]:
    out: dict[str, list] = {"fast": [], "slow": [], "deadletter": []}
    for lane in ("fast", "slow"):
        async for _k, v in read_topic(settings, getattr(settings.topics, lane)):
            out[lane].append(NormalizedRecord.model_validate_json(v))
    async for _k, v in read_topic(settings, settings.topics.deadletter):
        out["deadletter"].append(DeadLetter.model_validate_json(v))
    return out


def test_every_raw_offset_routed_exactly_once(pipeline_factory, wait_until,
                                             tmp_path: Path) -> None:
    p = pipeline_factory()
    paths = _inputs(tmp_path)
    produced = p.retro("produce", "--quiet", "--spread", "3", *paths)
    total = int(produced.stderr.decode().split("produced ")[1].split(" ")[0])
    p.start_worker("clean")
    settings = p.settings()

    def all_routed() -> dict[str, list] | None:
        routed = asyncio.run(_routed(settings))
        n = sum(len(v) for v in routed.values())
        return routed if n >= total else None

    routed = wait_until(all_routed, timeout=180, interval=2, what=f"{total} routed records")
    coords = [r.raw.as_tuple() for lane in ("fast", "slow") for r in routed[lane]]
    coords += [d.raw.as_tuple() for d in routed["deadletter"]]
    assert len(coords) == total, "a record was routed twice"
    assert len(set(coords)) == total
    raw = Coverage.from_coords(coords)
    # exactly the offsets 0..n-1 of each raw partition, no gap, no duplicate
    for part, ranges in raw.to_json().items():
        assert part.startswith(settings.topics.raw)
        assert ranges[0][0] == 0 and len(ranges) == 1, f"gap in {part}: {ranges}"
    assert routed["slow"], "no record reached the slow lane"
    sources = {r.source for lane in ("fast", "slow") for r in routed[lane]}
    assert not any("~" in s for s in sources), sources  # spread keys map back to sources
    assert len({r.raw.partition for lane in ("fast", "slow") for r in routed[lane]}) == 2
    reasons = {d.reason for d in routed["deadletter"]}
    assert reasons & {"undecodable", "binary", "too_large"}, reasons
    for d in routed["deadletter"]:
        assert d.detail and d.sample is not None and d.raw_sha256  # redacted, no raw bytes
