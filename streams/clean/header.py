"""Reading the fields of one header line: where a timestamp can start, a dated
timestamp at a position, the tokens after it and the shapes a level takes.

The vocabulary :mod:`streams.clean.infer` learns with: positions are counted in
whitespace tokens plus the character that opens a field (``[``, ``,``, ``|`` ...),
so the same spot is found again in the next line of the same source.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from streams.clean.levels import LETTERS, normalize_level
from streams.clean.timestamps import (
    Stamp,
    TimeResolver,
    from_number,
    match_leading,
    time_of_day_at,
)
from streams.records import Level

__all__ = [
    "COMPONENT",
    "SHAPES",
    "TAG",
    "Found",
    "LevelSpot",
    "StampSpot",
    "find_stamp",
    "first_stamp",
    "header_tokens",
    "level_at",
    "level_of",
]

MAX_HEADER_CHARS = 256  # the header is in the first characters of a line
MAX_STAMP_TOKENS = 12  # the timestamp starts within the first whitespace tokens
MAX_LEVEL_TOKENS = 6  # the level is within these tokens after the timestamp
_DELIMITERS = ",;|\t"
_EPOCH = re.compile(r"(?P<n>1\d{9}|1\d{12}|1\d{15}|1\d{18})(?:\.(?P<frac>\d{1,9}))?(?![\w.:/-])")
_EPOCH_SCALE = {10: 1.0, 13: 1e3, 16: 1e6, 19: 1e9}
_EPOCH_MIN, _EPOCH_MAX = 1e9, 2.2e9  # 2001..2039: a number outside is not a time
_SHORT_DATE = re.compile(  # 03-17 16:13:38.811 (logcat, no year), 17/06/09 20:10:40 (yy/MM/dd)
    r"(?P<a>\d{2})(?P<sep>[-/.])(?P<b>\d{2})(?:(?P=sep)(?P<c>\d{2}))?"
    r"[ T](?P<H>\d{2}):(?P<M>\d{2}):(?P<S>\d{2})(?:[.,](?P<frac>\d{1,9}))?(?![\d:])"
)
_LEVEL_KEY = re.compile(r"(?:level|lvl|severity|loglevel)=\"?(?P<w>[A-Za-z]+)", re.IGNORECASE)
_BRACKETED = re.compile(r"[\[<(]\s*(?P<w>[A-Za-z]+)\s*[\]>)]:?")
_LETTER = re.compile(r"(?P<w>[VDIWEFA])(?:/|:|$)")
_WORD = re.compile(r"(?P<w>[A-Za-z]+)[:,]?")
TAG = re.compile(  # "sshd[42]:", "Tag( 123):", "cron(pam_unix)[7]:", "/usr/sbin/gmetad[9]:"
    r"(?P<path>/(?:[\w.\-]+/)*)?"  # a program named by its path: the file name is the tag
    r"(?P<tag>[A-Za-z_][\w.$/\-()]{0,63}?)(?:\[(?P<pid>\d+)\]|\(\s*(?P<pid2>\d+)\))?:"
)
COMPONENT = re.compile(r"(?P<tag>[A-Za-z_][\w.$\-]{0,63})")


@dataclass(frozen=True, slots=True)
class StampSpot:
    """Where a source's timestamp starts and which layout family it has."""

    tokens_before: int  # whitespace-separated tokens before it
    opener: str  # the character just before it ("" at a token start)
    layout: str  # "known" (match_leading), "month-day", "short-ymd" or "epoch"


@dataclass(frozen=True, slots=True)
class LevelSpot:
    """Where a source's level is, in tokens after the timestamp (or the line start)."""

    index: int
    shape: str  # "word", "bracket", "key", "letter"
    before: bool = False  # counted from the line start, before the timestamp


@dataclass(slots=True)
class Found:
    """A timestamp found in a line: its value, rule, parts and where it sits."""

    timestamp: datetime | None
    rule: str | None
    stamp: Stamp | None  # None for epoch numbers
    start: int
    end: int
    layout: str  # as in StampSpot.layout


_TOKEN = re.compile(r"\S+")
_INNER_START = re.compile(r"(?<=[\[(<\"'=,;|])[^\W_]")  # a field opened inside a token
# a word of running text ("job", "done,", "Started"): a few in a row outside any bracket
# are prose, so the message has begun; two may still be header columns ("action start")
_PROSE_WORD = re.compile(r"[A-Za-z][a-z]+[,.;:!?]?")
PROSE_WORDS = 3
_GROUP_OPENERS = "[(<{"


