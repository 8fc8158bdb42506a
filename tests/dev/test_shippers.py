"""The shipper harness without shippers: config rendering and the field check."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.dev.shippers import field_errors, render

from helpers import make_record

EXPECTED = {
    "L01": {"timestamp": "2017-03-14T09:26:53.123Z", "level": "ERROR", "service": "billing"},
    "L02": {"timestamp": "2017-03-14T08:27:01.250Z", "level": None, "service": "sshd"},
}


def test_render_fills_every_placeholder_and_refuses_leftovers(tmp_path: Path) -> None:
    template = tmp_path / "t.conf"
    template.write_text('@version: 3.38\nbroker("@BROKER@") topic("@TOPIC@") "@timestamp"\n')
    out = render(template, tmp_path / "out.conf", {"BROKER": "127.0.0.1:9092", "TOPIC": "a.b"})
    # lowercase @words (syslog-ng's @version, Logstash's @timestamp) are config, not slots
    assert out.read_text() == '@version: 3.38\nbroker("127.0.0.1:9092") topic("a.b") "@timestamp"\n'
    with pytest.raises(ValueError, match="TOPIC"):
        render(template, tmp_path / "bad.conf", {"BROKER": "x"})


def _rec(offset: int, marker: str, *, ts: str, level: str | None, service: str):
    record = make_record(offset, message=f"{marker} something", level=level, service=service)
    return record.model_copy(update={"timestamp": ts})


def test_field_check_accepts_the_lines_own_fields() -> None:
    records = [_rec(0, "L01", ts="2017-03-14T09:26:53.123Z", level="ERROR", service="billing"),
               _rec(1, "L02", ts="2017-03-14T09:27:01.25+01:00", level="INFO", service="sshd")]
    assert field_errors(records, EXPECTED) == []  # same instant in another zone; no level asked


def test_field_check_names_read_time_wrong_level_service_and_duplicates() -> None:
    records = [_rec(0, "L01", ts="2026-12-01T12:30:25Z", level="NOTICE", service="app.log"),
               _rec(1, "L01", ts="2017-03-14T09:26:53.123Z", level="ERROR", service="billing")]
    wrong = field_errors(records, EXPECTED)
    assert "L01: 2 records, want 1" in wrong
    assert any(w.startswith("L01 time 2026-12-01T12:30:25Z") for w in wrong)
    assert "L01 level NOTICE, want ERROR" in wrong
    assert "L01 service app.log, want billing" in wrong
    assert "L02: 0 records, want 1" in wrong


def test_field_check_with_service_from_source() -> None:
    record = _rec(0, "L02", ts="2017-03-14T08:27:01.250Z", level=None, service="c.e.Main")
    record = record.model_copy(update={"source": "sshd"})
    assert field_errors([record], {"L02": EXPECTED["L02"]}, service_from_source=True) == []
    assert field_errors([record], {"L02": EXPECTED["L02"]}) == ["L02 service c.e.Main, want sshd"]
