"""Learning a source's line structure from a sample of its lines.

Per-record detection knows layouts that announce themselves at the start of a line.
Many sources do not: the time sits after a client address, a pid or an id column,
the year is missing, the level is one letter. As Elastic's text-structure finder
does, :class:`SourceLearner` keeps a small sample of each source's lines (by Kafka
key or file name) and looks for what the lines agree on:

* **where the timestamp is**: the first spot in the first fields (counted in
  whitespace tokens, plus the character that opens it, ``[``, ``,``, ``|`` ...) where
  a date and time parse, in any layout :func:`match_leading` knows, a year-less
  ``MM-DD HH:MM:SS`` or epoch seconds/ms/µs/ns;
* **where the level is**, counted in tokens after the timestamp: a level word in any
  case, bracketed (``[error]``, ``<W>``), ``level=error``, or a one-letter level when
  a whole column holds nothing else;
* **where a tag is** (``WindowManager:``, ``sshd[42]:``), used as the service.

A spot is learned when a large enough share of the sample agrees; the source is
then parsed with it. The learner only completes what per-record detection left
empty, so a source that already parses is never changed; when the learned layout
stops matching, the source is sampled again. Nothing here raises on any input.
"""

from __future__ import annotations

import re
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime

from streams.clean.levels import LETTERS, normalize_level
from streams.clean.parsed import Parsed
from streams.clean.timestamps import Stamp, TimeResolver, from_number, match_leading
from streams.records import Level

__all__ = ["LevelSpot", "SourceLearner", "StampSpot", "Structure", "apply", "learn"]

MAX_HEADER_CHARS = 256  # the header is in the first characters of a line
MAX_STAMP_TOKENS = 12  # the timestamp starts within the first whitespace tokens
MAX_LEVEL_TOKENS = 6  # the level is within these tokens after the timestamp
_DELIMITERS = ",;|\t"
_OPENERS = frozenset("[(<\"'=" + _DELIMITERS)
_EPOCH = re.compile(r"(?P<n>1\d{9}|1\d{12}|1\d{15}|1\d{18})(?:\.(?P<frac>\d{1,9}))?(?![\w.:/-])")
_EPOCH_SCALE = {10: 1.0, 13: 1e3, 16: 1e6, 19: 1e9}
_MONTH_DAY = re.compile(  # 03-17 16:13:38.811 (Android logcat, no year)
    r"(?P<mo>\d{2})-(?P<d>\d{2})[ T](?P<H>\d{2}):(?P<M>\d{2}):(?P<S>\d{2})"
    r"(?:[.,](?P<frac>\d{1,9}))?(?![\d:])"
)
_LEVEL_KEY = re.compile(r"(?:level|lvl|severity|loglevel)=\"?(?P<w>[A-Za-z]+)", re.IGNORECASE)
_BRACKETED = re.compile(r"[\[<(]\s*(?P<w>[A-Za-z]+)\s*[\]>)]:?")
_LETTER = re.compile(r"(?P<w>[VDIWEFA])(?:/|:|$)")
_WORD = re.compile(r"(?P<w>[A-Za-z]+)[:,]?")
_TAG = re.compile(r"(?P<tag>[A-Za-z_][\w.$/\-]{0,63}?)(?:\[(?P<pid>\d+)\]|\((?P<pid2>\d+)\))?:")
_COMPONENT = re.compile(r"(?P<tag>[A-Za-z_][\w.$\-]{0,63})")
_EPOCH_MIN, _EPOCH_MAX = 1e9, 2.2e9  # 2001..2039: a number outside is not a time


@dataclass(frozen=True, slots=True)
class StampSpot:
    """Where a source's timestamp starts and which layout family it has."""

    tokens_before: int  # whitespace-separated tokens before it
    opener: str  # the character just before it ("" at a token start)
    layout: str  # "known" (match_leading), "month-day" or "epoch"


