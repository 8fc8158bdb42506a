"""Messages real shippers wrote to Kafka, through the clean stage.

tests/fixtures/shippers/ holds what rsyslog omkafka, syslog-ng format-json, kcat and
the OpenTelemetry Collector wrote for the same four small logs (captured with
bench/shippers/capture.py; README there). Every input line carries a marker (L01..)
and expected.json says its own event time, level and the service the shipper was
told. The shippers read the files years after those times, so a record dated by the
shipper's read time (or the Kafka timestamp) fails here.
"""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime

import pytest

from streams.clean.cleaner import Cleaner
from streams.ingest.raw_keys import source_of_key
from streams.records import DeadLetter, NormalizedRecord, RawCoord
from streams.settings import Settings

from helpers import SHIPPER_CAPTURES, SHIPPER_FIXTURES, shipper_field_errors
from helpers import shipper_messages as messages

FIXTURES = SHIPPER_FIXTURES
EXPECTED: dict[str, dict[str, str | None]] = json.loads(
    (FIXTURES / "expected.json").read_text())["lines"]
# plain lines carry no envelope: the Kafka key (kcat -k) names the source, as
# `retro produce` does; the service is then whatever the line itself says
WITHOUT_ENVELOPE = {"kcat"}


@functools.cache
def clean_all(name: str) -> tuple[NormalizedRecord | DeadLetter, ...]:
    """Every message of a capture through one Cleaner, as the worker feeds it."""
    cleaner = Cleaner.from_settings(Settings())
    out: list[NormalizedRecord | DeadLetter] = []
    for row in messages(name):
        coord = RawCoord(topic=f"shippers.{name}", partition=row["partition"],
                         offset=row["offset"])
        key = row["key"].encode() if row["key"] is not None else None
        received = datetime.fromtimestamp(row["timestamp_ms"] / 1000, tz=UTC)
        result = cleaner.clean(row["bytes"], coord, source_of_key(key), received_at=received)
        out += result if isinstance(result, list) else [result]
    return tuple(out)


def _cases(fields: tuple[str, ...]) -> list:
    cases = []
    for name in SHIPPER_CAPTURES:
        for field in fields:
            cases.append(pytest.param(name, field, id=f"{name}-{field}"))
    return cases


def test_every_shipper_capture_is_here() -> None:
    assert {"kcat", "rsyslog-template", "rsyslog-jsonmesg", "syslog-ng-json", "otlp-json",
            "otlp-proto"} <= set(SHIPPER_CAPTURES)


@pytest.mark.parametrize("name", SHIPPER_CAPTURES)
def test_the_capture_holds_every_line_read_years_later(name: str) -> None:
    """The fixture itself: all input lines, and the shipper's time is not the line's."""
    rows = messages(name)
    blob = b"\n".join(r["bytes"] for r in rows)  # protobuf too: markers are plain bytes
    assert [m for m in EXPECTED if m.encode() not in blob] == []
    read_years = {datetime.fromtimestamp(r["timestamp_ms"] / 1000, tz=UTC).year for r in rows}
    assert 2017 not in read_years


@pytest.mark.parametrize(("name", "field"), _cases(("time", "level", "service")))
def test_each_log_record_gets_its_own_time_level_and_service(name: str, field: str) -> None:
    results = clean_all(name)
    dead = [r for r in results if isinstance(r, DeadLetter)]
    assert not dead, f"dead letters: {[(d.reason, d.detail) for d in dead][:3]}"
    records = [r for r in results if isinstance(r, NormalizedRecord)]
    wrong = shipper_field_errors(records, service_from_source=name in WITHOUT_ENVELOPE,
                                 field=field)
    assert not wrong, f"{len(wrong)} wrong:\n" + "\n".join(wrong)


@pytest.mark.parametrize(("name", "field"), _cases(("records",)))
def test_each_log_record_is_one_record_with_its_own_coordinate(name: str, field: str) -> None:
    """N log records in one message are N records (one per marked line), never one id twice."""
    results = clean_all(name)
    records = [r for r in results if isinstance(r, NormalizedRecord)]
    assert shipper_field_errors(records, field=field) == []
    ids = [r.id for r in results]
    assert len(ids) == len(EXPECTED) == len(set(ids))
