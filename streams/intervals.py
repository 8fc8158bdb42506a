"""Sets of Kafka offsets stored as sorted, merged, inclusive ranges.

Reports, fragments and the audit all speak about "which raw records are covered";
a partition's offsets compress to a few ranges, and overlap checks stay cheap.

Keys are ``"topic/partition"`` (values: raw offsets, one log record per message) or,
for a message that carries N > 1 log records (an OTLP batch),
``"topic/partition@offset:N"`` (values: record indices 0..N-1). A single-record
message therefore keeps today's compact offset ranges, a multi-record message costs
one key with (usually) one range, and every ledger counts log records. The audit
(``streams/report/ops/audit.py``) treats such a message as complete when its indices
0..N-1 are covered exactly once.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from itertools import groupby
from operator import itemgetter

Range = tuple[int, int]  # inclusive [first, last]
_MESSAGE_KEY = re.compile(r"^(?P<part>.+/\d+)@(?P<offset>\d+):(?P<count>\d+)$")


def message_key(topic: str, partition: int, offset: int, count: int) -> str:
    """The coverage key of a message carrying ``count`` log records (indices as values)."""
    return f"{topic}/{partition}@{offset}:{count}"


def split_message_key(key: str) -> tuple[str, int, int] | None:
    """("topic/partition", offset, count) of a multi-record message's key, else None."""
    m = _MESSAGE_KEY.match(key)
    if m is None:
        return None
    return m["part"], int(m["offset"]), int(m["count"])


class IntervalSet:
    """An immutable-by-convention set of ints kept as merged inclusive ranges.

    A report's ledger holds many ranges and a fragment few: the operations locate the
    few with bisection instead of walking the many, so merging a fragment costs about
    the same whether the report holds a hundred records or a million.
    """

    __slots__ = ("_ends", "_ranges")

    def __init__(self, ranges: Iterable[Iterable[int]] = ()) -> None:
        self._ranges: list[Range] = _normalize((int(a), int(b)) for a, b in ranges)
        self._ends: list[int] | None = None

    @classmethod
    def _of(cls, ranges: list[Range]) -> IntervalSet:
        """Trusted constructor: ``ranges`` are already sorted, merged and valid."""
        out = cls.__new__(cls)
        out._ranges = ranges
        out._ends = None
        return out

    def _end_offsets(self) -> list[int]:
        if self._ends is None:
            self._ends = [b for _, b in self._ranges]
        return self._ends

    @classmethod
    def from_values(cls, values: Iterable[int]) -> IntervalSet:
        return cls._of(_runs(set(map(int, values))))

    @property
    def ranges(self) -> list[Range]:
        return list(self._ranges)

    def to_json(self) -> list[list[int]]:
        return list(map(list, self._ranges))

    def __len__(self) -> int:
        return sum(b - a + 1 for a, b in self._ranges)

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def __iter__(self) -> Iterator[int]:
        for a, b in self._ranges:
            yield from range(a, b + 1)

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        return any(a <= value <= b for a, b in self._ranges)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IntervalSet) and self._ranges == other._ranges

    def __hash__(self) -> int:
        return hash(tuple(self._ranges))

    def __repr__(self) -> str:
        return f"IntervalSet({self._ranges!r})"

    def union(self, other: IntervalSet) -> IntervalSet:
        small, large = sorted((self, other), key=lambda s: len(s._ranges))
        if not small._ranges:
            return large
        if len(small._ranges) * 8 > len(large._ranges):
            return IntervalSet._of(_normalize(self._ranges + other._ranges))
        out = list(large._ranges)
        for a, b in reversed(small._ranges):  # from the end: earlier indices stay valid
            _insert(out, a, b)
        return IntervalSet._of(out)

    def intersection(self, other: IntervalSet) -> IntervalSet:
        small, large = sorted((self, other), key=lambda s: len(s._ranges))
        b = large._ranges
        ends = large._end_offsets()
        out: list[Range] = []
        for lo, hi in small._ranges:
            k = bisect_left(ends, lo)  # the first range of ``large`` ending at or after lo
            while k < len(b) and b[k][0] <= hi:
                out.append((max(lo, b[k][0]), min(hi, b[k][1])))
                k += 1
        return IntervalSet._of(out)

    def difference(self, other: IntervalSet) -> IntervalSet:
        out: list[Range] = []
        b = other._ranges
        if not b:
            return self
        ends = other._end_offsets()
        for lo, hi in self._ranges:
            cur = lo
            k = bisect_left(ends, cur)  # the first range of ``other`` ending at or after lo
            while k < len(b) and b[k][0] <= hi:
                if b[k][0] > cur:
                    out.append((cur, b[k][0] - 1))
                cur = max(cur, b[k][1] + 1)
                k += 1
            if cur <= hi:
                out.append((cur, hi))
        return IntervalSet._of(out)