@dataclass(frozen=True, slots=True)
class LevelSpot:
    """Where a source's level is, in tokens after the timestamp (or the line start)."""

    index: int
    shape: str  # "word", "bracket", "key", "letter"
    before: bool = False  # counted from the line start, before the timestamp


@dataclass(frozen=True, slots=True)
class Structure:
    """What a sample of one source's lines agreed on; ``None`` parts were not learned."""

    stamp: StampSpot | None = None
    level: LevelSpot | None = None
    tag: int | None = None  # token index (after the timestamp) of a ``name:`` tag
    component: int | None = None  # token index of a component name just before the level

    @property
    def empty(self) -> bool:
        return self.stamp is None and self.level is None and self.tag is None


@dataclass(slots=True)
class _Found:
    timestamp: datetime | None
    rule: str | None
    stamp: Stamp | None
    start: int
    end: int


def _candidates(line: str) -> Iterator[tuple[int, str, int]]:
    """(tokens before, opener, position) of every place a field may start."""
    tokens = 0
    limit = min(len(line), MAX_HEADER_CHARS)
    prev = " "
    for i in range(limit):
        ch = line[i]
        if ch.isspace():
            if not prev.isspace():
                tokens += 1
                if tokens >= MAX_STAMP_TOKENS:
                    return
        elif ch.isalnum() and (prev.isspace() or prev in _OPENERS):
            yield tokens, "" if prev.isspace() else prev, i
        prev = ch


def _stamp_at(line: str, pos: int, times: TimeResolver, layout: str | None) -> _Found | None:
    """A dated timestamp at ``line[pos]`` (of family ``layout`` if given)."""
    if layout in (None, "known"):
        stamp = match_leading(line, pos)
        if stamp is not None and stamp.month is not None:
            ts, rule = times.resolve(stamp)
            if ts is not None:
                return _Found(ts, rule, stamp, pos, stamp.end)
        if layout == "known":
            return None
    if not line[pos].isdigit():
        return None
    if layout in (None, "month-day"):
        m = _MONTH_DAY.match(line, pos)
        if m is not None:
            frac = m["frac"] or ""
            stamp = Stamp(
                None,
                int(m["mo"]),
                int(m["d"]),
                int(m["H"]),
                int(m["M"]),
                int(m["S"]),
                int((frac + "000000")[:6]) if frac else 0,
                None,
                m.end(),
            )
            if 1 <= stamp.month <= 12 and 1 <= stamp.day <= 31 and stamp.hour < 24:  # type: ignore[operator]
                ts, rule = times.resolve(stamp)
                if ts is not None:
                    return _Found(ts, rule, stamp, pos, m.end())
        if layout == "month-day":
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
        ts = _finer(line, m.end(), ts)
    return _Found(ts, None, None, pos, m.end())


def _finer(line: str, pos: int, exact: datetime) -> datetime:
    """An epoch in whole seconds, refined by a later clock in the header with a fraction.

    Some headers state the time twice: an exact Unix time, then a local wall clock
    with more digits. The wall clock lends its fraction only when both agree to the
    second, up to a whole quarter-hour zone offset.
    """
    for _, _, start in _candidates(line[:MAX_HEADER_CHARS]):
        if start < pos or not line[start].isdigit():
            continue
        stamp = match_leading(line, start)
        if stamp is None or stamp.month is None or not stamp.microsecond:
            continue
        if stamp.second == exact.second and stamp.minute % 15 == exact.minute % 15:
            return exact.replace(microsecond=stamp.microsecond)
    return exact


def _first_stamp(line: str, times: TimeResolver) -> tuple[StampSpot, _Found] | None:
    for tokens, opener, pos in _candidates(line):
        found = _stamp_at(line, pos, times, None)
        if found is not None:
            layout = "epoch" if found.stamp is None else "known"
            if found.stamp is not None and found.stamp.year is None and _MONTH_DAY.match(line, pos):
                layout = "month-day"
            return StampSpot(tokens, opener, layout), found
    return None


