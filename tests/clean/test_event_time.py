"""Event time comes from the line's header, completed by a shipper's envelope; never
from a date the message quotes (streams.clean.header, timestamps, cleaner)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from streams.clean.cleaner import Cleaner
from streams.clean.header import first_stamp
from streams.clean.infer import learn
from streams.clean.timestamps import TimeResolver, match_leading
from streams.records import NormalizedRecord, RawCoord, iso_utc

from helpers import make_cleaner, otlp_logs

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
SHIPPED = datetime(2024, 5, 4, 9, 15, 0, 250000, tzinfo=UTC)  # the shipper's exact time
TIMES = TimeResolver(default_year=None, default_timezone="UTC", clock=lambda: NOW)
BODY_DATES = [
    # the header has a time of day only
    "12:46:51 worker-3 INFO job done, time: Sat May 04 12:46:52 CST 2013",
    "17:26:32.809 INFO  t.s.TravelServiceImpl#372 [getTickets][calculate time: 175  "
    "time: Sat May 04 12:46:52 CST 2013]",
    # no time in the header at all
    "worker-3 INFO job done, time: Sat May 04 12:46:52 CST 2013",
    "INFO t.s.TravelServiceImpl#372 started Sat May 04 12:46:52 CST 2013",
    "worker-3 job finished at 2013-05-04 12:46:52",
]


def make(**overrides: object) -> Cleaner:
    return make_cleaner(NOW, **overrides)


def fluent_bit(line: str, at: datetime = SHIPPED) -> bytes:
    return json.dumps({"date": at.timestamp(), "log": line + "\n",
                       "kubernetes": {"container_name": "worker", "labels": {}}}).encode()


def one(raw: bytes, cleaner: Cleaner | None = None, offset: int = 0) -> NormalizedRecord:
    out = (cleaner or make()).clean(raw, RawCoord(topic="logs", partition=0, offset=offset), "k")
    assert len(out) == 1 and isinstance(out[0], NormalizedRecord), out
    return out[0]


# --- never from the body ---------------------------------------------------------------


@pytest.mark.parametrize("line", BODY_DATES)
def test_a_date_in_the_message_body_is_not_a_header_stamp(line: str) -> None:
    assert first_stamp(line, TIMES) is None
    assert learn([line] * 20, TIMES, min_share=0.6).stamp is None


@pytest.mark.parametrize("line", BODY_DATES)
def test_event_time_never_comes_from_a_body(line: str) -> None:
    # the first lines of a source, while its layout is still being sampled
    cleaner = make()
    for offset in range(3):
        rec = one(line.encode(), cleaner, offset)
        assert rec.timestamp is None or not rec.timestamp.startswith("2013"), rec
    # in an envelope: the shipper's time, never the quoted 2013
    rec = one(fluent_bit(line), make())
    assert rec.timestamp is not None and rec.timestamp.startswith("2024-05-0"), rec


@pytest.mark.parametrize(("line", "expected"), [
    # a level before the stamp: only a bracket group or a number between them
    ("INFO [main] 2026-03-17 16:13:00,123 c.a.Foo - ready", "2026-03-17T16:13:00.123Z"),
    ("<W> 2026-03-17 16:13:00 app: started", "2026-03-17T16:13:00.000Z"),
    # header fields before the stamp: a client address, ids, a plain host name
    ("192.0.2.7 - frank [17/Mar/2026:16:13:00 +0000] GET /", "2026-03-17T16:13:00.000Z"),
    ("[pid: 12|app: 0] {38 vars in 512 bytes} [Tue Mar 17 16:13:00 2026] GET /x",
     "2026-03-17T16:13:00.000Z"),
    ("134681 node-246 unix.hw state_change 1773763980 1 Component State Change",
     "2026-03-17T16:13:00.000Z"),
    ("myhost Mar 17 16:13:00 sshd[42]: accepted", "2026-03-17T16:13:00.000Z"),
])
def test_stamps_deeper_in_the_header_are_still_found(line: str, expected: str) -> None:
    found = first_stamp(line, TIMES)
    assert found is not None and found[1].timestamp is not None
    assert iso_utc(found[1].timestamp) == expected


# --- completed from the envelope -------------------------------------------------------


def test_a_time_of_day_header_takes_its_date_from_the_envelope() -> None:
    rec = one(fluent_bit("15:15:00 worker-3 INFO job done, time: Sat May 04 12:46:52 CST 2013"))
    assert (rec.timestamp, rec.timestamp_rule) == (
        "2024-05-04T09:15:00.000Z", "line,date-from:envelope:date")
    assert "time_of_day" not in rec.attributes


@pytest.mark.parametrize(("wall", "zone"), [
    ("2024-05-04 15:15:00", "+06:00"), ("2024-05-04 04:15:00", "-05:00"),
    ("2024-05-04 15:00:00", "+05:45"), ("2024-05-04 09:15:00", "+00:00"),
    ("2024-05-03 23:15:00", "-10:00"),
])
def test_a_zone_less_header_takes_its_zone_offset_from_the_envelope(wall: str, zone: str) -> None:
    rec = one(fluent_bit(f"{wall},004 INFO [main] c.a.Job - done"))
    assert (rec.timestamp, rec.timestamp_rule) == (
        "2024-05-04T09:15:00.004Z", "line,zone-from:envelope:date")


def test_otlp_time_gives_the_zone_offset() -> None:
    raw = otlp_logs([{"body": "2024-05-04 15:15:00.120 WARN pool exhausted",
                      "time": SHIPPED, "observed": SHIPPED + timedelta(seconds=1)}])
    rec = one(raw)
    assert (rec.timestamp, rec.timestamp_rule) == (
        "2024-05-04T09:15:00.120Z", "line,zone-from:envelope:timeUnixNano")


def test_a_year_less_header_takes_year_and_zone_from_the_envelope() -> None:
    rec = one(fluent_bit("May  4 15:15:00 host app[7]: done"))
    assert (rec.timestamp, rec.timestamp_rule) == (
        "2024-05-04T09:15:00.000Z", "line,year-from:envelope:date,zone-from:envelope:date")


@pytest.mark.parametrize("lag", [timedelta(minutes=6, seconds=3), timedelta(hours=5, minutes=31),
                                 timedelta(seconds=-30), timedelta(days=2)])
def test_a_gap_that_is_no_zone_offset_keeps_the_assumed_zone(lag: timedelta) -> None:
    rec = one(fluent_bit("2024-05-04 09:15:00 INFO [main] c.a.Job - done", SHIPPED + lag))
    assert (rec.timestamp, rec.timestamp_rule) == (
        "2024-05-04T09:15:00.000Z", "line,zone-assumed:UTC")


def test_full_stamps_are_unchanged() -> None:
    # a stated zone wins over the envelope's time, whatever the gap
    rec = one(fluent_bit("2024-05-04T15:15:00+06:00 INFO [main] c.a.Job - done",
                         SHIPPED + timedelta(hours=3)))
    assert (rec.timestamp, rec.timestamp_rule) == ("2024-05-04T09:15:00.000Z", "line")
    # a plain line, no envelope: as before
    plain = one(b"2024-05-04 15:15:00 INFO [main] c.a.Job - done")
    assert (plain.timestamp, plain.timestamp_rule) == (
        "2024-05-04T15:15:00.000Z", "zone-assumed:UTC")
    zoned = one(b"2024-05-04T15:15:00Z INFO [main] c.a.Job - done")
    assert (zoned.timestamp, zoned.timestamp_rule) == ("2024-05-04T15:15:00.000Z", None)


def test_on_envelope_names_what_it_took() -> None:
    stamp = match_leading("2024-05-04 15:15:00")
    assert stamp is not None
    when, taken = TIMES.on_envelope(stamp, SHIPPED) or (None, [])
    assert (when, taken) == (datetime(2024, 5, 4, 9, 15, tzinfo=UTC), ["zone-from"])
    zoned = match_leading("2024-05-04 15:15:00+06:00")
    assert zoned is not None and TIMES.on_envelope(zoned, SHIPPED) is None
    tod = match_leading("15:15:00.500")
    assert tod is not None
    assert TIMES.on_envelope(tod, SHIPPED) == (
        datetime(2024, 5, 4, 9, 15, 0, 500000, tzinfo=UTC), ["date-from"])


def _iso_variants() -> list[str]:
    """Zoned ISO-8601 instants in every spelling the fast path takes, and near misses."""
    import random

    rng = random.Random(7)
    out = []
    for _ in range(3000):
        year = rng.choice([1, 1970, 1999, 2024, 2026, 9999])
        stamp = (f"{year:04d}-{rng.randint(1, 12):02d}-{rng.randint(1, 31):02d}"
                 f"{rng.choice('T ')}{rng.randint(0, 24):02d}:{rng.randint(0, 59):02d}:"
                 f"{rng.randint(0, 60):02d}")
        if rng.random() < 0.7:
            stamp += rng.choice(".,") + "".join(rng.choice("0123456789")
                                                for _ in range(rng.randint(1, 9)))
        hours, minutes = rng.randint(0, 19), rng.choice([0, 15, 30, 45, 61])
        stamp += rng.choice(["Z", f"+{hours:02d}:{minutes:02d}", f"-{hours:02d}{minutes:02d}"])
        out.append(stamp)
    return out


def test_an_exact_iso_instant_reads_as_the_general_path_reads_it() -> None:
    from streams.clean.timestamps import exact_instant

    times = TimeResolver(default_year=None, default_timezone="Europe/Paris")
    taken = 0
    for text in _iso_variants():
        general = match_leading(text)
        slow = times.resolve(general) if general is not None else (None, None)
        fast = exact_instant(text)
        if fast is None:
            continue  # the general path reads it (or refuses it) as before
        taken += 1
        assert general is not None and general.end == len(text), text
        assert (fast[0], fast[1], None) == (general, *slow), text
    assert taken > 1000  # most variants take the fast path
