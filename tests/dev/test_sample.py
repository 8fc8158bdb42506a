"""The shipped sample workload: reproducible, the size asked for, and cleanable as intended."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from streams.dev.sample import (
    DEFAULT_START,
    INCIDENTS,
    MIN_RECORDS,
    SECRETS,
    count_logical_records,
    resolve_start,
    write_sample,
)
from streams.ingest.reader import iter_records, open_source
from streams.records import DeadLetter, NormalizedRecord, RawCoord

FORMATS = {
    "checkout-api.jsonl": "json",
    "payment-gateway.log": "docker",
    "inventory.log": "log4j",
    "edge.syslog": "syslog",
    "worker.logfmt": "logfmt",
    "ops.psv": "delimited",
    "feedback.txt": "text",
}
MAX_RECORD_BYTES = 64 * 1024
Results = dict[str, list[NormalizedRecord | DeadLetter]]


def clean_all(paths: list[Path], clock: Callable[[], datetime]) -> Results:
    """Clean every logical record of every file the way the clean stage would."""
    if importlib.util.find_spec("streams.clean.cleaner") is None:
        pytest.skip("streams.clean.cleaner is not written yet")
    from helpers import make_cleaner

    cleaner = make_cleaner(clock=clock, max_record_bytes=MAX_RECORD_BYTES)
    results: Results = {}
    for path in paths:
        with open_source(str(path)) as stream:
            results[path.name] = [
                out
                for line, raw in iter_records(stream, max_record_bytes=MAX_RECORD_BYTES)
                for out in cleaner.clean(raw, RawCoord(topic=path.name, partition=0, offset=line),
                                         path.name)
            ]
    return results


def cleaned(results: Results) -> list[NormalizedRecord]:
    return [r for rs in results.values() for r in rs if isinstance(r, NormalizedRecord)]


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_sample(tmp_path_factory.mktemp("sample"))


@pytest.fixture(scope="module")
def results(sample: list[Path]) -> Results:
    return clean_all(sample, lambda: datetime(2026, 11, 29, 16, 0, tzinfo=UTC))


def contents(paths: list[Path]) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in paths}


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    first = contents(write_sample(tmp_path / "a", records=800, seed=3))
    again = contents(write_sample(tmp_path / "b", records=800, seed=3))
    other = contents(write_sample(tmp_path / "c", records=800, seed=4))
    assert first == again
    assert set(first) == set(FORMATS) | {"garbage.bin.log"}
    assert first["checkout-api.jsonl"] != other["checkout-api.jsonl"]


@pytest.mark.parametrize("records", [MIN_RECORDS, 1000, 3000, 7919])
@pytest.mark.parametrize("include_bad", [True, False])
def test_logical_record_count_is_the_one_asked_for(
    tmp_path: Path, records: int, include_bad: bool
) -> None:
    paths = write_sample(tmp_path, records=records, include_bad=include_bad)
    assert ("garbage.bin.log" in {p.name for p in paths}) is include_bad
    assert abs(count_logical_records(paths) - records) <= records * 0.01


def test_too_few_records_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least"):
        write_sample(tmp_path, records=MIN_RECORDS - 1)


def test_a_java_trace_is_one_record_in_log4j_but_one_per_line_in_docker(
    sample: list[Path],
) -> None:
    def records_of(name: str) -> list[bytes]:
        with open_source(str(next(p for p in sample if p.name == name))) as stream:
            return [raw for _, raw in iter_records(stream)]

    traces = [r for r in records_of("inventory.log") if b"NullPointerException" in r]
    assert traces
    for trace in traces:
        assert trace.startswith(b"2026-11-28 ") and b" ERROR " in trace.split(b"\n")[0]
        assert b"\nCaused by: java.lang.NullPointerException" in trace
        assert trace.rstrip().endswith(b" more") and trace.count(b"\n\tat ") > 8
    docker = records_of("payment-gateway.log")
    frames = [r for r in docker if r.startswith(b'{"log":"\\tat ')]
    assert len(frames) > 10
    assert all(b"\n" not in r for r in docker)


@pytest.mark.parametrize(("name", "expected"), sorted(FORMATS.items()))
def test_each_file_is_detected_as_its_format(results: Results, name: str, expected: str) -> None:
    records = results[name]
    assert records and all(isinstance(r, NormalizedRecord) for r in records)
    assert {r.format for r in records if isinstance(r, NormalizedRecord)} == {expected}


def test_routine_traffic_collapses_into_few_templates(results: Results) -> None:
    records = cleaned(results)
    templates = {r.template_id for r in records}
    assert len(templates) < len(records) / 20


def test_no_secret_survives_cleaning(sample: list[Path], results: Results) -> None:
    raw = b"".join(p.read_bytes() for p in sample)
    for secret in SECRETS:
        assert secret.encode() in raw, f"the sample should contain {secret!r}"
    leaks = [
        (r.id, secret)
        for r in cleaned(results)
        for secret in SECRETS
        if secret in r.model_dump_json()
    ]
    assert leaks == []
    kinds = {kind for r in cleaned(results) for kind in r.redactions}
    assert {"jwt", "api_key", "password", "email", "card_number"} <= kinds
    with_secrets = sum(1 for r in cleaned(results) if r.redactions)
    assert 0.01 < with_secrets / len(cleaned(results)) < 0.10


def test_a_few_percent_go_to_the_slow_lane(results: Results) -> None:
    records = cleaned(results)
    slow = [r for r in records if r.lane == "slow"]
    assert 0.02 <= len(slow) / len(records) <= 0.06
    assert all(r.cost >= 5.0 for r in slow)
    fast_costs = sorted(r.cost for r in records if r.lane == "fast")
    assert fast_costs[len(fast_costs) // 2] < 1.0  # routine records are cheap


def test_the_bad_file_is_all_dead_letters(results: Results) -> None:
    bad = results["garbage.bin.log"]
    assert all(isinstance(r, DeadLetter) for r in bad)
    assert sorted(r.reason for r in bad if isinstance(r, DeadLetter)) == [
        "binary",
        "too_large",
        "undecodable",
    ]
    others = [r for name, rs in results.items() if name != "garbage.bin.log" for r in rs]
    assert not any(isinstance(r, DeadLetter) for r in others)


def test_without_bad_records_nothing_is_dead_lettered(tmp_path: Path) -> None:
    paths = write_sample(tmp_path, records=600, include_bad=False)
    results = clean_all(paths, lambda: datetime(2026, 11, 29, tzinfo=UTC))
    assert not any(isinstance(r, DeadLetter) for rs in results.values() for r in rs)


def in_window(record: NormalizedRecord, lo: datetime, hi: datetime) -> bool:
    assert record.timestamp is not None, record.id
    ts = datetime.fromisoformat(record.timestamp.replace("Z", "+00:00"))
    return lo <= ts <= hi


def test_every_timestamp_is_in_the_sample_hour(results: Results) -> None:
    records = [r for r in cleaned(results) if r.source != "feedback.txt"]
    assert all(in_window(r, DEFAULT_START, DEFAULT_START + timedelta(hours=1)) for r in records)
    assert all(r.timestamp is None for r in results["feedback.txt"])  # type: ignore[union-attr]


@pytest.mark.parametrize("incident", INCIDENTS, ids=lambda i: i.source)
def test_each_incident_is_where_and_when_it_says(results: Results, incident: Any) -> None:
    lo, hi = incident.window()
    hits = [
        r
        for r in cleaned(results)
        if r.source == incident.source and incident.signature in r.message
    ]
    assert len(hits) >= 5
    assert all(in_window(r, lo, hi) for r in hits)


def test_start_moves_the_story_and_stays_in_its_utc_day(tmp_path: Path) -> None:
    assert resolve_start(None) == DEFAULT_START
    naive = datetime(2025, 3, 2, 14, 30)
    assert resolve_start(naive) == naive.replace(tzinfo=UTC)
    late = datetime(2025, 3, 2, 23, 30, tzinfo=UTC)
    start = resolve_start(late)
    assert start.date() == late.date() and start + timedelta(hours=1) < datetime(
        2025, 3, 3, tzinfo=UTC
    )
    paths = write_sample(tmp_path, records=600, start=late, include_bad=False)
    results = clean_all(paths, lambda: datetime(2025, 3, 4, tzinfo=UTC))
    records = [r for r in cleaned(results) if r.timestamp is not None]
    assert all(in_window(r, start, start + timedelta(hours=1)) for r in records)
    lo, hi = INCIDENTS[0].window(late)
    assert (lo - start, hi - start) == (INCIDENTS[0].begin, INCIDENTS[0].end)
