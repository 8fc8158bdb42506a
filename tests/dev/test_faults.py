"""Generated fault cases: reproducible, cleanable, and their truth holds in the lines."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from streams.clean.cleaner import Cleaner
from streams.dev.faults import KINDS, Case, Kind, write_case
from streams.ingest.reader import iter_records, open_source
from streams.records import NormalizedRecord, RawCoord
from streams.settings import Settings


def cleaned(case: Case) -> dict[str, list[NormalizedRecord]]:
    """Every file's records through the clean stage, as the evaluation cleans them."""
    cleaner = Cleaner.from_settings(Settings())
    out: dict[str, list[NormalizedRecord]] = {}
    for path in case.files:
        with open_source(str(path)) as stream:
            records = []
            for n, (_, raw) in enumerate(iter_records(stream)):
                got = cleaner.clean(raw, RawCoord(topic=path.name, partition=0, offset=n),
                                    path.stem)
                assert all(isinstance(r, NormalizedRecord) for r in got), got
                records += got
        out[path.stem] = records
    return out


def at(record: NormalizedRecord) -> datetime:
    assert record.timestamp is not None
    return datetime.fromisoformat(record.timestamp.replace("Z", "+00:00"))


@pytest.fixture(scope="module", params=KINDS)
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    kind: Kind = request.param
    return write_case(tmp_path_factory.mktemp(kind), kind, seed=7)


@pytest.fixture(scope="module")
def records(case: Case) -> dict[str, list[NormalizedRecord]]:
    return cleaned(case)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    def contents(c: Case) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in c.files}

    first = write_case(tmp_path / "a", "crash", 3)
    assert contents(first) == contents(write_case(tmp_path / "b", "crash", 3))
    assert contents(first) != contents(write_case(tmp_path / "c", "crash", 4))


def test_every_line_cleans_with_its_time_inside_the_case(
    case: Case, records: dict[str, list[NormalizedRecord]]
) -> None:
    assert len(records) == len(case.files) >= 4
    for recs in records.values():
        assert recs
        assert all(case.start <= at(r) <= case.end + timedelta(seconds=1) for r in recs)


def test_the_truth_is_in_the_lines(case: Case, records: dict[str, list[NormalizedRecord]]
                                   ) -> None:
    truth = case.truth
    if truth.kind == "quiet":
        assert truth.service is None and truth.time is None
        assert case.end - case.start < timedelta(days=1)
        assert {at(r).date() for recs in records.values() for r in recs} == {case.start.date()}
        return
    assert truth.service is not None and truth.time is not None and truth.callers
    mine = records[truth.service]
    if truth.kind == "crash":  # its first failed request is the fault's start, to the ms
        failed = [at(r) for r in mine if "Request processing failed" in r.message]
        assert min(failed) == truth.time.replace(microsecond=truth.time.microsecond // 1000
                                                 * 1000)
    else:  # silent from the fault's start until a restart, if any
        after = [r for r in mine if at(r) >= truth.time]
        assert not after or "Started" in after[0].message
    for caller in truth.callers:  # callers name it, and only after the fault began
        naming = [at(r) for r in records[caller]
                  if truth.service in r.message and r.level in ("WARN", "ERROR")]
        assert naming and min(naming) > truth.time


def test_seeds_vary_the_formats(tmp_path: Path) -> None:
    firsts = {p.read_text()[:1] for seed in range(1, 4) for kind in KINDS
              for p in write_case(tmp_path / f"{kind}{seed}", kind, seed).files}
    assert firsts == {"{", "<", "2"}  # JSON, RFC 5424 syslog, log4j's date
