"""Interval sets agree with plain Python sets, whatever the sizes of the operands."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.intervals import Coverage, IntervalSet

values = st.sets(st.integers(min_value=0, max_value=300), max_size=120)


def _ranges(s: IntervalSet) -> list[tuple[int, int]]:
    return s.ranges


@settings(max_examples=400, deadline=None)
@given(values, values)
def test_operations_match_python_sets(a: set[int], b: set[int]) -> None:
    x, y = IntervalSet.from_values(a), IntervalSet.from_values(b)
    for op, expected in (("union", a | b), ("intersection", a & b), ("difference", a - b)):
        got = getattr(x, op)(y)
        assert set(got) == expected, op
        # results stay normalized: sorted, merged, nothing adjacent
        assert got == IntervalSet.from_values(expected), op
        assert len(got) == len(expected)


def test_a_small_set_against_a_large_ledger() -> None:
    ledger = IntervalSet((n * 10, n * 10 + 4) for n in range(10_000))  # 10k ranges
    fragment = IntervalSet([(50_003, 50_012), (99_990, 100_020)])
    assert fragment.difference(ledger).ranges == [(50_005, 50_009), (99_995, 100_020)]
    assert fragment.intersection(ledger).ranges == [(50_003, 50_004), (50_010, 50_012),
                                                     (99_990, 99_994)]
    grown = ledger.union(fragment)
    assert len(grown) == len(ledger) + 5 + 26
    assert grown.ranges[5_000] == (50_000, 50_014)  # 50000-4, 50003-12, 50010-14 merged
    assert ledger.ranges[5_000] == (50_000, 50_004)  # the operands are untouched


def test_coverage_keeps_partitions_apart() -> None:
    a = Coverage.from_json({"raw/0": [[0, 9]], "raw/1": [[0, 4]]})
    b = Coverage.from_json({"raw/0": [[5, 14]]})
    assert a.union(b).to_json() == {"raw/0": [[0, 14]], "raw/1": [[0, 4]]}
    assert a.difference(b).to_json() == {"raw/0": [[0, 4]], "raw/1": [[0, 4]]}
    assert a.intersection(b).to_json() == {"raw/0": [[5, 9]]}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["raw/0", "raw/1", "raw/0@7:3"]),
                          st.integers(min_value=-5, max_value=60)), max_size=80))
def test_coverage_from_entries_holds_each_entry_once(entries: list[tuple[str, int]]) -> None:
    coverage = Coverage.from_entries(iter(entries))
    expected: dict[str, set[int]] = {}
    for key, value in entries:
        expected.setdefault(key, set()).add(value)
    assert {k: set(v) for k, v in coverage.parts().items()} == expected
    for key, ranges in coverage.to_json().items():  # sorted, merged, nothing adjacent
        assert all(a <= b for a, b in ranges)
        assert all(b + 1 < c for (_, b), (c, _) in pairwise(ranges))
        assert IntervalSet(ranges) == coverage.parts()[key]
