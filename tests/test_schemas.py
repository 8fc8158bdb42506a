"""The JSON Schemas in schemas/ agree with the pydantic models in streams/records.py."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from pydantic import BaseModel

from streams.errors import ConfigError
from streams.records import (
    DeadLetter,
    Evidence,
    Fragment,
    NormalizedRecord,
    RawCoord,
    Review,
    TimeWindow,
)
from streams.report.state.merge import merge
from streams.schemas import load_schema, schemas_dir, validator

RAW = RawCoord(topic="retro.logs.raw", partition=2, offset=41)


def a_record(**overrides: Any) -> NormalizedRecord:
    fields: dict[str, Any] = {
        "id": RAW.id,
        "raw": RAW,
        "source": "hdfs/HDFS_2k.log",
        "format": "text",
        "timestamp": "2008-11-09T20:36:15.000Z",
        "timestamp_rule": "year from file",
        "level": "INFO",
        "service": "dfs.DataNode",
        "message": "PacketResponder 1 for block blk_38865049064139660 terminating",
        "attributes": {"pid": 148, "nested": {"a": [1, "b"]}},
        "template_id": "t0123456789",
        "template": "PacketResponder <NUM> for block <BLK> terminating",
        "tokens": 17,
        "cost": 0.095,
        "lane": "fast",
        "redactions": {"email": 1},
    }
    fields.update(overrides)
    return NormalizedRecord(**fields)


def a_deadletter() -> DeadLetter:
    return DeadLetter(
        id=RAW.id,
        raw=RAW,
        source="app.log",
        stage="clean",
        reason="undecodable",
        detail="not UTF-8 and not a known encoding; re-export the log as UTF-8",
        raw_base64=base64.b64encode(b"\xff\xfe\x00bad").decode(),
    )


def a_review() -> Review:
    return Review(
        id="r-1",
        lane="slow",
        reason="validation_failed",
        detail="fragment g2 has no suggestion",
        covered={"retro.logs.raw/2": [[0, 41], [50, 50]]},
        record_ids=[RAW.id],
        model="retro-rules-v1",
        prompt_version="v1",
        output='{"fragments": []}',
    )


CASES: list[tuple[str, BaseModel]] = [
    ("record", a_record()),
    ("deadletter", a_deadletter()),
    ("review", a_review()),
]
CASES_BY_NAME: dict[str, BaseModel] = dict(CASES)


def errors(name: str, doc: Any) -> list[str]:
    return [e.message for e in validator(name).iter_errors(doc)]


@pytest.mark.parametrize(("name", "model"), CASES)
def test_model_dump_validates(name: str, model: BaseModel) -> None:
    assert errors(name, model.model_dump(mode="json")) == []


@pytest.mark.parametrize(("name", "model"), CASES)
def test_schema_properties_are_exactly_the_model_fields(name: str, model: BaseModel) -> None:
    schema = load_schema(name)
    fields = type(model).model_fields
    assert set(schema["properties"]) == set(fields)
    required = {n for n, f in fields.items() if f.is_required()}
    assert set(schema["required"]) == required


def test_raw_coord_matches_its_model() -> None:
    for name in ("record", "deadletter"):
        raw = load_schema(name)["$defs"]["rawCoord"]
        assert set(raw["properties"]) == set(RawCoord.model_fields)
        required = {n for n, f in RawCoord.model_fields.items() if f.is_required()}
        assert set(raw["required"]) == required == {"topic", "partition", "offset"}


def test_optional_fields_may_be_null_or_absent() -> None:
    doc = a_record(timestamp=None, level=None, service=None, timestamp_rule=None).model_dump(
        mode="json"
    )
    assert errors("record", doc) == []
    for key in ("timestamp", "level", "service", "timestamp_rule", "attributes", "redactions"):
        del doc[key]
    assert errors("record", doc) == []
    review = a_review().model_dump(mode="json")
    review["output"] = None
    assert errors("review", review) == []


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        (name, field)
        for name, model in CASES
        for field, info in type(model).model_fields.items()
        if info.is_required()
    ],
)
def test_missing_required_field_fails(name: str, missing: str) -> None:
    doc = CASES_BY_NAME[name].model_dump(mode="json")
    del doc[missing]
    assert any(repr(missing) in m for m in errors(name, doc))


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("record", {"lane": "medium"}),
        ("record", {"format": "xml"}),
        ("record", {"level": "WARNING"}),
        ("record", {"tokens": -1}),
        ("record", {"tokens": 1.5}),
        ("record", {"redactions": {"email": "two"}}),
        ("record", {"id": "no-coordinates"}),
        ("record", {"unexpected": 1}),
        ("deadletter", {"stage": "report"}),
        ("deadletter", {"raw_base64": "not base64!"}),
        ("review", {"lane": "medium"}),
        ("review", {"covered": {"retro.logs.raw/2": [[1, 2, 3]]}}),
        ("review", {"covered": {"no-partition": [[1, 2]]}}),
    ],
)
def test_invalid_values_fail(name: str, change: dict[str, Any]) -> None:
    doc = CASES_BY_NAME[name].model_dump(mode="json")
    doc.update(change)
    assert errors(name, doc) != []


@pytest.mark.parametrize(
    "timestamp",
    [
        "2026-01-02 03:04:05Z",  # no T
        "2026-01-02T03:04:05",  # no zone
        "2026-01-02T03:04:05+00:00",  # UTC, but not written with Z
        "2026-13-02T03:04:05Z",  # month 13
        "2026-01-02T24:00:00Z",
        "Jan  2 03:04:05",
        "",
    ],
)
def test_bad_timestamps_fail(timestamp: str) -> None:
    doc = a_record().model_dump(mode="json")
    doc["timestamp"] = timestamp
    assert errors("record", doc) != []


@pytest.mark.parametrize(
    "timestamp",
    ["2026-01-02T03:04:05Z", "2026-01-02T03:04:05.678Z", "2026-01-02T03:04:05.123456789Z"],
)
def test_good_timestamps_pass(timestamp: str) -> None:
    doc = a_record().model_dump(mode="json")
    doc["timestamp"] = timestamp
    assert errors("record", doc) == []


def test_bad_raw_coord_fails() -> None:
    doc = a_record().model_dump(mode="json")
    doc["raw"] = {"topic": "t", "partition": -1, "offset": 0}
    assert errors("record", doc) != []
    doc["raw"] = {"topic": "t", "partition": 0}
    assert errors("record", doc) != []


def test_load_schema_accepts_both_names_and_returns_a_copy() -> None:
    schema = load_schema("record")
    assert schema == load_schema("record.schema.json")
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    schema["properties"].clear()
    assert load_schema("record")["properties"]  # the cache was not edited
    assert validator("record") is validator("record")  # cached


def test_unknown_schema_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="known"):
        load_schema("nope")


def test_schemas_dir_is_next_to_the_package() -> None:
    assert (schemas_dir() / "record.schema.json").is_file()


def test_every_schema_file_is_a_valid_schema() -> None:
    for path in sorted(schemas_dir().glob("*.schema.json")):
        validator(path.name)  # raises ConfigError if not a valid JSON Schema


def test_a_record_of_a_multi_record_message_validates() -> None:
    coord = RAW.in_message(3, 500)
    record = a_record(id=coord.id, raw=coord).model_dump(mode="json")
    assert record["raw"] == {"topic": "retro.logs.raw", "partition": 2, "offset": 41,
                             "index": 3, "count": 500}
    assert errors("record", record) == []
    letter = a_deadletter().model_copy(update={"id": coord.id, "raw": coord})
    assert errors("deadletter", letter.model_dump(mode="json")) == []
    review = a_review().model_copy(update={"covered": {"retro.logs.raw/2@41:500": [[0, 499]]}})
    assert errors("review", review.model_dump(mode="json")) == []
    half = dict(record, raw={"topic": "t", "partition": 0, "offset": 1, "index": 0})
    assert errors("record", half) != []  # an index without its message's count
    bad_key = a_review().model_copy(update={"covered": {"retro.logs.raw/2@41": [[0, 1]]}})
    assert errors("review", bad_key.model_dump(mode="json")) != []


def a_fragment(traces: list[str] | None = None, **minutes: dict[str, int]) -> Fragment:
    """A fragment of two templates; ``minutes`` by template name, ``traces`` of disk's."""
    return Fragment(
        id="f-1", lane="fast", window=TimeWindow(start="2026-01-02T03:04:05.000Z",
                                                 end="2026-01-02T03:05:01.000Z"),
        service="hdfs", timestamp="2026-01-02T03:04:05.000Z", event="Disk full",
        cause="No space", suggestion="Free space", severity="high",
        evidence=[Evidence(template="disk", count=3, covered={"retro.logs.raw/2": [[0, 2]]},
                           minutes=minutes.get("disk", {}), traces=traces or []),
                  Evidence(template="conn", count=1, covered={"retro.logs.raw/2": [[3, 3]]},
                           minutes=minutes.get("conn", {}))],
        covered={"retro.logs.raw/2": [[0, 3]]}, record_count=4, model="m", prompt_version="v1",
        report_id="2026-01-02/all")


