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
* **where a tag is** (``WindowManager:``, ``sshd[42]:``, ``/usr/sbin/cron[7]:``), used
  as the service; a ``name:`` deep in the line that never changes and has no pid is
  a word of the text (``... Component State Change: ...``), not a tag;
* **fixed columns**: in a space-separated layout with no level and no tag, the
  numeric columns right after the timestamp (a flag, a count) belong to the header,
  and a column before the timestamp whose few values are names is the component.
* **a padded component** right after the level (``Info   CBS    msg``): fixed-width
  layouts pad their columns, so a name followed by two or more blanks is a field.

A spot is learned when a large enough share of the sample agrees; the source is
then parsed with it. The learner only completes what per-record detection left
empty, so a source that already parses is never changed; when the learned layout
stops matching, the source is sampled again. Nothing here raises on any input.
How a line's fields are read is in :mod:`streams.clean.header`.
"""

from __future__ import annotations

import re
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from streams.clean.header import (
    COMPONENT,
    MAX_HEADER_CHARS,
    SHAPES,
    TAG,
    Found,
    LevelSpot,
    StampSpot,
    find_stamp,
    first_stamp,
    header_tokens,
    level_at,
    level_of,
)
from streams.clean.parsed import Parsed
from streams.clean.timestamps import Stamp, TimeResolver

__all__ = ["LevelSpot", "SourceLearner", "StampSpot", "Structure", "apply", "learn"]


@dataclass(frozen=True, slots=True)
class Structure:
    """What a sample of one source's lines agreed on; ``None`` parts were not learned."""

    stamp: StampSpot | None = None
    level: LevelSpot | None = None
    tag: int | None = None  # token index (after the timestamp) of a ``name:`` tag
    component: int | None = None  # token index of a component name next to the level
    dashed: bool = False  # the tag is a name followed by a lone "-" (``chrome.exe - msg``)
    fields_after: int = 0  # numeric columns right after the timestamp (header, not text)
    service_before: int | None = None  # token index, before the timestamp, of the component

    @property
    def empty(self) -> bool:
        return self.stamp is None and self.level is None and self.tag is None


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
    for shape in SHAPES:
        if level_of(token, shape, strict=strict) is not None:
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
    found_in: list[Found | None] = []
    for line in lines:
        first = first_stamp(line, times)
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
    tag_values: dict[int, set[str]] = {}
    tag_pids: Counter[int] = Counter()
    names: Counter[int] = Counter()
    dashes: Counter[int] = Counter()
    after: list[list[tuple[str, int, int]]] = []
    for line, found in zip(lines, found_in, strict=True):
        start = _past_closers(line, found.end) if stamp is not None and found is not None else 0
        tokens = header_tokens(line, start)
        after.append(tokens)
        for i, (token, _, _) in enumerate(tokens):
            if COMPONENT.fullmatch(token):
                names[i] += 1
                if i + 1 < len(tokens) and tokens[i + 1][0] == "-":
                    dashes[i] += 1
            _count_level(token, LevelSpot(i, ""), levels, letters, strict=strict)
            m = TAG.fullmatch(token)
            if m is not None and not token[:-1].isdigit():
                tags[i] += 1
                tag_values.setdefault(i, set()).add(m["tag"])
                if m["pid"] or m["pid2"]:
                    tag_pids[i] += 1
        if start and found is not None:  # "<W> 2024-...", "INFO [main] 2024-..."
            for i, (token, _, _) in enumerate(header_tokens(line, 0, found.start)):
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
    first_free = level.index + 1 if level is not None and not level.before else 0
    for index, count in tags.most_common():
        if _share(count, total) >= min_share and (
            level is None or level.before or index != level.index
        ) and (index <= first_free or tag_pids[index] or len(tag_values[index]) > 1):
            tag = index
            break
    dashed = False
    if tag is None and _share(dashes[first_free], total) >= min_share:
        tag, dashed = first_free, True  # "name - message" (Python logging's "%(name)s - ")
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
    elif (
        level is not None and not level.before and level.shape == "word" and tag is None
        and _share(_padded_names(lines, after, level.index + 1), total) >= min_share
    ):
        component = level.index + 1
    fields_after = 0
    service_before: int | None = None
    if stamp is not None and level is None and tag is None:
        fields_after = _numeric_columns(after, total)
        service_before = _name_column(lines, found_in, stamp.tokens_before)
    return Structure(stamp, level, tag, component, dashed, fields_after, service_before)


_NUMERIC = re.compile(r"-|[-+]?\d+(?:\.\d+)?")
FIXED_COLUMN_SHARE = 0.9  # a column is a field when nearly every line agrees on its shape


