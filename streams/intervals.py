"""Sets of Kafka offsets stored as sorted, merged, inclusive ranges.

Reports, fragments and the audit all speak about "which raw records are covered";
a partition's offsets compress to a few ranges, and overlap checks stay cheap.

Keys are ``"topic/partition"`` (values: raw offsets, one log record per message) or,
for a message that carries N > 1 log records (an OTLP batch),
``"topic/partition@offset:N"`` (values: record indices 0..N-1). A single-record
message therefore keeps today's compact offset ranges, a multi-record message costs
one key with (usually) one range, and every ledger counts log records. The audit
(``streams/dev/audit.py``) treats such a message as complete when its indices
0..N-1 are covered exactly once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

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
    """An immutable-by-convention set of ints kept as merged inclusive ranges."""

    __slots__ = ("_ranges",)

    def __init__(self, ranges: Iterable[Iterable[int]] = ()) -> None:
        self._ranges: list[Range] = _normalize((int(a), int(b)) for a, b in ranges)

    @classmethod
    def from_values(cls, values: Iterable[int]) -> IntervalSet:
        return cls((v, v) for v in values)

    @property
    def ranges(self) -> list[Range]:
        return list(self._ranges)

    def to_json(self) -> list[list[int]]:
        return [[a, b] for a, b in self._ranges]

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
        return IntervalSet(self._ranges + other._ranges)

    def intersection(self, other: IntervalSet) -> IntervalSet:
        out: list[Range] = []
        i = j = 0
        a, b = self._ranges, other._ranges
        while i < len(a) and j < len(b):
            lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
            if lo <= hi:
                out.append((lo, hi))
            if a[i][1] < b[j][1]:
                i += 1
            else:
                j += 1
        return IntervalSet(out)

    def difference(self, other: IntervalSet) -> IntervalSet:
        out: list[Range] = []
        b = other._ranges
        j = 0
        for lo, hi in self._ranges:
            cur = lo
            while j < len(b) and b[j][1] < cur:
                j += 1
            k = j
            while k < len(b) and b[k][0] <= hi:
                if b[k][0] > cur:
                    out.append((cur, b[k][0] - 1))
                cur = max(cur, b[k][1] + 1)
                k += 1
            if cur <= hi:
                out.append((cur, hi))
        return IntervalSet(out)


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
        buckets: dict[str, list[int]] = {}
        for key, value in entries:
            buckets.setdefault(key, []).append(value)
        return cls({k: IntervalSet.from_values(v) for k, v in buckets.items()})

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