def test_fragments_and_reports_with_minutes_validate() -> None:
    # two records in 03:04, one undated, and conn's one record in 03:05
    fragment = a_fragment(disk={"2026-01-02T03:04": 2}, conn={"2026-01-02T03:05": 1})
    doc = fragment.model_dump(mode="json")
    assert errors("fragment", doc) == []
    assert errors("fragment", a_fragment().model_dump(mode="json")) == []  # none dated
    report, _ = merge(None, fragment, report_id="2026-01-02/all", now="2026-01-02T04:00:00.000Z")
    stored = report.model_dump(mode="json")
    assert errors("report", stored) == []
    assert {ev["template"]: ev["minutes"] for ev in stored["incidents"][0]["evidence"]} == {
        "disk": {"2026-01-02T03:04": 2}, "conn": {"2026-01-02T03:05": 1}}


@pytest.mark.parametrize(
    "key",
    ["2026-01-02T03:04:05", "2026-01-02T03:04Z", "2026-01-02 03:04", "2026-13-02T03:04",
     "2026-01-02T24:00", "2026-01-02T03:60", "2026-01-02"],
)
def test_a_minute_key_is_a_utc_minute_without_seconds_or_zone(key: str) -> None:
    fragment = a_fragment(disk={key: 1}).model_dump(mode="json")
    assert errors("fragment", fragment) != []
    report, _ = merge(None, a_fragment(disk={key: 1}), report_id="2026-01-02/all",
                      now="2026-01-02T04:00:00.000Z")
    assert errors("report", report.model_dump(mode="json")) != []


