"""Trace context lifted out of a log message into attributes.

Instrumented services print the ids of the current span on every line: logback/log4j
MDC patterns (``TraceID: <hex> SpanID: <hex>``), OpenTelemetry's log formats
(``trace_id=... span_id=... trace_flags=01``, ``trace_sampled=True``), ECS
(``trace.id``), Datadog (``dd.trace_id``, decimal), B3 (``X-B3-TraceId``), JSON
spellings (``"traceId":"..."``) and the W3C Trace Context header (``traceparent:
00-<32 hex>-<16 hex>-<2 hex>``). The ids change on every request, so in the text they
only cost tokens, and a line that opens with them mines to one template for many
events. :func:`lift_trace` returns the message without them and the ids as
attributes: ``trace_id``, ``span_id``, ``parent_span_id``, ``trace_flags``,
``trace_sampled``.

Only a key with an explicit separator and a value shaped like an id is lifted, so a
line that merely talks about a trace ("stack trace follows", "no trace id in
request") is returned unchanged. Pure and cheap: a substring test rejects almost every
line before any regex runs.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["lift_trace"]

MAX_SCAN_CHARS = 1024  # trace context sits in the first part of a line, not deep in a payload
MIN_ID_DIGITS, MAX_ID_DIGITS = 8, 64  # 32-bit ids printed short, up to two 128-bit halves

_PAIR = re.compile(
    # the first character a key can start with, tested first so most positions fail fast
    r"(?=[\"'tTsSpPdDxX])"
    # a key of its own: not the tail of a longer name, not a URL query parameter
    r"(?<![\w.\-/?&])(?P<q>[\"']?)"
    r"(?P<key>traceparent"
    r"|(?:dd\.|x-b3-)?(?:parent[_.\-]?)?span[_.\-]?id"
    r"|(?:dd\.|x-b3-)?trace[_.\-]?(?:id|flags|sampled))"
    r"(?P=q)[ \t]?[:=][ \t]?"
    r"(?P<vq>[\"']?)(?P<value>[\w.\-/]*)(?P=vq)(?![\w\-])"
    r"(?:[ \t]*[,;])?",  # the separator that followed the pair goes with it
    re.IGNORECASE,
)
# every key holds one of these words, ending at most KEY_WORD_REACH characters after the
# pair's start ('"x-b3-parent-span'); compiled with _PAIR's flag, so it folds case alike
_KEY_WORD = re.compile(r"race|span", re.IGNORECASE)
KEY_WORD_REACH = 17
_ID = re.compile(r"[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+)*")  # hex or decimal, UUID-style dashes
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})", re.I)
_FLAGS = re.compile(r"[0-9A-Fa-f]{1,2}")
_SAMPLED = {"true": True, "false": False, "1": True, "0": False}
_NO_ID = frozenset(("", "-", "null", "none", "nil", "undefined", "n/a"))  # printed when no span
_ATTRIBUTE = {
    "traceid": "trace_id", "spanid": "span_id", "parentspanid": "parent_span_id",
    "traceflags": "trace_flags", "tracesampled": "trace_sampled",
}
_SEPARATORS = str.maketrans("", "", "_.-")
_OPENERS, _CLOSERS = "[({", "])}"  # pairs, in the same order


def lift_trace(message: str) -> tuple[str, dict[str, Any]]:
    """``message`` without the trace context on its first line, and that context.

    Returns ``message`` itself and an empty dict when there is none. A placeholder
    printed outside any span (``trace_id=0``, ``span_id=-``) is removed from the text
    but gives no attribute.
    """
    head = message[:MAX_SCAN_CHARS].lower()  # one short copy: faster than five searches
    if "race" not in head and "span" not in head:
        return message, {}
    end = message.find("\n")
    line = message if end < 0 else message[:end]
    found: dict[str, Any] = {}
    cuts: list[tuple[int, int]] = []
    pos = 0
    while pos < MAX_SCAN_CHARS:
        if not _key_word_ahead(line, pos):
            break  # no pair can start here: the search would scan the rest of the line
        m = _PAIR.search(line, pos)
        if m is None or m.start() >= MAX_SCAN_CHARS:
            break
        if _read(m["key"], m["value"], found):
            cuts.append((m.start(), m.end()))
            pos = m.end()
        else:  # not an id: the next key may start inside what the value swallowed
            pos = m.end("key")
    if not cuts:
        return message, {}
    rest = _cut(line, cuts)
    return (rest if end < 0 else rest + message[end:]), found


def _key_word_ahead(line: str, pos: int) -> bool:
    """A key word where a pair starting at ``pos`` or later, before the scan's end,
    would hold one; in an ASCII window (most) two substring tests, lowered as _PAIR's
    IGNORECASE folds ASCII."""
    window = line[pos:MAX_SCAN_CHARS + KEY_WORD_REACH]
    if window.isascii():
        lowered = window.lower()
        return "race" in lowered or "span" in lowered
    return _KEY_WORD.search(window) is not None


def _read(key: str, value: str, found: dict[str, Any]) -> bool:
    """Put the pair's attributes into ``found``; False if the value is no trace context."""
    name = key.lower().translate(_SEPARATORS).removeprefix("dd").removeprefix("xb3")
    if name == "traceparent":
        tp = _TRACEPARENT.fullmatch(value)
        if tp is None:
            return value.lower() in _NO_ID
        if int(tp[2], 16):  # the all-zero trace id is W3C's "invalid"
            found.setdefault("trace_id", tp[2].lower())
            found.setdefault("span_id", tp[3].lower())
            found.setdefault("trace_flags", tp[4].lower())
        return True
    attribute = _ATTRIBUTE.get(name)
    if attribute is None:  # a key folded from non-ASCII letters (a long s): not one of ours
        return False
    if attribute == "trace_flags":
        if _FLAGS.fullmatch(value) is None:
            return False
        found.setdefault(attribute, value.lower())
        return True
    if attribute == "trace_sampled":
        sampled = _SAMPLED.get(value.lower())
        if sampled is None:
            return False
        found.setdefault(attribute, sampled)
        return True
    if value.lower() in _NO_ID:
        return True
    if _ID.fullmatch(value) is None:
        return False
    digits = len(value) - value.count("-")
    if digits > MAX_ID_DIGITS:
        return False
    if value.strip("0-") == "":
        return True  # all zeros: no span was active
    if digits < MIN_ID_DIGITS:
        return False
    found.setdefault(attribute, value)
    return True


def _cut(line: str, cuts: list[tuple[int, int]]) -> str:
    """``line`` without the cut spans; the text around each joined by one space."""
    out = line[: cuts[0][0]]
    for i, (_, end) in enumerate(cuts):
        stop = cuts[i + 1][0] if i + 1 < len(cuts) else len(line)
        out = _join(out, line[end:stop])
    if not line[cuts[-1][1]:].strip():
        out = out.rstrip(",;")  # the context closed the line: its separator goes too
    return out.strip()


def _join(left: str, right: str) -> str:
    left, right = left.rstrip(), right.lstrip()
    while left and right and left[-1] in _OPENERS and right[0] == _CLOSERS[
            _OPENERS.index(left[-1])]:
        left, right = left[:-1].rstrip(), right[1:].lstrip()  # a group emptied by the cut
    if not left or not right:
        return left or right
    if right[0] in _CLOSERS:
        return left.rstrip(",;") + right
    if left[-1] in _OPENERS:
        return left + right
    return f"{left} {right}"