def candidates(line: str, *, prose: bool = True) -> Iterator[tuple[int, str, int]]:
    """(tokens before, opener, position) of every place a header field may start.

    Only the header is searched: a message may quote any date ("job done, time: Sat
    May 04 12:46:52 CST 2013"), which is not the record's time. The header ends after
    a time of day that opens the line (that is its stamp) and, with ``prose``, where
    the message visibly begins: at the first word after an upper-case or bracketed
    level (only a bracket group, a number or ``key=value`` sits between a level and a
    later stamp: ``INFO [main] 2024-...``, ``<W> 2024-...``), or after a run of plain
    words outside brackets.
    """
    head = line[:MAX_HEADER_CHARS]
    depth = words = 0
    after_level = False
    for index, token in enumerate(_TOKEN.finditer(head)):
        if index >= MAX_STAMP_TOKENS:
            return
        start = token.start()
        first = -1
        if head[start].isalnum():
            first = start
            yield index, "", start
        for inner in _INNER_START.finditer(head, start + 1, token.end()):
            if first < 0:
                first = inner.start()
            yield index, head[inner.start() - 1], inner.start()
        if index == 0 and first >= 0 and time_of_day_at(head, first):
            return  # the line opens with a time of day: that is its stamp, and it has no date
        if not prose:
            continue
        text = token.group()
        if depth:
            depth = max(0, depth + _balance(text))
            continue
        if text[0] in _GROUP_OPENERS:
            words = 0
            depth = max(0, _balance(text))
            if not after_level and level_of(text, "bracket") is not None:
                after_level = True
        elif after_level:
            if "=" not in text and text.lower() != text.upper():
                return  # a word after the level: a logger, or the message itself
        elif _PROSE_WORD.fullmatch(text):
            words += 1
            if words >= PROSE_WORDS:
                return
        else:
            words = 0
            if text.isupper() and level_of(text, "word", strict=True) is not None:
                after_level = True


def _balance(text: str) -> int:
    """Brackets a token opens minus those it closes: words inside a group are a field."""
    if text.isalnum():
        return 0
    return (text.count("[") + text.count("(") + text.count("{")
            - text.count("]") - text.count(")") - text.count("}"))


def stamp_at(line: str, pos: int, times: TimeResolver, layout: str | None) -> Found | None:
    """A dated timestamp at ``line[pos]`` (of family ``layout`` if given)."""
    if layout in (None, "known"):
        stamp = match_leading(line, pos)
        if stamp is not None and stamp.month is not None:
            ts, rule = times.resolve(stamp)
            if ts is not None:
                return Found(ts, rule, stamp, pos, stamp.end, "known")
        if layout == "known":
            return None
    if not line[pos].isdigit():
        return None
    if layout in (None, "month-day", "short-ymd"):
        found = _short_date(line, pos, times)
        if found is not None and layout in (None, found.layout):
            return found
        if layout is not None:
            return None
    m = _EPOCH.match(line, pos)
    if m is None:
        return None
    seconds = int(m["n"]) / _EPOCH_SCALE[len(m["n"])]
    if not _EPOCH_MIN <= seconds <= _EPOCH_MAX:
        return None
    value = float(m["n"] + ("." + m["frac"] if m["frac"] else ""))
    ts = from_number(value)
    if ts is None:
        return None
    if ts.microsecond == 0:
        ts = finer(line, m.end(), ts)
    return Found(ts, None, None, pos, m.end(), "epoch")


def _short_date(line: str, pos: int, times: TimeResolver) -> Found | None:
    """``MM-DD HH:MM:SS`` (no year: logcat, ``MM/DD``, ``MM.DD``) or ``yy/MM/dd HH:mm:ss``.

    A two-digit year is read in ISO order (Java's ``yy/MM/dd``, ``yy-MM-dd``), in
    2000-2069 or 1970-1999.
    """
    m = _SHORT_DATE.match(line, pos)
    if m is None:
        return None
    if m["c"] is None:
        year, month, day, layout = None, int(m["a"]), int(m["b"]), "month-day"
    else:
        yy = int(m["a"])
        year, month, day = (2000 + yy if yy < 70 else 1900 + yy), int(m["b"]), int(m["c"])
        layout = "short-ymd"
    hour, minute, second = int(m["H"]), int(m["M"]), int(m["S"])
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        return None
    frac = m["frac"] or ""
    micro = int((frac + "000000")[:6]) if frac else 0
    stamp = Stamp(year, month, day, hour, minute, min(second, 59), micro, None, m.end())
    ts, rule = times.resolve(stamp)
    return None if ts is None else Found(ts, rule, stamp, pos, m.end(), layout)