def _find_stamp(line: str, spot: StampSpot, times: TimeResolver) -> _Found | None:
    for tokens, opener, pos in _candidates(line):
        if tokens > spot.tokens_before:
            return None
        if tokens == spot.tokens_before and opener == spot.opener:
            found = _stamp_at(line, pos, times, spot.layout)
            if found is not None:
                return found
    return None


_FIELDS = {d: re.compile(rf"[^{re.escape(d)}]+") for d in _DELIMITERS}
# a [bracket group] (padding allowed: "[WARN ]"), a word with an optional [pid] and
# colon ("sshd[42]:"), or a stray bracket: "][WARN ][x]" reads as "]", "[WARN ]", "[x]"
_WHITESPACE_TOKEN = re.compile(r"\[[^\[\]]{0,64}\]|[^\s\[\]]+(?:\[[^\[\]\s]*\][^\s\[\]]*)?|\S")


def _tokens(line: str, start: int, end: int | None = None) -> list[tuple[str, int, int]]:
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


def _level_of(token: str, shape: str, *, strict: bool = False) -> Level | None:
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


_SHAPES = ("word", "bracket", "key", "letter")


def _share(count: int, total: int) -> float:
    return count / total if total else 0.0


def _count_level(
    token: str,
    at: LevelSpot,
    levels: Counter[LevelSpot],
    letters: dict[tuple[int, bool], set[str]],
    *,
    strict: bool,
) -> None:
    for shape in _SHAPES:
        if _level_of(token, shape, strict=strict) is not None:
            levels[LevelSpot(at.index, shape, at.before)] += 1
            if shape == "letter":
                letters.setdefault((at.index, at.before), set()).add(token[0])
            return


def learn(
    lines: list[str], times: TimeResolver, *, min_share: float, strict: bool = False
) -> Structure:
    """The structure at least ``min_share`` of ``lines`` agree on (maybe empty).

    ``strict`` (a sample too small to decide on) trusts only upper-case level words.
    """
    if not lines:
        return Structure()
    total = len(lines)
    stamps: Counter[StampSpot] = Counter()
    found_in: list[_Found | None] = []
    for line in lines:
        first = _first_stamp(line, times)
        found_in.append(first[1] if first else None)
        if first is not None:
            stamps[first[0]] += 1
    stamp: StampSpot | None = None
    if stamps:
        spot, count = stamps.most_common(1)[0]
        if _share(count, total) >= min_share:
            stamp = spot
    levels: Counter[LevelSpot] = Counter()
    letters: dict[tuple[int, bool], set[str]] = {}
    tags: Counter[int] = Counter()
    names: Counter[int] = Counter()
    for line, found in zip(lines, found_in, strict=True):
        start = found.end if stamp is not None and found is not None else 0
        for i, (token, _, _) in enumerate(_tokens(line, start)):
            if _COMPONENT.fullmatch(token):
                names[i] += 1
            _count_level(token, LevelSpot(i, ""), levels, letters, strict=strict)
            if _TAG.fullmatch(token) and not token[:-1].isdigit():
                tags[i] += 1
        if start and found is not None:  # "<W> 2024-...", "INFO [main] 2024-..."
            for i, (token, _, _) in enumerate(_tokens(line, 0, found.start)):
                _count_level(token, LevelSpot(i, "", before=True), levels, letters, strict=strict)
    level: LevelSpot | None = None
    for spot, count in levels.most_common():
        need = 1.0 if spot.shape == "letter" else min_share
        if _share(count, total) < need:
            continue
        seen = letters.get((spot.index, spot.before), set())
        if spot.shape == "letter" and len(seen) < 2 and not seen <= {"I", "D", "V"}:
            continue  # one letter that is not a routine level: a code, not a level
        level = spot
        break
    tag: int | None = None
    for index, count in tags.most_common():
        if _share(count, total) >= min_share and (
            level is None or level.before or index != level.index
        ):
            tag = index
            break
    component: int | None = None  # "... KERNEL INFO msg": a name right before the level
    if (
        level is not None
        and not level.before
        and level.index > 0
        and level.shape == "word"
        and tag is None
        and _share(names[level.index - 1], total) >= min_share
    ):
        component = level.index - 1
    return Structure(stamp, level, tag, component)


