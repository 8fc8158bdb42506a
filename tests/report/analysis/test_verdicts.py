"""The roll-up payload carries the baseline's verdict on each template (new, departed,
chronic, usual) and the day incidents they are part of; the rules model and the
simulated provider summarise from them; the prompt stays within its budget."""

from __future__ import annotations

import json
from typing import Any

import pytest

from streams.batch.prompt import extract_payload
from streams.dev.fakellm.judge import answer as fake_answer
from streams.gateway.rollup_prompt import (
    ROLLUP_INPUT_TOKENS,
    parse_rollup,
    rollup_messages,
    rollup_prompt_tokens,
)
from streams.gateway.rules.analyzer import analyze
from streams.report.analysis.rollup import rollup_payload
from streams.report.analysis.verdicts import Baseline
from streams.report.state.model import Incident, Report, Series, Suggestion, TemplateEvidence
from streams.settings import ModelSettings

HOUR = [f"2026-11-29T10:{m:02d}" for m in range(60)]
RID = "2026-11-29/all"


def steady(n: int) -> dict[str, int]:
    return dict.fromkeys(HOUR, n)


def varying() -> dict[str, int]:
    return {m: 20 + (i * 7) % 11 for i, m in enumerate(HOUR)}


def series() -> dict[str, dict[str, Series]]:
    """An hour of three services: api writes a new error from 10:40; db's chronic slow
    query warning goes on all hour, and its 'row returned' line, which follows 'row
    fetched' one for one, thins out from 10:45; cart cannot reach db from 10:46."""
    thinned = varying()
    for m in HOUR[45:48]:
        thinned[m] = 3
    return {
        "api": {"GET /orders done": Series(level="INFO", minutes=steady(40)),
                "payment call failed": Series(level="ERROR",
                                              minutes={m: 6 for m in HOUR[40:45]})},
        "cart": {"cart ok": Series(level="INFO", minutes=steady(20)),
                 "no instances available for db": Series(
                     level="ERROR", minutes={m: 8 for m in HOUR[46:49]}, named={"db": 24})},
        "db": {"query ok": Series(level="INFO", minutes=steady(30)),
               "slow query warning": Series(level="WARN", minutes=steady(2)),
               "row fetched": Series(level="INFO", minutes=varying()),
               "row returned": Series(level="INFO", minutes=thinned)},
    }


def incident(key: str, event: str, service: str, templates: list[tuple[str, int]], *,
             severity: str = "high") -> Incident:
    return Incident(
        key=key, event=event, cause=f"{event.lower()} in {service}", severity=severity,
        services=[service], first_seen="2026-11-29T10:00:00Z", last_seen="2026-11-29T10:59:00Z",
        count=sum(n for _, n in templates),
        evidence=[TemplateEvidence(template=t, count=n, examples=[f"{t} (example)"])
                  for t, n in templates])


def report() -> Report:
    return Report(id=RID, series=series(), incidents=[
        incident("pay", "Payment call failures", "api",
                 [("payment call failed", 30), ("GET /orders done", 5)]),
        incident("slow", "Slow queries", "db", [("slow query warning", 120)],
                 severity="medium"),
        incident("rows", "Rows served", "db", [("row fetched", 1500), ("row returned", 1400)],
                 severity="info"),
        incident("cart", "Database unreachable", "cart",
                 [("no instances available for db", 24)]),
    ], suggestions=[Suggestion(key="retry", text="Retry the db lookup with backoff",
                               incidents=["cart"])])


def payload(key: str, source: Report | None = None) -> dict[str, Any]:
    source = source or report()
    return rollup_payload(RID, next(i for i in source.incidents if i.key == key),
                          report=source)