def _numeric_columns(after: list[list[tuple[str, int, int]]], total: int) -> int:
    """How many columns right after the timestamp hold a number (or ``-``) in nearly
    every line: a flag or count column of a fixed layout, not the start of the text."""
    count = 0
    while count < MAX_FIELDS_AFTER:
        hits = sum(1 for tokens in after
                   if len(tokens) > count and _NUMERIC.fullmatch(tokens[count][0]))
        if _share(hits, total) < FIXED_COLUMN_SHARE:
            break
        count += 1
    return count


MAX_FIELDS_AFTER = 3


def _name_column(lines: list[str], found_in: list[Found | None], before: int) -> int | None:
    """The first column before the timestamp whose values are names and few (a
    component: ``unix.hw``), not ids or hosts, which take a new value on most lines."""
    if before < 1:
        return None
    columns: list[list[str]] = [[] for _ in range(before)]
    for line, found in zip(lines, found_in, strict=True):
        if found is None:
            continue
        tokens = line[: found.start].split()
        if len(tokens) != before:
            return None
        for i, token in enumerate(tokens):
            columns[i].append(token)
    for i, values in enumerate(columns):
        if len(values) < 2 or not all(COMPONENT.fullmatch(v) for v in values):
            continue
        if len(set(values)) <= max(2, len(values) // 4):
            return i
    return None


def _padded_names(lines: list[str], after: list[list[tuple[str, int, int]]], index: int) -> int:
    """Lines whose token at ``index`` is a name padded by two or more blanks."""
    hits = 0
    for line, tokens in zip(lines, after, strict=True):
        if index < len(tokens):
            token, _, end = tokens[index]
            if COMPONENT.fullmatch(token) and line.startswith("  ", end):
                hits += 1
    return hits


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
        found = find_stamp(line, structure.stamp, times)
        if found is None:
            return False
        start = header_end = _past_closers(line, found.end)
        stamp_start = found.start
        if need_time:
            prefix = line[: found.start].strip(" [(<\"',;|=\t")
            if _set_time(parsed, found, line, header, prefix):
                return True  # the header grammar read the rest of the line
            if prefix:
                skipped.append(prefix)
        if not _needs_spots(structure, parsed):
            _trim_message(parsed, line, header_end, skipped)  # a learned time is header
            return True
    tokens = header_tokens(line, start)
    used: set[int] = set()
    spot = structure.level
    if parsed.level is None and spot is not None:
        found_level = level_at(line, spot, tokens, stamp_start)
        if found_level is not None:
            parsed.level, end = found_level
            if not spot.before:
                used.add(spot.index)
                header_end = max(header_end, end)
    for index in (structure.tag, structure.component):
        if parsed.service is not None or index is None or index >= len(tokens):
            continue
        token, _, end = tokens[index]
        m = TAG.fullmatch(token) if index == structure.tag else COMPONENT.fullmatch(token)
        if structure.dashed and index == structure.tag:
            m = COMPONENT.fullmatch(token)
            if m is None or index + 1 >= len(tokens) or tokens[index + 1][0] != "-":
                continue
            used.add(index + 1)
            end = tokens[index + 1][2]
        if m is None:
            continue
        parsed.service = m["tag"]
        pid = m.groupdict().get("pid") or m.groupdict().get("pid2")
        if pid and "pid" not in parsed.attributes:
            parsed.attributes["pid"] = int(pid)
        used.add(index)
        header_end = max(header_end, end)
    if structure.fields_after and header_end == start and len(tokens) > structure.fields_after:
        numbers = tokens[: structure.fields_after]
        if all(_NUMERIC.fullmatch(t) for t, _, _ in numbers):
            header_end = numbers[-1][2]
    if structure.service_before is not None and parsed.service is None:
        columns = line[:stamp_start].split()
        if len(columns) > structure.service_before:
            m = COMPONENT.fullmatch(columns[structure.service_before])
            if m is not None:
                parsed.service = m["tag"]
    skipped += [t for i, (t, _, end) in enumerate(tokens) if end <= header_end and i not in used]
    _trim_message(parsed, line, header_end, skipped)
    return True


def _past_closers(line: str, pos: int) -> int:
    """Past the brackets that close a timestamp's field (``[10.30 16:49:06] msg``)."""
    while line[pos : pos + 1] in ("]", ")", ">"):
        pos += 1
    return pos


def _needs_spots(structure: Structure, parsed: Parsed) -> bool:
    return (parsed.level is None and structure.level is not None) or structure.fields_after > 0 or (
        parsed.service is None and (structure.tag is not None or structure.component is not None
                                    or structure.service_before is not None)
    )


def _set_time(
    parsed: Parsed, found: Found, line: str, header: HeaderParser | None, prefix: str
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
        structure = state.structure  # read after deciding, which may have set it
        if structure is None:  # until then: what the sample so far agrees on
            sofar = learn(state.sample, self.times, min_share=1.0, strict=True)
            apply(sofar, line, parsed, self.times, header)
            return
        if structure.empty:
            state.since_learned += 1
            if state.since_learned >= self.retry_lines:
                self._reset(state)
            return
        if apply(structure, line, parsed, self.times, header):
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
