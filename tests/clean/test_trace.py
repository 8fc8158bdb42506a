"""Trace context lifted out of the message (streams.clean.trace) and through the Cleaner."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from streams.clean.cleaner import Cleaner
from streams.clean.trace import lift_trace
from streams.records import NormalizedRecord, RawCoord

from helpers import make_cleaner

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize(("line", "rest", "attributes"), [
    # logback/log4j MDC pattern
    (f"TraceID: {TRACE} SpanID: {SPAN} [getOrder][Order not found]",
     "[getOrder][Order not found]", {"trace_id": TRACE, "span_id": SPAN}),
    # OpenTelemetry key=value, at the end of the line
    (f"request done trace_id={TRACE} span_id={SPAN} trace_flags=01",
     "request done", {"trace_id": TRACE, "span_id": SPAN, "trace_flags": "01"}),
    (f"traceId={TRACE} spanId={SPAN} cart updated",
     "cart updated", {"trace_id": TRACE, "span_id": SPAN}),
    # OpenTelemetry Python's logging format: a bracket group keeps what is not trace context
    (f"[trace_id={TRACE} span_id={SPAN} resource.service.name=cart trace_sampled=True] - added",
     "[resource.service.name=cart] - added",
     {"trace_id": TRACE, "span_id": SPAN, "trace_sampled": True}),
    (f"trace.id={TRACE} span.id={SPAN} transaction ok",
     "transaction ok", {"trace_id": TRACE, "span_id": SPAN}),
    # Datadog injects decimal ids
    ("dd.trace_id=1234567890123456789 dd.span_id=987654321987654321 payment accepted",
     "payment accepted", {"trace_id": "1234567890123456789", "span_id": "987654321987654321"}),
    # B3 headers as a proxy logs them
    ("X-B3-TraceId: 463ac35c9f6413ad X-B3-SpanId: a2fb4a1d1a96d312 "
     "X-B3-ParentSpanId: 0020000000000001 upstream call",
     "upstream call",
     {"trace_id": "463ac35c9f6413ad", "span_id": "a2fb4a1d1a96d312",
      "parent_span_id": "0020000000000001"}),
    # JSON spellings inside a text line; the separator goes with the pair
    (f'sent {{"traceId":"{TRACE}","spanId": "{SPAN}","order":42}}',
     'sent {"order":42}', {"trace_id": TRACE, "span_id": SPAN}),
    (f'sent {{"order":42, "trace_id": "{TRACE}"}}', 'sent {"order":42}', {"trace_id": TRACE}),
    # W3C Trace Context
    (f"traceparent: 00-{TRACE}-{SPAN}-01 GET /cart 200",
     "GET /cart 200", {"trace_id": TRACE, "span_id": SPAN, "trace_flags": "01"}),
    (f"GET /cart traceparent=00-{TRACE}-{SPAN}-00",
     "GET /cart", {"trace_id": TRACE, "span_id": SPAN, "trace_flags": "00"}),
    # in the middle of the line, with the comma that followed it
    (f"user=bob, trace_id={TRACE}, took 5ms", "user=bob, took 5ms", {"trace_id": TRACE}),
])
def test_each_spelling_is_lifted_and_the_message_cleaned(
        line: str, rest: str, attributes: dict[str, object]) -> None:
    assert lift_trace(line) == (rest, attributes)


@pytest.mark.parametrize("line", [
    "printing stack trace follows",
    "no trace id in request, traceId missing",
    "traceId: deadline exceeded",  # a word made of hex letters is not an id
    "span: 3 days, Span id 12345678",
    f"GET /api?trace_id={TRACE} HTTP/1.1",  # a URL's query stays whole
    f"subtrace_id={TRACE} done",  # the tail of another name
    "trace_id=12ab span_id=7",  # too short to be trace context
    "TRACE level enabled for org.acme",
])
def test_lines_that_merely_mention_a_trace_are_untouched(line: str) -> None:
    message, found = lift_trace(line)
    assert message is line and found == {}


def test_ids_printed_outside_any_span_leave_the_text_but_give_no_attribute() -> None:
    assert lift_trace("trace_id=0 span_id=0 cache warmed") == ("cache warmed", {})
    assert lift_trace("TraceID: - SpanID: - cache warmed") == ("cache warmed", {})
    assert lift_trace(f"traceparent=00-{'0' * 32}-{'0' * 16}-00 ping") == ("ping", {})


def test_only_the_first_line_is_searched() -> None:
    message = f"failed trace_id={TRACE}\n\tat a.B(B.java:1) trace_id=1111111111111111"
    assert lift_trace(message) == (
        "failed\n\tat a.B(B.java:1) trace_id=1111111111111111", {"trace_id": TRACE})


@pytest.mark.parametrize("key", ['"x-b3-parent-span-id"=', "X-B3-TraceId: ", "traceparent: ",
                                 "span_id="])
def test_a_pair_is_lifted_when_it_starts_in_the_first_1024_characters(key: str) -> None:
    """However long its key, a pair starting before the scan's end is found; one
    starting at the end is not (the key-word check before each search looks far enough)."""
    value = f"00-{TRACE}-{SPAN}-01" if key.startswith("traceparent") else SPAN
    for start in (1000, 1023):
        head = f"TraceID: {TRACE} " + "x" * (start - 43) + " "
        line = head + key + value + " done " + "y" * 5000
        assert len(head) == start
        rest, found = lift_trace(line)
        assert key.strip(' :="') not in rest and value not in rest, (key, start)
    head = f"TraceID: {TRACE} " + "x" * (1024 - 43) + " "
    rest, found = lift_trace(head + key + value + " done")
    assert found == {"trace_id": TRACE} and key in rest


# --- through the Cleaner ----------------------------------------------------------------


def make() -> Cleaner:
    return make_cleaner(datetime(2026, 6, 1, tzinfo=UTC))


def clean(cleaner: Cleaner, line: str, offset: int = 0) -> NormalizedRecord:
    out = cleaner.clean_line(line.encode(), RawCoord(topic="t", partition=0, offset=offset), "s")
    assert isinstance(out, NormalizedRecord), out
    return out


def test_the_cleaner_moves_trace_ids_to_attributes_and_mines_the_real_text() -> None:
    rec = clean(make(), f"2023-01-29 17:26:48.079 WARN o.s.OrderServiceImpl TraceID: {TRACE} "
                        f"SpanID: {SPAN} [getOrderById][Order not found]")
    assert rec.message == "[getOrderById][Order not found]"
    assert (rec.attributes["trace_id"], rec.attributes["span_id"]) == (TRACE, SPAN)
    assert rec.template is not None and "TraceID" not in rec.template
    assert TRACE not in rec.template and SPAN not in rec.template


def test_two_events_behind_trace_prefixes_get_two_templates() -> None:
    # same token count: with the ids left in, both events share five of nine tokens and
    # Drain mines them to one "TraceID: <*> SpanID: <*> <*> <*> <*> <*> <NUM>]"
    events = ["[getOrderById][Get Order By Id][OrderId: {}]",
              "[queryOrders][Query Orders For Refresh][Login: {}]"]
    cleaner = make()
    records = []
    for i in range(6):
        trace, span = f"{0x9e3779b97f4a7c15 * (i + 1):032x}"[-32:], f"{0xa5a5 * (i + 7):016x}"
        event = events[i // 3].format(i)
        line = f"17:26:48.{i:03d} INFO  o.c.OrderController TraceID: {trace} SpanID: {span} {event}"
        records.append(clean(cleaner, line, i))
    assert len({r.template_id for r in records[:3]}) == 1
    assert len({r.template_id for r in records[3:]}) == 1
    assert records[0].template_id != records[3].template_id
    assert records[3].template == "[queryOrders][Query Orders For Refresh][Login: <NUM>]"


def test_a_json_bodys_own_trace_ids_are_kept() -> None:
    body = {"ts": "2026-05-04T09:15:00Z", "level": "info", "msg": "cart updated",
            "trace_id": TRACE, "span_id": SPAN, "traceId": "ffffffffffffffff0000000000000001"}
    rec = clean(make(), json.dumps(body))
    assert rec.message == "cart updated"
    assert (rec.attributes["trace_id"], rec.attributes["span_id"]) == (TRACE, SPAN)
    assert rec.attributes["traceId"] == "ffffffffffffffff0000000000000001"


def test_a_key_spelled_with_letters_that_fold_to_ascii_is_text_not_a_crash() -> None:
    # Unicode case folding makes a long s match "s": such a key is no trace context
    text = "trace_id=4bf92f3577b34da6a3ce929d0e0e4736 \u017fpan_id=00f067aa0ba902b7 done"
    rest, found = lift_trace(text)
    assert found == {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736"}
    assert rest == "\u017fpan_id=00f067aa0ba902b7 done"
