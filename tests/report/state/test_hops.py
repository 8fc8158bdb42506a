"""Hops added to a report: once per trace, however often and in whatever order sent."""

from __future__ import annotations

from streams.records import HopsUpdate, TraceHops
from streams.report.compactor.compact import fold
from streams.report.state.hops import MAX_NEXT, apply_hops
from streams.report.state.merge import compose, report_body
from streams.report.state.model import OTHER_TEMPLATES, Report

MINUTE = "2026-11-29T10:00"


def trace(first: int, last: int, *hops: tuple[str, int], failed_after: str | None = None
          ) -> TraceHops:
    """Hops of one trace that the gateway began, each into a service it called; with
    ``failed_after``, the gateway failed after calling that one last."""
    return TraceHops(covered={"retro.traces/0": [[first, last]]},
                     hops=[(service, MINUTE, b, "gateway") for service, b in hops],
                     failed=[("gateway", failed_after, MINUTE)] if failed_after else [])


def test_a_trace_sent_again_adds_nothing_and_order_does_not_matter() -> None:
    a = HopsUpdate(report_id="r", traces=[trace(0, 2, ("orders", 6), ("stock", 9),
                                                failed_after="stock")])
    b = HopsUpdate(report_id="r", traces=[trace(3, 4, ("orders", 6), failed_after="orders")])
    once, changed = apply_hops(Report(id="r"), [a, b], now="t")
    assert changed and once.hops == {"orders": {MINUTE: {"6": 2}}, "stock": {MINUTE: {"9": 1}}}
    assert once.calls == {"gateway": {"orders": 2, "stock": 1}}
    assert once.failed_calls == {"gateway": {"orders": {MINUTE: 1}, "stock": {MINUTE: 1}}}
    again, changed = apply_hops(once, [b, a], now="t2")
    assert not changed and again is once
    # a re-read after a crash may cut the same marks into other updates: still once each
    other, _ = apply_hops(apply_hops(Report(id="r"), [b], now="t")[0], [a, b], now="t")
    assert report_body(other) == report_body(once)
    assert other.hops_covered == {"retro.traces/0": [[0, 4]]}


def test_hops_may_reach_a_report_before_its_records() -> None:
    folded = fold(None, [], [], report_id="r", now="t",
                  hops=[HopsUpdate(report_id="r", traces=[trace(0, 1, ("orders", 5))])])
    assert folded.report is not None and folded.report.hops == {"orders": {MINUTE: {"5": 1}}}
    assert folded.report.version == 1


def test_a_trace_with_failed_calls_but_no_hop_in_a_report_still_counts_once() -> None:
    only_failed = HopsUpdate(report_id="r", traces=[TraceHops(
        covered={"retro.traces/0": [[5, 6]]}, hops=[], failed=[("gateway", "orders", MINUTE)])])
    once, changed = apply_hops(Report(id="r"), [only_failed], now="t")
    assert changed and once.hops == {} and once.failed_calls == {
        "gateway": {"orders": {MINUTE: 1}}}
    assert apply_hops(once, [only_failed], now="t2") == (once, False)


def test_shards_of_a_report_add_their_hops() -> None:
    one = apply_hops(Report(id="r|0"), [HopsUpdate(report_id="r|0", traces=[
        trace(0, 1, ("orders", 5), failed_after="orders")])], now="t")[0]
    two = apply_hops(Report(id="r|1"), [HopsUpdate(report_id="r|1", traces=[
        TraceHops(covered={"retro.traces/1": [[0, 0]]}, hops=[("orders", MINUTE, 5)],
                  failed=[("gateway", "orders", MINUTE)])])],
        now="t")[0]
    whole = compose("r", [one, two])
    assert whole.hops == {"orders": {MINUTE: {"5": 2}}}
    assert whole.calls == {"gateway": {"orders": 1}}  # the second shard's hop had no caller
    assert whole.failed_calls == {"gateway": {"orders": {MINUTE: 2}}}
    assert whole.hops_covered == {"retro.traces/0": [[0, 1]], "retro.traces/1": [[0, 0]]}


def test_next_lines_count_once_per_trace_and_shards_add_them() -> None:
    def traced(first: int, then: str) -> HopsUpdate:
        return HopsUpdate(report_id="r", traces=[TraceHops(
            covered={"retro.traces/0": [[first, first + 1]]}, hops=[],
            next_lines=[("orders", MINUTE, "lookup <*>", then, 1),
                        ("orders", MINUTE, then, "", 1)])])

    once, changed = apply_hops(Report(id="r"), [traced(0, "found <*>"), traced(2, "missing")],
                               now="t")
    assert changed and once.next_lines == {"orders": {
        "lookup <*>": {"found <*>": {MINUTE: 1}, "missing": {MINUTE: 1}},
        "found <*>": {"": {MINUTE: 1}}, "missing": {"": {MINUTE: 1}}}}
    assert apply_hops(once, [traced(2, "missing")], now="t2") == (once, False)
    other = apply_hops(Report(id="r|1"), [traced(5, "found <*>")], now="t")[0]
    whole = compose("r", [once, other])
    assert whole.next_lines["orders"]["lookup <*>"] == {
        "found <*>": {MINUTE: 2}, "missing": {MINUTE: 1}}


def test_a_line_followed_by_many_lines_keeps_the_usual_ones_and_its_count() -> None:
    many = [(f"step {i}", 20 - i) for i in range(MAX_NEXT + 3)]  # step 0 most often
    report, _ = apply_hops(Report(id="r"), [HopsUpdate(report_id="r", traces=[TraceHops(
        covered={"retro.traces/0": [[0, 0]]}, hops=[],
        next_lines=[("orders", MINUTE, "lookup <*>", then, n) for then, n in many])])],
        now="t")
    nexts = report.next_lines["orders"]["lookup <*>"]
    assert len(nexts) == MAX_NEXT and "step 0" in nexts and "step 10" not in nexts
    assert nexts[OTHER_TEMPLATES] == {MINUTE: sum(n for _, n in many[MAX_NEXT - 1:])}
    assert sum(n for minutes in nexts.values() for n in minutes.values()) == sum(
        n for _, n in many)
