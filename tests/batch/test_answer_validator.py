"""The answer validator checks what schemas/answer.schema.json says, in the same words."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema

from streams.batch.answers import _answer_accepts, _answer_validator

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "answer.schema.json"


def _errors(validator: Any, answer: Any) -> list[tuple[list[Any], str]]:
    found = sorted(validator.iter_errors(answer), key=lambda e: list(e.absolute_path))
    return [(list(e.absolute_path), e.message) for e in found]


FRAGMENT = {"refs": ["g1"], "service": "api", "event": "Timeouts", "cause": "pool full",
            "suggestion": "raise the pool", "severity": "high"}


def _mutated_answers(seed: int, values: list[Any], count: int, *, fragments: tuple[int, int],
                     changes: tuple[int, int], odd: list[Any]) -> Iterator[Any]:
    """Answers of ``fragments`` (min, max) copies of FRAGMENT with ``changes`` (min, max)
    fields dropped or set to one of ``values``; one in twenty replaced by one of ``odd``."""
    rng = random.Random(seed)
    for _ in range(count):
        answer: Any = {"fragments": [copy.deepcopy(FRAGMENT)
                                     for _ in range(rng.randint(*fragments))]}
        for _ in range(rng.randint(*changes)):
            if not answer["fragments"]:
                break
            item = rng.choice(answer["fragments"])
            key = rng.choice([*FRAGMENT, "extra"])
            if rng.random() < 0.2:
                item.pop(key, None)
            else:
                item[key] = rng.choice(values)
        if rng.random() < 0.05:
            answer = rng.choice(odd)
        yield answer


def test_inlined_references_report_the_same_errors_as_the_schema_file() -> None:
    reference = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    values = [None, 1, True, "", " ", "x" * 600, "x" * 2500, [], ["g1"], [""], ["x" * 70],
              "medium", "unknown", [1], {}]
    for answer in _mutated_answers(7, values, 2000, fragments=(3, 3), changes=(1, 3),
                                   odd=[{}, {"fragments": 1}, {"fragments": [1, "x"]}, []]):
        assert _errors(_answer_validator(), answer) == _errors(reference, answer), answer
    assert _errors(_answer_validator(), {"fragments": [FRAGMENT]}) == []


def test_the_quick_check_passes_only_answers_the_schema_accepts() -> None:
    accepts = _answer_accepts()
    assert accepts is not None  # the schema uses only keywords the quick check knows
    values = [None, 1, 1.0, True, "", " ", "\t\n", "\u00a0", "x" * 64, "x" * 65, "x" * 201,
              "x" * 500, "x" * 501, "x" * 2001, [], ["g1"], [""], ["x" * 64], ["x" * 65], [1],
              {}, "info", "critical", "unknown", "High", ["high"]]
    for answer in _mutated_answers(11, values, 5000, fragments=(0, 3), changes=(0, 3),
                                   odd=[{}, {"fragments": 1}, {"fragments": [1, "x"]}, [], None]):
        valid = not _errors(_answer_validator(), answer)
        assert accepts(answer) == valid, answer
