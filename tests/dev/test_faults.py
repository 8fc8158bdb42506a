"""Generated fault cases: reproducible, cleanable, and their truth holds in the lines."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from streams.clean.cleaner import Cleaner
from streams.dev.faults import (
    _RESOURCES,
    _RETIRED,
    DAY_FAULTS,
    DAY_WARMUP,
    KINDS,
    Case,
    DayCase,
    Kind,
    Truth,
    write_case,
    write_day,
)
from streams.ingest.reader import iter_records, open_source
from streams.records import NormalizedRecord, RawCoord, service_of, trace_id_of
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


# ------------------------------------------------------------------ days with several faults

_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})[.,](\d{3})")
_MASK = re.compile(rf"[\w.-]*\d[\w.-]*|\b(?:{'|'.join(_RESOURCES)})\b")


@dataclass(frozen=True)
class Raw:
    """A physical line as written: its service (the file's or the Fluent Bit app label), the
    time it states (a continuation line: its head's), its level word and its text."""

    service: str
    time: datetime
    warn: bool  # WARN or above, in the line's own format
    text: str


def raw_lines(case: DayCase) -> list[Raw]:
    """Every line of the day, read without the clean stage."""
    out: list[Raw] = []
    for path in case.files:
        last: dict[str, tuple[datetime, bool]] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            if case.layout == "fluentbit":
                obj = json.loads(line)
                service, text = obj["kubernetes"]["labels"]["app"], obj["log"].rstrip("\n")
            else:
                service, text = path.stem, line
            m = _STAMP.search(text[:80])
            if m:
                when = datetime.fromisoformat(f"{m[1]}T{m[2]}.{m[3]}+00:00")
                warn = bool(re.search(r'\b(?:WARN|WARNING|ERROR)\b|level=(?:warning|error)'
                                      r'|"level":"(?:warn|error)"', text, re.IGNORECASE))
                last[service] = (when, warn)
            when, warn = last[service]  # a traceback line belongs to the line above
            out.append(Raw(service, when, warn, text))
    return out


def ms(t: datetime) -> datetime:
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def shape(text: str) -> str:
    """A line without its values (numbers, ids, resource names): the same message."""
    return _MASK.sub("#", text)


def pattern(template: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\\\{\w+\\\}", r"\\S+", re.escape(template)))


def pairs(lines: list[Raw], first: str, second: str) -> tuple[int, int]:
    """How many of ``lines`` are the first line of a unit of work, and how many the second."""
    a, b = pattern(first), pattern(second)
    return (sum(bool(a.search(x.text)) for x in lines),
            sum(bool(b.search(x.text)) for x in lines))


@pytest.fixture(scope="module", params=[("multi", 1), ("multi", 2), ("multi", 3),
                                        ("multi", 4), ("quiet", 1), ("quiet", 3)],
                ids=lambda p: f"{p[0]}-{p[1]}")
def day(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> DayCase:
    label, seed = request.param
    return write_day(tmp_path_factory.mktemp(f"day-{label}-{seed}"), seed,
                     quiet=label == "quiet")


@pytest.fixture(scope="module")
def day_lines(day: DayCase) -> list[Raw]:
    return raw_lines(day)


def test_a_day_is_reproducible(tmp_path: Path) -> None:
    def contents(c: DayCase) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in c.files}

    first = write_day(tmp_path / "a", 5)
    assert contents(first) == contents(write_day(tmp_path / "b", 5))
    assert contents(first) != contents(write_day(tmp_path / "c", 6))
    assert contents(first) != contents(write_day(tmp_path / "d", 5, quiet=True))


def test_a_day_has_its_faults_apart_in_time_on_one_date(day: DayCase, day_lines: list[Raw]
                                                        ) -> None:
    assert day.start.date() == day.end.date()
    assert {x.service for x in day_lines} == set(day.services)
    assert all(day.start <= x.time <= day.end + timedelta(seconds=1) for x in day_lines)
    if day.name.startswith("day-quiet"):
        assert day.truth == [] and day.faults == ()
        return
    assert 4 <= len(day.faults) <= 5
    assert {f.kind for f in day.faults} == set(DAY_FAULTS)
    assert len({f.service for f in day.faults}) == len(day.faults)
    assert day.truth == [(f.service, f.time, f.kind) for f in day.faults]
    for f, after in zip(day.faults, day.faults[1:], strict=False):
        assert f.end < after.time
    assert day.faults[0].time >= day.start + DAY_WARMUP
    assert day.faults[-1].end <= day.end
    chronic_callees = {callee for _, callee in day.chronic}
    assert all(f.service in day.services and f.service not in chronic_callees
               for f in day.faults)


def test_the_truth_of_each_fault_is_in_the_lines(day: DayCase, day_lines: list[Raw]) -> None:
    hour = timedelta(hours=1)
    for f in day.faults:
        begin, until = ms(f.time), ms(f.end)  # as the lines write them
        mine = [x for x in day_lines if x.service == f.service]
        during = [x for x in mine if begin <= x.time < until]
        before = [x for x in mine if f.time - hour <= x.time < begin]
        span = (f.end - f.time) / hour  # the fault's length, in hours
        if f.kind == "crash":  # new failures of its own, the first at the fault's start
            usual = {shape(x.text) for x in mine if x.warn and x.time < begin}
            failing = [x.time for x in during if x.warn and shape(x.text) not in usual]
            assert min(failing) == begin
            assert len(failing) > 30 * span  # one every two minutes at least
        elif f.kind == "silent":  # nothing until a restart
            assert not during
            assert any(x.time == until and "Started" in x.text for x in mine)
        elif f.kind == "slow":  # fewer lines of its own, none of them new at WARN+
            assert len(during) < 0.7 * len(before) * span
            usual = {shape(x.text) for x in mine if x.warn and x.time < f.time}
            assert all(shape(x.text) in usual for x in during if x.warn)
        else:  # vanishing: the line after another thins out; nothing new at WARN+
            assert f.line and f.follows
            a0, b0 = pairs(before, f.follows, f.line)
            assert a0 == b0 > 0  # one for one
            a, b = pairs(during, f.follows, f.line)
            assert a >= 5 and b <= 0.5 * a
            assert a > 0.5 * a0 * span  # the line before it goes on as usual
            usual = {shape(x.text) for x in day_lines if x.warn and x.time < f.time}
            assert all(shape(x.text) in usual for x in day_lines
                       if x.warn and f.time <= x.time < f.end)
            continue
        assert f.callers
        for caller in f.callers:  # callers name it at WARN+, only once it began
            naming = [x.time for x in day_lines
                      if x.service == caller and x.warn and f.service in x.text]
            assert naming and min(naming) > f.time
            assert max(naming) < f.end
        if f.kind == "slow":  # by URL or host name, as an HTTP client writes it
            assert any(f"http://{f.service}:" in x.text or f"for {f.service}" in x.text
                       or f"waiting for {f.service}" in x.text
                       for x in day_lines if x.warn and f.time <= x.time < f.end)


def test_chronic_callers_miss_their_callee_every_minute(day: DayCase, day_lines: list[Raw]
                                                        ) -> None:
    assert day.chronic
    for caller, callee in day.chronic:
        assert caller in day.services and caller != callee
        minutes = {x.time.replace(second=0, microsecond=0) for x in day_lines
                   if x.service == caller and x.warn and callee in x.text}
        first = day.start.replace(second=0, microsecond=0) + timedelta(minutes=1)
        whole = int((day.end - first).total_seconds() // 60)
        assert all(first + timedelta(minutes=m) in minutes for m in range(whole))


def test_warnings_name_other_services_only_in_a_fault_or_as_chronic(
        day: DayCase, day_lines: list[Raw]) -> None:
    """Outside its faults (all day on a quiet day) a line at WARN+ names no other service
    but a chronic callee; during a fault, only the faulty one."""
    chronic = {callee for _, callee in day.chronic}
    names = set(day.services) | set(_RETIRED)
    for x in day_lines:
        if not x.warn:
            continue
        named = {n for n in names if re.search(rf"\b{n}\b", x.text)} - {x.service} - chronic
        if named:
            assert any(named == {f.service} and ms(f.time) <= x.time < f.end
                       for f in day.faults), x.text


def test_every_line_of_a_day_cleans_with_its_time(tmp_path: Path) -> None:
    for quiet in (False, True):
        day = write_day(tmp_path / str(quiet), 2, quiet=quiet)
        case = Case(day.name, day.files, Truth("quiet", None, None), day.start, day.end)
        records = [r for recs in cleaned(case).values() for r in recs]
        assert len(records) > 10_000
        assert all(day.start <= at(r) <= day.end + timedelta(seconds=1) for r in records)


def test_a_days_requests_carry_one_trace_id_from_caller_to_callee(tmp_path: Path) -> None:
    """Every format writes the trace id of a call (logback's MDC, OpenTelemetry's logging
    fields, JSON, logfmt): the callee answers within 40 ms, and seconds later while it
    is the slow fault, or its caller is (a slow service is slow to send, too); a caller
    keeps sending to it meanwhile."""
    day = write_day(tmp_path, 1)
    [slow] = [f for f in day.faults if f.kind == "slow"]
    case = Case(day.name, day.files, Truth("quiet", None, None), day.start, day.end)
    traces: dict[str, list[tuple[datetime, str]]] = {}
    for record in (r for recs in cleaned(case).values() for r in recs):
        trace = trace_id_of(record.attributes)
        if trace is not None:
            traces.setdefault(trace, []).append((at(record), service_of(record)))
    usual: list[float] = []
    slowed: list[float] = []
    sent_late: list[float] = []
    edge = timedelta(seconds=1)
    for marks in traces.values():
        marks.sort()
        (sent, caller), (answered, callee) = next(
            ((a, b) for a, b in pairwise(marks) if a[1] != b[1]),
            (marks[0], marks[0]))
        if callee == caller:
            continue  # a unit of work of one service
        took = (answered - sent).total_seconds()
        during = slow.time + edge <= sent < slow.end - edge
        near = slow.time - edge <= sent < slow.end + 4 * edge
        if slow.service in (callee, caller) and during:
            (slowed if callee == slow.service else sent_late).append(took)
        elif slow.service not in (callee, caller) or not near:
            usual.append(took)
    assert len(usual) > 1000 and max(usual) <= 0.05
    assert len(slowed) >= 5 and min(slowed) >= 0.5
    assert len(sent_late) >= 5 and min(sent_late) >= 0.5
