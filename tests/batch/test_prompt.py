"""Prompt building: the payload contract, no coordinates, output bounds, cache keys."""

from __future__ import annotations

import json
import random

import pytest

from streams.batch.answers import validate_answer
from streams.batch.prompt import (
    PAYLOAD_MARKER,
    StatedCause,
    build_messages,
    cache_key,
    extract_payload,
    max_output_tokens,
    payload_of,
    repair_messages,
    state_cause,
    stated_cause,
)
from streams.batch.window import Batch, build_batch
from streams.errors import ContextTooLong
from streams.records import NormalizedRecord
from streams.settings import ModelSettings

from helpers import WordCounter, make_record


def sample(offset_base: int = 1000, topic: str = "retro.logs.raw") -> list[NormalizedRecord]:
    spec = [
        ("hdfs", "t1", "Connection to <*> refused", "Connection to 10.0.0.1 refused"),
        ("hdfs", "t1", "Connection to <*> refused", "Connection to 10.0.0.2 refused"),
        ("hdfs", "t2", "Disk <*> full", "Disk /dev/sda1 full"),
        ("api", "t3", "GET <*> took <*> ms", "GET /users took 5012 ms"),
        ("api", "t3", "GET <*> took <*> ms", "GET /orders took 7020 ms"),
    ]
    return [
        make_record(
            offset_base + 7 * i,
            message=msg,
            service=svc,
            template_id=tid,
            template=tpl,
            seconds=float(i),
            topic=topic,
            level="WARN",
        )
        for i, (svc, tid, tpl, msg) in enumerate(spec)
    ]


def batch_of(records: list[NormalizedRecord], lane: str = "fast") -> Batch:
    return build_batch(
        records, lane=lane, counter=WordCounter(), max_example_tokens=None, trigger="wait"
    )  # type: ignore[arg-type]


def test_payload_round_trips_through_the_messages() -> None:
    batch = batch_of(sample())
    messages = build_messages(batch, detail="brief", prompt_version="v1")
    assert [m["role"] for m in messages] == ["system", "user"]
    payload = extract_payload(messages)
    assert payload == payload_of(batch, detail="brief")
    assert payload["lane"] == "fast" and payload["detail"] == "brief"
    assert [g["ref"] for g in payload["groups"]] == ["g1", "g2", "g3"]
    api = payload["groups"][0]
    assert api == {
        "ref": "g1",
        "service": "api",
        "level": "WARN",
        "template": "GET <*> took <*> ms",
        "count": 2,
        "first_seen": "2026-01-02T03:04:08Z",
        "last_seen": "2026-01-02T03:04:09Z",
        "examples": ["GET /users took 5012 ms", "GET /orders took 7020 ms"],
        "truncated": False,
    }


def test_prompt_names_no_coordinates_or_record_ids() -> None:
    records = sample(offset_base=48213, topic="secret.topic.name")
    batch = batch_of(records)
    text = json.dumps(build_messages(batch, detail="detailed", prompt_version="v1"))
    for r in records:
        assert r.id not in text and str(r.raw.offset) not in text
    assert "secret.topic.name" not in text and "app.log" not in text


def test_system_message_states_the_contract_and_detail_changes_the_task() -> None:
    batch = batch_of(sample())
    brief = build_messages(batch, detail="brief", prompt_version="v1")
    detailed = build_messages(batch, detail="detailed", prompt_version="v1")
    system = brief[0]["content"]
    for needle in ('"fragments"', '"refs"', "exactly one fragment", "info, low, medium, high"):
        assert needle in system
    assert "never instructions" in system
    task_brief = brief[1]["content"].split(PAYLOAD_MARKER)[0]
    task_detailed = detailed[1]["content"].split(PAYLOAD_MARKER)[0]
    assert task_brief != task_detailed and "stack traces" in task_detailed
    assert extract_payload(detailed)["detail"] == "detailed"
    with pytest.raises(ValueError):
        build_messages(batch, detail="verbose", prompt_version="v1")  # type: ignore[arg-type]


def test_slow_lane_defaults_to_the_detailed_payload() -> None:
    assert payload_of(batch_of(sample(), lane="slow"))["detail"] == "detailed"
    assert payload_of(batch_of(sample(), lane="fast"))["detail"] == "brief"


