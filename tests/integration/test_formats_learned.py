"""Sources in layouts nobody listed, through the worker's clean stage on the real broker.

Each file is one source (its Kafka key); the worker's cleaner learns each source's
structure from its first lines and every record comes out with the time and the
level its line states (streams.dev.layouts writes both down as truth).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from streams.dev.layouts import LAYOUTS, Line, generate
from streams.kafka.readers import read_topic
from streams.records import NormalizedRecord

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NAMES = ("logcat", "apache-combined", "epoch-millis", "csv-time-column")
LINES = 120


async def _records(settings) -> list[NormalizedRecord]:
    out: list[NormalizedRecord] = []
    for lane in ("fast", "slow"):
        async for _k, v in read_topic(settings, getattr(settings.topics, lane)):
            out.append(NormalizedRecord.model_validate_json(v))
    return out


def test_worker_learns_unlisted_layouts_per_source(pipeline_factory, wait_until,
                                                  tmp_path: Path) -> None:
    start = datetime.now(UTC) - timedelta(days=40)
    truth: dict[str, list[Line]] = {}
    paths: list[str] = []
    for layout in (x for x in LAYOUTS if x.name in NAMES):
        lines = generate(layout, LINES, start=start)
        path = tmp_path / f"{layout.name}.log"
        path.write_text("".join(line.text + "\n" for line in lines), encoding="utf-8")
        truth[layout.name] = lines
        paths.append(str(path))
    p = pipeline_factory()
    p.retro("produce", "--quiet", *paths)
    p.start_worker("clean")
    settings = p.settings()
    total = LINES * len(NAMES)

    def all_cleaned() -> list[NormalizedRecord] | None:
        records = asyncio.run(_records(settings))
        return records if len(records) >= total else None

    records = wait_until(all_cleaned, timeout=180, interval=2, what=f"{total} cleaned records")
    assert len(records) == total
    by_source: dict[str, list[NormalizedRecord]] = {}
    for rec in records:
        by_source.setdefault(rec.source, []).append(rec)
    assert set(by_source) == set(NAMES)
    for name, recs in by_source.items():
        recs.sort(key=lambda r: r.raw.offset)  # one key, one partition: offsets keep order
        stated = truth[name]
        assert [r.timestamp for r in recs] == [x.time for x in stated], name
        levels_ok = sum(r.level == x.level for r, x in zip(recs, stated, strict=True))
        # only lines before the first five agreed may miss a lower-case or rare level
        assert levels_ok >= LINES - 4, (name, levels_ok)
