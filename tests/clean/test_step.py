"""The clean step: one output per log record, sent together, done on delivery."""

from __future__ import annotations

import asyncio
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.clean.cleaner import Cleaner
from streams.clean.step import CleanStep, route
from streams.ingest.raw_keys import source_of_key
from streams.metrics import Metrics
from streams.records import NormalizedRecord, RawCoord, read_lane_record
from streams.runtime.memory import MemoryRun, Part, Record
from streams.settings import CleanSettings, Settings

from helpers import SHIPPER_CAPTURES, otlp_logs, sample_lines, shipper_messages


def test_an_otlp_message_routes_every_record_and_a_line_routes_one() -> None:
    cleaner = Cleaner.from_settings(Settings())
    raw = otlp_logs([{"body": f"2017-12-01 06:33:0{i} ERROR boom {i}"} for i in range(3)],
                    resource={"service.name": "checkout"})
    routed = route(cleaner, value=raw, key=None, topic="otlp", partition=2, offset=5,
                   timestamp_ms=1_700_000_000_000)
    assert [r.lane for r in routed] == ["fast"] * 3
    docs = [json.loads(r.value) for r in routed]
    assert [d["id"] for d in docs] == ["otlp/2/5/0", "otlp/2/5/1", "otlp/2/5/2"]
    assert {r.key for r in routed} == {b"checkout"}  # no Kafka key: the envelope's stream
    (line,) = route(cleaner, value=b"2017-12-01 06:33:04 INFO ok", key=b"app.log",
                    topic="raw", partition=0, offset=9, timestamp_ms=None)
    assert json.loads(line.value)["raw"] == {"topic": "raw", "partition": 0, "offset": 9}
    assert line.key == b"app.log"


def test_a_routed_value_is_the_records_own_json() -> None:
    """The lanes read these bytes back as a NormalizedRecord: what the model writes."""
    settings = Settings()
    coord = RawCoord(topic="raw", partition=0, offset=9)
    line = b'{"time":"2026-11-28T10:00:00Z","level":"warn","msg":"disk 91% on /dev/sda1"}'
    (record,) = Cleaner.from_settings(settings).clean(line, coord, "app")
    (routed,) = route(Cleaner.from_settings(settings), value=line, key=b"app", topic="raw",
                      partition=0, offset=9, timestamp_ms=None)
    assert isinstance(record, NormalizedRecord)
    assert routed.value == record.model_dump_json().encode()
    assert NormalizedRecord.model_validate_json(routed.value) == record


def test_the_step_writes_the_bytes_of_the_records_clean_builds(tmp_path) -> None:
    """The step writes each record's fields as JSON without building the record (the
    lanes validate what they read): on every line of the sample and the shared logs,
    and every message the real shippers wrote, the bytes are those of the record that
    ``clean`` builds, and they read back as that record."""
    settings = Settings()
    raw = [(line.encode(), b"app") for line in sample_lines(tmp_path)]
    raw += [(row["bytes"], None) for name in SHIPPER_CAPTURES for row in shipper_messages(name)]
    built, routed = Cleaner.from_settings(settings), Cleaner.from_settings(settings)
    records = 0
    for offset, (value, key) in enumerate(raw):
        coord = RawCoord(topic="raw", partition=0, offset=offset)
        want = [o for o in built.clean(value, coord, source_of_key(key))
                if isinstance(o, NormalizedRecord)]
        got = [r.value for r in route(routed, value=value, key=key, topic="raw", partition=0,
                                      offset=offset, timestamp_ms=None) if r.lane != "deadletter"]
        assert got == [record.model_dump_json().encode() for record in want]
        assert [NormalizedRecord.model_validate_json(v) for v in got] == want
        records += len(want)
    assert records > len(raw) / 2


any_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF))  # lone surrogates too
any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | any_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(any_text, inner, max_size=3),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(any_text, any_json, max_size=5), any_text, st.booleans())
def test_any_json_object_is_routed_without_raising_and_reads_back(
        doc: dict, message: str, ascii_only: bool) -> None:
    """Any JSON log line, whatever code points it escapes (NaN, lone surrogates): one
    output, a dead letter with its reason or a record the lanes can read."""
    line = json.dumps({**doc, "message": message}, ensure_ascii=ascii_only)
    cleaner = Cleaner.from_settings(Settings())
    (routed,) = route(cleaner, value=line.encode("utf-8", "surrogatepass"), key=b"app",
                      topic="raw", partition=0, offset=1, timestamp_ms=None)
    if routed.lane == "deadletter":
        assert routed.reason
    else:
        assert read_lane_record(routed.value).raw.id == "raw/0/1"


def _fetch() -> list[Record]:
    stamp = 1_764_000_000_000
    return [Record("raw", 0, 0, b"app", b"2026-11-28T10:00:00Z INFO ok", stamp),
            Record("raw", 0, 1, b"app", b"x" * 500, stamp),
            Record("raw", 0, 2, b"app", b"y" * 500, stamp)]


def test_a_fetch_is_done_and_counted_only_once_it_is_delivered() -> None:
    """Counting when a record was cleaned counted every attempt: a fetch read again
    after a failed delivery showed 9 dead letters where the topic held 4."""
    settings = Settings(clean=CleanSettings(max_record_bytes=100))
    metrics = Metrics()
    step = CleanStep(settings, Cleaner.from_settings(settings), metrics)

    def count(name: str, labels: dict[str, str]) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    async def scenario() -> None:
        failing = MemoryRun(step, [Part("raw", 0)])
        failing.sink.refuse = True  # a broker restart
        await failing.fetch(*_fetch())
        assert failing.committed == {} and failing.ctx.failed is not None
        assert count("retro_deadletter_total", {"stage": "clean", "reason": "too_large"}) == 0
        again = MemoryRun(step, [Part("raw", 0)])  # rejoined: read from the commit
        await again.fetch(*_fetch())
        assert len(again.sent_to(settings.topics.deadletter)) == 2
        assert [o.key for o in again.sent_to(settings.topics.fast)] == [b"app"]
        assert again.committed == {Part("raw", 0): 3}

    asyncio.run(scenario())
    assert count("retro_deadletter_total", {"stage": "clean", "reason": "too_large"}) == 2
    assert count("retro_records_routed_total", {"lane": "deadletter"}) == 2
    assert count("retro_records_routed_total", {"lane": "fast"}) == 1