def finer(line: str, pos: int, exact: datetime) -> datetime:
    """An epoch in whole seconds, refined by a later clock in the header with a fraction.

    Some headers state the time twice: an exact Unix time, then a local wall clock
    with more digits. The wall clock lends its fraction only when both agree to the
    second, up to a whole quarter-hour zone offset.
    """
    for _, _, start in candidates(line[:MAX_HEADER_CHARS], prose=False):
        if start < pos or not line[start].isdigit():
            continue
        stamp = match_leading(line, start)
        if stamp is None or stamp.month is None or not stamp.microsecond:
            continue
        if stamp.second == exact.second and stamp.minute % 15 == exact.minute % 15:
            return exact.replace(microsecond=stamp.microsecond)
    return exact


def first_stamp(line: str, times: TimeResolver) -> tuple[StampSpot, Found] | None:
    """The first dated timestamp in the header fields of ``line``, and its spot."""
    for tokens, opener, pos in candidates(line):
        found = stamp_at(line, pos, times, None)
        if found is not None:
            return StampSpot(tokens, opener, found.layout), found
    return None


def find_stamp(line: str, spot: StampSpot, times: TimeResolver) -> Found | None:
    """The timestamp at a learned spot; the sample that agreed on the spot has already
    shown it to be in the header, so only a line opening with a time of day stops."""
    for tokens, opener, pos in candidates(line, prose=False):
        if tokens > spot.tokens_before:
            return None
        if tokens == spot.tokens_before and opener == spot.opener:
            found = stamp_at(line, pos, times, spot.layout)
            if found is not None:
                return found
    return None


# fields of a delimited header; blanks inside a field separate too ("..., Info   CBS  msg")
_FIELDS = {d: re.compile(rf"[^{re.escape(d)}\s]+") for d in _DELIMITERS}
# a [bracket group] (padding allowed: "[WARN ]"), a word with an optional [pid] and
# colon ("sshd[42]:"), or a stray bracket: "][WARN ][x]" reads as "]", "[WARN ]", "[x]"
_WHITESPACE_TOKEN = re.compile(r"\[[^\[\]]{0,64}\]|[^\s\[\]]+(?:\[[^\[\]\s]*\][^\s\[\]]*)?|\S")


def header_tokens(line: str, start: int, end: int | None = None) -> list[tuple[str, int, int]]:
    """Header tokens after ``start``: (text, start, end).

    Whitespace-separated, or the fields of a delimited line when a delimiter follows
    the timestamp (CSV, ``|``-separated): ``2024-...,ERROR,api,...``.
    """
    delimiter = line[start : start + 1]
    pattern = _FIELDS.get(delimiter, _WHITESPACE_TOKEN)
    out: list[tuple[str, int, int]] = []
    stop = min(len(line), start + MAX_HEADER_CHARS, len(line) if end is None else end)
    for m in pattern.finditer(line, start, stop):
        token = m.group()
        if pattern is not _WHITESPACE_TOKEN:
            token = token.strip()
            if not token:
                continue
        out.append((token, m.start(), m.end()))
        if len(out) > MAX_LEVEL_TOKENS:
            break
    return out


def level_of(token: str, shape: str, *, strict: bool = False) -> Level | None:
    if shape == "letter":
        m = _LETTER.match(token)
        return LETTERS[m["w"]] if m is not None else None
    pattern = {"word": _WORD, "bracket": _BRACKETED, "key": _LEVEL_KEY}[shape]
    m = pattern.fullmatch(token) if shape != "key" else pattern.match(token)
    if m is None:
        return None
    word = m["w"]
    if strict and shape == "word" and not word.isupper():
        return None  # one line alone: "error" in prose is not a level, "ERROR" is
    if shape == "bracket" and len(word) == 1:
        return LETTERS.get(word.upper())
    return normalize_level(word)


SHAPES = ("word", "bracket", "key", "letter")


def level_at(
    line: str, spot: LevelSpot, after: list[tuple[str, int, int]], stamp_start: int
) -> tuple[Level, int] | None:
    tokens = header_tokens(line, 0, stamp_start) if spot.before else after
    if spot.index >= len(tokens):
        return None
    token, _, end = tokens[spot.index]
    level = level_of(token, spot.shape)
    return None if level is None else (level, end)
