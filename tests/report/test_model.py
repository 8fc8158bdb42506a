"""What a stored report holds: only what cannot be derived, and older forms still load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from streams.records import Evidence
from streams.report.merge import merge_all
from streams.report.model import Report, pick_examples, timeline_of

from helpers import make_fragment

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "schemas" / "report.schema.json").read_text())


def report_of(incidents: int, templates: int = 3) -> Report:
    """``incidents`` incidents of ``templates`` templates, every example text distinct."""
    fragments = []
    for i in range(incidents):
        covered = {"t/0": [[i * 100, i * 100 + templates - 1]]}
        evidence = [
            Evidence(template=f"event {i} step {t} <*>", count=1,
                     examples=[f"event {i} step {t} at host-{i}-{t}-{n}" for n in range(3)],
                     covered={"t/0": [[i * 100 + t, i * 100 + t]]})
            for t in range(templates)
        ]
        fragments.append(make_fragment(
            f"f{i}", covered, event=f"Event {i}", evidence=evidence,
            timestamp=f"2026-11-29T1{i % 10}:00:00Z", window={"start": None, "end": None}))
    report, _ = merge_all(None, fragments, report_id="2026-11-29/all", now="t")
    return report


def as_stored_before(report: Report) -> dict[str, Any]:
    """The report as it was stored before the timeline and the incidents' examples were
    derived on read: both written out beside the fields they repeat."""
    doc = json.loads(report.to_json())
    doc["timeline"] = [e.model_dump(mode="json") for e in report.timeline]
    for stored, inc in zip(doc["incidents"], report.incidents, strict=True):
        stored["examples"] = inc.examples
    return doc


def test_a_report_stores_each_example_once_and_no_derived_field() -> None:
    report = report_of(6)
    text = report.to_json()
    doc = json.loads(text)
    jsonschema.validate(doc, SCHEMA)
    assert "timeline" not in doc
    assert all("examples" not in inc for inc in doc["incidents"])
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


def test_leaving_out_the_derived_fields_shrinks_a_report_by_their_size() -> None:
    report = report_of(10)
    old = json.dumps(as_stored_before(report), separators=(",", ":"))
    new = report.to_json()
    derived = json.dumps(
        {"timeline": as_stored_before(report)["timeline"],
         "examples": [i.examples for i in report.incidents]}, separators=(",", ":"))
    assert len(new) < len(old)
    # what went is the derived fields, nothing else: the difference is about their size
    assert abs((len(old) - len(new)) - len(derived)) < 20 * len(report.incidents)
