"""``iso_utc``: one fixed-width UTC spelling, so the times the clean stage writes sort
as strings and read back as the instants they were."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from streams.records import iso_utc

ZONES = st.integers(min_value=-14 * 60, max_value=14 * 60).map(
    lambda minutes: timezone(timedelta(minutes=minutes)))


@given(st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30),
                    timezones=st.just(UTC) | ZONES))
def test_every_instant_is_spelled_as_its_utc_millisecond(when: datetime) -> None:
    utc = when.astimezone(UTC)
    text = iso_utc(when)
    assert len(text) == 24 and text.endswith("Z")
    assert datetime.fromisoformat(text) == utc.replace(microsecond=utc.microsecond // 1000 * 1000)


def test_years_before_1000_keep_four_digits_and_sort_first() -> None:
    early, late = datetime(999, 5, 6, 7, 8, 9, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)
    assert iso_utc(early) == "0999-05-06T07:08:09.000Z"
    assert sorted([iso_utc(late), iso_utc(early)]) == [iso_utc(early), iso_utc(late)]