HeaderParser = Callable[[str, int, "Stamp | None"], "Parsed | None"]


def apply(
    structure: Structure,
    line: str,
    parsed: Parsed,
    times: TimeResolver,
    header: HeaderParser | None = None,
) -> bool:
    """Fill what ``parsed`` lacks from the learned structure; False if its stamp is absent.

    ``header`` parses the rest of a line after a timestamp the way per-record
    detection would (``pid [thread] LEVEL logger: msg``); it runs when the learned
    timestamp is the first one found in the line.
    """
    need_time = parsed.timestamp is None and structure.stamp is not None
    if not (need_time or _needs_spots(structure, parsed)):
        return True
    start = stamp_start = 0
    header_end = 0
    skipped: list[str] = []
    if structure.stamp is not None:
        found = _find_stamp(line, structure.stamp, times)
        if found is None:
            return False
        start = header_end = found.end
        stamp_start = found.start
        if need_time:
            prefix = line[: found.start].strip(" [(<\"',;|=\t")
            if _set_time(parsed, found, line, header, prefix):
                return True  # the header grammar read the rest of the line
            if prefix:
                skipped.append(prefix)
        if not _needs_spots(structure, parsed):
            return True
    tokens = _tokens(line, start)
    used: set[int] = set()
    spot = structure.level
    if parsed.level is None and spot is not None:
        found_level = _level_at(line, spot, tokens, stamp_start)
        if found_level is not None:
            parsed.level, end = found_level
            if not spot.before:
                used.add(spot.index)
                header_end = max(header_end, end)
    for index in (structure.tag, structure.component):
        if parsed.service is not None or index is None or index >= len(tokens):
            continue
        token, _, end = tokens[index]
        m = _TAG.fullmatch(token) if index == structure.tag else _COMPONENT.fullmatch(token)
        if m is None:
            continue
        parsed.service = m["tag"]
        pid = m.groupdict().get("pid") or m.groupdict().get("pid2")
        if pid and "pid" not in parsed.attributes:
            parsed.attributes["pid"] = int(pid)
        used.add(index)
        header_end = max(header_end, end)
    skipped += [t for i, (t, _, end) in enumerate(tokens) if end <= header_end and i not in used]
    _trim_message(parsed, line, header_end, skipped)
    return True


def _level_at(
    line: str, spot: LevelSpot, after: list[tuple[str, int, int]], stamp_start: int
) -> tuple[Level, int] | None:
    tokens = _tokens(line, 0, stamp_start) if spot.before else after
    if spot.index >= len(tokens):
        return None
    token, _, end = tokens[spot.index]
    level = _level_of(token, spot.shape)
    return None if level is None else (level, end)


def _needs_spots(structure: Structure, parsed: Parsed) -> bool:
    return (parsed.level is None and structure.level is not None) or (
        parsed.service is None and (structure.tag is not None or structure.component is not None)
    )


def _set_time(
    parsed: Parsed, found: _Found, line: str, header: HeaderParser | None, prefix: str
) -> bool:
    """Set the learned timestamp; True if the header grammar also read the rest."""
    parsed.timestamp, parsed.timestamp_rule, parsed.stamp = found.timestamp, found.rule, found.stamp
    rest = header(line, found.end, found.stamp) if header is not None else None
    if rest is None or (rest.level is None and rest.service is None):
        return False
    attributes = {"prefix": prefix} if prefix else {}
    attributes.update(rest.attributes)
    attributes.pop("time_of_day", None)
    parsed.format, parsed.message, parsed.attributes = rest.format, rest.message, attributes
    parsed.level = parsed.level or rest.level
    parsed.service = parsed.service or rest.service
    return True


