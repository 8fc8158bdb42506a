"""What a stored report holds: only what cannot be derived, and older forms still load."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.records import Evidence
from streams.report.state import model
from streams.report.state.merge import MAX_FRAGMENT_IDS, merge_all
from streams.report.state.model import Report, example_shape, pick_examples, timeline_of
from streams.report.views.view import render_html
from streams.schemas import validator

from helpers import make_fragment

SCHEMA = validator("report")


def report_of(incidents: int, templates: int = 3) -> Report:
    """``incidents`` incidents of ``templates`` templates, every example text distinct."""
    fragments = []
    for i in range(incidents):
        covered = {"t/0": [[i * 100, i * 100 + templates - 1]]}
        evidence = [
            Evidence(template=f"event {i} step {t} <*>", count=1,
                     examples=[f"event {i} step {t} at host-{i}-{t} {word}"
                               for word in ("up", "down", "gone")],
                     covered={"t/0": [[i * 100 + t, i * 100 + t]]})
            for t in range(templates)
        ]
        fragments.append(make_fragment(
            f"f{i}", covered, event=f"Event {chr(65 + i)}", evidence=evidence,
            timestamp=f"2026-11-29T1{i % 10}:00:00Z", window={"start": None, "end": None}))
    report, _ = merge_all(None, fragments, report_id="2026-11-29/all", now="t")
    return report


def as_stored_before(report: Report) -> dict[str, Any]:
    """The report as it was stored before it kept only what cannot be derived: the timeline
    and the incidents' examples written out beside the fields they repeat, each change's
    event and cause, and the empty defaults (no summary, no entities) on every entry."""
    doc = json.loads(report.to_json())
    doc["timeline"] = [e.model_dump(mode="json") for e in report.timeline]
    for stored, inc in zip(doc["incidents"], report.incidents, strict=True):
        stored["examples"] = inc.examples
        stored.setdefault("summary", None)
        stored.setdefault("summary_count", 0)
        for ev in stored["evidence"]:
            ev.setdefault("entities", {})
    changes = doc["changes"]
    for change in [*changes["new_incidents"], *changes["growing"]]:
        inc = report.incident(change["key"])
        assert inc is not None
        change.update(event=inc.event, cause=inc.cause)
    return doc


def test_a_report_stores_each_example_once_and_no_derived_field() -> None:
    report = report_of(6)
    text = report.to_json()
    doc = json.loads(text)
    SCHEMA.validate(doc)
    assert "timeline" not in doc
    assert all("examples" not in inc for inc in doc["incidents"])
    assert all("summary" not in inc and "summary_count" not in inc for inc in doc["incidents"])
    assert all("entities" not in ev for inc in doc["incidents"] for ev in inc["evidence"])
    changed = doc["changes"]["new_incidents"]
    assert len(changed) == 6 and all(set(c) == {"key", "before", "after"} for c in changed)
    examples = [x for inc in report.incidents for ev in inc.evidence for x in ev.examples]
    assert len(examples) == 6 * 3 * 3
    assert all(text.count(json.dumps(x)) == 1 for x in examples)
    # the served form (the worker's /reports/{window}/{group}) is the same document
    assert report.model_dump(mode="json") == doc
    # readers still have both, derived on read
    for inc in report.incidents:
        assert inc.examples == pick_examples(x for ev in inc.evidence for x in ev.examples)
        assert 0 < len(inc.examples) <= 5
    assert [e.incident for e in report.timeline if e.kind == "first_seen"] == [
        i.key for i in sorted(report.incidents, key=lambda i: i.first_seen or "")]


def test_a_report_stored_with_timeline_and_examples_loads_and_derives_them_anew() -> None:
    report = report_of(4)
    old = as_stored_before(report)
    assert len(old["timeline"]) == len(report.timeline) > 0
    loaded = Report.from_json(json.dumps(old))
    assert loaded == report
    assert loaded.timeline == timeline_of(loaded.incidents) == report.timeline
    assert [i.examples for i in loaded.incidents] == [i.examples for i in report.incidents]
    # a stored timeline is never trusted: the incidents decide it
    old["timeline"] = old["timeline"][:1]
    old["incidents"][0]["examples"] = ["stale"]
    loaded = Report.from_json(old)
    assert loaded.timeline == report.timeline
    assert "stale" not in loaded.incidents[0].examples
    assert json.loads(loaded.to_json()) == json.loads(report.to_json())
    SCHEMA.validate(json.loads(loaded.to_json()))


def test_set_entities_and_summaries_are_stored() -> None:
    report = report_of(2)
    inc = report.incidents[0]
    inc.summary, inc.summary_count = "Step 0 failed on every host.", 3
    inc.evidence[0].entities = {"host-0": 2}
    doc = json.loads(report.to_json())
    SCHEMA.validate(doc)
    stored = doc["incidents"][0]
    assert (stored["summary"], stored["summary_count"]) == (inc.summary, 3)
    assert stored["evidence"][0]["entities"] == {"host-0": 2}
    assert "entities" not in stored["evidence"][1] and "summary" not in doc["incidents"][1]
    assert Report.from_json(doc) == report


def test_minutes_are_stored_when_some_record_is_dated_and_left_out_otherwise() -> None:
    report = report_of(2)
    assert all("minutes" not in ev for inc in json.loads(report.to_json())["incidents"]
               for ev in inc["evidence"])  # report_of's fragments carry none
    report.incidents[0].evidence[0].minutes = {"2026-11-29T10:00": 1}
    doc = json.loads(report.to_json())
    SCHEMA.validate(doc)
    stored = doc["incidents"][0]["evidence"]
    assert stored[0]["minutes"] == {"2026-11-29T10:00": 1} and "minutes" not in stored[1]
    assert Report.from_json(doc) == report
    bad = json.loads(report.to_json())
    bad["incidents"][0]["evidence"][0]["minutes"] = {"2026-11-29T10:00:00Z": 1}
    assert not SCHEMA.is_valid(bad)
    bad["incidents"][0]["evidence"][0]["minutes"] = {"2026-11-29T10:00": 0}
    assert not SCHEMA.is_valid(bad)


def test_service_minutes_validate_and_bad_ones_do_not() -> None:
    report = report_of(2)
    assert "service_minutes" not in json.loads(report.to_json())  # report_of's are undated
    report.service_minutes = {"hdfs": {"2026-11-29T10:00": 2, "2026-11-29T10:01": 1},
                              "kafka broker/1": {"2026-11-29T10:01": 4}}  # names as given
    doc = json.loads(report.to_json())
    SCHEMA.validate(doc)
    assert doc["service_minutes"] == report.service_minutes
    assert Report.from_json(doc) == report
    for bad in ({"hdfs": {"2026-11-29T10:00:00Z": 1}},  # not a minute key
                {"hdfs": {"2026-11-29T24:00": 1}},
                {"hdfs": {"2026-11-29T10:00": 0}},  # an empty minute is left out
                {"hdfs": {"2026-11-29T10:00": 1.5}},
                {"hdfs": {}},  # so is a service without dated records
                {"hdfs": 3}):
        assert not SCHEMA.is_valid({**doc, "service_minutes": bad}), bad


def test_hops_calls_and_failed_calls_validate_and_bad_failed_calls_do_not() -> None:
    report = report_of(1)
    assert "failed_calls" not in json.loads(report.to_json())  # absent until a trace fails
    report.hops = {"db": {"2026-11-29T10:00": {"9": 2}}}
    report.calls = {"api": {"db": 2}}
    report.failed_calls = {"api": {"db": {"2026-11-29T10:00": 1}}}
    doc = json.loads(report.to_json())
    SCHEMA.validate(doc)
    assert Report.from_json(doc) == report
    for bad in ({"api": {"db": {"2026-11-29T10:00:00Z": 1}}},  # not a minute key
                {"api": {"db": {"2026-11-29T10:00": 0}}},
                {"api": {"db": {}}},
                {"api": {}}):
        assert not SCHEMA.is_valid({**doc, "failed_calls": bad}), bad


def test_a_report_keeps_only_the_most_recent_fragment_ids() -> None:
    fragments = [make_fragment(f"f{n:02}", {"t/0": [[n, n]]}) for n in range(MAX_FRAGMENT_IDS + 5)]
    report, _ = merge_all(None, fragments[:3], report_id="r", now="t")
    for fragment in fragments[3:]:
        report, _ = merge_all(report, [fragment], report_id="r", now="t")
    assert report.fragment_ids == [f.id for f in fragments][-MAX_FRAGMENT_IDS:]
    assert report.fragments_applied == len(fragments)


def test_leaving_out_the_derived_fields_shrinks_a_report_by_their_size() -> None:
    report = report_of(10)
    old = json.dumps(as_stored_before(report), separators=(",", ":"))
    new = report.to_json()
    derived = json.dumps(
        {"timeline": as_stored_before(report)["timeline"],
         "examples": [i.examples for i in report.incidents]}, separators=(",", ":"))
    assert len(old) - len(new) >= len(derived)


def test_examples_keep_one_text_per_shape_and_are_cut() -> None:
    trace = "java.io.IOException: fetch failed\n" + "\tat kafka.Fetcher.run(Fetcher.scala:1)\n" * 40
    texts = [
        "ask 10.0.0.7:50010 to delete blk_-5471189807977280544",
        "ask 10.0.0.12:50010 to delete blk_6708643067868168687",
        "Error in fetch FetchRequest@4e3f58bf",
        "Error in fetch FetchRequest@71b25ec9",
        "ERROR in fetch fetchrequest@0a1b2c3d",  # case and spacing do not make a new shape
        "disk full on node3", "disk full", "quota exceeded", trace,
    ]
    # one text a shape, the shortest (then the first in code point order), shortest first
    assert pick_examples(texts) == [
        "disk full",
        "quota exceeded",
        "disk full on node3",
        "ERROR in fetch fetchrequest@0a1b2c3d",
        "ask 10.0.0.12:50010 to delete blk_6708643067868168687",
    ]
    assert pick_examples([trace]) == [trace[:model.MAX_EXAMPLE_CHARS]]
    assert pick_examples([trace, trace[:model.MAX_EXAMPLE_CHARS] + "more"]) == [
        trace[:model.MAX_EXAMPLE_CHARS]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(
    ["a", "a1", "a2", "b 10", "b 7", "B 99", "x@ff01", "x@0a", "zz", "long 1 text", "long 22 text",
     "c", "d3", "e"]), max_size=12), st.randoms())
def test_picking_examples_in_any_split_and_order_picks_the_same(texts, rnd) -> None:
    shuffled = texts[:]
    rnd.shuffle(shuffled)
    held: list[str] = []
    for n in range(0, len(shuffled), 3):  # merged a few at a time, like fragments
        held = pick_examples([*held, *shuffled[n:n + 3]])
    assert held == pick_examples(texts)
    assert len({example_shape(x) for x in held}) == len(held) <= model.MAX_EXAMPLES


def test_the_page_timeline_comes_from_the_incidents_of_a_report_stored_before() -> None:
    report = report_of(3)
    old = as_stored_before(report)
    old["timeline"] = []  # a stale stored copy: the page must not show it
    page = render_html(Report.from_json(old))
    timeline = page.split('<details id="timeline">', 1)[1].split("</details>", 1)[0]
    assert all(f"first seen: <strong>{inc.event}</strong>" in timeline
               for inc in report.incidents)
