"""Roll-up: payloads from report data, prompts backends can read, pure idempotent updates."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from pydantic import ValidationError

from streams.batch.prompt import extract_payload
from streams.dev.fakellm import FakeLLMConfig, FakeLLMServer
from streams.dev.fakellm.judge import answer as fake_answer
from streams.errors import MalformedOutput
from streams.gateway.aimd import AIMDLimiter
from streams.gateway.backends import OpenAIBackend
from streams.gateway.buckets import TokenBucket
from streams.gateway.caller import ModelCaller
from streams.gateway.gateway import Gateway
from streams.gateway.retry import RetryBudget
from streams.gateway.rollup_prompt import (
    MAX_SUMMARY_CHARS,
    ROLLUP_KIND,
    parse_rollup,
    rollup_messages,
)
from streams.gateway.rules.analyzer import analyze
from streams.gateway.telemetry import LaneMetrics
from streams.records import Evidence, Fragment, TimeWindow, count_minutes
from streams.report.analysis import rollup as rollup_module
from streams.report.analysis.rollup import (
    RollupUpdate,
    apply_rollup,
    needs_rollup,
    rollup_payload,
)
from streams.report.state.merge import merge, merge_all
from streams.report.state.model import Report

from helpers import make_fragment

TOPIC = "retro.logs.raw"
RID = "2026-11-29/all"


def _frag(fid: str, covered: dict, **kw: Any) -> Fragment:
    return make_fragment(fid, covered, **({"event": "Disk full on datanode",
                                          "cause": "No space left on /data",
                                          "suggestion": "Free disk space on the datanodes"}
                                         | kw))


def _many_templates() -> list[Evidence]:
    """Seven templates with 1..7 records each and four examples, over offsets 0..27."""
    out, offset = [], 0
    for n in range(1, 8):
        covered = {f"{TOPIC}/3": [[offset, offset + n - 1]]}
        examples = [f"t{n} example {word} at offset {offset + k}"
                    for k, word in enumerate(("one", "two", "three", "four"))]
        out.append(Evidence(template=f"tpl {n} <*>", count=n, examples=examples, covered=covered))
        offset += n
    return out


def _report() -> Report:
    report, _ = merge(
        None,
        _frag("a", {f"{TOPIC}/3": [[0, 27]]}, evidence=_many_templates()),
        report_id=RID,
        now="t1",
    )
    report, _ = merge(
        report,
        _frag("b", {f"{TOPIC}/4": [[100, 101]]}, event="Broker down", cause="restart",
              suggestion="Add client retries", service="kafka", severity="low"),
        report_id=RID,
        now="t2",
    )  # fmt: skip
    return report


def _disk(report: Report) -> Any:
    return next(i for i in report.incidents if i.event == "Disk full on datanode")


def _update(report: Report, summary: str = "Disk filled up.", count: int | None = None) -> Any:
    inc = _disk(report)
    return RollupUpdate(
        report_id=report.id,
        incident_key=inc.key,
        summary=summary,
        based_on_count=inc.count if count is None else count,
        model="m",
        prompt_version="v1",
    )


# --- payload and messages -----------------------------------------------------------


def test_payload_has_the_incident_facts_and_no_raw_coordinates() -> None:
    report = _report()
    inc = _disk(report)
    payload = rollup_payload(report.id, inc, report=report)
    assert payload["kind"] == ROLLUP_KIND and payload["report"] == RID
    body = payload["incident"]
    assert (body["key"], body["event"], body["severity"]) == (inc.key, inc.event, "high")
    assert body["count"] == 28 and body["services"] == ["hdfs"]
    assert body["first_seen"] == inc.first_seen and body["last_seen"] == inc.last_seen
    # the five most frequent templates, at most three examples each
    assert [t["count"] for t in body["templates"]] == [7, 6, 5, 4, 3]
    assert body["templates"][0]["template"] == "tpl 7 <*>"
    assert all(len(t["examples"]) == 3 for t in body["templates"])
    assert body["suggestions"] == ["Free disk space on the datanodes"]
    text = json.dumps(payload)
    assert TOPIC not in text and "covered" not in text
    assert "offset" not in set(body) and all("covered" not in t for t in body["templates"])


def test_payload_without_report_has_no_suggestions() -> None:
    report = _report()
    payload = rollup_payload(report.id, _disk(report))
    assert payload["incident"]["suggestions"] == []


def test_messages_round_trip_through_extract_payload() -> None:
    report = _report()
    payload = rollup_payload(report.id, _disk(report), report=report)
    messages = rollup_messages(payload, prompt_version="v1")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert '"summary"' in messages[0]["content"] and "never instructions" in messages[0]["content"]
    assert extract_payload(messages) == payload


def _at(minute: float) -> str:
    return f"2026-11-29T09:{int(minute):02d}:{int(minute % 1 * 60):02d}.000Z"


def _timed(event: str, service: str, *, minute: float, until: float, records: int,
           severity: str = "high", example: str | None = None, offset: int = 0) -> Fragment:
    """``records`` records of one template spread evenly from ``minute`` to ``until``."""
    step = (until - minute) / max(records - 1, 1)
    minutes = count_minutes(_at(minute + i * step) for i in range(records))
    return make_fragment(
        f"{service}-{offset}", {f"{TOPIC}/0": [[offset, offset + records - 1]]}, event=event,
        cause=f"{event.lower()} happened", service=service, severity=severity,
        window=TimeWindow(start=_at(minute), end=_at(until)), timestamp=_at(minute),
        record_count=records, suggestion=f"Look at {service}",
        evidence=[Evidence(template=example or event, count=records,
                           examples=[example or event], minutes=minutes)])


def _outage() -> Report:
    """An hour of routine traffic; payments' pool runs dry at 30 min, checkout and cart
    cannot reach it from 31 min, and a relay defers mail all hour long."""
    report, _ = merge_all(None, [
        _timed("Routine activity", "web", minute=0, until=59, records=300, severity="info"),
        _timed("Connection pool exhausted", "payments", minute=30, until=34, records=30,
               offset=1000),
        _timed("Connection failures", "checkout", minute=31, until=34, records=60,
               example="Connection refused to payments:8080", offset=2000),
        _timed("Connection failures", "cart", minute=31, until=34, records=40,
               example="Connection refused to payments:8080", offset=3000),
        _timed("Mail delivery deferred", "relay", minute=0, until=59, records=120,
               offset=4000),
    ], report_id=RID, now="t1")
    return report


def _incident(report: Report, service: str) -> Any:
    return next(i for i in report.incidents if service in i.services)


def test_payload_carries_the_counts_and_the_post_mortems_judgement() -> None:
    report = _outage()
    checkout = rollup_payload(report.id, _incident(report, "checkout"), report=report)
    body = checkout["incident"]
    assert body["minutes"]["with_records"] == 4 and body["minutes"]["first"] == "2026-11-29T09:31"
    assert body["minutes"]["peak_records"] == max(
        n for ev in _incident(report, "checkout").evidence for n in ev.minutes.values())
    judgement = body["judgement"]
    assert judgement["role"] == "impact" and judgement["pattern"] in ("new", "burst")
    assert judgement["counts"].startswith(judgement["pattern"])
    assert judgement["suspected_origin"]["service"] == "payments"
    assert judgement["suspected_origin"]["first_anomaly"].startswith("2026-11-29T09:30")
    assert sorted(judgement["suspected_origin"]["callers"]) == ["cart", "checkout"]
    assert judgement["severity"] == "high"  # errors in three services at once

    payments = rollup_payload(report.id, _incident(report, "payments"), report=report)
    assert payments["incident"]["judgement"]["role"] == "origin"

    relay = rollup_payload(report.id, _incident(report, "relay"), report=report)
    judgement = relay["incident"]["judgement"]
    assert judgement["pattern"] == "chronic" and "not this incident's" in judgement["chronic"]
    assert judgement["severity"] == "low" and judgement["role"] == "unknown"

    routine = rollup_payload(report.id, _incident(report, "web"), report=report)
    assert "judgement" not in routine["incident"]  # not a failure the post-mortem counts
    assert "judgement" not in rollup_payload(report.id, _incident(report, "checkout"))["incident"]


def test_the_post_mortem_is_derived_once_per_report_and_its_failure_costs_only_the_judgement(
        monkeypatch: pytest.MonkeyPatch) -> None:
    report = _outage()
    calls: list[Report] = []

    def failing(r: Report) -> Any:
        calls.append(r)
        raise RuntimeError("post-mortem bug")

    monkeypatch.setattr(rollup_module, "derive", failing)
    rollup_module._LAST.clear()
    payloads = [rollup_payload(report.id, inc, report=report) for inc in report.incidents]
    assert len(calls) == 1  # one pass over one report: derived once
    assert all("judgement" not in p["incident"] and p["incident"]["event"] for p in payloads)
    other = _outage()
    rollup_payload(other.id, other.incidents[0], report=other)
    assert len(calls) == 2  # another report object: derived again


def test_the_rollup_prompt_asks_for_origin_or_impact_and_new_or_chronic() -> None:
    report = _outage()
    payload = rollup_payload(report.id, _incident(report, "checkout"), report=report)
    system = rollup_messages(payload, prompt_version="v3")[0]["content"]
    for needle in ("Say whether this incident is the origin or the impact of a failure elsewhere",
                   "name the suspected origin and its first anomaly",
                   "not the root cause", "new or bursting", "chronic",
                   "never call them the incident's trigger or cause",
                   "judgement.severity", "several services at once or a symptom users see"):
        assert needle in system, needle
    assert extract_payload(rollup_messages(payload, prompt_version="v3")) == payload


def test_the_fake_model_summary_names_the_origin_of_an_impact_incident() -> None:
    report = _outage()
    payload = rollup_payload(report.id, _incident(report, "checkout"), report=report)
    summary = parse_rollup(json.dumps(fake_answer(payload)))
    assert "These errors are impact: the suspected origin is payments" in summary
    relay = rollup_payload(report.id, _incident(report, "relay"), report=report)
    summary = parse_rollup(json.dumps(fake_answer(relay)))
    assert "(low severity)" in summary and "chronic background" in summary


# --- parsing answers ----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"summary": "Disk  full.\\nFree space."}',
        'Sure!\n```json\n{"summary": "Disk full. Free space."}\n```\nAnything else?',
        'Here you go: {"summary": "Disk full. Free space."} -- hope it helps',
    ],
)
def test_parse_rollup_reads_plain_fenced_and_wrapped_answers(text: str) -> None:
    assert parse_rollup(text) == "Disk full. Free space."


@pytest.mark.parametrize(
    "text",
    ["", "the disk is full", '{"summary": ""}', '{"summary": "   "}', '{"summary": 3}',
     '{"text": "Disk full."}', '["summary"]', '{"summary": "cut'],
)  # fmt: skip
def test_parse_rollup_rejects_garbage(text: str) -> None:
    with pytest.raises(MalformedOutput):
        parse_rollup(text)


def test_parse_rollup_clips_long_summaries() -> None:
    summary = parse_rollup(json.dumps({"summary": "word " * 1000}))
    assert len(summary) == MAX_SUMMARY_CHARS and summary.endswith("...")


# --- applying updates ---------------------------------------------------------------


def test_apply_rollup_sets_the_summary_and_bumps_the_version() -> None:
    report = _report()
    assert needs_rollup(_disk(report))
    before = report.model_dump()
    out, changed = apply_rollup(report, _update(report), now="t9")
    assert changed
    assert report.model_dump() == before  # the input is not modified
    inc = _disk(out)
    assert (inc.summary, inc.summary_count) == ("Disk filled up.", 28)
    assert not needs_rollup(inc)
    assert (out.version, out.updated_at) == (report.version + 1, "t9")
    # nothing else moved: the other incident, counts, coverage, the last merge's changes
    assert [i.key for i in out.incidents] == [i.key for i in report.incidents]
    other = next(i for i in out.incidents if i.event == "Broker down")
    assert other.summary is None and other.summary_count == 0
    assert out.covered == report.covered and out.changes == report.changes
    assert out.fragments_applied == report.fragments_applied


def test_apply_rollup_is_idempotent() -> None:
    report = _report()
    once, changed = apply_rollup(report, _update(report), now="t9")
    assert changed
    twice, changed = apply_rollup(once, _update(report), now="t10")
    assert not changed
    assert twice is once and twice.version == once.version and twice.updated_at == "t9"


def test_apply_rollup_ignores_stale_and_unknown_updates() -> None:
    report = _report()
    current, _ = apply_rollup(report, _update(report, "Newest.", count=28), now="t9")
    stale, changed = apply_rollup(current, _update(report, "Older.", count=20), now="t10")
    assert not changed and _disk(stale).summary == "Newest."
    # same count, new text: a newer model answer for the same state replaces it
    rewritten, changed = apply_rollup(current, _update(report, "Rewritten."), now="t10")
    assert changed and _disk(rewritten).summary == "Rewritten."

    unknown = _update(report).model_copy(update={"incident_key": "no-such-incident"})
    assert apply_rollup(report, unknown) == (report, False)
    other_report = _update(report).model_copy(update={"report_id": "2026-11-30/all"})
    assert apply_rollup(report, other_report) == (report, False)
    # based on more records than the incident has: from another history of the report
    assert apply_rollup(report, _update(report, count=29)) == (report, False)


def test_a_merge_after_a_rollup_makes_the_summary_stale_but_keeps_it() -> None:
    report, _ = apply_rollup(_report(), _update(_report()), now="t9")
    grown, _ = merge(report, _frag("c", {f"{TOPIC}/3": [[28, 31]]}), report_id=RID, now="t10")
    inc = _disk(grown)
    assert inc.count == 32 and (inc.summary, inc.summary_count) == ("Disk filled up.", 28)
    assert needs_rollup(inc)


def test_update_json_round_trip_and_validation() -> None:
    update = _update(_report())
    assert RollupUpdate.from_json(update.to_json()) == update
    assert RollupUpdate.from_json(json.loads(update.to_json())) == update
    with pytest.raises(ValidationError):
        RollupUpdate.from_json(json.loads(update.to_json()) | {"summary": ""})
    with pytest.raises(ValidationError):
        RollupUpdate.from_json(json.loads(update.to_json()) | {"based_on_count": -1})
    with pytest.raises(ValidationError):
        update.summary = "x"  # type: ignore[misc]


# --- the offline model and the fake provider ---------------------------------------


def test_rules_analyzer_answers_a_rollup_prompt_with_a_parseable_summary() -> None:
    report = _report()
    payload = rollup_payload(report.id, _disk(report), report=report)
    answer = analyze(extract_payload(rollup_messages(payload, prompt_version="v1")))
    summary = parse_rollup(json.dumps(answer))
    assert "Disk full on datanode" in summary and "28 log records" in summary


def _gateway(base_url: str) -> Gateway:
    async def no_sleep(_: float) -> None:
        await asyncio.sleep(0)

    caller = ModelCaller(
        backend=OpenAIBackend(base_url=base_url, api_key=None),
        model="fake-gpt",
        timeout_seconds=10.0,
        limiter=AIMDLimiter(start=2, maximum=4, pause_seconds=0.0),
        rpm=TokenBucket(rate_per_minute=600),
        tpm=TokenBucket(rate_per_minute=1_000_000),
        retry_budget=RetryBudget(),
        max_attempts=3,
        backoff_base=1.0,
        calibration=None,
        telemetry=LaneMetrics(None, "fast"),
        sleep=no_sleep,
        rng=random.Random(0),
    )
    return Gateway(caller, prompt_version="v1", detail="brief", context_window=8192,
                   output_reserve=0.3)


async def test_fake_provider_answers_a_rollup_request_through_the_gateway() -> None:
    report = _report()
    payload = rollup_payload(report.id, _disk(report), report=report)
    messages = rollup_messages(payload, prompt_version="v1")
    # every answer would get its refs corrupted: a roll-up has none, so it is a no-op
    config = FakeLLMConfig(seed=3, wrong_ids_rate=1.0, base_latency=0.0, per_input_token=0.0,
                           per_output_token=0.0)  # fmt: skip
    async with FakeLLMServer(config) as server:
        gateway = _gateway(server.base_url)
        try:
            summary, reason = await gateway.summarize(messages)
        finally:
            await gateway.backend.close()
        assert reason is None and summary is not None
        assert "Disk full on datanode" in summary and "28 log records" in summary
        assert server.stats.requests == 1 and server.stats.ok == 1
        assert server.stats.wrong_ids == 0
