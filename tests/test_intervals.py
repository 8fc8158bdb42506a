"""Interval sets agree with plain Python sets, whatever the sizes of the operands."""

from __future__ import annotations

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
