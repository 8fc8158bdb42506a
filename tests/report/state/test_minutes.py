"""Records per minute: keyed from the records' UTC times, summed and shared exactly."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.records import count_minutes, minute_of
from streams.report.state.minutes import (
    add_minutes,
    add_service_minutes,
    minute_counts,
    parse_minute,
    share_minutes,
)
from streams.report.state.model import TemplateEvidence


@pytest.mark.parametrize(
    ("stamp", "minute"),
    [
        ("2026-01-02T03:04:05.678Z", "2026-01-02T03:04"),
        ("2026-01-02T03:04:59.999999Z", "2026-01-02T03:04"),
        ("2026-01-02T03:05:00Z", "2026-01-02T03:05"),
        ("2026-01-02T01:30:00-02:00", "2026-01-02T03:30"),  # converted to UTC
        ("2026-01-01T00:10:00+01:00", "2025-12-31T23:10"),  # across a year, in UTC
        ("2026-01-02T03:04:05", "2026-01-02T03:04"),  # naive means UTC
        ("0099-01-02T03:04:05Z", "0099-01-02T03:04"),  # fixed width, so keys sort as text
        (None, None),
        ("", None),
        ("yesterday", None),
        ("0001-01-01T00:10:00+01:00", None),  # before year 1 in UTC
    ],
)
def test_a_record_is_counted_in_the_utc_minute_its_time_falls_in(stamp, minute) -> None:
    assert minute_of(stamp) == minute


def test_count_minutes_leaves_out_undated_records_and_sorts() -> None:
    stamps = ["2026-01-02T03:05:00Z", None, "2026-01-02T03:04:01Z", "bad", "2026-01-02T03:04:59Z"]
    counts = count_minutes(stamps)
    assert counts == {"2026-01-02T03:04": 2, "2026-01-02T03:05": 1}
    assert list(counts) == sorted(counts)


times = st.one_of(
    st.none(),
    st.sampled_from(["", "bad", "2026-13-02T03:04:05.678Z", "2026-02-30T03:04:05.678Z",
                     "2026-01-02T03:04:05.678Z\n2026-01-02T03:04:05.678Z",
                     "2026-01-02T03:04:05.678Z\n", "2026-01-02T01:30:00-02:00"]),
    st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2040, 1, 1)).map(
        lambda t: t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(times, max_size=40))
def test_count_minutes_counts_each_time_as_minute_of_does(stamps) -> None:
    expected: dict[str, int] = {}
    for stamp in stamps:
        minute = minute_of(stamp)
        if minute is not None:
            expected[minute] = expected.get(minute, 0) + 1
    counts = count_minutes(iter(stamps))
    assert counts == expected
    assert list(counts) == sorted(counts)


def test_parse_minute_reads_back_the_start_of_the_minute() -> None:
    assert parse_minute("2026-01-02T03:04") == datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    assert parse_minute(minute_of("2026-01-02T03:04:59Z") or "") == parse_minute(
        "2026-01-02T03:04")
    for bad in ("2026-01-02T03:04:05", "2026-01-02", "2026-13-02T03:04", "x"):
        with pytest.raises(ValueError):
            parse_minute(bad)


def test_minute_counts_sum_templates() -> None:
    evidence = [
        TemplateEvidence(template="a", count=3, minutes={"2026-01-02T03:05": 1,
                                                         "2026-01-02T03:04": 2}),
        TemplateEvidence(template="b", count=2, minutes={"2026-01-02T03:05": 1}),
        TemplateEvidence(template="c", count=4),  # undated
    ]
    counts = minute_counts(evidence)
    assert counts == {"2026-01-02T03:04": 2, "2026-01-02T03:05": 2}
    assert list(counts) == sorted(counts)
    assert minute_counts([]) == {}
    assert add_minutes({"a": 1}, {"a": 2, "b": 0}) == {"a": 3}  # no empty minutes


def test_share_minutes_of_a_partial_replay() -> None:
    minutes = {"m1": 2, "m2": 2, "m3": 3, "m4": 3}
    assert share_minutes(minutes, 10, 10) == minutes  # all new: as they are
    assert share_minutes(minutes, 0, 10) == {}
    # 6 of 10 new: quotas 1.2, 1.2, 1.8, 1.8; the two largest remainders get the rest
    assert share_minutes(minutes, 6, 10) == {"m1": 1, "m2": 1, "m3": 2, "m4": 2}
    # 7 of 10 records dated, 5 new: the dated share 3.5 rounds to 4
    assert sum(share_minutes({"m1": 3, "m2": 4}, 5, 10).values()) == 4
    # a total above the count is never added beyond it
    assert sum(share_minutes({"m1": 8}, 5, 5).values()) == 5


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(1, 50), max_size=8), undated=st.integers(0, 20),
       data=st.data())
def test_a_share_totals_the_new_records_exactly_and_never_invents_a_minute(
        counts, undated, data) -> None:
    minutes = {f"2026-01-02T03:{i:02}": n for i, n in enumerate(counts)}
    offered = sum(counts) + undated
    new = data.draw(st.integers(0, offered))
    share = share_minutes(minutes, new, offered)
    total = sum(counts)
    assert set(share) <= set(minutes)
    assert all(0 < n <= minutes[k] for k, n in share.items())
    assert sum(share.values()) <= new
    if offered:
        assert sum(share.values()) == (2 * total * new + offered) // (2 * offered)
    if not undated:
        assert sum(share.values()) == new  # every record dated: exactly the new count
    # largest remainder: no minute is more than one record off its exact share
    for key, n in minutes.items():
        assert abs(share.get(key, 0) - n * new / max(offered, 1)) < 1
    assert list(share) == sorted(share)


def test_service_minutes_add_per_service_in_name_order() -> None:
    summed = add_service_minutes(
        {"payments": {"2026-01-02T03:05": 1}, "checkout": {"2026-01-02T03:05": 2}},
        {"checkout": {"2026-01-02T03:04": 1, "2026-01-02T03:05": 1}, "mailer": {}},
    )
    assert summed == {"checkout": {"2026-01-02T03:04": 1, "2026-01-02T03:05": 3},
                      "payments": {"2026-01-02T03:05": 1}}  # a service without records: none
    assert list(summed) == sorted(summed)
    assert all(list(m) == sorted(m) for m in summed.values())
    assert add_service_minutes() == {}