def test_a_minute_counts_at_least_one_record() -> None:
    doc = a_fragment(disk={"2026-01-02T03:04": 0}).model_dump(mode="json")
    assert errors("fragment", doc) != []


def test_fragments_and_reports_with_traces_validate() -> None:
    traces = ["4bf92f3577b34da6a3ce929d0e0e4736", "5a1b2c3d4e5f6a7b"]
    doc = a_fragment(traces).model_dump(mode="json")
    assert errors("fragment", doc) == []
    assert [("traces" in ev) for ev in doc["evidence"]] == [True, False]  # absent when none
    assert Fragment.model_validate(doc) == a_fragment(traces)
    report, _ = merge(None, a_fragment(traces), report_id="2026-01-02/all",
                      now="2026-01-02T04:00:00.000Z")
    stored = report.model_dump(mode="json")
    assert errors("report", stored) == []
    assert [ev.get("traces") for ev in stored["incidents"][0]["evidence"]] == [traces, None]


@pytest.mark.parametrize(
    "traces",
    [[f"{n:016x}" for n in range(1, 10)],  # more than a sample keeps
     ["5a1b2c3d4e5f6a7b", "5a1b2c3d4e5f6a7b"],  # twice
     ["4BF92F3577B34DA6"],  # not lower case
     ["abc"],  # too short for an id
     ["4bf92f35 77b34da6"],  # not one id
     []],  # an empty sample is left out, never stored
)
def test_a_trace_sample_is_a_few_distinct_ids(traces: list[str]) -> None:
    doc = a_fragment(["5a1b2c3d4e5f6a7b"]).model_dump(mode="json")
    doc["evidence"][0]["traces"] = traces
    assert errors("fragment", doc) != []
    report, _ = merge(None, a_fragment(["5a1b2c3d4e5f6a7b"]), report_id="2026-01-02/all",
                      now="2026-01-02T04:00:00.000Z")
    stored = report.model_dump(mode="json")
    stored["incidents"][0]["evidence"][0]["traces"] = traces
    assert errors("report", stored) != []
