"""The compactor: counts come from coverage, so order and duplication never matter."""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import random
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.errors import ValidationFailed
from streams.intervals import Coverage
from streams.records import (
    MAX_TRACES,
    Evidence,
    Fragment,
    TimeWindow,
    count_minutes,
    smallest_traces,
)
from streams.report.analysis.postmortem import derive
from streams.report.state.merge import (
    compose,
    incident_key,
    merge,
    merge_all,
    report_body,
)
from streams.report.state.minutes import add_minutes, minute_counts
from streams.report.state.model import (
    MAX_EXAMPLES,
    MAX_TEMPLATES,
    OTHER_TEMPLATES,
    SEVERITY_WEIGHT,
    Report,
)
from streams.report.views.view import render_markdown

from helpers import make_fragment as one_fragment
from helpers import shared_file

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = json.loads((ROOT / "schemas" / "report.schema.json").read_text())
SEVERITIES = ["info", "low", "medium", "high", "critical"]
T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
# Distinct (event, cause) signatures; two incidents share a suggestion spelled differently.
INCIDENTS = [
    ("Disk full on datanode", "No space left on /data", "Free disk space on the datanodes"),
    ("Broker connection refused", "Broker restarting", "Add client retries with backoff"),
    ("Order service timeout", "Slow database query", "free  DISK space on the datanodes"),
    ("Unknown failure", "unknown", "Investigate the stack traces"),
]
TEMPLATES = ["No space left on <*>", "Connection to <*> refused", "Timeout after <*> ms"]
TEXTS = ["e1", "err 22", "a", "no space left on /data/3", "<script>x</script>", "timeout 5000 ms"]
TRACES = [f"{n * 104729:032x}" for n in range(1, 16)]  # more than a sample keeps


@dataclass(frozen=True)
class Rec:
    incident: int
    service: str
    template: int
    severity: str
    minute: int | None  # None: undated record
    text: str
    trace: str | None = None  # its trace id, if it has one
    failing: bool = True  # WARN or above: only then is its trace sampled


def _iso(minute: int) -> str:
    return (T0 + timedelta(minutes=minute)).isoformat().replace("+00:00", "Z")


def _stamp(minute: int | None) -> str | None:
    return None if minute is None else _iso(minute)


def _canon(minute: int) -> str:
    return (T0 + timedelta(minutes=minute)).isoformat(timespec="milliseconds")[:-6] + "Z"


def _top(texts: set[str]) -> list[str]:
    """The examples a fragment carries: its records' shortest, one per shape (digits and hex
    ids blanked), like the merge keeps them; picked by another rule, which examples a
    report keeps would depend on which overlapping re-run of a batch came first."""
    best: dict[str, str] = {}
    for t in sorted(texts, key=lambda t: (len(t), t), reverse=True):
        best[re.sub(r"-?[0-9a-f]*[0-9][0-9a-f]*", "#", " ".join(t.lower().split()))] = t
    return sorted(best.values(), key=lambda t: (len(t), t))[:MAX_EXAMPLES]


def _sample(rows: Iterable[Rec]) -> list[str]:
    """The trace sample a batch takes of its records (``failing_traces``: dated ones)."""
    return smallest_traces(r.trace for r in rows
                           if r.failing and r.trace is not None and r.minute is not None)


def make_fragment(part: str, offsets: list[int], recs: dict[tuple[str, int], Rec]) -> Fragment:
    """One fragment for records of a single (incident, service), as a batch would emit it."""
    chosen = [recs[(part, o)] for o in offsets]
    first = chosen[0]
    assert all((r.incident, r.service) == (first.incident, first.service) for r in chosen)
    topic, partition = part.rsplit("/", 1)
    evidence = []
    for t in sorted({r.template for r in chosen}):
        offs = [o for o, r in zip(offsets, chosen, strict=True) if r.template == t]
        evidence.append(
            Evidence(
                template=TEMPLATES[t],
                count=len(offs),
                examples=_top({recs[(part, o)].text for o in offs}),
                covered=Coverage.from_coords((topic, int(partition), o) for o in offs).to_json(),
                minutes=count_minutes(_stamp(recs[(part, o)].minute) for o in offs),
                traces=_sample(recs[(part, o)] for o in offs),
            )
        )
    minutes = [r.minute for r in chosen if r.minute is not None]
    start = _iso(min(minutes)) if minutes else None
    end = _iso(max(minutes)) if minutes else None
    event, cause, suggestion = INCIDENTS[first.incident]
    covered = Coverage.from_coords((topic, int(partition), o) for o in offsets).to_json()
    fid = hashlib.sha256(json.dumps([covered, first.incident]).encode()).hexdigest()[:12]
    return Fragment(
        id=fid,
        lane="fast",
        window=TimeWindow(start=start, end=end),
        service=first.service,
        timestamp=start,
        event=event,
        cause=cause,
        suggestion=suggestion,
        severity=max((r.severity for r in chosen), key=SEVERITIES.index),
        evidence=evidence,
        covered=covered,
        record_count=len(offsets),
        model="retro-rules-v1",
        prompt_version="v1",
    )


