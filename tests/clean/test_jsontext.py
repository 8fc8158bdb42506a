"""JSON decoding of the clean stage: pydantic-core where it can, json.loads's result always."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_core import from_json

from streams.clean import jsontext
from streams.clean.jsontext import loads, loads_utf8

SHIPPERS = Path(__file__).resolve().parents[1] / "fixtures" / "shippers"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(),  # NaN: json.dumps writes it
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down; floats to the bit (NaN, -0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return a == b


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_any_value_decodes_as_json_loads_does(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert same(loads(text), json.loads(text))
    assert same(loads_utf8(text.encode("utf-8", "surrogatepass")), json.loads(text))


@pytest.mark.parametrize("path", sorted(SHIPPERS.glob("*.jsonl")), ids=lambda p: p.name)
def test_shipper_envelopes_decode_as_json_loads_does(path: Path) -> None:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            assert same(loads_utf8(line.encode()), json.loads(line))


def test_nesting_deeper_than_pydantic_core_goes_is_read_by_json_loads() -> None:
    text = '{"a": ' * 300 + "1" + "}" * 300
    with pytest.raises(ValueError):
        from_json(text)
    assert same(loads(text), json.loads(text))
    assert same(loads_utf8(text.encode()), json.loads(text))


@pytest.mark.parametrize(("text", "expected"), [
    ('{"s": "\\ud800 alone"}', {"s": "\ufffd alone"}),
    ('{"\\udfff": ["x\\udbff", {"k": "\\ud800"}]}', {"\ufffd": ["x\ufffd", {"k": "\ufffd"}]}),
    ('{"pair": "\\ud83d\\ude00", "lone": "\\ud83d"}', {"pair": "\U0001f600", "lone": "\ufffd"}),
    ('"\\ud800"', "\ufffd"),
])
def test_an_escaped_lone_surrogate_is_read_as_the_replacement_character(
        text: str, expected: Any) -> None:
    """It is no text: UTF-8 cannot hold it, so the record could not be written on."""
    with pytest.raises(ValueError):
        from_json(text)
    assert loads(text) == expected
    assert loads_utf8(text.encode()) == expected


def test_surrogate_bytes_are_read_as_the_replacement_character() -> None:
    data = '{"msg": "a \ud83d b"}'.encode("utf-8", "surrogatepass")  # CESU-style bytes
    assert loads_utf8(data) == {"msg": "a \ufffd b"}


def test_a_lone_surrogate_nine_hundred_levels_deep_is_replaced_without_recursion() -> None:
    depth = 450  # an object and a list a level: json.loads stops near the recursion limit
    text = '{"a": [' * depth + '"\\ud800"' + "]}" * depth
    value = loads(text)
    for _ in range(depth):
        value = value["a"][0]
    assert value == "\ufffd"


@pytest.mark.parametrize("text", ['{"a": 1', '{"a": 1} x', "", "{'a': 1}"])
def test_bad_json_raises_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        loads(text)
    with pytest.raises(ValueError):
        loads_utf8(text.encode())


def test_a_plain_line_never_reaches_json_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("json.loads was called")

    monkeypatch.setattr(jsontext.json, "loads", refuse)
    line = '{"ts": "2026-01-02T03:04:05.678Z", "level": "info", "msg": "GET /a 200", "n": 3}'
    assert loads(line)["n"] == 3
    assert loads_utf8(line.encode())["msg"] == "GET /a 200"
