"""The lanes' contract read two ways: ``LaneRecord`` (what the batch stage reads) must
read every lane message as ``NormalizedRecord`` (what clean writes) does, and refuse
what it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pydantic import ValidationError

from streams.clean.cleaner import Cleaner
from streams.clean.step import routed_records
from streams.dev.sample import write_sample
from streams.errors import BadLaneRecord
from streams.ingest.reader import iter_records, open_source
from streams.records import (
    Coord,
    LaneRecord,
    NormalizedRecord,
    RawCoord,
    read_lane_record,
)
from streams.settings import Settings

from helpers import make_record

COORD_FIELDS = ("topic", "partition", "offset", "index", "count")


def _model_fields(model: Any) -> dict[str, Any]:
    """name -> default (``...`` when required) of a pydantic model."""
    return {name: (... if f.is_required() else f.get_default(call_default_factory=True))
            for name, f in model.model_fields.items()}


def _struct_fields(struct: Any) -> dict[str, Any]:
    """name -> default (``...`` when required) of a msgspec struct."""
    return {f.name: (... if f.required else (f.default if f.default is not msgspec.NODEFAULT
                                             else f.default_factory()))
            for f in msgspec.structs.fields(struct)}


def test_the_reader_has_the_fields_and_defaults_of_the_model() -> None:
    assert _struct_fields(LaneRecord) == _model_fields(NormalizedRecord)
    assert _struct_fields(Coord) == _model_fields(RawCoord)


def _assert_read_alike(data: bytes) -> None:
    model = NormalizedRecord.model_validate_json(data)
    read = read_lane_record(data)
    for name in NormalizedRecord.model_fields:
        if name != "raw":
            assert getattr(read, name) == getattr(model, name), name
    for name in COORD_FIELDS:
        assert getattr(read.raw, name) == getattr(model.raw, name), name
    assert (read.raw.id, read.raw.ledger_entry()) == (model.raw.id, model.raw.ledger_entry())


def _lane_messages(directory: Path, records: int) -> list[bytes]:
    """The lane messages clean writes for the generated sample, bad records included."""
    cleaner = Cleaner.from_settings(Settings())
    out = []
    for path in write_sample(directory, records=records):
        with open_source(str(path)) as stream:
            for number, data in iter_records(stream):
                coord = RawCoord(topic=path.name, partition=0, offset=number)
                out += [value for lane, _key, value, _reason, _mark in routed_records(
                    cleaner, data, coord, path.name, None, None) if lane != "deadletter"]
    return out


def test_every_lane_message_of_the_sample_reads_the_same_both_ways(tmp_path: Path) -> None:
    messages = _lane_messages(tmp_path, 1500)
    assert len(messages) > 1000
    for data in messages:
        _assert_read_alike(data)


def test_a_record_of_a_multi_record_message_reads_the_same_both_ways() -> None:
    record = make_record(7, level=None, timestamped=False)
    record.raw = record.raw.in_message(2, 5)
    record.redactions = {"email": 2}
    record.attributes = {"nested": {"a": [1, 2.5, None, True]}, "n": 3}
    _assert_read_alike(record.model_dump_json().encode())
    assert read_lane_record(record.model_dump_json().encode()).raw.id.endswith("/7/2")


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_a_number_json_has_no_word_for_reaches_the_lanes_as_null(number: bytes) -> None:
    """Python's JSON reader takes NaN and infinities from a log line; JSON has no
    such numbers, so clean writes null and every reader of the lanes can read it."""
    line = b'{"message": "slow call", "latency": ' + number + b'}'
    cleaner = Cleaner.from_settings(Settings())
    [(lane, _key, value, _reason, _mark)] = routed_records(
        cleaner, line, RawCoord(topic="raw", partition=0, offset=0), "app", None, None)
    assert lane != "deadletter"
    assert read_lane_record(value).attributes == {"latency": None}
    assert json.loads(value)["attributes"] == {"latency": None}
    _assert_read_alike(value)


def _valid() -> dict[str, Any]:
    return json.loads(make_record(3).model_dump_json())


def _without(name: str) -> dict[str, Any]:
    doc = _valid()
    del doc[name]
    return doc


def _with(path: str, value: Any) -> dict[str, Any]:
    doc = _valid()
    *parents, last = path.split(".")
    target = doc
    for p in parents:
        target = target[p]
    target[last] = value
    return doc


REFUSED = [
    *[(f"no {name}", _without(name)) for name in
      ("id", "raw", "source", "format", "message", "template_id", "template", "tokens",
       "cost", "lane")],
    ("message a number", _with("message", 5)),
    ("tokens text", _with("tokens", "many")),
    ("tokens a fraction", _with("tokens", 1.5)),
    ("an unknown lane", _with("lane", "medium")),
    ("an unknown level", _with("level", "LOUD")),
    ("an unknown format", _with("format", "xml")),
    ("raw a string", _with("raw", "raw/0/3")),
    ("raw without an offset", {**_valid(), "raw": {"topic": "t", "partition": 0}}),
    ("attributes a list", _with("attributes", [1])),
    ("a redaction count text", _with("redactions", {"email": "two"})),
    ("cost null", _with("cost", None)),
    ("a list", [_valid()]),
]


@pytest.mark.parametrize(("case", "doc"), REFUSED, ids=[c for c, _ in REFUSED])
def test_what_the_model_refuses_the_reader_refuses(case: str, doc: Any) -> None:
    data = json.dumps(doc).encode()
    with pytest.raises(ValidationError):
        NormalizedRecord.model_validate_json(data)
    with pytest.raises(BadLaneRecord):
        read_lane_record(data)


@pytest.mark.parametrize("data", [b"", b"{", b"\xff\xfe", b"null", b'{"id": "x"'])
def test_bytes_that_are_no_json_object_are_refused_with_a_reason(data: bytes) -> None:
    with pytest.raises(BadLaneRecord) as caught:
        read_lane_record(data)
    assert str(caught.value)


def test_unknown_fields_are_ignored_by_both() -> None:
    data = json.dumps({**_valid(), "added_later": {"x": 1}}).encode()
    _assert_read_alike(data)


def test_the_reader_refuses_the_numbers_as_text_the_model_would_coerce() -> None:
    """Strict where pydantic is lax: clean never writes a count as text or a bool,
    so such a message came from another producer and goes to the dead letter."""
    for value in ("5", True):
        data = json.dumps(_with("tokens", value)).encode()
        assert NormalizedRecord.model_validate_json(data).tokens in (5, 1)
        with pytest.raises(BadLaneRecord, match="tokens"):
            read_lane_record(data)


@pytest.mark.parametrize(("index", "count"), [(0, 1), (2, 5)])
def test_a_coord_says_what_the_raw_coord_it_stands_for_says(index: int, count: int) -> None:
    model = RawCoord(topic="raw", partition=3, offset=41).in_message(index, count)
    fast = Coord("raw", 3, 41).in_message(index, count)
    assert (fast.id, fast.ledger_entry(), fast.wire()) == (
        model.id, model.ledger_entry(), json.loads(model.model_dump_json()))
    assert fast.as_raw() == model


def test_the_in_memory_pipeline_builds_the_records_clean_builds(tmp_path: Path) -> None:
    """``clean_lane_records`` (``retro postmortem``) holds what ``clean`` holds, and
    dead-letters the same records."""
    models, lanes = Cleaner.from_settings(Settings()), Cleaner.from_settings(Settings())
    for path in write_sample(tmp_path, records=1500):
        with open_source(str(path)) as stream:
            for number, data in iter_records(stream):
                built = models.clean(data, RawCoord(topic=path.name, partition=0,
                                                    offset=number), path.name)
                read = lanes.clean_lane_records(data, Coord(path.name, 0, number), path.name)
                assert [type(r).__name__ for r in built] == [
                    "DeadLetter" if type(r).__name__ == "DeadLetter" else "NormalizedRecord"
                    for r in read]
                for model, record in zip(built, read, strict=True):
                    if isinstance(record, LaneRecord):
                        fields = {**msgspec.structs.asdict(record), "raw": record.raw.wire()}
                        assert fields == model.model_dump(), number