def batch_fragments(part: str, lo: int, hi: int, recs: dict) -> list[Fragment]:
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for o in range(lo, hi + 1):
        r = recs[(part, o)]
        groups[(r.incident, r.service)].append(o)
    return [make_fragment(part, offs, recs) for _, offs in sorted(groups.items())]


rec_strategy = st.builds(
    Rec,
    incident=st.integers(0, len(INCIDENTS) - 1),
    service=st.sampled_from(["hdfs", "kafka", "orders"]),
    template=st.integers(0, len(TEMPLATES) - 1),
    severity=st.sampled_from(SEVERITIES),
    minute=st.one_of(st.none(), st.integers(0, 300)),
    text=st.sampled_from(TEXTS),
    trace=st.one_of(st.none(), st.sampled_from(TRACES)),
    failing=st.booleans(),
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[dict, list[Fragment]]:
    """Ground truth per record, cut into batches, plus overlapping re-runs of the same truth."""
    recs: dict[tuple[str, int], Rec] = {}
    fragments: list[Fragment] = []
    spans = []
    for p in range(draw(st.integers(1, 2))):
        part, base = f"retro.logs.raw/{p}", draw(st.integers(0, 1000))
        rows = draw(st.lists(rec_strategy, min_size=1, max_size=25))
        for i, rec in enumerate(rows):
            recs[(part, base + i)] = rec
        last = base + len(rows) - 1
        cuts = sorted(draw(st.sets(st.integers(base + 1, last), max_size=4)) if last > base else [])
        bounds = [base, *cuts, last + 1]
        for lo, nxt in itertools.pairwise(bounds):
            fragments += batch_fragments(part, lo, nxt - 1, recs)
        spans.append((part, base, last))
    for _ in range(draw(st.integers(0, 3))):  # re-runs after a "crash": other boundaries
        part, base, last = draw(st.sampled_from(spans))
        lo = draw(st.integers(base, last))
        fragments += batch_fragments(part, lo, draw(st.integers(lo, last)), recs)
    return recs, fragments


def _timeless(body: dict) -> dict:
    """A report body without the templates' and services' minute counts (series too)."""
    body.pop("service_minutes", None)
    body.pop("series", None)
    for inc in body["incidents"]:
        for ev in inc["evidence"]:
            ev.pop("minutes", None)
    return body


def apply_all(fragments: list[Fragment]) -> tuple[Report | None, list[str]]:
    report, results = None, []
    for n, frag in enumerate(fragments):
        report, result = merge(report, frag, report_id="2026-11-29/all", now=f"t{n}")
        results.append(result)
    return report, results


@settings(max_examples=60, deadline=None)
@given(scenario=scenarios(), data=st.data())
def test_any_order_any_duplication_gives_the_same_report(scenario, data) -> None:
    recs, fragments = scenario
    reference, first_results = apply_all(fragments)
    order = list(data.draw(st.permutations(fragments)))
    for dup in data.draw(st.lists(st.sampled_from(fragments), max_size=6)):
        order.insert(data.draw(st.integers(0, len(order))), dup)

    report, seen, version, results = None, Coverage(), 0, []
    for frag in order:
        offered = Coverage.from_json(frag.covered)
        report, result = merge(report, frag, report_id="2026-11-29/all", now="t")
        new = offered.difference(seen)
        expected = "duplicate" if not new else "applied" if new == offered else "partial"
        assert result == expected
        results.append(result)
        version += result != "duplicate"
        assert report.version == version
        seen = seen.union(offered)
        assert report.record_count == len(seen)

    # a partial replay spreads its new records over minutes by share (which of its records
    # were new is known, their minutes are not): only then may the minutes differ by order
    replayed = "partial" in results or "partial" in first_results
    if replayed:
        assert _timeless(report_body(report)) == _timeless(report_body(reference))
    else:
        assert report_body(report) == report_body(reference)
    _check_against_truth(report, recs, exact_minutes=not replayed)


def _check_against_truth(
    report: Report, recs: dict[tuple[str, int], Rec], *, exact_minutes: bool = True
) -> None:
    truth: dict[int, list[Rec]] = defaultdict(list)
    for rec in recs.values():
        truth[rec.incident].append(rec)
    assert report.record_count == len(recs)
    assert len(report.incidents) == len(truth)
    for idx, rows in truth.items():
        event, cause, _ = INCIDENTS[idx]
        inc = report.incident(incident_key(event, cause))
        assert inc is not None
        assert (inc.event, inc.cause) == (event, cause)
        assert inc.count == len(rows)
        assert inc.services == sorted({r.service for r in rows})
        assert inc.severity == max((r.severity for r in rows), key=SEVERITIES.index)
        minutes = [r.minute for r in rows if r.minute is not None]
        assert inc.first_seen == (_canon(min(minutes)) if minutes else None)
        assert inc.last_seen == (_canon(max(minutes)) if minutes else None)
        per_template = {ev.template: ev for ev in inc.evidence}
        assert set(per_template) == {TEMPLATES[r.template] for r in rows}
        for t, ev in per_template.items():
            mine = [r for r in rows if TEMPLATES[r.template] == t]
            assert ev.count == len(mine)
            assert ev.examples == _top({r.text for r in mine})
            truth_minutes = count_minutes(_stamp(r.minute) for r in mine)
            assert set(ev.minutes) <= set(truth_minutes)
            assert sum(ev.minutes.values()) <= ev.count
            if all(r.minute is not None for r in mine):  # shares of dated records add up
                assert sum(ev.minutes.values()) == ev.count
            if exact_minutes:
                assert ev.minutes == truth_minutes
            # a sample of the smallest: exact in any order, with replays and partial ones
            assert ev.traces == _sample(mine)
    _check_service_minutes(report, recs, exact=exact_minutes)
    # Two incidents suggest the same action spelled differently: one suggestion.
    sharing = [i for i in (0, 2) if i in truth]
    if sharing:
        (s,) = [s for s in report.suggestions if "datanodes" in s.text.lower()]
        assert s.records == sum(len(truth[i]) for i in sharing)
    ranks = [(SEVERITY_WEIGHT[s.severity], s.score) for s in report.suggestions]
    assert ranks == sorted(ranks, reverse=True)  # most severe first, then widest reach


def _check_service_minutes(
    report: Report, recs: dict[tuple[str, int], Rec], *, exact: bool
) -> None:
    """Each service's records per minute, whatever incident and template they went to."""
    truth = {service: count_minutes(_stamp(r.minute) for r in recs.values()
                                    if r.service == service)
             for service in sorted({r.service for r in recs.values()})}
    truth = {service: minutes for service, minutes in truth.items() if minutes}
    got = report.service_minutes
    assert list(got) == sorted(got) and all(list(m) == sorted(m) for m in got.values())
    # a service gets the shares its fragments' templates got: per minute they add up
    assert add_minutes(*got.values()) == add_minutes(
        *(minute_counts(inc.evidence) for inc in report.incidents))
    for service, minutes in got.items():  # a replay's share: never a minute, nor a record,
        assert set(minutes) <= set(truth.get(service, {}))  # the service does not have
        assert sum(minutes.values()) <= sum(r.service == service for r in recs.values())
    if exact:
        assert got == truth


# ---------------------------------------------------------------- examples


def test_duplicate_returns_the_report_unchanged() -> None:
    first, result = merge(None, one_fragment("a", {"t/0": [[0, 9]]}), report_id="r", now="t1")
    assert (result, first.version, first.record_count) == ("applied", 1, 10)
    again, result = merge(first, one_fragment("a", {"t/0": [[0, 9]]}), report_id="r", now="t2")
    assert result == "duplicate"
    assert again.version == 1 and again.updated_at == "t1"
    assert again.model_dump() == first.model_dump()
    # A different fragment id over already-counted records is still a duplicate.
    _, result = merge(first, one_fragment("b", {"t/0": [[2, 4]]}), report_id="r")
    assert result == "duplicate"


def test_partial_overlap_counts_only_new_records_and_reports_growth() -> None:
    r1, _ = merge(None, one_fragment("a", {"t/0": [[0, 9]]}), report_id="r", now="t1")
    before = r1.model_dump()
    r2, result = merge(r1, one_fragment("b", {"t/0": [[5, 14]]}), report_id="r", now="t2")
    assert result == "partial"
    assert r1.model_dump() == before  # merge is pure
    assert r2.version == 2 and r2.updated_at == "t2"
    (inc,) = r2.incidents
    assert inc.count == 15 and inc.evidence[0].count == 15
    assert r2.changes.new_incidents == []
    (grow,) = r2.changes.growing
    assert (grow.before, grow.after) == (10, 15)
    assert (r2.changes.from_version, r2.changes.to_version) == (1, 2)


def test_a_record_two_templates_claim_in_one_fragment_is_counted_once() -> None:
    """A raw record read again before its commit moved is cleaned again, by another
    worker's miner under another template; both copies can meet in one batch."""
    both = {"t/0": [[0, 4]]}
    fragment = one_fragment("a", {"t/0": [[0, 9]]}, record_count=10, evidence=[
        Evidence(template="Failed password for root from <IP>", count=5,
                 examples=["Failed password for root from 10.0.0.1"], covered=both),
        Evidence(template="Failed password for <*> from <IP>", count=10,
                 examples=["Failed password for ftp from 10.0.0.2"], covered={"t/0": [[0, 9]]}),
    ])
    report, _ = merge(None, fragment, report_id="r", now="t1")
    (inc,) = report.incidents
    assert report.record_count == inc.count == 10
    assert sum(ev.count for ev in inc.evidence) == 10


def test_new_incident_is_listed_in_changes_and_signature_is_normalized() -> None:
    r1, _ = merge(None, one_fragment("a", {"t/0": [[0, 1]]}), report_id="r")
    same, _ = merge(
        r1,
        one_fragment("b", {"t/0": [[2, 3]]}, event="disk  FULL on node 12", severity="critical"),
        report_id="r",
    )
    assert len(same.incidents) == 1
    assert same.incidents[0].severity == "critical"
    assert same.incidents[0].event == "Disk full on node 3"  # shortest spelling wins
    other, _ = merge(same, one_fragment("c", {"t/1": [[0, 0]]}, event="Broker down"), report_id="r")
    assert [other.incident(c.key).event for c in other.changes.new_incidents] == ["Broker down"]
    assert other.changes.records_before == 4 and other.changes.records_after == 5


def test_evidence_without_coverage_gets_unclaimed_records() -> None:
    frag = one_fragment(
        "a",
        {"t/0": [[0, 9]]},
        evidence=[
            Evidence(template="A <*>", count=3, covered={"t/0": [[0, 2]]}),
            Evidence(template="B <*>", count=7),
        ],
    )
    report, _ = merge(None, frag, report_id="r")
    counts = {ev.template: ev.count for ev in report.incidents[0].evidence}
    assert counts == {"A <*>": 3, "B <*>": 7}


def test_bad_ranges_and_wrong_report_are_rejected() -> None:
    with pytest.raises(ValidationFailed, match="review"):
        merge(None, one_fragment("a", {"t/0": [[9, 0]]}), report_id="r")
    report, _ = merge(None, one_fragment("a", {"t/0": [[0, 0]]}), report_id="r")
    with pytest.raises(ValueError, match="report"):
        merge(report, one_fragment("b", {"t/0": [[1, 1]]}), report_id="other")


def test_json_round_trip_recomputes_the_ledger_count_and_validates_against_schema() -> None:
    report, _ = merge(None, one_fragment("a", {"t/0": [[0, 9]]}), report_id="r", now="t1")
    report, _ = merge(report, one_fragment("b", {"t/1": [[0, 4]]}, event="Other"), report_id="r")
    doc = json.loads(report.to_json())
    jsonschema.validate(doc, SCHEMA)
    assert Report.from_json(report.to_json()) == report
    doc["record_count"] = 999_999  # the report's count is its ledger's size, never stored
    assert Report.from_json(doc).record_count == 15
    # incident counts add up to the ledger: each record is attributed to one incident
    assert sum(i.count for i in report.incidents) == report.record_count


def test_schema_names_every_model_field() -> None:
    generated = Report.model_json_schema(mode="serialization")
    # the post-mortem is derived on read and added by the JSON view, never stored
    assert set(SCHEMA["properties"]) == set(generated["properties"]) | {"postmortem"}
    for name, ref in [("Incident", "incident"), ("Suggestion", "suggestion")]:
        assert set(SCHEMA["$defs"][ref]["properties"]) == set(
            generated["$defs"][name]["properties"]
        )


def _lines(indexes: list[int]) -> dict[str, list[list[int]]]:
    return Coverage.from_coords(("HDFS_2k.log", 0, i) for i in indexes).to_json()


def test_real_hdfs_log_with_overlapping_reruns_counts_each_line_once() -> None:
    path = shared_file("loghub", "HDFS", "HDFS_2k.log_structured.csv")
    rows = list(csv.DictReader(path.open(encoding="utf-8")))
    rng = random.Random(7)
    spans = [(lo, min(lo + 199, len(rows) - 1)) for lo in range(0, len(rows), 200)]
    spans += [(lo, lo + rng.randint(0, 300)) for lo in rng.sample(range(len(rows) - 301), 8)]
    fragments = []
    for lo, hi in spans:
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i in range(lo, hi + 1):
            groups[(rows[i]["Level"], rows[i]["Component"])].append(i)
        for (level, component), idx in sorted(groups.items()):
            by_template: dict[str, list[int]] = defaultdict(list)
            for i in idx:
                by_template[rows[i]["EventTemplate"]].append(i)
            stamps = sorted(
                datetime.strptime(rows[i]["Date"] + rows[i]["Time"], "%y%m%d%H%M%S").isoformat()
                + "Z"
                for i in idx
            )
            cov = _lines(idx)
            fragments.append(
                one_fragment(
                    f"{lo}-{hi}-{level}-{component}",
                    cov,
                    event=f"{component} {level}",
                    cause="see template",
                    timestamp=stamps[0],
                    window=TimeWindow(start=stamps[0], end=stamps[-1]),
                    severity="medium" if level == "WARN" else "info",
                    evidence=[
                        Evidence(
                            template=t,
                            count=len(ix),
                            examples=_top({rows[i]["Content"] for i in ix}),
                            covered=_lines(ix),
                        )
                        for t, ix in by_template.items()
                    ],
                )
            )
    forward, results = apply_all(fragments)
    backward, _ = apply_all(fragments[::-1])
    assert "partial" in results or "duplicate" in results
    assert report_body(forward) == report_body(backward)
    assert forward.record_count == len(rows)
    expected: dict[str, int] = defaultdict(int)
    for row in rows:
        expected[incident_key(f"{row['Component']} {row['Level']}", "see template")] += 1
    assert {i.key: i.count for i in forward.incidents} == expected
    jsonschema.validate(json.loads(forward.to_json()), SCHEMA)


def test_a_rollup_summary_survives_merges_and_stays_out_of_the_body() -> None:
    report, _ = merge(None, one_fragment("a", {"t/0": [[0, 9]]}), report_id="r", now="t1")
    (inc,) = report.incidents
    with_summary = inc.model_copy(update={"summary": "Disk filled.", "summary_count": 10})
    summarized = report.model_copy(update={"incidents": [with_summary]})
    grown, _ = merge(summarized, one_fragment("b", {"t/0": [[10, 14]]}), report_id="r", now="t2")
    other, _ = merge(grown, one_fragment("c", {"t/1": [[0, 0]]}, event="Broker down"),
                     report_id="r")
    disk = other.incident(inc.key)
    assert disk is not None and disk.count == 15
    assert (disk.summary, disk.summary_count) == ("Disk filled.", 10)
    (broker,) = [i for i in other.incidents if i.key != inc.key]
    assert (broker.summary, broker.summary_count) == (None, 0)
    # the summary depends on when the roll-up ran, not on the fragments
    plain, _ = merge(report, one_fragment("b", {"t/0": [[10, 14]]}), report_id="r", now="t2")
    assert report_body(grown) == report_body(plain)
    assert grown.model_dump() != plain.model_dump()
    doc = json.loads(other.to_json())
    jsonschema.validate(doc, SCHEMA)
    assert Report.from_json(doc) == other
    # an incident without a roll-up stores neither field; reports from before roll-ups
    # (which never had them) and from before that omission (null and 0) load alike
    (bare,) = [i for i in doc["incidents"] if i["key"] == broker.key]
    assert "summary" not in bare and "summary_count" not in bare
    bare.update(summary=None, summary_count=0)
    jsonschema.validate(doc, SCHEMA)
    assert Report.from_json(doc) == other
    for stored in doc["incidents"]:
        stored.pop("summary", None), stored.pop("summary_count", None)
    jsonschema.validate(doc, SCHEMA)
    assert Report.from_json(doc).incident(inc.key).summary is None


# --- many fragments at once, bounded state -------------------------------------------


def test_merging_at_once_equals_merging_one_by_one_in_one_version() -> None:
    fragments = [
        one_fragment("a", {"t/0": [[0, 9]]}),
        one_fragment("b", {"t/1": [[0, 4]]}, event="Other"),
        one_fragment("c", {"t/0": [[5, 14]]}),  # overlaps a: only 10-14 are new
        one_fragment("d", {"t/0": [[0, 3]]}),  # a replay: nothing new
    ]
    one_by_one = None
    for fragment in fragments:
        one_by_one, _ = merge(one_by_one, fragment, report_id="r", now="t")
    at_once, results = merge_all(None, fragments, report_id="r", now="t")
    assert results == ["applied", "applied", "partial", "duplicate"]
    assert report_body(at_once) == report_body(one_by_one)
    assert at_once.version == 1 and at_once.fragments_applied == 3
    assert at_once.record_count == 20 == sum(i.count for i in at_once.incidents)
    unchanged, results = merge_all(at_once, fragments, report_id="r", now="t2")
    assert unchanged is at_once and set(results) == {"duplicate"}


def test_an_incident_keeps_the_most_frequent_templates_and_counts_the_rest() -> None:
    fragments = []
    for n in range(MAX_TEMPLATES + 15):  # one template per fragment, n+1 records each
        covered = {"t/0": [[n * 100, n * 100 + n]]}
        fragments.append(one_fragment(f"f{n}", covered).model_copy(update={"evidence": [
            Evidence(template=f"template {n} <*>", count=n + 1, examples=[f"line {n}"],
                     covered=covered)]}))
    report, _ = merge_all(None, fragments, report_id="r", now="t")
    (incident,) = report.incidents
    assert len(incident.evidence) == MAX_TEMPLATES + 1
    assert incident.evidence[-1].template == OTHER_TEMPLATES
    assert incident.evidence[0].template == f"template {MAX_TEMPLATES + 14} <*>"
    assert sum(e.count for e in incident.evidence) == incident.count == report.record_count
    jsonschema.validate(json.loads(report.to_json()), SCHEMA)


def test_report_size_does_not_grow_with_the_variety_of_lines() -> None:
    def size(templates: int) -> int:
        fragments = [
            one_fragment(f"f{n}", {"t/0": [[n, n]]}).model_copy(update={"evidence": [
                Evidence(template=f"template {n} <*>", count=1, examples=[f"line {n}"],
                         covered={"t/0": [[n, n]]})]})
            for n in range(templates)]
        report, _ = merge_all(None, fragments, report_id="r", now="t")
        return len(report.to_json())

    assert size(2000) < 1.05 * size(200)


@settings(max_examples=60, deadline=None)
@given(scenario=scenarios())
def test_a_report_composed_from_shares_equals_the_report_compacted_whole(scenario) -> None:
    """Shares by raw partition (as ``record_place`` cuts them) compose to the same report."""
    _recs, fragments = scenario
    whole, _ = merge_all(None, fragments, report_id="2026-11-29/all", now="t")
    shares: dict[str, Report] = {}
    for fragment in fragments:
        (part,) = fragment.covered  # the scenario's fragments cover one partition each
        key = f"2026-11-29/all#{part.rsplit('/', 1)[1]}"
        shares[key], _ = merge(shares.get(key), fragment, report_id=key, now="t")
    composed = compose("2026-11-29/all", list(shares.values()))
    assert report_body(composed) == report_body(whole)
    assert composed.fragments_applied == whole.fragments_applied


def test_composing_one_unsharded_report_returns_it() -> None:
    report, _ = merge(None, one_fragment("a", {"t/0": [[0, 9]]}), report_id="d/all", now="t")
    assert compose("d/all", [report]) is report


def test_templates_beyond_the_cap_count_their_minutes_in_the_other_entry() -> None:
    fragments = []
    for n in range(MAX_TEMPLATES + 3):  # one template per fragment, n+1 records each
        covered = {"t/0": [[n * 100, n * 100 + n]]}
        fragments.append(one_fragment(f"f{n}", covered).model_copy(update={"evidence": [
            Evidence(template=f"template {n} <*>", count=n + 1, examples=[f"line {n}"],
                     covered=covered, minutes={f"2026-11-29T10:{n:02}": n + 1})]}))
    report, _ = merge_all(None, fragments, report_id="r", now="t")
    (incident,) = report.incidents
    other = incident.evidence[-1]
    assert other.template == OTHER_TEMPLATES
    assert other.minutes == {"2026-11-29T10:00": 1, "2026-11-29T10:01": 2, "2026-11-29T10:02": 3}
    assert all(sum(e.minutes.values()) == e.count for e in incident.evidence)


def _timed(fid: str, lo: int, hi: int, minutes: dict[str, int], **fields) -> Fragment:
    """One template over offsets lo..hi of t/0 with the given minute counts."""
    covered = {"t/0": [[lo, hi]]}
    return one_fragment(fid, covered, record_count=hi - lo + 1, evidence=[Evidence(
        template="No space <*>", count=hi - lo + 1, examples=["No space /d"], covered=covered,
        minutes=minutes)], **fields)


def test_minutes_are_summed_for_new_records_and_a_replay_adds_none() -> None:
    a = _timed("a", 0, 3, {"2026-11-29T10:00": 3, "2026-11-29T10:01": 1})
    b = _timed("b", 4, 6, {"2026-11-29T10:01": 2})  # one record undated
    report, _ = merge_all(None, [a, b], report_id="r", now="t")
    (ev,) = report.incidents[0].evidence
    assert ev.minutes == {"2026-11-29T10:00": 3, "2026-11-29T10:01": 3}
    assert (ev.count, list(ev.minutes)) == (7, sorted(ev.minutes))  # oldest first
    again, results = merge_all(report, [b, a], report_id="r", now="t2")
    assert again is report and results == ["duplicate", "duplicate"]
    # shares compacted apart compose to the same minutes
    share_a, _ = merge(None, a, report_id="r#0", now="t")
    share_b, _ = merge(None, b, report_id="r#1", now="t")
    assert report_body(compose("r", [share_b, share_a])) == report_body(report)


def test_a_partial_replay_adds_a_share_of_its_minutes_that_totals_its_new_records() -> None:
    first = _timed("a", 0, 3, {"2026-11-29T10:00": 2, "2026-11-29T10:01": 2})
    rerun = _timed("b", 0, 9, {"2026-11-29T10:00": 2, "2026-11-29T10:01": 2,
                               "2026-11-29T10:02": 3, "2026-11-29T10:03": 3})
    report, results = merge_all(None, [first, rerun], report_id="r", now="t")
    assert results == ["applied", "partial"]
    (ev,) = report.incidents[0].evidence
    # 6 of 10 records are new: 1.2, 1.2, 1.8, 1.8 rounded by largest remainder
    assert ev.minutes == {"2026-11-29T10:00": 3, "2026-11-29T10:01": 3,
                          "2026-11-29T10:02": 2, "2026-11-29T10:03": 2}
    assert sum(ev.minutes.values()) == ev.count == 10
    jsonschema.validate(json.loads(report.to_json()), SCHEMA)


# ---------------------------------------------------------------- trace samples


def _traced(fid: str, lo: int, hi: int, traces: list[str], template: str = "No space <*>",
            **fields) -> Fragment:
    """One template over offsets lo..hi of t/0 whose failing records carry ``traces``."""
    covered = {"t/0": [[lo, hi]]}
    return one_fragment(fid, covered, record_count=hi - lo + 1, evidence=[Evidence(
        template=template, count=hi - lo + 1, examples=[template.replace("<*>", "x")],
        covered=covered, traces=smallest_traces(traces))], **fields)


def _ids(*numbers: int) -> list[str]:
    return [f"{n:016x}" for n in numbers]


def test_trace_samples_union_to_the_smallest_in_any_order_and_replays_add_none() -> None:
    a = _traced("a", 0, 9, _ids(*range(20, 30)))  # 10 failing traces: it keeps 20..27
    b = _traced("b", 10, 14, _ids(3, 40, 25))
    rerun = _traced("c", 5, 19, _ids(*range(25, 30), 3, 40, 25, 1))  # 15..19 are new
    report, results = merge_all(None, [a, b, rerun], report_id="r", now="t")
    assert results == ["applied", "applied", "partial"]
    (ev,) = report.incidents[0].evidence
    assert ev.traces == _ids(1, 3, 20, 21, 22, 23, 24, 25)
    assert len(ev.traces) == MAX_TRACES
    for order in itertools.permutations([a, b, rerun]):
        again = None
        for fragment in [*order, b, a]:  # one by one, replays included
            again, _ = merge(again, fragment, report_id="r", now="t")
        assert again is not None and report_body(again) == report_body(report)
    # shares compacted apart compose to the same sample
    shares = [merge(None, f, report_id=f"r#{n}", now="t")[0] for n, f in enumerate([a, b])]
    whole, _ = merge_all(None, [a, b], report_id="r", now="t")
    assert report_body(compose("r", shares)) == report_body(whole)
    doc = json.loads(report.to_json())
    jsonschema.validate(doc, SCHEMA)
    assert doc["incidents"][0]["evidence"][0]["traces"] == ev.traces
    assert Report.from_json(doc) == report


def test_traces_are_left_out_while_no_failing_record_has_one() -> None:
    report, _ = merge(None, _traced("a", 0, 3, []), report_id="r", now="t")
    (ev,) = json.loads(report.to_json())["incidents"][0]["evidence"]
    assert "traces" not in ev
    jsonschema.validate(json.loads(report.to_json()), SCHEMA)
    assert Report.from_json(report.to_json()) == report
    bad = json.loads(merge(None, _traced("a", 0, 3, _ids(5)), report_id="r")[0].to_json())
    bad["incidents"][0]["evidence"][0]["traces"] = _ids(*range(1, MAX_TRACES + 2))
    assert not jsonschema.Draft202012Validator(SCHEMA).is_valid(bad)


def test_templates_beyond_the_cap_keep_the_smallest_traces_in_the_other_entry() -> None:
    fragments = [_traced(f"f{n}", n * 100, n * 100 + n, _ids(1000 - n, 2000 + n),
                         template=f"template {n} <*>") for n in range(MAX_TEMPLATES + 3)]
    report, _ = merge_all(None, fragments, report_id="r", now="t")
    (incident,) = report.incidents
    other = incident.evidence[-1]
    assert other.template == OTHER_TEMPLATES  # the three smallest templates: n = 0, 1, 2
    assert other.traces == _ids(998, 999, 1000, 2000, 2001, 2002)
    again, _ = merge_all(None, fragments[::-1], report_id="r", now="t")
    assert report_body(again) == report_body(report)


# ---------------------------------------------------------------- service minutes


def _of(service: str, fid: str, lo: int, hi: int, minutes: dict[str, int],
        template: str = "No space <*>", **fields) -> Fragment:
    """One template over offsets lo..hi of t/0, logged by ``service``."""
    covered = {"t/0": [[lo, hi]]}
    return one_fragment(fid, covered, service=service, record_count=hi - lo + 1, evidence=[
        Evidence(template=template, count=hi - lo + 1, examples=[template.replace("<*>", "x")],
                 covered=covered, minutes=minutes)], **fields)


def _two_services() -> list[Fragment]:
    """checkout and payments both run out of disk (one incident, one template); checkout
    also serves requests (routine, an incident of its own)."""
    m = "2026-11-29T10:0"
    return [
        _of("checkout", "a", 0, 3, {f"{m}0": 2, f"{m}1": 2}),
        _of("payments", "b", 4, 6, {f"{m}1": 1, f"{m}2": 1}),  # one record undated
        _of("checkout", "c", 7, 9, {f"{m}0": 1, f"{m}2": 2}, template="GET <*> 200",
            event="Request served", cause="routine", severity="info"),
    ]


def test_each_service_counts_its_records_per_minute_whatever_incident_they_went_to() -> None:
    report, _ = merge_all(None, _two_services(), report_id="r", now="t")
    disk = report.incident(incident_key("Disk full on node 3", "No space left"))
    assert disk is not None and disk.services == ["checkout", "payments"]
    (ev,) = disk.evidence  # merged by template text: whose records are whose is gone here
    assert ev.minutes == {"2026-11-29T10:00": 2, "2026-11-29T10:01": 3, "2026-11-29T10:02": 1}
    assert report.service_minutes == {  # ... and kept here, routine records included
        "checkout": {"2026-11-29T10:00": 3, "2026-11-29T10:01": 2, "2026-11-29T10:02": 2},
        "payments": {"2026-11-29T10:01": 1, "2026-11-29T10:02": 1},
    }
    assert list(json.loads(report.to_json())["service_minutes"]) == ["checkout", "payments"]
    jsonschema.validate(json.loads(report.to_json()), SCHEMA)


def test_service_minutes_do_not_depend_on_order_and_a_replay_adds_nothing() -> None:
    fragments = _two_services()
    reference, _ = merge_all(None, fragments, report_id="2026-11-29/all", now="t")
    for order in itertools.permutations(fragments):
        one_by_one, results = apply_all(list(order))
        assert results == ["applied"] * 3
        assert report_body(one_by_one) == report_body(reference)
    again, results = merge_all(reference, fragments[::-1], report_id=reference.id, now="t2")
    assert again is reference and results == ["duplicate"] * 3
    replayed, _ = apply_all([*fragments, *fragments, fragments[1]])
    assert replayed.service_minutes == reference.service_minutes
    # shares compacted apart compose to the same counts (checkout's records are in both)
    shares = [merge_all(None, part, report_id=f"{reference.id}#{n}", now="t")[0]
              for n, part in enumerate([fragments[1:], fragments[:1]])]
    assert all("checkout" in share.service_minutes for share in shares)
    assert report_body(compose(reference.id, shares)) == report_body(reference)


def test_a_partial_replay_gives_its_service_the_share_its_templates_got() -> None:
    m = "2026-11-29T10:0"
    first = _of("checkout", "a", 0, 3, {f"{m}0": 2, f"{m}1": 2})
    rerun = _of("checkout", "b", 0, 9, {f"{m}0": 2, f"{m}1": 2, f"{m}2": 3, f"{m}3": 3})
    other = _of("payments", "c", 20, 21, {f"{m}3": 2})
    report, results = merge_all(None, [first, other, rerun], report_id="r", now="t")
    assert results == ["applied", "applied", "partial"]
    # 6 of 10 records are new: 1.2, 1.2, 1.8, 1.8 rounded by largest remainder
    assert report.service_minutes["checkout"] == {f"{m}0": 3, f"{m}1": 3, f"{m}2": 2,
                                                  f"{m}3": 2}
    assert report.service_minutes["payments"] == {f"{m}3": 2}
    (ev,) = report.incidents[0].evidence
    assert add_minutes(*report.service_minutes.values()) == ev.minutes


def test_service_minutes_are_left_out_while_no_record_is_dated() -> None:
    report, _ = merge(None, one_fragment("a", {"t/0": [[0, 0]]}), report_id="r", now="t")
    assert report.service_minutes == {} and "service_minutes" not in json.loads(report.to_json())
    jsonschema.validate(json.loads(report.to_json()), SCHEMA)
    assert Report.from_json(report.to_json()) == report


@settings(max_examples=40, deadline=None)
@given(scenario=scenarios())
def test_any_merged_report_tells_a_post_mortem_that_names_only_its_services(scenario) -> None:
    _, fragments = scenario
    report, _ = apply_all(fragments)
    assert report is not None
    assert render_markdown(report).startswith("# Post-mortem")
    services = {s for inc in report.incidents for s in inc.services}
    assert {i.origin for i in derive(report).incidents} <= services