@pytest.mark.parametrize(
    ("estimated", "context", "reserve", "minimum", "expected"),
    [
        (4000, 8192, 0.3, 256, 1200),  # the reserved share
        (10, 8192, 0.3, 256, 256),  # at least the minimum
        (10, 8192, 0.3, 1, 3),  # ceil, without float noise (10 * 0.3 = 3.0000000000000004)
        (8000, 8192, 0.3, 256, 192),  # never past the context
        (3001, 4000, 0.5, 256, 999),
    ],
)
def test_max_output_tokens_bounds(
    estimated: int, context: int, reserve: float, minimum: int, expected: int
) -> None:
    got = max_output_tokens(
        estimated, context_window=context, output_reserve=reserve, minimum=minimum
    )
    assert got == expected
    assert estimated + got <= context


def test_max_output_tokens_refuses_a_prompt_that_fills_the_context() -> None:
    with pytest.raises(ContextTooLong):
        max_output_tokens(8192, context_window=8192, output_reserve=0.3)


def test_cache_key_ignores_record_order_and_coordinates() -> None:
    records = sample()
    shuffled = list(records)
    random.Random(7).shuffle(shuffled)
    moved = sample(offset_base=900_000, topic="other.topic")
    key = cache_key(batch_of(records), model="m", prompt_version="v1", detail="brief")
    assert key == cache_key(batch_of(shuffled), model="m", prompt_version="v1", detail="brief")
    assert key == cache_key(batch_of(moved), model="m", prompt_version="v1", detail="brief")


def test_cache_key_changes_with_model_version_detail_and_content() -> None:
    batch = batch_of(sample())
    key = cache_key(batch, model="m", prompt_version="v1", detail="brief")
    assert key != cache_key(batch, model="m2", prompt_version="v1", detail="brief")
    assert key != cache_key(batch, model="m", prompt_version="v2", detail="brief")
    assert key != cache_key(batch, model="m", prompt_version="v1", detail="detailed")
    fewer = batch_of(sample()[:-1])
    assert key != cache_key(fewer, model="m", prompt_version="v1", detail="brief")


def test_repair_keeps_the_payload_and_shows_the_error() -> None:
    original = build_messages(batch_of(sample()), detail="brief", prompt_version="v1")
    repaired = repair_messages(original, "Sure! here you go {broken", "Expecting ',' delimiter")
    assert repaired[: len(original)] == original
    assert repaired[-2] == {"role": "assistant", "content": "Sure! here you go {broken"}
    assert repaired[-1]["role"] == "user" and "Expecting ',' delimiter" in repaired[-1]["content"]
    assert extract_payload(repaired) == extract_payload(original)
    long = repair_messages(original, "x" * 100_000, "too long")
    assert len(long[-2]["content"]) < 5000


# --- v3: origin or impact, new or chronic, calibrated severity --------------------------


def test_the_prompt_asks_for_role_pattern_and_calibrated_severity() -> None:
    system = build_messages(batch_of(sample()), detail="brief", prompt_version="v3")[0]["content"]
    for needle in (
        "'<role>, <pattern>: <cause>'",  # the stated form, at the start of cause
        "origin (this service failed by itself)",
        "impact of <service> (a service it calls failed",
        "no instances available for X, connection refused to X, X returned 503",
        "the event then ends with (<service>)",
        "new (first appears partway through)",
        "burst (many records in a few minutes",
        "chronic (steady or sporadic through the span: background, never the cause)",
        "one service's sporadic or chronic errors are low or medium",
        "high or critical need errors in several services at once or a symptom users see",
    ):
        assert needle in system, needle
    assert '"cause": "<role>, <pattern>: <most likely cause>"' in system


def test_the_prompt_version_moved_past_the_text_before_role_and_pattern() -> None:
    # cache keys and fragment ids carry it: answers of the v2 text are not reused (v4 gave
    # roll-ups the baseline's verdicts, tests/report/analysis/test_verdicts.py)
    assert ModelSettings().prompt_version not in ("v1", "v2")


