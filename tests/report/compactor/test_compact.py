"""One buffer's share of one report: merged at once, bad fragments named, roll-ups last."""

from __future__ import annotations

from streams.report.analysis.rollup import RollupUpdate
from streams.report.compactor.compact import fold
from streams.report.state.merge import incident_key

from helpers import make_fragment

RID = "2026-11-29/all#0"


def test_fragments_merge_into_one_version_and_replays_change_nothing() -> None:
    fragments = [make_fragment("a", {"t/0": [[0, 9]]}), make_fragment("b", {"t/0": [[5, 14]]})]
    first = fold(None, fragments, [], report_id=RID, now="t1")
    assert first.results == ["applied", "partial"] and not first.rejected
    assert first.report is not None and first.report.version == 1
    assert first.report.record_count == 15
    again = fold(first.report, fragments, [], report_id=RID, now="t2")
    assert again.report is None and again.results == ["duplicate", "duplicate"]


def test_a_fragment_that_cannot_merge_is_named_and_the_rest_still_merge() -> None:
    good = make_fragment("a", {"t/0": [[0, 9]]})
    bad = make_fragment("b", {"t/0": [[20, 10]]})  # ranges backwards: unusable
    folded = fold(None, [good, bad], [], report_id=RID, now="t")
    assert folded.results == ["applied", "invalid"]
    assert [(f.id, "unusable" in why) for f, why in folded.rejected] == [("b", True)]
    assert folded.report is not None and folded.report.record_count == 10


def test_roll_ups_apply_after_the_fragments_of_the_same_buffer() -> None:
    fragment = make_fragment("a", {"t/0": [[0, 9]]})
    key = incident_key(fragment.event, fragment.cause)
    update = RollupUpdate(report_id=RID, incident_key=key, summary="Disk full; free space.",
                          based_on_count=10, model="m", prompt_version="v1")
    folded = fold(None, [fragment], [update], report_id=RID, now="t")
    assert folded.report is not None
    assert folded.report.incidents[0].summary == "Disk full; free space."
    assert fold(None, [], [update], report_id=RID, now="t").report is None  # nothing to sum