def verdicts(body: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {t["template"]: t.get("baseline", []) for t in body["incident"]["templates"]}


def summary(body: dict[str, Any]) -> str:
    """What the rules model answers, read back as the gateway reads it."""
    answer = analyze(extract_payload(rollup_messages(body, prompt_version="v5")))
    return parse_rollup(json.dumps(answer))


# --- the payload ----------------------------------------------------------------------


def test_a_new_error_line_is_new_and_its_incident_begins_in_its_service() -> None:
    body = payload("pay")
    said = verdicts(body)
    [new] = said["payment call failed"]
    assert (new["service"], new["verdict"], new["first"]) == ("api", "new", "2026-11-29T10:40")
    assert (new["observed"], new["expected"], new["minutes"]) == (6, 0.0, 5)
    assert said["GET /orders done"] == [{"service": "api", "verdict": "usual"}]
    [day] = body["incident"]["baseline"]["incidents"]
    assert new["incidents"] == [0]
    assert (day["origin"], day["role"], day["started"]) == ("api", "origin",
                                                            "2026-11-29T10:40:00Z")
    assert day["ended"] > day["started"] and "new line" in day["lead"]


def test_a_thinning_line_departs_with_observed_against_expected() -> None:
    body = payload("rows")
    said = verdicts(body)
    [thin] = said["row returned"]
    assert (thin["verdict"], thin["kind"], thin["first"]) == ("departed", "thin",
                                                              "2026-11-29T10:45")
    assert thin["observed"] == 3 and thin["expected"] > 20 and thin["minutes"] == 3
    assert said["row fetched"] == [{"service": "db", "verdict": "usual"}]
    [day] = body["incident"]["baseline"]["incidents"]
    assert (day["origin"], day["role"], day["callers"]) == ("db", "origin", ["cart"])


def test_a_chronic_line_is_chronic_and_no_incident() -> None:
    body = payload("slow")
    assert verdicts(body) == {"slow query warning": [{"service": "db", "verdict": "chronic"}]}
    assert body["incident"]["baseline"]["incidents"] == []


def test_a_caller_is_told_where_the_incident_began() -> None:
    body = payload("cart")
    [new] = verdicts(body)["no instances available for db"]
    assert (new["service"], new["verdict"]) == ("cart", "new")
    [day] = body["incident"]["baseline"]["incidents"]
    assert (day["origin"], day["role"]) == ("db", "caller")
    assert day["started"] == "2026-11-29T10:45:00Z"  # where db's own line first thinned


def test_a_line_the_log_began_with_is_unknown_and_standing_not_usual() -> None:
    # three minutes: the error was there from the first, so nothing could judge it
    short = dict.fromkeys(HOUR[:3], 8)
    began = report().model_copy(update={"series": {"api": {
        "GET /orders done": Series(level="INFO", minutes=dict.fromkeys(HOUR[:3], 80)),
        "payment call failed": Series(level="ERROR", minutes=short)}}})
    said = verdicts(payload("pay", began))
    assert said["payment call failed"] == [
        {"service": "api", "verdict": "unknown", "kind": "standing", "records": 24}]
    assert said["GET /orders done"] == [{"service": "api", "verdict": "usual"}]


def test_no_series_no_verdicts() -> None:
    bare = report().model_copy(update={"series": {}})
    body = payload("pay", bare)
    assert "baseline" not in body["incident"]
    assert all("baseline" not in t for t in body["incident"]["templates"])


def test_the_prompt_explains_the_verdicts_and_its_version_moved() -> None:
    body = payload("cart")
    messages = rollup_messages(body, prompt_version="v5")
    system = messages[0]["content"]
    for needle in ("outranks judgement.pattern", "thin: a usual line that thinned out",
                   "never the trigger, cause or origin", "name that origin service",
                   "the next step is at the origin", "kind standing: failing when the log",
                   "of kind slow: calls into that service"):
        assert needle in system, needle
    assert extract_payload(messages) == body
    assert ModelSettings().prompt_version == "v5"  # cached roll-ups of the v4 text go


# --- what the rules model and the simulated provider make of them ----------------------


@pytest.mark.parametrize(("key", "said"), [
    ("pay", ["'payment call failed' in api is new from 10:40 (up to 6 a minute)",
             "the incident began here, in api from 10:40"]),
    ("rows", ["'row returned' in db thinned out from 10:45 (3 a minute against",
              "cart report failures calling it"]),
    ("slow", ["'slow query warning' in db is chronic background",
              "not what started an incident"]),
    ("cart", ["these lines are impact of the incident that began in db from 10:45",
              "Next step: start at db, where the incident began; then retry the db lookup "
              "with backoff."]),
])
def test_the_rules_summary_says_what_the_baseline_says(key: str, said: list[str]) -> None:
    text = summary(payload(key))
    for needle in said:
        assert needle in text, needle


def test_the_fake_model_follows_the_baseline_over_the_judgement() -> None:
    body = payload("cart")
    # a judgement that disagrees: the prompt ranks the baseline's verdict above it
    body["incident"]["judgement"] = {"pattern": "chronic", "counts": "chronic: steady",
                                     "role": "origin", "severity": "high",
                                     "suspected_origin": {"service": "cart"}}
    text = parse_rollup(json.dumps(fake_answer(body)))
    assert "impact of the incident that began in db" in text
    assert "chronic background" not in text and "origin is cart" not in text


# --- the budget -----------------------------------------------------------------------


def test_the_prompt_stays_within_its_budget_with_every_field_at_its_largest() -> None:
    source = report()
    long = "x" * 2000
    templates = [("payment call failed", 500), ("GET /orders done", 400)] + [
        (f"{long} {n}", 300 - n) for n in range(18)]
    big = incident("big", long, "api", templates).model_copy(update={
        "cause": long * 3, "services": ["api", "cart", "db"],
        "evidence": [TemplateEvidence(template=t, count=n, examples=[f"{t} {k} {long}"
                                                                     for k in range(5)])
                     for t, n in templates]})
    source.incidents.append(big)
    body = payload("big", source)
    assert rollup_prompt_tokens(body) <= ROLLUP_INPUT_TOKENS
    shown = body["incident"]["templates"]
    assert shown[0]["template"] == "payment call failed"  # the most frequent stays
    assert shown[0]["baseline"][0]["verdict"] == "new"  # and its verdict with it
    assert all(len(t["template"]) <= 300 for t in shown)
    assert len(body["incident"]["event"]) <= 200 and len(body["incident"]["cause"]) <= 600


def test_a_usual_payload_is_not_trimmed() -> None:
    body = payload("pay")
    assert rollup_prompt_tokens(body) < ROLLUP_INPUT_TOKENS // 2
    assert [len(t["examples"]) for t in body["incident"]["templates"]] == [1, 1]


def test_a_service_gone_quiet_while_the_incident_lasts_is_said_of_the_service() -> None:
    source = report()
    for m in HOUR[50:53]:
        source.series["api"]["GET /orders done"].minutes[m] = 0
    during = incident("gap", "Orders stalled", "api", [("GET /orders done", 5)]).model_copy(
        update={"first_seen": "2026-11-29T10:49:00Z", "last_seen": "2026-11-29T10:54:00Z"})
    before = during.model_copy(update={"key": "early", "last_seen": "2026-11-29T10:20:00Z"})
    source.incidents += [during, before]
    body = payload("gap", source)
    [quiet] = body["incident"]["baseline"]["services"]
    assert (quiet["service"], quiet["verdict"], quiet["kind"]) == ("api", "departed", "quiet")
    assert (quiet["first"], quiet["observed"]) == ("2026-11-29T10:50", 0)
    assert quiet["expected"] > 30
    assert "api's volume fell from 10:50 (0 a minute against" in summary(body)
    assert "services" not in payload("early", source)["incident"]["baseline"]


def test_calls_into_a_service_that_slowed_while_the_incident_lasts_are_said_of_it() -> None:
    source = report()
    source.hops = {"api": {m: {"6": 6} if not "10:50" <= m[11:] < "10:53" else {"13": 6}
                           for m in HOUR}}
    during = incident("lag", "Orders slow", "api", [("GET /orders done", 5)]).model_copy(
        update={"first_seen": "2026-11-29T10:49:00Z", "last_seen": "2026-11-29T10:54:00Z"})
    source.incidents.append(during)
    [slow] = payload("lag", source)["incident"]["baseline"]["services"]
    assert (slow["service"], slow["verdict"], slow["kind"]) == ("api", "departed", "slow")
    assert (slow["first"], slow["observed"], slow["minutes"]) == ("2026-11-29T10:50", 6, 3)
    assert "calls into api slowed from 10:50 (6 a minute against" in summary(
        payload("lag", source))


def test_a_failure_reading_the_verdicts_costs_only_the_verdicts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(*_: Any) -> Any:
        raise RuntimeError("verdict bug")

    monkeypatch.setattr(Baseline, "read", failing)
    body = payload("pay")
    assert "baseline" not in body["incident"] and "judgement" in body["incident"]
    assert all("baseline" not in t for t in body["incident"]["templates"])
