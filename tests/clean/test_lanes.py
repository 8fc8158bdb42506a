"""The lane cost score, on hand-computed examples, and the lane it picks."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.clean.lanes import DEFAULT_SLOW_THRESHOLD, choose_lane, cost_score, special_chars


def test_empty() -> None:
    assert cost_score("") == 0.0


def test_plain_words_cost_only_their_length() -> None:
    # 11 characters, no brackets, no specials: 11/1000
    assert cost_score("hello world") == pytest.approx(0.011)


def test_hand_computed_json() -> None:
    text = '{"a": [1, 2]}'
    # len 13 -> 0.013; one '{' and one '[' -> 2*0.5 = 1.0
    # specials: { " " : [ , ] } -> 8 -> 8/100*0.3 = 0.024
    assert special_chars(text) == 8
    assert cost_score(text) == pytest.approx(0.013 + 1.0 + 0.024)


def test_closing_brackets_do_not_count_as_depth() -> None:
    # '}' and ']' are specials only: 4 chars, 4 specials
    assert cost_score("}]}]") == pytest.approx(4 / 1000 + 4 / 100 * 0.3)


def test_underscore_is_a_word_character_as_in_the_original() -> None:
    # re's [^\w\s]: '_' is a word character, so blk_123 has no special character
    assert special_chars("blk_-123") == 1  # only '-'
    assert cost_score("a_b") == pytest.approx(3 / 1000)


def test_non_ascii_letters_are_not_special_but_punctuation_is() -> None:
    assert special_chars("连接被拒绝") == 0
    assert special_chars("错误\uff1a连接") == 1  # the full-width colon
    assert cost_score("连接被拒绝") == pytest.approx(5 / 1000)  # characters, not bytes


def test_a_nested_stack_of_json_reaches_the_slow_lane() -> None:
    doc = json.dumps({"a": [{"b": [1, {"c": []}]} for _ in range(3)]})
    score = cost_score(doc)
    opening = doc.count("{") + doc.count("[")
    assert opening == 2 + 3 * 4  # outer {, [ and per item {, [, {, []
    assert score >= opening * 0.5
    assert choose_lane(score, DEFAULT_SLOW_THRESHOLD) == "slow"


@given(st.text())
def test_matches_the_reference_code(text: str) -> None:
    # the formula written out with the regex alone, so the ASCII fast path must match it
    length_score = len(text) / 1000
    depth_score = text.count("{") + text.count("[")
    special_score = len(re.findall(r"[^\w\s]", text)) / 100
    expected = length_score + depth_score * 0.5 + special_score * 0.3
    assert cost_score(text) == expected


def test_lane_threshold_is_inclusive() -> None:
    assert choose_lane(4.999, 5.0) == "fast"
    assert choose_lane(5.0, 5.0) == "slow"
    assert choose_lane(7.5, 5.0) == "slow"
    assert choose_lane(0.0, 0.0) == "slow"
    assert choose_lane(1.0) == "fast"  # default threshold: the formula's 5.0
    assert DEFAULT_SLOW_THRESHOLD == 5.0


@given(st.text(max_size=200))
def test_special_chars_counts_what_the_regex_counts_for_any_text(text: str) -> None:
    assert special_chars(text) == len(re.findall(r"[^\w\s]", text))
