"""A record's report is a function of the record: any batching gives the same reports.

The double counting seen after crashes came from choosing a report from a batch's
earliest timestamp: a record re-batched after a crash landed in another day's report.
Fragments are now cut one per report, by each record's own time and fields.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.batch.answers import place_fragments, validate_answer
from streams.batch.lane import LaneProcessor
from streams.batch.window import Batch, TokenWindow, build_batch
from streams.intervals import Coverage
from streams.records import (
    BatchOutcome,
    Fragment,
    NormalizedRecord,
    count_minutes,
    minute_of,
    smallest_traces,
)
from streams.report.state.keys import record_place, report_of
from streams.report.state.merge import merge
from streams.report.state.minutes import add_minutes
from streams.report.state.model import Report

from helpers import WordCounter, iso_z, make_record

T0 = datetime(2026, 3, 30, 22, 0, tzinfo=UTC)  # two hours before a day boundary
SERVICES = ("api", "db", "auth")
TEMPLATES = ("Connection to <*> refused", "User <*> logged in", "Disk <*> full")


def rec(offset: int, minutes: float | None, *, service: str | None = "api",
        template: int = 0, partition: int = 0, source: str = "app.log",
        level: str = "ERROR", trace: str | None = None) -> NormalizedRecord:
    """A record ``minutes`` after T0 (None: undated) of one of three templates."""
    stamp = None if minutes is None else iso_z(T0 + timedelta(minutes=minutes))
    msg = TEMPLATES[template].replace("<*>", str(offset))
    record = make_record(offset, message=msg, service=service, template_id=f"t{template}",
                         template=TEMPLATES[template], level=level, partition=partition,
                         topic="raw")
    attributes = {} if trace is None else {"trace_id": trace}
    return record.model_copy(update={"timestamp": stamp, "source": source,
                                     "attributes": attributes})


def batch_of(records: list[NormalizedRecord]) -> Batch:
    return build_batch(records, lane="fast", counter=WordCounter(), max_example_tokens=None,
                       trigger="wait")


def answer_all_in_one(batch: Batch) -> dict[str, object]:
    """The answer that mixes most: every group in one finding."""
    return {"fragments": [{"refs": [g.ref for g in batch.groups], "service": "api",
                           "event": "Errors", "cause": "Unknown", "suggestion": "Look",
                           "severity": "high"}]}


def answer_per_group(batch: Batch) -> dict[str, object]:
    return {"fragments": [{"refs": [g.ref], "service": g.service, "event": g.template,
                           "cause": "Unknown", "suggestion": "Look", "severity": "low"}
                          for g in batch.groups]}


def fragments_of(records: list[NormalizedRecord], answer=answer_all_in_one, *,
                 window: str = "day", group_by: str = "all") -> list[Fragment]:
    batch = batch_of(records)
    found = validate_answer(batch, answer(batch), model="m", prompt_version="v1")
    return place_fragments(found, batch.by_coord(),
                           lambda r: record_place(r, window=window, group_by=group_by))


def compact(fragments: list[Fragment]) -> dict[str, Report]:
    """Each fragment merged into the report it names, as the compactor merges them."""
    reports: dict[str, Report] = {}
    for fragment in fragments:
        rid = fragment.report_id
        assert rid is not None  # place_fragments names every part's report
        reports[rid], _ = merge(reports.get(rid), fragment, report_id=rid, now="x")
    return reports


# --- the rule ------------------------------------------------------------------------


@pytest.mark.parametrize(("window", "group_by", "expected"), [
    ("day", "all", "2026-03-31/all"),
    ("hour", "service", "2026-03-31T01/db"),
    ("week", "source", "2026-W14/app.log"),
])
def test_record_place_comes_from_the_record(window, group_by, expected) -> None:
    assert record_place(rec(1, 190, service="db"), window=window, group_by=group_by) == expected


def test_a_record_without_time_or_service_still_has_one_place() -> None:
    record = rec(1, None, service=None, source="k8s/pod a")
    assert record_place(record, window="day", group_by="service") == "undated/k8s_pod_a"
    with pytest.raises(ValueError, match="window"):
        record_place(record, window="month", group_by="all")  # type: ignore[arg-type]


def test_a_batch_across_midnight_gives_one_fragment_per_day() -> None:
    records = [rec(i, 100 + 10 * i, template=i % 2, trace=f"{i + 1:016x}")
               for i in range(6)]  # 23:40 .. 00:30
    parts = fragments_of(records)
    assert [f.report_id for f in parts] == ["2026-03-30/all", "2026-03-31/all"]
    before, after = parts
    assert before.record_count == 2 and after.record_count == 4
    assert before.window.end < "2026-03-31" <= after.window.start
    assert before.timestamp == before.window.start
    # evidence is cut with the records: counts add up per template, examples stay with their day
    assert sum(e.count for e in before.evidence) == 2
    assert all("0" in ex or "1" in ex for e in before.evidence for ex in e.examples)
    # each part counts the minutes of its own records only
    assert {e.template: e.minutes for e in before.evidence} == {
        TEMPLATES[0]: {"2026-03-30T23:40": 1}, TEMPLATES[1]: {"2026-03-30T23:50": 1}}
    assert {e.template: e.minutes for e in after.evidence} == {
        TEMPLATES[0]: {"2026-03-31T00:00": 1, "2026-03-31T00:20": 1},
        TEMPLATES[1]: {"2026-03-31T00:10": 1, "2026-03-31T00:30": 1}}
    # ... and samples the trace ids of its own records only
    assert {e.template: e.traces for e in before.evidence} == {
        TEMPLATES[0]: [f"{1:016x}"], TEMPLATES[1]: [f"{2:016x}"]}
    assert {e.template: e.traces for e in after.evidence} == {
        TEMPLATES[0]: [f"{3:016x}", f"{5:016x}"], TEMPLATES[1]: [f"{4:016x}", f"{6:016x}"]}
    assert before.id != after.id and len({before.id, after.id}) == 2


def test_a_fragment_within_one_report_is_kept_whole_with_its_id() -> None:
    records = [rec(i, i, service=SERVICES[i % 3]) for i in range(5)]
    batch = batch_of(records)
    found = validate_answer(batch, answer_all_in_one(batch), model="m", prompt_version="v1")
    placed = place_fragments(found, batch.by_coord(),
                             lambda r: record_place(r, window="day", group_by="all"))
    assert [f.id for f in placed] == [f.id for f in found]
    assert placed[0].report_id == "2026-03-30/all"


def test_grouping_by_service_names_each_part_by_its_records() -> None:
    records = [rec(i, i, service=SERVICES[i % 3]) for i in range(6)]
    parts = fragments_of(records, group_by="service")
    assert {f.report_id: f.service for f in parts} == {
        "2026-03-30/api": "api", "2026-03-30/auth": "auth", "2026-03-30/db": "db"}


def test_a_fragment_covering_a_record_outside_its_batch_is_a_bug() -> None:
    records = [rec(i, i) for i in range(3)]
    fragment = fragments_of(records)[0]
    with pytest.raises(ValueError, match="not in its batch"):
        place_fragments([fragment], {r.raw.ledger_entry(): r for r in records[:2]},
                        lambda r: "x/all")


# --- the property --------------------------------------------------------------------

TRACES = tuple(f"{n * 7919:016x}" for n in range(1, 14))  # few: requests repeat
_records = st.lists(
    st.tuples(st.one_of(st.none(), st.floats(0, 3 * 24 * 60)), st.sampled_from(SERVICES),
              st.integers(0, 2), st.sampled_from(("INFO", "WARN", "ERROR")),
              st.one_of(st.none(), st.sampled_from(TRACES))),
    min_size=1, max_size=40,
).map(lambda rows: [rec(i, m, service=s, template=t, level=lv, trace=tr)
                    for i, (m, s, t, lv, tr) in enumerate(rows)])


def _batched(records: list[NormalizedRecord], cuts: list[int], order: list[int],
             answer) -> list[Fragment]:
    shuffled = [records[i % len(records)] for i in order]
    unique = list({r.id: r for r in shuffled}.values())
    unique += [r for r in records if r.id not in {u.id for u in unique}]
    bounds = sorted({0, len(unique), *(c % (len(unique) + 1) for c in cuts)})
    out: list[Fragment] = []
    for lo, hi in pairwise(bounds):
        out += fragments_of(unique[lo:hi], answer)
    return out


@settings(max_examples=60, deadline=None)
@given(records=_records, cuts_a=st.lists(st.integers(0, 40), max_size=6),
       cuts_b=st.lists(st.integers(0, 40), max_size=6),
       order=st.permutations(range(40)), per_group=st.booleans())
def test_any_batching_of_the_same_records_gives_the_same_reports(
        records, cuts_a, cuts_b, order, per_group) -> None:
    answer = answer_per_group if per_group else answer_all_in_one
    first = _batched(records, cuts_a, list(range(40)), answer_all_in_one)
    second = _batched(records, cuts_b, order, answer)

    def coverage(reports: dict[str, Report]) -> dict[str, Coverage]:
        return {rid: Coverage.from_json(r.covered) for rid, r in reports.items()}

    one, other = compact(first), compact(second)
    assert coverage(one) == coverage(other)
    # batched either way, each report's templates count the minutes of its own records
    truth: dict[str, dict[str, list[str | None]]] = {}
    for record in records:
        rid = record_place(record, window="day", group_by="all")
        truth.setdefault(rid, {}).setdefault(record.template, []).append(record.timestamp)
    expected = {rid: {t: count_minutes(stamps) for t, stamps in by_t.items()}
                for rid, by_t in truth.items()}
    assert _minutes(one) == _minutes(other) == expected
    # ... and sample the smallest trace ids of their own dated failing records, in any
    # batching (an undated record is in no series, so its id is in no sample)
    failing: dict[str, dict[str, list[str]]] = {}
    for record in records:
        rid = record_place(record, window="day", group_by="all")
        mine = failing.setdefault(rid, {}).setdefault(record.template, [])
        if record.level != "INFO" and "trace_id" in record.attributes \
                and minute_of(record.timestamp) is not None:
            mine.append(record.attributes["trace_id"])
    samples = {rid: {t: smallest_traces(ids) for t, ids in by_t.items()}
               for rid, by_t in failing.items()}
    assert _traces(one) == _traces(other) == samples
    for record in records:  # every record is in the report its own place names
        rid = record_place(record, window="day", group_by="all")
        assert record.raw.offset in Coverage.from_json(one[rid].covered).parts()["raw/0"]

    # a crash replays some of it re-batched: still nothing in two reports, nothing lost
    replayed = compact(first + second)
    assert coverage(replayed) == coverage(one)
    assert sum(r.record_count for r in replayed.values()) == len(records)
    for report in replayed.values():  # a partial replay shares minutes out, never over count
        for ev in (ev for inc in report.incidents for ev in inc.evidence):
            assert sum(ev.minutes.values()) <= ev.count
    assert _traces(replayed) == samples  # a sample unions: a replay changes none


def _traces(reports: dict[str, Report]) -> dict[str, dict[str, list[str]]]:
    """Each report's trace sample per template, over its incidents."""
    out: dict[str, dict[str, list[str]]] = {}
    for rid, report in reports.items():
        by_template: dict[str, list[list[str]]] = {}
        for ev in (ev for inc in report.incidents for ev in inc.evidence):
            by_template.setdefault(ev.template, []).append(ev.traces)
        out[rid] = {t: smallest_traces(*s) for t, s in by_template.items()}
    return out


