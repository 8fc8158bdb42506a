"""Open traces, when they are complete, and the hops into services they show."""

from __future__ import annotations

import json
import math

from streams.records import (
    HEAD_WORD_CHARS,
    HEAD_WORDS,
    Coord,
    HopsUpdate,
    TraceHops,
    TraceMark,
    read_mark,
    template_head,
    trace_mark,
)
from streams.schemas import load_schema, validator
from streams.traces.table import (
    TraceTable,
    epoch_ms,
    failed_calls_of,
    hop_bin,
    hop_updates,
    hops_of,
    next_lines_of,
)

T0 = "2026-11-29T10:00:00.000Z"


def at(ms: int) -> str:
    """A time ``ms`` after 10:00:00 UTC, as records carry it."""
    seconds, millis = divmod(ms, 1000)
    minutes, seconds = divmod(seconds, 60)
    return f"2026-11-29T10:{minutes:02d}:{seconds:02d}.{millis:03d}Z"


def mark(trace: str, service: str, ms: int, offset: int, *, partition: int = 0,
         failing: bool = False, template: str = "") -> TraceMark:
    return TraceMark(trace, f"logs/{partition}/{offset}", service, f"{service}.log", at(ms),
                     Coord("logs", partition, offset), failing, template)


def test_the_hop_into_a_service_runs_from_its_callers_line_just_before_its_first() -> None:
    lines = [mark("t1", "gateway", 0, 1), mark("t1", "gateway", 5, 2),
             mark("t1", "orders", 12, 3), mark("t1", "orders", 40, 4),
             mark("t1", "stock", 300, 5), mark("t1", "orders", 310, 6)]
    hops = {m.service: (caller, delay) for m, caller, delay in hops_of(reversed(lines))}
    # gateway began the request; orders' second line and its line after stock are no hops
    assert hops == {"orders": ("gateway", 7), "stock": ("orders", 260)}


def test_a_service_failing_after_calls_is_linked_to_the_one_it_called_last() -> None:
    lines = [mark("t1", "gateway", 0, 1), mark("t1", "orders", 5, 2),
             mark("t1", "stock", 20, 3), mark("t1", "orders", 30, 4),
             mark("t1", "price", 40, 5), mark("t1", "orders", 90, 6, failing=True),
             mark("t1", "orders", 95, 7, failing=True), mark("t1", "gateway", 99, 8, failing=True)]
    linked = [(m.service, m.id, callee) for m, callee in failed_calls_of(lines[::-1])]
    # orders called stock, then price, then failed: price; its second failing line adds
    # nothing; gateway's last call was orders
    assert linked == [("orders", "logs/0/6", "price"), ("gateway", "logs/0/8", "orders")]


def test_a_service_failing_before_it_called_anyone_is_linked_to_no_callee() -> None:
    lines = [mark("t1", "gateway", 0, 1), mark("t1", "orders", 5, 2, failing=True),
             mark("t1", "stock", 20, 3)]  # stock was called after orders failed
    assert failed_calls_of(lines) == []
    # without failing lines a trace links nothing
    assert failed_calls_of([mark("t2", "gateway", 0, 1), mark("t2", "orders", 5, 2)]) == []


def test_each_line_counts_the_line_its_service_wrote_next_in_the_request() -> None:
    lines = [mark("t1", "gateway", 0, 1, template="GET /orders"),
             mark("t1", "orders", 5, 12, template="lookup <*>"),
             mark("t1", "orders", 5, 13, template="found <*>"),  # the same ms: written next
             mark("t1", "stock", 6, 14, template="reserve <*>"),
             mark("t1", "orders", 9, 15, template="lookup <*>"),
             mark("t1", "orders", 61_000, 16, template="found <*>"),
             mark("t1", "stock", 7, 17)]  # an older clean stage's mark: no template
    minute, later = "2026-11-29T10:00", "2026-11-29T10:01"
    # another service's line between two of orders' does not part them
    assert next_lines_of(reversed(lines)) == [
        ("gateway", minute, "GET /orders", "", 1),
        ("orders", minute, "found <*>", "lookup <*>", 1),
        ("orders", minute, "lookup <*>", "found <*>", 2),
        ("orders", later, "found <*>", "", 1),
        ("stock", minute, "reserve <*>", "", 1)]


