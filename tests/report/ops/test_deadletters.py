"""`retro deadletter`: counts per reason and the newest entries, as text and JSON."""

from __future__ import annotations

import base64
import json

from streams.records import DeadLetter, RawCoord
from streams.report.ops.deadletters import Entry, render_json, render_text, summarize

T = 1_764_583_200_000  # 2025-12-01T10:00:00Z in ms


def entry(offset: int, reason: str, *, at: int, partition: int = 0,
          raw: bytes = b"\x00\x01bad", detail: str = "send text logs only") -> Entry:
    coord = RawCoord(topic="retro.logs.raw", partition=partition, offset=offset)
    letter = DeadLetter(id=f"{coord.id}:clean", raw=coord, source="garbage.bin", stage="clean",
                        reason=reason, detail=detail,
                        raw_base64=base64.b64encode(raw).decode())
    return Entry(letter, T + at)


ENTRIES = [
    entry(0, "binary", at=0),
    entry(1, "undecodable", at=1000),
    entry(2, "binary", at=2000, partition=1),
    entry(3, "too_large", at=3000, raw=b"x" * 70_000,
          detail="record is over the 65536-byte limit;\nraise RETRO_CLEAN__MAX_RECORD_BYTES"),
    entry(4, "binary", at=4000),
]


def test_counts_per_reason_most_frequent_first_and_newest_entries() -> None:
    s = summarize(ENTRIES, topic="retro.deadletter", latest=2)
    assert s.total == 5
    assert list(s.by_reason.items()) == [("binary", 3), ("too_large", 1), ("undecodable", 1)]
    assert [e.letter.raw.offset for e in s.latest] == [4, 3]


def test_a_replayed_dead_letter_counts_once() -> None:
    replay = entry(1, "undecodable", at=9000)  # same id, re-sent after a crash
    s = summarize([*ENTRIES, replay], topic="t", latest=10)
    assert s.total == 5 and s.by_reason["undecodable"] == 1
    assert [e.letter.raw.offset for e in s.latest] == [4, 3, 2, 1, 0]


def test_text_shows_reasons_coordinates_and_one_line_details() -> None:
    text = render_text(summarize(ENTRIES, topic="retro.deadletter", latest=2))
    lines = text.splitlines()
    assert lines[0] == "5 dead letters on retro.deadletter"
    assert "  3  binary" in lines and "  1  too_large" in lines
    assert "latest 2 (newest first):" in lines
    newest = lines[lines.index("latest 2 (newest first):") + 1]
    assert newest.split() == ["2025-12-01T10:00:04Z", "retro.logs.raw/0/4", "clean/binary",
                              "source=garbage.bin"]
    # a multi-line detail stays on one line under its entry
    assert ("      record is over the 65536-byte limit; raise RETRO_CLEAN__MAX_RECORD_BYTES"
            in lines)


def test_text_for_an_empty_topic() -> None:
    assert render_text(summarize([], topic="retro.deadletter")) == (
        "no dead letters on retro.deadletter")


def test_json_has_the_same_facts_and_raw_bytes_only_on_request() -> None:
    s = summarize(ENTRIES, topic="retro.deadletter", latest=1, unreadable=2)
    doc = json.loads(render_json(s))
    assert doc["total"] == 5 and doc["unreadable"] == 2
    assert doc["by_reason"] == {"binary": 3, "too_large": 1, "undecodable": 1}
    assert doc["latest"] == [{
        "written_at": "2025-12-01T10:00:04Z", "raw": "retro.logs.raw/0/4",
        "source": "garbage.bin", "stage": "clean", "reason": "binary",
        "detail": "send text logs only", "raw_bytes": 5}]
    with_raw = json.loads(render_json(s, raw=True))["latest"][0]
    assert base64.b64decode(with_raw["raw_base64"]) == b"\x00\x01bad"


def test_text_never_passes_terminal_controls_from_keys_file_names_or_details() -> None:
    nasty = "\x1b[2J\x1b]0;owned\x07\x9b31m"
    coord = RawCoord(topic=f"logs/{nasty}.log", partition=0, offset=3)
    letter = DeadLetter(id=coord.id, raw=coord, source=f"src{nasty}", stage="produce",
                        reason="too_large", detail=f"line {nasty} too long",
                        raw_base64=base64.b64encode(b"x").decode())
    text = render_text(summarize([Entry(letter, T)], topic="retro.deadletter", latest=5))
    assert not re_controls(text)
    assert "[2J" in text and "too long" in text  # the visible rest stays


def re_controls(text: str) -> list[str]:
    import re

    return re.findall(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", text)