def _insert(ranges: list[Range], a: int, b: int) -> None:
    """Add [a, b] to sorted, merged ``ranges`` in place, merging the neighbours it
    touches; only those are looked at."""
    if a > b:
        raise ValueError(f"range start {a} is after its end {b}")
    lo = bisect_left(ranges, (a,))
    if lo > 0 and ranges[lo - 1][1] + 1 >= a:  # the range before touches [a, b]
        lo -= 1
    hi = lo
    while hi < len(ranges) and ranges[hi][0] <= b + 1:
        hi += 1
    if hi > lo:
        a, b = min(a, ranges[lo][0]), max(b, ranges[hi - 1][1])
    ranges[lo:hi] = [(a, b)]


def _runs(values: set[int]) -> list[Range]:
    """The merged ranges of a set of ints, found by set operations in C rather than a
    Python step per value: a run starts at a value whose predecessor is missing and
    ends at one whose successor is missing."""
    if len(values) < 2:
        return [(v, v) for v in values]
    starts = sorted(values.difference(map((1).__add__, values)))
    ends = sorted(values.difference(map((-1).__add__, values)))
    return list(zip(starts, ends, strict=True))


def _normalize(ranges: Iterable[Range]) -> list[Range]:
    merged: list[Range] = []
    for a, b in sorted(ranges):
        if a > b:
            raise ValueError(f"range start {a} is after its end {b}")
        if merged and a <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


_KEY = itemgetter(0)
_VALUE = itemgetter(1)


class Coverage:
    """Covered raw records per stream partition, keyed ``"topic/partition"``."""

    __slots__ = ("_parts",)

    def __init__(self, parts: dict[str, IntervalSet] | None = None) -> None:
        self._parts: dict[str, IntervalSet] = {k: v for k, v in (parts or {}).items() if v}

    @classmethod
    def from_json(cls, data: dict[str, list[list[int]]]) -> Coverage:
        return cls({k: IntervalSet(v) for k, v in data.items()})

    @classmethod
    def from_coords(cls, coords: Iterable[tuple[str, int, int]]) -> Coverage:
        buckets: dict[str, list[int]] = {}
        for topic, partition, offset in coords:
            buckets.setdefault(f"{topic}/{partition}", []).append(offset)
        return cls({k: IntervalSet.from_values(v) for k, v in buckets.items()})

    @classmethod
    def from_entries(cls, entries: Iterable[tuple[str, int]]) -> Coverage:
        """From (key, value) ledger entries, e.g. ``RawCoord.ledger_entry()``."""
        given: Sequence[tuple[str, int]] = (
            entries if isinstance(entries, list | tuple) else list(entries))
        keys = set(map(_KEY, given))
        if len(keys) == 1:  # one partition, the common case: no grouping needed
            return cls({keys.pop(): IntervalSet.from_values(map(_VALUE, given))})
        # grouped in C: the sort brings each key's entries together
        return cls({key: IntervalSet.from_values(map(_VALUE, group))
                    for key, group in groupby(sorted(given, key=_KEY), _KEY)})

    def to_json(self) -> dict[str, list[list[int]]]:
        return {k: self._parts[k].to_json() for k in sorted(self._parts)}

    def parts(self) -> dict[str, IntervalSet]:
        return dict(self._parts)

    def __len__(self) -> int:
        return sum(len(v) for v in self._parts.values())

    def __bool__(self) -> bool:
        return bool(self._parts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Coverage) and self._parts == other._parts

    def __repr__(self) -> str:
        return f"Coverage({self.to_json()!r})"

    def _combine(self, other: Coverage, op: str) -> Coverage:
        keys = set(self._parts) | set(other._parts)
        empty = IntervalSet()
        return Coverage(
            {
                k: getattr(self._parts.get(k, empty), op)(other._parts.get(k, empty))
                for k in keys
            }
        )

    def union(self, other: Coverage) -> Coverage:
        return self._combine(other, "union")

    def intersection(self, other: Coverage) -> Coverage:
        return self._combine(other, "intersection")

    def difference(self, other: Coverage) -> Coverage:
        return self._combine(other, "difference")