def _trim_message(parsed: Parsed, line: str, header_end: int, skipped: list[str]) -> None:
    """Start the message after the learned header when per-record parsing began earlier."""
    message = parsed.message
    if not header_end or not line.endswith(message):
        return
    if len(line) - len(message) >= header_end:
        return  # per-record parsing already started the message after the header
    parsed.message = line[header_end:].lstrip(" ]):|,;\t").lstrip()
    header = " ".join(s.strip(" []") for s in skipped if s.strip(" []"))
    if header and "header" not in parsed.attributes:
        parsed.attributes["header"] = header


@dataclass(slots=True)
class _SourceState:
    sample: list[str] = field(default_factory=list)
    structure: Structure | None = None
    misses: int = 0
    since_learned: int = 0


class SourceLearner:
    """Per-source samples and learned structures, for a bounded number of sources (LRU).

    ``early_lines`` lines that all agree on a timestamp and a level decide at once;
    otherwise ``sample_lines`` lines decide by a ``min_share`` majority. A source
    whose learned timestamp is absent from ``relearn_misses`` lines in a row, or
    that learned nothing and has sent ``retry_lines`` more lines, is sampled again.
    """

    def __init__(
        self,
        times: TimeResolver,
        *,
        sample_lines: int = 20,
        early_lines: int = 5,
        min_share: float = 0.6,
        max_sources: int = 1024,
        relearn_misses: int = 20,
        retry_lines: int = 2000,
    ) -> None:
        if not 1 <= early_lines <= sample_lines:
            raise ValueError(
                f"need 1 <= early_lines <= sample_lines, got {early_lines}, {sample_lines}"
            )
        if max_sources < 1:
            raise ValueError(f"max_sources must be >= 1, got {max_sources}")
        self.times = times
        self.sample_lines = sample_lines
        self.early_lines = early_lines
        self.min_share = min_share
        self.max_sources = max_sources
        self.relearn_misses = relearn_misses
        self.retry_lines = retry_lines
        self._states: OrderedDict[str, _SourceState] = OrderedDict()

    def structure(self, source: str) -> Structure | None:
        """What was learned for ``source`` so far (``None``: still sampling)."""
        state = self._states.get(source)
        return state.structure if state is not None else None

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, source: object) -> bool:
        return source in self._states

    def complete(
        self, source: str, line: str, parsed: Parsed, header: HeaderParser | None = None
    ) -> None:
        """Learn from ``line`` (if still sampling) and fill what ``parsed`` lacks."""
        state = self._state(source)
        if state.structure is None:
            state.sample.append(line[:MAX_HEADER_CHARS])
            self._maybe_decide(state)
            if state.structure is None:  # until then: what the sample so far agrees on
                sofar = learn(state.sample, self.times, min_share=1.0, strict=True)
                apply(sofar, line, parsed, self.times, header)
                return
        if state.structure.empty:
            state.since_learned += 1
            if state.since_learned >= self.retry_lines:
                self._reset(state)
            return
        if apply(state.structure, line, parsed, self.times, header):
            state.misses = 0
            return
        state.misses += 1
        if state.misses >= self.relearn_misses:
            self._reset(state)

    def _state(self, source: str) -> _SourceState:
        state = self._states.get(source)
        if state is None:
            state = self._states[source] = _SourceState()
            if len(self._states) > self.max_sources:
                self._states.popitem(last=False)
        else:
            self._states.move_to_end(source)
        return state

    def _maybe_decide(self, state: _SourceState) -> None:
        n = len(state.sample)
        if n < self.early_lines:
            return
        if n < self.sample_lines:
            early = learn(state.sample, self.times, min_share=1.0)
            if early.stamp is None or early.level is None:
                return
            structure = early
        else:
            structure = learn(state.sample, self.times, min_share=self.min_share)
        state.structure = structure
        state.sample.clear()
        state.misses = state.since_learned = 0

    @staticmethod
    def _reset(state: _SourceState) -> None:
        state.structure = None
        state.sample.clear()
        state.misses = state.since_learned = 0