def test_a_mark_names_its_line_by_the_first_words_of_its_template() -> None:
    payload = "Travels: [Trip(id=" + "ab12" * 2000 + ")]"  # one word of 8,000 characters
    template = f"[queryForTravels][Query for travels][{payload} " + "<*> " * 40
    head = template_head(template)
    assert head.split()[:3] == ["[queryForTravels][Query", "for", "travels][Travels:"]
    assert len(head.split()) == HEAD_WORDS and len(head) < HEAD_WORDS * (HEAD_WORD_CHARS + 1)
    assert template_head("lookup <*> done") == "lookup <*> done"  # a short one is itself
    fields = {"id": "logs/0/1", "raw": {"topic": "logs", "partition": 0, "offset": 1},
              "source": "travel.log", "service": "travel", "timestamp": T0,
              "attributes": {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"},
              "template": template}
    assert read_mark(trace_mark(fields)[1]).template == head


def test_hop_bins_are_half_octaves_so_four_up_is_four_times_slower() -> None:
    assert hop_bin(0.4) == 0
    assert hop_bin(1) == 1
    assert hop_bin(5) + 4 == hop_bin(20)
    assert hop_bin(1000) - hop_bin(250) == 4


def test_a_trace_closes_after_its_lines_stop_and_every_input_moved_past_it() -> None:
    table = TraceTable(since=-60, hold_seconds=5, grace_ms=30_000, idle_seconds=30)
    table.add(mark("t1", "gateway", 0, 1), ("traces", 0, 0), "a", now=0.0)
    table.add(mark("t1", "orders", 10, 2), ("traces", 0, 1), "b", now=1.0)
    table.add(mark("t2", "gateway", 31_000, 3), ("traces", 0, 2), "c", now=2.0)
    assert table.due(now=5.5) == []  # t1's last line came 4.5 s ago
    [closed] = table.due(now=6.0)
    assert closed.tags == ["a", "b"] and set(closed.marks) == {"logs/0/1", "logs/0/2"}
    assert list(table.open) == ["t2"]  # its input has not moved 30 s past it


def test_an_input_behind_in_event_time_holds_traces_open_until_it_goes_idle() -> None:
    table = TraceTable(since=-60, hold_seconds=5, grace_ms=30_000, idle_seconds=30)
    table.add(mark("t1", "gateway", 0, 1), ("traces", 0, 0), None, now=0.0)
    table.add(mark("t1", "orders", 10, 2, partition=1), ("traces", 0, 1), None, now=0.0)
    table.add(mark("t8", "orders", 20, 4, partition=1), ("traces", 0, 3), None, now=10.0)
    table.add(mark("t9", "gateway", 120_000, 3), ("traces", 0, 2), None, now=35.0)
    # partition 1 of the input is only 20 ms in: its lines of t1 may still come
    assert table.watermark(now=35.0) == epoch_ms(at(20)) and table.due(now=35.0) == []
    # ... until it sent nothing for 30 s: then only partition 0's two minutes count
    assert table.watermark(now=40.5) == epoch_ms(at(120_000))
    assert {next(iter(t.marks.values())).trace for t in table.due(now=40.5)} == {"t1", "t8"}
    assert table.watermark(now=100.0) == math.inf  # nothing sends: everything is in


def test_a_new_table_closes_nothing_before_every_sending_input_was_heard() -> None:
    table = TraceTable(since=0, hold_seconds=1, grace_ms=0, idle_seconds=10)
    table.add(mark("t1", "gateway", 0, 1), ("traces", 0, 0), None, now=0.0)
    table.add(mark("t1", "orders", 10, 2), ("traces", 0, 1), None, now=0.0)
    table.add(mark("t2", "gateway", 60_000, 3), ("traces", 0, 2), None, now=9.0)
    assert table.due(now=9.5) == []  # input partition 1 may not have said anything yet
    table.add(mark("t1", "stock", 30, 4, partition=1), ("traces", 0, 3), None, now=9.9)
    assert table.due(now=10.0) == []  # and it did: t1 goes on, held 1 s more
    assert len(table.due(now=11.0)[0].marks) == 3


def test_a_mark_sent_twice_counts_once_and_a_late_one_is_refused() -> None:
    table = TraceTable(hold_seconds=0, grace_ms=0, idle_seconds=30)
    first = mark("t1", "gateway", 0, 1)
    assert table.add(first, ("traces", 0, 0), "a", now=0.0)
    assert table.add(first, ("traces", 0, 1), "b", now=0.0)  # a re-cleaned fetch sent it again
    assert table.add(mark("t1", "orders", 10, 2), ("traces", 0, 2), "c", now=0.0)
    [closed] = table.flush()
    assert len(closed.marks) == 2 and closed.tags == ["a", "b", "c"]
    assert not table.add(mark("t1", "stock", 20, 3), ("traces", 0, 3), "d", now=1.0)
    assert table.late == 1 and not table.open


def test_a_closed_trace_is_remembered_until_the_newest_line_is_far_past_its_last() -> None:
    table = TraceTable(since=-60, hold_seconds=0, grace_ms=0, remember_ms=60_000,
                       idle_seconds=30)
    for i, trace in enumerate(["t1", "t2"]):  # t1's last line comes after t2's
        table.add(mark(trace, "gateway", 1000 * i, 2 * i), ("traces", 0, 2 * i), None, now=0.0)
    table.add(mark("t1", "orders", 5000, 9), ("traces", 0, 9), None, now=0.0)
    assert len(table.due(now=1.0)) == 2 and set(table.closed) == {"t1", "t2"}
    table.add(mark("t3", "gateway", 62_000, 10), ("traces", 0, 10), None, now=2.0)
    table.due(now=2.0)  # the newest line is 61 s past t2's last and 57 s past t1's
    assert "t2" not in table.closed and "t1" in table.closed
    table.add(mark("t4", "gateway", 66_000, 11), ("traces", 0, 11), None, now=3.0)
    table.due(now=3.0)
    assert "t1" not in table.closed and "t3" in table.closed
    # forgotten, a line of t1 opens it again rather than being dropped as late
    assert table.add(mark("t1", "stock", 66_500, 12), ("traces", 0, 12), None, now=3.0)


def test_hop_updates_go_to_the_report_of_each_services_first_line() -> None:
    table = TraceTable()
    for i, (service, ms) in enumerate([("gateway", 0), ("orders", 8), ("stock", 65_000)]):
        table.add(mark("t1", service, ms, i), ("retro.traces", 3, 10 + i), None, now=0.0)
    table.add(mark("t2", "gateway", 5, 9), ("retro.traces", 3, 20), None, now=0.0)
    updates = hop_updates(table.flush(), lambda m: m.timestamp[:16])  # a report a minute
    assert [(u.report_id, [t.hops for t in u.traces]) for u in updates] == [
        ("2026-11-29T10:00", [[("orders", "2026-11-29T10:00", hop_bin(8), "gateway")]]),
        ("2026-11-29T10:01", [[("stock", "2026-11-29T10:01", hop_bin(64_992), "orders")]])]
    # both carry all of t1's marks; t2, one service, has no hop and no update
    assert {str(u.traces[0].covered) for u in updates} == {"{'retro.traces/3': [[10, 12]]}"}
    assert [t.failed for u in updates for t in u.traces] == [[], []]


def test_next_lines_go_to_the_report_of_the_services_first_line_in_the_trace() -> None:
    table = TraceTable()
    for i, (ms, template) in enumerate([(59_990, "lookup <*>"), (60_010, "found <*>")]):
        table.add(mark("t1", "orders", ms, i, template=template), ("retro.traces", 3, i),
                  None, now=0.0)
    # one service: no hop, but which line followed which is an update of its own
    [update] = hop_updates(table.flush(), lambda m: m.timestamp[:16])
    assert update.report_id == "2026-11-29T10:00"
    assert update.traces[0].hops == [] and update.traces[0].next_lines == [
        ("orders", "2026-11-29T10:00", "lookup <*>", "found <*>", 1),
        ("orders", "2026-11-29T10:01", "found <*>", "", 1)]


def test_a_failed_call_goes_to_the_report_of_the_callers_failing_line() -> None:
    table = TraceTable()
    for i, (service, ms, failing) in enumerate([("gateway", 0, False), ("orders", 8, False),
                                                ("gateway", 61_000, True)]):
        table.add(mark("t1", service, ms, i, failing=failing), ("retro.traces", 3, i), None,
                  now=0.0)
    updates = hop_updates(table.flush(), lambda m: m.timestamp[:16])
    assert [(u.report_id, [(t.hops, t.failed) for t in u.traces]) for u in updates] == [
        ("2026-11-29T10:00", [([("orders", "2026-11-29T10:00", hop_bin(8), "gateway")], [])]),
        ("2026-11-29T10:01", [([], [("gateway", "orders", "2026-11-29T10:01")])])]


def test_marks_and_hop_updates_match_their_schemas() -> None:
    fields = {"id": "logs/2/7", "raw": {"topic": "logs", "partition": 2, "offset": 7},
              "source": "orders.log", "service": "orders", "timestamp": T0,
              "attributes": {"trace_id": "4BF92F3577B34DA6A3CE929D0E0E4736"},
              "template": "lookup <*>"}
    key, value = trace_mark(fields)
    assert key == b"4bf92f3577b34da6a3ce929d0e0e4736"
    assert read_mark(value).raw == Coord("logs", 2, 7) and not read_mark(value).failing
    assert read_mark(trace_mark({**fields, "level": "ERROR"})[1]).failing
    assert list(validator("trace-mark").iter_errors(json.loads(value))) == []
    assert trace_mark({**fields, "timestamp": None}) is None
    assert trace_mark({**fields, "attributes": {}}) is None
    table = TraceTable()
    table.add(read_mark(value), ("retro.traces", 0, 0), None, now=0.0)
    table.add(mark("4bf92f3577b34da6a3ce929d0e0e4736", "stock", 30, 8), ("retro.traces", 0, 1),
              None, now=0.0)
    table.add(mark("4bf92f3577b34da6a3ce929d0e0e4736", "orders", 60, 9, failing=True),
              ("retro.traces", 0, 2), None, now=0.0)
    [update] = hop_updates(table.flush(), lambda m: "2026-11-29/all")
    assert update.traces[0].failed == [("orders", "stock", "2026-11-29T10:00")]
    assert update.traces[0].next_lines == [("orders", "2026-11-29T10:00", "lookup <*>", "", 1)]
    assert list(validator("hops").iter_errors(update.model_dump(mode="json"))) == []
    # an older trace stage's hops carry no caller, and still read
    older = HopsUpdate(report_id="r", traces=[TraceHops(covered={"retro.traces/0": [[0, 1]]},
                                                        hops=[("stock", "2026-11-29T10:00", 9)])])
    assert list(validator("hops").iter_errors(older.model_dump(mode="json"))) == []
    assert set(load_schema("hops")["properties"]) == set(HopsUpdate.model_fields)
    assert set(load_schema("trace-mark")["properties"]) == set(TraceMark.__struct_fields__)
    # an older clean stage's mark has no failing flag nor template, and still reads
    older_mark = {k: v for k, v in json.loads(value).items() if k not in ("failing", "template")}
    assert not read_mark(json.dumps(older_mark).encode()).failing
    assert read_mark(json.dumps(older_mark).encode()).template == ""
