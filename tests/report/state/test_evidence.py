"""Canonical templates: an event mined by two workers, or before and after a restart,
ends as one evidence entry whatever order its fragments arrive in."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.batch.covering import canonical_templates
from streams.intervals import Coverage
from streams.records import Evidence, Fragment, count_minutes
from streams.report.state.evidence import fold_evidence
from streams.report.state.merge import compose, merge, merge_all, report_body
from streams.report.state.minutes import add_minutes
from streams.report.state.model import OTHER_TEMPLATES, Report, TemplateEvidence, pick_examples

from helpers import make_fragment

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "schemas" / "report.schema.json")
                    .read_text())
ROOT_T = "Failed password for root from <IP> port <NUM> ssh2"
ADMIN_T = "Failed password for admin from <IP> port <NUM> ssh2"
ANY_T = "Failed password for <*> from <IP> port <NUM> ssh2"
WIDER_T = "Failed <*> for <*> from <IP> port <NUM> ssh2"
KEY_T = "Accepted publickey for deploy from <IP> port <NUM> ssh2"


# --- the fold ---------------------------------------------------------------------------


def test_fold_evidence_sums_repicks_and_leaves_its_input_alone() -> None:
    root = TemplateEvidence(template=ROOT_T, count=3, examples=["Failed password for root x"],
                            entities={"user root": 3, "ip 10.0.0.1": 3},
                            minutes={"2026-11-29T10:01": 2, "2026-11-29T10:02": 1},
                            traces=[f"{n:016x}" for n in (3, 5, 7, 9, 11, 13, 15, 17)])
    anyone = TemplateEvidence(template=ANY_T, count=2, examples=["Failed password for bob"],
                              entities={"user bob": 2, "ip 10.0.0.1": 2},
                              minutes={"2026-11-29T10:00": 1, "2026-11-29T10:01": 1},
                              traces=[f"{n:016x}" for n in (4, 5, 6)])
    other = TemplateEvidence(template=OTHER_TEMPLATES, count=7)
    key = TemplateEvidence(template=KEY_T, count=1)
    given_ = {ROOT_T: root, ANY_T: anyone, OTHER_TEMPLATES: other, KEY_T: key}
    before = {t: ev.model_copy(deep=True) for t, ev in given_.items()}
    folded = fold_evidence(given_)
    assert given_ == before
    assert set(folded) == {ANY_T, KEY_T, OTHER_TEMPLATES}
    assert folded[ANY_T].count == 5
    assert folded[ANY_T].examples == pick_examples([*root.examples, *anyone.examples])
    assert folded[ANY_T].entities == {"ip 10.0.0.1": 5, "user root": 3, "user bob": 2}
    assert folded[ANY_T].minutes == {"2026-11-29T10:00": 1, "2026-11-29T10:01": 3,
                                     "2026-11-29T10:02": 1}
    # trace samples unioned, the smallest kept
    assert folded[ANY_T].traces == [f"{n:016x}" for n in (3, 4, 5, 6, 7, 9, 11, 13)]
    assert folded[OTHER_TEMPLATES] is other and folded[KEY_T] is key
    assert fold_evidence(folded) == folded  # idempotent


def test_the_other_templates_bucket_never_takes_part() -> None:
    bucket = TemplateEvidence(template=OTHER_TEMPLATES, count=4)
    wide = TemplateEvidence(template="<*> <*>", count=1)  # same token count as the bucket
    folded = fold_evidence({OTHER_TEMPLATES: bucket, "<*> <*>": wide})
    assert folded == {OTHER_TEMPLATES: bucket, "<*> <*>": wide}


# --- in the merge ----------------------------------------------------------------------


def _auth(fid: str, template: str, part: str, lo: int, hi: int, users: list[str]) -> Fragment:
    """An auth-failure fragment of one template over records lo..hi of ``part``."""
    covered = {part: [[lo, hi]]}
    examples = [f"Failed password for {u} from 10.0.0.{lo} port 22 ssh2" for u in users]
    return make_fragment(fid, covered, event="Authentication failures",
                         cause="Password guessing", suggestion="Block the hosts",
                         record_count=hi - lo + 1, evidence=[Evidence(
                             template=template, count=hi - lo + 1, examples=examples,
                             covered=covered,
                             entities={f"user {u}": 1 for u in users},
                             minutes=_minutes(range(lo, hi + 1)))])


def _minutes(offsets: range | list[int]) -> dict[str, int]:
    """Record o of a partition was logged at 10:0o, o mod 10."""
    return count_minutes(f"2026-11-29T10:0{o % 10}:30Z" for o in offsets)


# worker A met "root" first, worker B "admin"; both later generalised
FRAGMENTS = [
    _auth("a1", ROOT_T, "raw/0", 0, 4, ["root"]),
    _auth("b1", ADMIN_T, "raw/2", 0, 2, ["admin"]),
    _auth("a2", ANY_T, "raw/0", 5, 9, ["root", "guest"]),
    _auth("b2", ANY_T, "raw/2", 3, 5, ["admin", "oracle"]),
]


def _merged(fragments: list[Fragment], results: list[str] | None = None) -> Report:
    report = None
    for fragment in fragments:
        report, result = merge(report, fragment, report_id="2026-11-29/all", now="t")
        if results is not None:
            results.append(result)
    assert report is not None
    return report


def test_a_covered_template_folds_into_its_generaliser_in_any_order() -> None:
    bodies = {json.dumps(report_body(_merged(list(order))), sort_keys=True)
              for order in itertools.permutations(FRAGMENTS)}
    assert len(bodies) == 1
    (incident,) = _merged(FRAGMENTS).incidents
    (evidence,) = incident.evidence
    assert evidence.template == ANY_T
    assert evidence.count == incident.count == 16
    assert evidence.examples == pick_examples(x for f in FRAGMENTS for x in f.evidence[0].examples)
    assert evidence.entities == {"user admin": 2, "user root": 2, "user guest": 1,
                                 "user oracle": 1}
    assert evidence.minutes == add_minutes(_minutes(range(10)), _minutes(range(6)))
    at_once, _ = merge_all(None, list(reversed(FRAGMENTS)), report_id="2026-11-29/all", now="t")
    assert report_body(at_once) == report_body(_merged(FRAGMENTS))
    jsonschema.validate(json.loads(at_once.to_json()), SCHEMA)


def test_replays_and_overlapping_reruns_count_nothing_twice() -> None:
    report = _merged(FRAGMENTS)
    # a restarted worker re-cleans records 3..7 with a fresh miner: the narrow text again
    rerun = _auth("a3", ROOT_T, "raw/0", 3, 12, ["root"])
    again, results = merge_all(report, [*FRAGMENTS, rerun], report_id="2026-11-29/all", now="t")
    assert results == ["duplicate"] * 4 + ["partial"]
    (incident,) = again.incidents
    (evidence,) = incident.evidence
    assert (evidence.template, evidence.count) == (ANY_T, 19)
    assert incident.count == again.record_count == 19
    assert sum(evidence.minutes.values()) == 19  # the rerun's 3 new records, in its minutes
    replayed, results = merge_all(again, [*FRAGMENTS, rerun], report_id="2026-11-29/all",
                                  now="t")
    assert replayed is again and set(results) == {"duplicate"}


def test_templates_that_do_not_cover_each_other_stay_apart() -> None:
    # only the two narrow texts arrived: neither names the other's records
    report = _merged(FRAGMENTS[:2])
    (incident,) = report.incidents
    assert {(e.template, e.count) for e in incident.evidence} == {(ROOT_T, 5), (ADMIN_T, 3)}
    key = _auth("k", KEY_T, "raw/1", 0, 3, ["deploy"])
    report = _merged([*FRAGMENTS, key])
    (incident,) = report.incidents
    assert {(e.template, e.count) for e in incident.evidence} == {(ANY_T, 16), (KEY_T, 4)}


def test_shares_composed_fold_like_the_whole() -> None:
    """The compactor's shares of one report (one per raw partition) each hold one worker's
    texts; composed, they fold as the report compacted whole does."""
    whole = _merged(FRAGMENTS)
    shares = [_merged([f for f in FRAGMENTS if part in f.covered]).model_copy(
        update={"id": f"2026-11-29/all#{part[-1]}"}) for part in ("raw/0", "raw/2")]
    b_share = shares[1]
    assert {e.template for e in b_share.incidents[0].evidence} == {ANY_T}  # b1 folded in b2
    narrow_share = _merged(FRAGMENTS[:1]).model_copy(update={"id": "2026-11-29/all#0"})
    composed = compose("2026-11-29/all", [narrow_share, b_share])
    (incident,) = composed.incidents
    (evidence,) = incident.evidence
    assert (evidence.template, evidence.count) == (ANY_T, 11)
    assert evidence.entities == {"user admin": 2, "user oracle": 1, "user root": 1}
    composed = compose("2026-11-29/all", shares)
    assert report_body(composed) == report_body(whole)


# --- any order, any duplication ----------------------------------------------------------

# one event's texts as one drain3 cluster generalises them (each text's generalisers form a
# chain), and a second event's
FAMILY = [ROOT_T, ADMIN_T, ANY_T, WIDER_T, KEY_T,
          "Accepted <*> for deploy from <IP> port <NUM> ssh2"]
USERS = ["root", "admin", "bob"]


@st.composite
def _runs(draw: st.DrawFn) -> list[Fragment]:
    """Batches of one incident over two partitions, plus overlapping re-runs. Each record
    has one text and one template (which worker mined it, when); a fragment has one
    evidence entry per template among its records, as a batch does."""
    truth = {(part, o): (draw(st.sampled_from(FAMILY)), draw(st.sampled_from(USERS)))
             for part in ("raw/0", "raw/1") for o in range(draw(st.integers(1, 12)))}
    spans = []
    for part in ("raw/0", "raw/1"):
        last = max(o for p, o in truth if p == part)
        cuts = sorted(draw(st.sets(st.integers(1, last), max_size=3))) if last else []
        spans += [(part, lo, nxt - 1) for lo, nxt in itertools.pairwise([0, *cuts, last + 1])]
    for _ in range(draw(st.integers(0, 3))):  # re-runs after a crash: other boundaries
        part, lo, _hi = draw(st.sampled_from(spans))
        last = max(o for p, o in truth if p == part)
        spans.append((part, lo, draw(st.integers(lo, last))))
    fragments = []
    for n, (part, lo, hi) in enumerate(spans):
        by_template: dict[str, list[int]] = {}
        for o in range(lo, hi + 1):
            by_template.setdefault(truth[(part, o)][0], []).append(o)
        evidence = [Evidence(
            template=t, count=len(offsets),
            examples=pick_examples(f"Failed password for {truth[(part, o)][1]} from 10.0.0.{o}"
                                   for o in offsets),
            covered=Coverage.from_entries((part, o) for o in offsets).to_json(),
            minutes=_minutes(offsets))
            for t, offsets in sorted(by_template.items())]
        covered = {part: [[lo, hi]]}
        fragments.append(make_fragment(f"f{n}", covered, event="Authentication failures",
                                       cause="Password guessing", evidence=evidence,
                                       record_count=hi - lo + 1))
    return fragments


@settings(max_examples=80, deadline=None)
@given(fragments=_runs(), data=st.data())
def test_any_order_and_any_replay_give_one_body(fragments: list[Fragment], data) -> None:
    first: list[str] = []
    reference = _merged(fragments, first)
    order = list(data.draw(st.permutations(fragments)))
    for dup in data.draw(st.lists(st.sampled_from(fragments), max_size=4)):
        order.insert(data.draw(st.integers(0, len(order))), dup)
    then: list[str] = []
    report = _merged(order, then)
    body, expected_body = report_body(report), report_body(reference)
    if "partial" in first or "partial" in then:  # a replay's minutes are shared by estimate
        for doc in (body, expected_body):
            doc.pop("service_minutes", None)
            doc.pop("series", None)
            for ev in doc["incidents"][0]["evidence"]:
                del ev["minutes"]
    assert body == expected_body
    (incident,) = report.incidents
    assert sum(e.count for e in incident.evidence) == incident.count == report.record_count
    # every record is dated: whatever the order, each template's minutes add up to its count
    assert all(sum(e.minutes.values()) == e.count for e in incident.evidence)
    # one entry per canonical template of the records' texts, holding all of its records
    texts = [ev.template for f in fragments for ev in f.evidence]
    canonical = canonical_templates(texts)
    expected: dict[str, set[tuple[str, int]]] = {}
    for ev in (ev for f in fragments for ev in f.evidence):
        for part, ranges in ev.covered.items():
            for lo, hi in ranges:
                expected.setdefault(canonical[ev.template], set()).update(
                    (part, o) for o in range(lo, hi + 1))
    assert {e.template: e.count for e in incident.evidence} == {
        t: len(coords) for t, coords in expected.items()}
