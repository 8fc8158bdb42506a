"""The answer validator checks what schemas/answer.schema.json says, in the same words."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import jsonschema

from streams.batch.answers import _answer_accepts, _answer_validator

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "answer.schema.json"


def _errors(validator: Any, answer: Any) -> list[tuple[list[Any], str]]:
    found = sorted(validator.iter_errors(answer), key=lambda e: list(e.absolute_path))
    return [(list(e.absolute_path), e.message) for e in found]


def test_inlined_references_report_the_same_errors_as_the_schema_file() -> None:
    reference = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    fragment = {"refs": ["g1"], "service": "api", "event": "Timeouts", "cause": "pool full",
                "suggestion": "raise the pool", "severity": "high"}
    values = [None, 1, True, "", " ", "x" * 600, "x" * 2500, [], ["g1"], [""], ["x" * 70],
              "medium", "unknown", [1], {}]
    rng = random.Random(7)
    for _ in range(2000):
        answer: Any = {"fragments": [copy.deepcopy(fragment) for _ in range(3)]}
        for _ in range(rng.randint(1, 3)):
            item = rng.choice(answer["fragments"])
            key = rng.choice([*fragment, "extra"])
            if rng.random() < 0.2:
                item.pop(key, None)
            else:
                item[key] = rng.choice(values)
        if rng.random() < 0.05:
            answer = rng.choice([{}, {"fragments": 1}, {"fragments": [1, "x"]}, []])
        assert _errors(_answer_validator(), answer) == _errors(reference, answer), answer
    assert _errors(_answer_validator(), {"fragments": [fragment]}) == []


def test_the_quick_check_passes_only_answers_the_schema_accepts() -> None:
    accepts = _answer_accepts()
    assert accepts is not None  # the schema uses only keywords the quick check knows
    fragment = {"refs": ["g1"], "service": "api", "event": "Timeouts", "cause": "pool full",
                "suggestion": "raise the pool", "severity": "high"}
    values = [None, 1, 1.0, True, "", " ", "\t\n", "\u00a0", "x" * 64, "x" * 65, "x" * 201,
              "x" * 500, "x" * 501, "x" * 2001, [], ["g1"], [""], ["x" * 64], ["x" * 65], [1],
              {}, "info", "critical", "unknown", "High", ["high"]]
    rng = random.Random(11)
    for _ in range(5000):
        answer: Any = {"fragments": [copy.deepcopy(fragment) for _ in range(rng.randint(0, 3))]}
        for _ in range(rng.randint(0, 3)):
            if not answer["fragments"]:
                break
            item = rng.choice(answer["fragments"])
            key = rng.choice([*fragment, "extra"])
            if rng.random() < 0.2:
                item.pop(key, None)
            else:
                item[key] = rng.choice(values)
        if rng.random() < 0.05:
            answer = rng.choice([{}, {"fragments": 1}, {"fragments": [1, "x"]}, [], None])
        valid = not _errors(_answer_validator(), answer)
        assert accepts(answer) == valid, answer
