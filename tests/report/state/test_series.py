"""The report's series: a service past MAX_SERIES templates keeps every record."""

from __future__ import annotations

from streams.report.state.model import OTHER_TEMPLATES, Series
from streams.report.state.series import MAX_SERIES, add_series

MINUTE = "2026-01-02T03:04"


def _records(table: dict[str, dict[str, Series]]) -> int:
    return sum(n for templates in table.values() for s in templates.values()
               for n in s.minutes.values())


def test_a_full_services_bucket_keeps_its_records_when_it_outranks_a_template() -> None:
    """The bucket of earlier merges (50 records) ranks among the busiest templates: a
    new rare template pushes the service past the cap again, and the bucket must hold
    its 50 records and the least busy template's, not only the latter."""
    busy = {f"busy {i:03d}": Series(minutes={MINUTE: 10}) for i in range(MAX_SERIES - 1)}
    base = {"svc": {**busy, OTHER_TEMPLATES: Series(minutes={MINUTE: 50}, named={"db": 2})}}
    new = {"svc": {"rare line": Series(minutes={MINUTE: 1}, named={"db": 1})}}
    out = add_series(base, new)
    assert len(out["svc"]) == MAX_SERIES
    assert _records(out) == _records(base) + _records(new)
    assert out["svc"][OTHER_TEMPLATES].minutes == {MINUTE: 51}
    assert out["svc"][OTHER_TEMPLATES].named == {"db": 3}


def test_merging_in_pieces_keeps_every_minutes_records() -> None:
    """A compactor adds a day's series a few fragments at a time: past the cap, the
    per-minute records of the service are those of one merge of everything."""
    tables = [{"svc": {f"line {i:03d} of {k}": Series(minutes={MINUTE: 1 + i % 7})
                       for i in range(60)}} for k in range(8)]
    once = add_series(*tables)
    piecewise: dict[str, dict[str, Series]] = {}
    for table in tables:
        piecewise = add_series(piecewise, table)
    assert len(piecewise["svc"]) == MAX_SERIES
    assert _records(piecewise) == _records(once) == _records({"t": {
        t: s for table in tables for t, s in table["svc"].items()}})
