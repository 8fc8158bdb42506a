"""The fake model answers the v3 prompts: origin or impact, pattern, calibrated severity."""

from __future__ import annotations

from typing import Any

from streams.batch.answers import validate_answer
from streams.batch.prompt import StatedCause, payload_of, stated_cause
from streams.batch.window import build_batch
from streams.dev.fakellm.judge import answer, summarize
from streams.records import NormalizedRecord
from streams.report.analysis.postmortem import derive
from streams.report.state.merge import merge_all

from helpers import WordCounter, make_record

POOL = "HikariPool-1 - Connection is not available, request timed out after <*>ms"


def group(ref: str, service: str, template: str, *, level: str = "ERROR", count: int = 20,
          first: str = "03:30", last: str = "03:34", example: str | None = None
          ) -> dict[str, Any]:
    return {"ref": ref, "service": service, "level": level, "template": template,
            "count": count, "first_seen": f"2026-01-02T{first}:00Z",
            "last_seen": f"2026-01-02T{last}:00Z",
            "examples": [example or template.replace("<*>", "30000")], "truncated": False}


def payload(*groups: dict[str, Any]) -> dict[str, Any]:
    return {"lane": "fast", "detail": "brief", "groups": list(groups)}


ROUTINE = group("g9", "web", "GET <*> 200", level="INFO", count=600, first="03:00",
                last="03:59", example="GET / 200")


def said(cause: str) -> tuple[str, str | None, str] | None:
    stated = stated_cause(cause)
    return None if stated is None else (stated.role, stated.calls, stated.pattern)


def by_service(answered: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["service"]: f for f in answered["fragments"]}


def test_a_caller_naming_the_failed_service_is_its_impact_and_names_it() -> None:
    got = by_service(answer(payload(
        group("g1", "checkout", "Connection refused to payments:8080", count=40, first="03:31"),
        group("g2", "payments", POOL, count=30, first="03:30"),
        ROUTINE)))
    checkout, payments, web = got["checkout"], got["payments"], got["web"]
    assert said(checkout["cause"]) == ("impact", "payments", "new")
    assert checkout["event"].endswith("(payments)")  # the subject the origin rule reads
    assert said(payments["cause"]) == ("origin", None, "new")
    assert "(" not in payments["event"]
    # errors in two services at once: high stays high
    assert checkout["severity"] == "high" and payments["severity"] == "high"
    assert stated_cause(web["cause"]) == StatedCause(
        "unknown", None, "unknown", "routine activity with no error signals.")


def test_one_services_errors_alone_are_medium_unless_users_see_them() -> None:
    alone = by_service(answer(payload(group("g1", "payments", POOL, count=300), ROUTINE)))
    assert alone["payments"]["severity"] == "medium"  # the analyzer said high (300 errors)
    users = by_service(answer(payload(
        group("g1", "frontend", "503 Service Unavailable for <*>", count=300,
              example="503 Service Unavailable for GET /cart"), ROUTINE)))
    assert users["frontend"]["severity"] in ("high", "critical")


def test_the_pattern_is_judged_in_the_payloads_own_span() -> None:
    spread = answer(payload(
        group("g1", "a", POOL, count=60, first="03:01", last="03:58"),
        group("g2", "b", "disk <*> full", count=30, first="03:40", last="03:50",
              example="disk /data full"),
        group("g3", "c", "NullPointerException at <*>", count=12, first="03:05", last="03:07",
              example="java.lang.NullPointerException at Foo.bar(Foo.java:12)"),
        group("g4", "d", "NullPointerException at <*>", count=2, first="03:05", last="03:05",
              example="java.lang.NullPointerException at Foo.bar(Foo.java:12)"),
        ROUTINE))
    patterns = {f["service"]: said(f["cause"])[2] for f in spread["fragments"]}  # type: ignore[index]
    assert patterns == {"a": "chronic", "b": "new", "c": "burst", "d": "unknown",
                        "web": "unknown"}
    short = answer(payload(group("g1", "a", POOL, first="03:00", last="03:04")))
    assert said(short["fragments"][0]["cause"]) == ("origin", None, "unknown")


def test_a_roll_up_says_impact_and_chronic_from_the_judgement() -> None:
    incident = {"event": "Connection failures (payments)", "services": ["checkout"],
                "cause": "impact of payments, burst: connections were refused. Evidence: x",
                "severity": "high", "count": 40, "first_seen": "2026-01-02T03:31:00Z",
                "last_seen": "2026-01-02T03:34:00Z", "templates": [], "suggestions": [
                    "Check that payments is running"],
                "judgement": {"pattern": "burst", "counts": "burst: 40 records in 3 min",
                              "severity": "high", "role": "impact",
                              "suspected_origin": {"service": "payments",
                                                   "first_anomaly": "2026-01-02T03:30:00Z",
                                                   "callers": ["checkout"]}}}
    summary = summarize({"kind": "rollup", "report": "r", "incident": incident})["summary"]
    assert ("These errors are impact: the suspected origin is payments (first anomaly "
            "2026-01-02T03:30:00Z); by its counts it is burst (40 records in 3 min).") in summary
    assert summary.endswith("Next step: Check that payments is running.")
    assert "impact of payments, burst" not in summary  # the stated form is not prose

    chronic = {**incident, "judgement": {"pattern": "chronic", "severity": "low",
                                         "counts": "chronic: steady through the window",
                                         "role": "unknown"}}
    summary = summarize({"kind": "rollup", "incident": chronic})["summary"]
    assert "(low severity)" in summary  # the post-mortem's calibrated severity
    assert "chronic background (steady through the window), not this incident's" in summary

    unjudged = {k: v for k, v in incident.items() if k != "judgement"}
    summary = summarize({"kind": "rollup", "incident": unjudged})["summary"]
    assert "These errors look like impact of a failure in payments" in summary


def records() -> list[NormalizedRecord]:
    """An hour of routine web traffic; payments' pool runs dry at 30 min, checkout's calls
    to it are refused from 31 min."""
    out: list[NormalizedRecord] = []
    offset = 0

    def add(n: int, start: float, end: float, **kw: Any) -> None:
        nonlocal offset
        for i in range(n):
            out.append(make_record(offset, seconds=60 * (start + (end - start) * i / max(n - 1, 1)),
                                   **kw))
            offset += 1

    add(120, 0, 59, service="web", template_id="get", template="GET <*> 200",
        message="GET / 200", level="INFO")
    add(30, 30, 34, service="payments", template_id="pool", template=POOL,
        message=POOL.replace("<*>", "30000"), level="ERROR")
    add(60, 31, 34, service="checkout", template_id="refused",
        template="Connection refused to payments:8080",
        message="Connection refused to payments:8080", level="ERROR")
    return out


def test_the_model_path_names_the_same_origin_as_the_post_mortem() -> None:
    batch = build_batch(records(), lane="fast", counter=WordCounter(), max_example_tokens=None,
                        trigger="wait")
    fragments = validate_answer(batch, answer(payload_of(batch)), model="fake-gpt",
                                prompt_version="v3")
    checkout = next(f for f in fragments if f.service == "checkout")
    assert said(checkout.cause) == ("impact", "payments", "new")
    report, _ = merge_all(None, fragments, report_id="2026-01-02/all", now="t")
    pm = derive(report)
    assert pm.episodes and pm.episodes[0].origin is not None
    assert pm.episodes[0].origin.service == "payments"
