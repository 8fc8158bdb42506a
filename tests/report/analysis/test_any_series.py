"""Whatever a report holds, the walk over it finishes, and every origin it names is a
service of the report: drawn series, with empty minutes, lines no template took, odd
levels and message words taken for callees."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.report.analysis.departures import find_departures
from streams.report.analysis.incidents import find_incidents, find_unjudged
from streams.report.state.model import OTHER_TEMPLATES, Series

MINUTES = [f"2026-11-29T10:{m:02d}" for m in range(40)]
SERVICES = ("api", "db", "ts-cart-service", "batch")
# what failures may name: services, a word of a message, a logger class
NAMES = (*SERVICES, "cartservice", "for", "com.shop.DbClient")

series_st = st.builds(
    Series,
    level=st.sampled_from([None, "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "NOTICE"]),
    minutes=st.dictionaries(st.sampled_from(MINUTES), st.integers(0, 400), max_size=40),
    named=st.dictionaries(st.sampled_from(NAMES), st.integers(0, 50), max_size=3),
)
report_st = st.dictionaries(
    st.sampled_from(SERVICES),
    st.dictionaries(st.sampled_from([OTHER_TEMPLATES, "ok", "done", "failed", "retry"]),
                    series_st, min_size=1, max_size=5),
    max_size=4)
hops_st = st.dictionaries(
    st.sampled_from(SERVICES),
    st.dictionaries(st.sampled_from(MINUTES),
                    st.dictionaries(st.sampled_from([str(b) for b in range(30)]),
                                    st.integers(0, 30), max_size=4), max_size=40),
    max_size=4)
calls_st = st.dictionaries(st.sampled_from(SERVICES),
                           st.dictionaries(st.sampled_from(SERVICES), st.integers(0, 20),
                                           max_size=3), max_size=4)


@settings(max_examples=300, deadline=None)
@given(report_st, hops_st, calls_st)
def test_any_report_is_walked_and_its_origins_are_its_services(
        series: dict[str, dict[str, Series]], hops: dict[str, dict[str, dict[str, int]]],
        calls: dict[str, dict[str, int]]) -> None:
    findings = find_departures(series, hops=hops, calls=calls)
    known = set(series) | set(hops)
    assert {d.service for d in findings.departures} <= known
    incidents = find_incidents(findings) + find_unjudged(findings)
    for incident in incidents:
        assert incident.origin in known
        assert set(incident.callers) <= known