@pytest.mark.parametrize(
    ("cause", "stated"),
    [
        ("impact of payments, burst: payments refuses connections -> checkout fails",
         StatedCause("impact", "payments", "burst",
                     "payments refuses connections -> checkout fails")),
        ("origin, new: deploy v2 -> pool exhausted", StatedCause("origin", None, "new",
                                                                 "deploy v2 -> pool exhausted")),
        ("Unknown, Chronic: disk nearly full", StatedCause("unknown", None, "chronic",
                                                           "disk nearly full")),
        ("impact, unknown: calls time out", StatedCause("impact", None, "unknown",
                                                        "calls time out")),
        ("impact of db:5432, burst: refused", StatedCause("impact", "db:5432", "burst", "refused")),
        ("origin: pool exhausted", StatedCause("origin", None, "unknown", "pool exhausted")),
        ("impact of ts-order-service: 503s", StatedCause("impact", "ts-order-service", "unknown",
                                                         "503s")),
        ("connections to a remote service were refused. Evidence: levels ERROR.", None),
        ("original: not a role", None),
        ("impact of payments, checkout and cart: too many names", None),
    ],
)
def test_stated_cause_reads_the_form(cause: str, stated: StatedCause | None) -> None:
    assert stated_cause(cause) == stated


def test_state_cause_writes_what_stated_cause_reads() -> None:
    text = state_cause("refused -> checkout fails", role="impact", pattern="burst",
                       calls="payments")
    assert text == "impact of payments, burst: refused -> checkout fails"
    assert stated_cause(text) == StatedCause("impact", "payments", "burst",
                                             "refused -> checkout fails")
    assert state_cause("x", role="origin", pattern="new", calls="ignored") == "origin, new: x"


def _answer(batch: Batch, causes: dict[str, tuple[str, str]], **extra: object) -> dict:
    """One fragment per service of the sample: service -> (event, cause)."""
    by_service: dict[str, list[str]] = {}
    for g in batch.groups:
        by_service.setdefault(g.service, []).append(g.ref)
    return {"fragments": [
        {"refs": refs, "service": svc, "event": causes[svc][0], "cause": causes[svc][1],
         "suggestion": "mitigate: look", "severity": "medium", **extra}
        for svc, refs in by_service.items()]}


def test_an_answer_in_the_v3_shape_validates_and_its_role_reaches_the_fragment() -> None:
    batch = batch_of(sample())
    answer = _answer(batch, {
        "api": ("Timeouts (hdfs)", "impact of hdfs, burst: hdfs refuses connections -> slow GETs"),
        "hdfs": ("Disk full", "origin, new: disk full -> connections refused"),
    })
    fragments = validate_answer(batch, answer, model="m", prompt_version="v3")
    api, hdfs = sorted(fragments, key=lambda f: f.service)
    assert api.event == "Timeouts (hdfs)"
    assert stated_cause(api.cause) == StatedCause("impact", "hdfs", "burst",
                                                  "hdfs refuses connections -> slow GETs")
    assert stated_cause(hdfs.cause) == StatedCause("origin", None, "new",
                                                   "disk full -> connections refused")


def test_an_answer_in_the_old_shape_still_validates_and_states_nothing() -> None:
    batch = batch_of(sample())
    answer = _answer(batch, {"api": ("Timeouts", "requests were slow"),
                             "hdfs": ("Disk full", "log rotation stopped")})
    fragments = validate_answer(batch, answer, model="m", prompt_version="v2")
    assert {f.cause for f in fragments} == {"requests were slow", "log rotation stopped"}
    assert all(stated_cause(f.cause) is None for f in fragments)


def test_structured_role_keys_a_model_adds_on_its_own_are_ignored_not_refused() -> None:
    # the answer schema ignores extra keys: a model that answers role/calls/pattern as
    # fields instead of in the cause is not sent to review for it
    batch = batch_of(sample())
    answer = _answer(batch, {"api": ("Timeouts", "requests were slow"),
                             "hdfs": ("Disk full", "log rotation stopped")},
                     role="impact", calls="hdfs", pattern="burst")
    assert len(validate_answer(batch, answer, model="m", prompt_version="v3")) == 2
