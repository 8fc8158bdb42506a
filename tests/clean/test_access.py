"""HTTP access logs: the time inside brackets, the status class as the level."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from streams.clean.access import status_level
from streams.clean.formats import FormatParser
from streams.records import iso_utc

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def parse(line: str):  # type: ignore[no-untyped-def]
    return FormatParser(default_year=None, default_timezone="UTC", clock=lambda: NOW).parse(line)


@pytest.mark.parametrize(
    ("status", "level"),
    [(200, "INFO"), (302, "INFO"), (404, "WARN"), (499, "WARN"), (503, "ERROR")],
)
def test_status_class_is_the_level(status: int, level: str) -> None:
    assert status_level(status) == level


def test_combined_log_reads_request_status_size_referrer_and_agent() -> None:
    p = parse(
        '192.0.2.7 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 500 2326 '
        '"http://www.example.com/start.html" "Mozilla/4.08 [en] (Win98; I ;Nav)"'
    )
    assert (iso_utc(p.timestamp), p.timestamp_rule, p.level) == (
        "2000-10-10T20:55:36.000Z",
        None,
        "ERROR",
    )
    assert p.attributes == {
        "client": "192.0.2.7",
        "user": "frank",
        "request": "GET /apache_pb.gif HTTP/1.0",
        "status": 500,
        "size": 2326,
        "referrer": "http://www.example.com/start.html",
        "agent": "Mozilla/4.08 [en] (Win98; I ;Nav)",
    }
    assert p.message == '"GET /apache_pb.gif HTTP/1.0" 500 2326'


def test_common_log_with_a_virtual_host_and_no_size() -> None:
    p = parse(
        'www.example.com 2001:db8::1 - - [10/Oct/2000:13:55:36 +0000] "HEAD / HTTP/1.1" 404 -'
    )
    assert (p.level, p.attributes["vhost"], p.attributes["client"]) == (
        "WARN",
        "www.example.com",
        "2001:db8::1",
    )
    assert "size" not in p.attributes and "referrer" not in p.attributes


def test_nginx_extra_fields_are_kept() -> None:
    p = parse('::1 - - [10/Oct/2000:13:55:36 +0000] "GET / HTTP/1.1" 200 12 "-" "curl/8.5.0" 0.004')
    assert (p.level, p.attributes["extra"], p.attributes["agent"]) == (
        "INFO",
        "0.004",
        "curl/8.5.0",
    )


def test_a_line_with_a_leading_time_is_not_taken_for_an_access_log() -> None:
    p = parse('2024-03-01 10:00:00 ERROR proxy: upstream said [x] "GET / HTTP/1.1" 200 5')
    assert (p.level, "status" in p.attributes) == ("ERROR", False)


def test_an_access_line_behind_a_collector_timestamp_keeps_its_own_time() -> None:
    p = parse(
        "2026-03-17T16:13:39.000000001Z 192.0.2.7 - - [17/Mar/2026:16:13:38 +0000] "
        '"POST /pay HTTP/1.1" 502 0 "-" "curl/8.5.0"'
    )
    assert (iso_utc(p.timestamp), p.level, p.attributes["status"]) == (  # type: ignore[arg-type]
        "2026-03-17T16:13:38.000Z",
        "ERROR",
        502,
    )
    assert p.attributes["prefix"] == "2026-03-17T16:13:39.000000001Z"