def _minutes(reports: dict[str, Report]) -> dict[str, dict[str, dict[str, int]]]:
    """Each report's minutes per template, summed over its incidents."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for rid, report in reports.items():
        by_template: dict[str, list[dict[str, int]]] = {}
        for ev in (ev for inc in report.incidents for ev in inc.evidence):
            by_template.setdefault(ev.template, []).append(ev.minutes)
        out[rid] = {t: add_minutes(*m) for t, m in by_template.items()}
    return out


# --- the lane cuts what the analyzer found -------------------------------------------


class _AllInOne:
    async def analyze(self, batch: Batch) -> BatchOutcome:
        found = validate_answer(batch, answer_all_in_one(batch), model="m", prompt_version="v1")
        return BatchOutcome(fragments=found, calls=1)


async def test_the_lane_publishes_one_fragment_per_report_and_acks_after() -> None:
    published: list[BatchOutcome] = []
    acked: list[int] = []

    async def publish(outcome: BatchOutcome) -> None:
        published.append(outcome)

    lane = LaneProcessor(
        window=TokenWindow(lane="fast", input_budget=4000, context_window=8192,
                           output_reserve=0.3, max_records=6, max_wait_seconds=60,
                           counter=WordCounter()),
        analyzer=_AllInOne(), publish=publish, ack=acked.append, model="m",
        prompt_version="v1",
        place=lambda r: record_place(r, window="day", group_by="all"))
    for i in range(6):
        await lane.add(rec(i, 100 + 10 * i), token=i)
    await lane.drain()
    (outcome,) = published
    assert [f.report_id for f in outcome.fragments] == ["2026-03-30/all", "2026-03-31/all"]
    assert sorted(acked) == list(range(6))


def test_shares_spread_a_report_by_raw_partition_and_name_it_back() -> None:
    keys = {record_place(rec(i, 5, partition=i), window="day", group_by="all", shards=4)
            for i in range(8)}
    assert keys == {f"2026-03-30/all#{n}" for n in range(4)}
    assert {report_of(k) for k in keys} == {"2026-03-30/all"}
    assert report_of("2026-03-30/all") == "2026-03-30/all"


def test_records_of_one_multi_record_message_are_placed_and_merged_by_index() -> None:
    """An OTLP batch of 6 records across midnight: each record its own coordinate, the
    report ledgers count records (indices), and a replay adds nothing."""
    records = []
    for i in range(6):
        base = rec(40, 100 + 10 * i, template=i % 2)
        records.append(base.model_copy(update={"raw": base.raw.in_message(i, 6),
                                               "id": base.raw.in_message(i, 6).id}))
    parts = fragments_of(records)
    assert [f.covered for f in parts] == [{"raw/0@40:6": [[0, 1]]}, {"raw/0@40:6": [[2, 5]]}]
    reports = compact(parts)
    assert {rid: r.record_count for rid, r in reports.items()} == {
        "2026-03-30/all": 2, "2026-03-31/all": 4}
    again = compact(parts + fragments_of(records))
    assert {rid: r.record_count for rid, r in again.items()} == {
        "2026-03-30/all": 2, "2026-03-31/all": 4}
