"""A record's report id: its own UTC time bucket and its group, one path segment each."""

from __future__ import annotations

import pytest

from streams.records import NormalizedRecord
from streams.report.state.keys import previous_window, record_place

from helpers import make_record


def record(*, timestamp: str | None = "2026-11-29T13:45:00Z", service: str | None = "hdfs",
           source: str = "app.log") -> NormalizedRecord:
    return make_record(0, service=service).model_copy(
        update={"timestamp": timestamp, "source": source})


@pytest.mark.parametrize(
    ("stamp", "window", "group_by", "expected"),
    [
        ("2026-11-29T13:45:00Z", "day", "all", "2026-11-29/all"),
        ("2026-11-29T13:45:00Z", "hour", "service", "2026-11-29T13/hdfs"),
        ("2026-11-29T13:45:00Z", "week", "all", "2026-W48/all"),  # a Sunday ends its week
        ("2026-11-30T00:00:00Z", "week", "all", "2026-W49/all"),  # a Monday starts one
        ("2027-01-01T08:00:00Z", "week", "service", "2026-W53/hdfs"),  # ISO year, not 2027
        ("2029-12-31T08:00:00Z", "week", "all", "2030-W01/all"),  # ISO year, not 2029
        ("2026-11-29T23:30:00-02:00", "day", "all", "2026-11-30/all"),  # converted to UTC
        ("2026-11-30T00:30:00+01:00", "hour", "all", "2026-11-29T23/all"),  # ... back a day
        ("2026-11-29T23:30:00", "hour", "all", "2026-11-29T23/all"),  # naive means UTC
        (None, "day", "all", "undated/all"),
        ("", "week", "all", "undated/all"),
        ("not a time", "day", "service", "undated/hdfs"),
    ],
)
def test_the_bucket_is_the_records_own_utc_time(stamp, window, group_by, expected) -> None:
    assert record_place(record(timestamp=stamp), window=window, group_by=group_by) == expected


def test_the_group_is_the_service_the_source_or_all_with_slashes_and_spaces_cleaned() -> None:
    named = record(timestamp="2026-11-28T23:59:00Z", service="a/b c", source="HDFS_2k.log")
    assert record_place(named, window="day", group_by="service") == "2026-11-28/a_b_c"
    assert record_place(named, window="day", group_by="source") == "2026-11-28/HDFS_2k.log"
    assert record_place(named, window="day", group_by="all") == "2026-11-28/all"
    # a record that names no service speaks for its source
    unnamed = record(timestamp="2026-11-28T23:59:00Z", service=None, source=" k8s/pod  a\t")
    assert record_place(unnamed, window="day", group_by="service") == "2026-11-28/k8s_pod_a"
    assert record_place(unnamed, window="day", group_by="source") == "2026-11-28/k8s_pod_a"
    blank = record(service=None, source="  ")
    assert record_place(blank, window="day", group_by="source") == "2026-11-29/unknown"


def test_an_unknown_window_or_grouping_raises() -> None:
    with pytest.raises(ValueError, match="window"):
        record_place(record(), window="month", group_by="all")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group_by"):
        record_place(record(), window="day", group_by="host")  # type: ignore[arg-type]


def test_the_window_before_is_the_latest_earlier_one_of_the_same_group_and_size() -> None:
    ids = ["2026-11-27/all", "2026-11-28/all", "2026-11-28/api", "2026-11-28T23/all",
           "2026-W48/all", "undated/all", "2026-11-29/all#1"]
    assert previous_window("2026-11-29/all", ids) == "2026-11-28/all"
    assert previous_window("2026-11-29/all#0", ids) == "2026-11-28/all"
    assert previous_window("2026-11-29/api", ids) == "2026-11-28/api"
    assert previous_window("2026-11-29T00/all", ids) == "2026-11-28T23/all"
    assert previous_window("2026-11-27/all", ids) is None
    assert previous_window("undated/all", ids) is None
