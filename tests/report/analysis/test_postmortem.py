"""The post-mortem derived from a report: grouping, anomalies, trigger/mitigation, length."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from itertools import count
from pathlib import Path
from typing import Any

import jsonschema

from streams.notify.incidents import alerts_for
from streams.records import Evidence, Fragment, TimeWindow, count_minutes
from streams.report.analysis.causes import entities_in
from streams.report.analysis.postmortem import derive
from streams.report.state.merge import merge_all
from streams.report.state.model import SEVERITY_WEIGHT, Report, Series
from streams.report.views.view import (
    POSTMORTEM_SECTIONS,
    one_line,
    rank_reports,
    render_html,
    render_json,
    render_markdown,
    render_text,
)

from helpers import make_fragment

ROOT = Path(__file__).resolve().parents[3]
START = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
_offsets = count()


def at(minute: float) -> str:
    return (START + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def frag(event: str, *, minute: float, until: float | None = None, records: int = 1,
         service: str = "api", severity: str = "medium", cause: str | None = None,
         template: str | None = None, examples: list[str] | None = None,
         suggestion: str = "Look into it") -> Fragment:
    """A fragment of ``records`` fresh raw records from ``minute`` to ``until``."""
    first = next(_offsets) * 1_000_000
    covered = {"raw/0": [[first, first + records - 1]]}
    end = at(until if until is not None else minute)
    return make_fragment(
        f"f{first}", covered, event=event, cause=cause or f"{event.lower()} happened",
        service=service, severity=severity, suggestion=suggestion, timestamp=at(minute),
        window=TimeWindow(start=at(minute), end=end), record_count=records,
        evidence=[Evidence(template=template or event, count=records,
                           examples=examples or [template or event],
                           minutes=spread(records, minute, until))])


def spread(records: int, minute: float, until: float | None) -> dict[str, int]:
    """``records`` event times spread evenly from ``minute`` to ``until``, per minute."""
    last = minute if until is None else until
    step = (last - minute) / max(records - 1, 1)
    return count_minutes(at(minute + i * step) for i in range(records))


def report_of(*fragments: Fragment, **kw: Any) -> Report:
    report, _ = merge_all(None, list(fragments), report_id="2026-11-29/all",
                          now="2026-11-29T12:00:00Z")
    return report


def steady_api(minutes: list[str]) -> dict[str, Series]:
    """api's steady routine line over ``minutes``: the stream a baseline is learned from."""
    return {"GET /orders done": Series(level="INFO", minutes=dict.fromkeys(minutes, 40))}


def routine(minute: float = 0, until: float = 60, records: int = 500) -> Fragment:
    return frag("Routine activity", minute=minute, until=until, records=records,
                severity="info", cause="routine activity with no error signals",
                template="GET <PATH> <NUM>", suggestion="No action needed")


def outage() -> list[Fragment]:
    """Deploy at 10, retries from 10.2, timeouts in two services, an alert, a rollback."""
    return [
        routine(),
        frag("Deploy", minute=10, severity="info", service="checkout",
             template="deploy v1.42.0 started"),
        frag("Unclassified WARN events", minute=10.2, until=24, records=40, severity="low",
             service="checkout", cause="unclassified WARN events: retrying payment authorize",
             template="retrying payment authorize"),
        frag("Timeouts", minute=12, until=27, records=80, service="checkout",
             cause="calls timed out. Evidence: levels ERROR"),
        frag("Timeouts", minute=12.5, until=26, records=30, service="payments",
             cause="calls timed out. Evidence: levels WARN, ERROR"),
        frag("Connection pool exhausted", minute=13, until=26, records=12, severity="high",
             service="payments", suggestion="Cap caller concurrency"),
        frag("Alert fired", minute=13.5, severity="low", service="payments",
             template="alert PoolExhausted firing"),
        frag("Rollback", minute=24, severity="info", service="checkout",
             template="rollback v1.42.0 -> v1.41.3"),
    ]


def test_incidents_of_one_cause_group_across_services_and_templates() -> None:
    pm = derive(report_of(*outage()))
    titles = [c.title for c in pm.causes]
    assert titles.count("Timeouts") == 1  # two incidents (different cause text) are one cause
    timeouts = next(c for c in pm.causes if c.title == "Timeouts")
    assert timeouts.count == 110 and timeouts.services == ["checkout", "payments"]
    assert len(timeouts.keys) == 2
    assert pm.routine_records == 500  # routine folded into one line, not a cause
    assert all("Routine" not in t for t in titles)
    # changes are not incidents
    assert {c.kind for c in pm.changes} == {"deploy", "alert", "rollback"}
    assert not any(t in ("Deploy", "Rollback", "Alert fired") for t in titles)


def test_trigger_detection_and_mitigation_are_found_from_change_events() -> None:
    pm = derive(report_of(*outage()))
    ep = pm.episodes[0]
    assert ep.trigger is not None and ep.trigger.kind == "deploy"
    assert ep.detection is not None and ep.detection.kind == "alert"
    assert [m.kind for m in ep.mitigations] == ["rollback"]
    assert ep.causes[0].title.startswith("Unusual WARN")  # the earliest anomaly heads the chain
    # the suspected origin leads the title: the earliest error, in the deployed service
    assert ep.origin is not None and ep.origin.service == "checkout"
    assert pm.title.startswith("Timeouts in checkout")
    assert "resolved in the logs at 09:27:00" in pm.status
    assert len(pm.summary) == 4 and pm.summary[0].startswith("Suspected origin: checkout")
    assert "after a deploy (deploy v1.42.0 started) at 09:10:00" in pm.summary[2]
    assert "after a rollback" in pm.summary[3]
    kinds = {(a.priority, a.type) for a in pm.actions}
    assert ("P0", "mitigate") in kinds and ("P1", "prevent") in kinds
    assert any(w.startswith("An alert fired at 09:13:30") for w in pm.went_well)


def test_without_a_preceding_change_or_alert_the_post_mortem_says_so() -> None:
    fragments = [routine(), frag("Disk full", minute=30, until=59.9, records=20,
                                 severity="critical", service="mailer")]
    pm = derive(report_of(*fragments))
    ep = pm.episodes[0]
    assert ep.trigger is None and ep.detection is None and not ep.mitigations
    assert pm.status == "ongoing at the end of the logs"
    assert any(a.type == "detect" for a in pm.actions)
    assert "No alert in the logs: the incident shows only as errors" in pm.went_badly
    md = render_markdown(report_of(*fragments))
    assert "No deploy, config change or restart before the first failure" in md


def test_a_deploy_after_the_failures_began_is_not_their_trigger() -> None:
    fragments = [routine(), frag("Disk full", minute=30, until=40, records=20,
                                 severity="critical"),
                 frag("Deploy", minute=35, severity="info", template="deploy v2 started")]
    assert derive(report_of(*fragments)).episodes[0].trigger is None


def test_unclassified_templates_are_ranked_by_anomaly_and_steady_ones_folded() -> None:
    def unclassified(text: str, **kw: Any) -> Fragment:
        return frag("Unclassified WARN events", severity="low",
                    cause=f"unclassified WARN events: {text}", template=text, **kw)

    fragments = [
        routine(),
        unclassified("stock low for sku", minute=1, until=59, records=50),  # steady: folded
        unclassified("cache miss storm", minute=20, until=22, records=30),  # new and bursty
        unclassified("queue depth high", minute=30, until=50, records=10),  # new, slower
        unclassified("rare thing", minute=5, until=5, records=1),  # too few to judge
        frag("Connection refused", minute=20, until=25, records=5, severity="high"),
    ]
    pm = derive(report_of(*fragments))
    anomalies = [c for c in pm.causes if c.kind == "anomaly"]
    assert [c.title for c in anomalies] == ["Unusual WARN: cache miss storm",
                                           "Unusual WARN: queue depth high"]
    assert "new: first seen 09:20" in (anomalies[0].anomaly or "")
    assert "30 records in its peak" in (anomalies[0].anomaly or "")  # counted, not a span
    assert pm.folded_unclassified == (2, 51)


def test_an_anomaly_is_at_most_medium_even_at_fatal_level() -> None:
    fragments = [routine(), frag("Unclassified FATAL events", minute=30, until=31, records=9,
                                 severity="high", cause="unclassified FATAL events: x")]
    (anomaly,) = derive(report_of(*fragments)).causes
    assert anomaly.severity == "medium"


def test_quiet_logs_give_no_incident() -> None:
    pm = derive(report_of(routine()))
    assert pm.title == "No incident found" and not pm.episodes and not pm.actions
    assert "No failure of medium or higher severity in 500 records" in pm.summary[0]
    complaints = frag("Users report problems", minute=3, records=2, examples=["app crashed"])
    pm = derive(report_of(routine(), complaints))
    assert pm.title.startswith("Users report problems") and "2 user report(s)" in pm.summary[0]


def test_separate_failures_far_apart_in_time_and_services_are_separate_incidents() -> None:
    fragments = [*outage(), frag("Disk full", minute=40, until=45, records=20,
                                 severity="critical", service="mailer")]
    pm = derive(report_of(*fragments))
    assert len(pm.episodes) == 2
    assert {tuple(ep.services) for ep in pm.episodes[1:]} == {("mailer",)}
    assert "Other incidents" in render_markdown(report_of(*fragments))


def test_entities_in_count_addresses_and_users_in_evidence() -> None:
    examples = [
        "Failed password for invalid user admin from 10.1.2.3 port 22 ssh2",
        "Failed password for root from 10.1.2.3 port 22 ssh2",
        "Failed password for root from 192.168.7.9 port 22 ssh2",
        "authorization timed out waiting for ledger",  # no entity: "for ledger" is no user
    ]
    top = dict(entities_in(examples))
    assert top["ip 10.1.2.3"] == 2
    assert top["user root"] == 2 and "user ledger" not in top
    fragments = [routine(), frag("Authentication failures", minute=5, until=50, records=900,
                                 severity="high", examples=examples)]
    md = render_markdown(report_of(*fragments))
    assert "top entities in evidence" in md and "10.1.2.3" in md


def test_a_big_noisy_day_fits_the_length_bound() -> None:
    """100k records, 300 incidents over many services and hours: at most ~150 lines."""
    def name(n: int) -> str:  # digits are normalized away in incident keys; letters are not
        return chr(97 + n % 26) + chr(97 + n // 26 % 26)

    fragments = [routine(records=60_000)]
    for n in range(300):
        minute = (n * 7) % 1400
        kind = n % 3
        if kind == 0:
            fragments.append(frag(f"Failure kind {name(n)}", minute=minute, until=minute + 20,
                                  records=100, service=f"svc-{n % 25}",
                                  severity=("medium", "high", "critical")[n % 3]))
        elif kind == 1:
            fragments.append(frag("Unclassified ERROR events", minute=minute,
                                  until=minute + 3, records=100, service=f"svc-{n % 25}",
                                  cause=f"unclassified ERROR events: template {name(n)}",
                                  template=f"template {name(n)} <NUM>"))
        else:
            fragments.append(frag("Deploy", minute=minute, severity="info",
                                  service=f"svc-{n % 25}", template=f"deploy svc-{n} v{n}"))
    report = report_of(*fragments)
    assert report.record_count == 60_000 + 200 * 100 + 100
    md = render_markdown(report, deadletter_count=12, review_count=1)
    assert md.count("\n") <= 150
    assert max(len(line) for line in md.splitlines()) < 1200
    headings = re.findall(r"^## (.+)$", md, flags=re.M)
    assert headings == [h for h in POSTMORTEM_SECTIONS if h in headings]
    assert headings[0] == "Summary" and headings[-1] == "Data coverage"
    page = render_html(report)
    assert page.count("<details") >= 8  # every detail of the report stays in the page
    assert len(report.incidents) > 200
    assert all(f"template {name(n)}" in page for n in range(1, 300, 3))


def test_text_render_has_no_markdown_escapes() -> None:
    fragments = [routine(), frag("Timeouts of <NUM> [calls]", minute=5, until=20, records=9,
                                 severity="high", examples=["upstream <NUM> timed out [x]"])]
    report = report_of(*fragments)
    assert "Timeouts of \\<NUM\\> \\[calls\\]" in render_markdown(report)
    text = render_text(report)
    assert "\\<" not in text and "**" not in text
    assert "Timeouts of <NUM> [calls]" in text and "upstream <NUM> timed out [x]" in text


def test_a_change_incident_of_several_alerts_shows_the_one_about_this_incident() -> None:
    alerts = frag("Alert fired", minute=13.5, until=40, records=2, severity="low",
                  service="monitoring", template="alert <*> firing",
                  examples=["alert DiskFull /var/spool firing", "alert PoolExhausted firing"])
    alerts.evidence.append(Evidence(template="alert PoolExhausted <*>", count=1,
                                    examples=["alert PoolExhausted firing"]))
    alerts.evidence[0].examples[:] = ["alert DiskFull /var/spool firing"]
    pool = frag("Connection pool exhausted", minute=13, until=26, records=12, severity="high",
                service="payments")
    pm = derive(report_of(routine(), pool, alerts))
    assert pm.episodes[0].detection is not None
    assert pm.episodes[0].detection.detail == "alert PoolExhausted firing"


def test_user_reports_are_impact_but_a_user_login_failure_is_a_failure() -> None:
    fragments = [routine(),
                 frag("Connection refused", minute=5, until=20, records=30, severity="high"),
                 frag("Users report problems", minute=6, until=19, records=4,
                      examples=["why was I charged twice?"]),
                 frag("User login failures", minute=7, until=18, records=9, severity="high")]
    pm = derive(report_of(*fragments))
    assert [c.title for c in pm.users] == ["Users report problems"]
    assert "User login failures" in [c.title for c in pm.causes]
    assert "Users: 4 report(s), e.g. `why was I charged twice?`" in render_markdown(
        report_of(*fragments))


def test_entities_counted_over_all_records_win_over_the_examples() -> None:
    """The batch stage counted the addresses over all 900 records; the few examples
    would name a different, rarer one first."""
    fragment = frag("Authentication failures", minute=5, until=50, records=900,
                    severity="high",
                    examples=["Failed password for root from 192.168.7.9 port 22 ssh2"])
    fragment.evidence[0].entities = {"ip 10.1.2.3": 580, "ip 192.168.7.9": 3}
    report = report_of(routine(), fragment)
    md = render_markdown(report)
    assert "top entities: `ip 10.1.2.3` x580" in md, md
    assert "top entities in evidence" not in md


# ------------------------------------------------------------ counts, origin, severity


def steady(event: str, *, service: str, records: int, severity: str = "high",
           template: str | None = None) -> Fragment:
    """Errors at a constant rate through the whole hour: chronic background."""
    return frag(event, minute=0, until=59, records=records, service=service,
                severity=severity, template=template)


def test_chronic_errors_are_listed_below_the_incident_never_as_its_cause() -> None:
    fragments = [routine(), steady("Mail delivery deferred", service="relay", records=120),
                 frag("Disk full", minute=30, until=33, records=40, service="db")]
    pm = derive(report_of(*fragments))
    assert [c.title for c in pm.chronic] == ["Mail delivery deferred"]
    assert pm.chronic[0].severity == "low" and "chronic" in (pm.chronic[0].anomaly or "")
    assert all(c.title != "Mail delivery deferred" for ep in pm.episodes for c in ep.causes)
    assert pm.title.startswith("Disk full")
    md = render_markdown(report_of(*fragments))
    assert "## Chronic and quiet signals" in md and "Mail delivery deferred" in md


def test_the_same_errors_in_a_burst_are_the_incident() -> None:
    burst = frag("Mail delivery deferred", minute=30, until=33, records=120, service="relay",
                 severity="high")
    pm = derive(report_of(routine(), burst))
    assert not pm.chronic and pm.title.startswith("Mail delivery deferred")
    assert "120 records in its peak" in (pm.episodes[0].causes[0].anomaly or "")
    # impact is the burst's span, not the window's
    assert pm.episodes[0].first_seen == at(30) and pm.episodes[0].last_seen == at(33)


def test_a_burst_within_steady_errors_dates_the_impact_by_the_burst() -> None:
    fragments = [routine(), steady("Timeouts", service="api", records=60),
                 frag("Timeouts", minute=40, until=42, records=90, service="api")]
    pm = derive(report_of(*fragments))
    cause = pm.episodes[0].causes[0]
    assert (cause.anomaly or "").startswith("burst")
    assert cause.first_seen == at(40) and cause.last_seen == at(42)


def test_one_service_alone_is_at_most_medium_errors_across_services_stay_high() -> None:
    alone = derive(report_of(routine(), frag("Disk full", minute=30, until=33, records=40,
                                             service="db", severity="high")))
    assert alone.episodes[0].top.severity == "medium"
    both = derive(report_of(
        routine(), frag("Disk full", minute=30, until=33, records=40, service="db",
                        severity="high"),
        frag("Timeouts", minute=31, until=34, records=60, service="api", severity="high")))
    assert {c.severity for c in both.episodes[0].causes} == {"high"}


def test_a_user_facing_symptom_keeps_one_service_high() -> None:
    pm = derive(report_of(routine(), frag("HTTP 503 answers", minute=30, until=33, records=40,
                                          service="web", severity="high")))
    assert pm.episodes[0].top.severity == "high"


def test_the_service_callers_name_is_the_origin_in_title_and_first_sentence() -> None:
    callers = [frag("Service discovery: no instances of a downstream service", minute=31,
                    until=34, records=60, service=svc, severity="high",
                    examples=["No instances available for inventory-service"])
               for svc in ("checkout", "cart")]
    own = frag("Unclassified ERROR events", minute=30, until=34, records=9,
               service="com.example.InventoryServiceImpl",
               cause="unclassified ERROR events: stock lookup failed",
               template="stock lookup failed")
    pm = derive(report_of(routine(), *callers, own))
    ep = pm.episodes[0]
    assert ep.origin is not None and ep.origin.service == "com.example.InventoryServiceImpl"
    assert "InventoryServiceImpl" in pm.title
    assert pm.summary[0].startswith("Suspected origin: com.example.InventoryServiceImpl, "
                                    "first anomaly at 09:30:00")
    assert "checkout" in pm.summary[0] and "are its impact" in pm.summary[0]


def test_warnings_in_a_window_too_short_for_a_baseline_fold_errors_count() -> None:
    def one_minute(level: str, text: str) -> Fragment:
        return frag(f"Unclassified {level} events", minute=0, until=0.9, records=12,
                    severity="low" if level == "WARN" else "medium",
                    cause=f"unclassified {level} events: {text}", template=text)

    pm = derive(report_of(one_minute("WARN", "order not found"),
                          one_minute("ERROR", "price lookup threw")))
    assert [c.title for c in pm.causes] == ["Unusual ERROR: price lookup threw"]
    assert pm.folded_unclassified == (1, 12)


def test_a_service_that_went_silent_is_named() -> None:
    talker = frag("Routine activity", minute=0, until=40, records=400, service="rates",
                  severity="info", cause="routine activity with no error signals",
                  template="quote served in <NUM> ms")
    pm = derive(report_of(routine(), talker))
    assert pm.silent == [("rates", at(41))]
    assert "`rates` went silent at 09:41:00" in render_markdown(report_of(routine(), talker))


def test_failed_requests_shared_through_trace_ids_point_at_the_dependency() -> None:
    def failing(event: str, service: str, minute: float, traces: list[str]) -> Fragment:
        f = frag(event, minute=minute, until=minute + 3, records=30, service=service,
                 severity="high", examples=[f"{event.lower()} for this request"])
        f.evidence[0].traces = sorted(traces)
        return f

    shared = [f"{n:032x}" for n in range(1, 7)]  # each caller shares 3 requests with it
    pm = derive(report_of(routine(), failing("Checkout page errors", "web", 30.1, shared[:3]),
                          failing("Basket call failures", "mobile-bff", 30.2, shared[3:]),
                          failing("Stock lookups failing", "inventory", 30.5, shared)))
    origin = pm.episodes[0].origin
    assert origin is not None and origin.service == "inventory"  # linked to both callers
    assert set(origin.callers) >= {"web", "mobile-bff"}


def test_a_log_that_begins_mid_failure_is_titled_by_it_but_never_pages() -> None:
    report = report_of(routine(until=3))
    minutes = [f"2026-11-29T09:0{m}" for m in range(3)]
    report.series = {
        "api": {**steady_api(minutes),
                "payment call failed": Series(level="ERROR", minutes=dict.fromkeys(minutes, 8),
                                              first_seen="2026-11-29T09:00:12Z")},
        "db": {"query ok": Series(level="INFO", minutes=dict.fromkeys(minutes, 30))}}
    pm = derive(report)
    assert pm.title == "api: already failing when the log begins"
    assert pm.summary[0].startswith("api was already failing when the log begins, at 09:00:12")
    assert not alerts_for(report)
    # a departure of medium severity or more leads instead
    report.series["db"]["deadlock detected"] = Series(
        level="ERROR", minutes={minutes[2]: 30}, first_seen="2026-11-29T09:02:05Z")
    assert derive(report).title == "db: a new error"
    # both as `retro report --format json` prints them, as the schema describes them
    doc = json.loads(render_json(report))
    jsonschema.validate(doc, json.loads((ROOT / "schemas" / "report.schema.json").read_text()))
    assert [(i["origin"], i["evidence"][0]["kind"]) for i in doc["postmortem"]["incidents"]
            ] == [("db", "new"), ("api", "standing")]


def test_a_low_slowdown_measured_on_minutes_of_past_leads_lines_with_none() -> None:
    """api was failing when the log began; db's calls slowed later, too few to be
    medium. Measured against two minutes of the log, db's slowdown titles the report;
    against one, it is as much a guess as api's errors, which title it."""
    minutes = [f"2026-11-29T09:0{m}" for m in range(5)]

    def slowed_at(minute: int, slow: int) -> Report:
        report = report_of(routine(until=5))
        report.series = {
            "api": {**steady_api(minutes), "payment call failed": Series(
                level="ERROR", minutes=dict.fromkeys(minutes, 8),
                first_seen="2026-11-29T09:00:12Z")},
            "db": {"query ok": Series(level="INFO", minutes=dict.fromkeys(minutes, 300))}}
        report.hops = {"db": {m: {"7": 40 - slow, "14": slow} if m == minutes[minute]
                              else {"7": 40} for m in minutes}}
        return report

    later = slowed_at(3, slow=4)
    pm = derive(later)
    assert [(i.origin, i.severity) for i in pm.incidents] == [("db", "low"), ("api", "low")]
    assert pm.title == "db: calls into it slowed"
    assert pm.summary[0].startswith("db departed from its baseline at 09:03:00 (low)")
    soon = slowed_at(1, slow=6)
    pm = derive(soon)
    assert [(i.origin, i.severity) for i in pm.incidents] == [("db", "low"), ("api", "low")]
    assert pm.title == "api: already failing when the log begins"


def slowed_db(report: Report) -> Report:
    """``report`` with api's steady lines and calls into db: about 8 ms a call, 90 from
    09:30 on."""
    minutes = [f"2026-11-29T09:{m:02d}" for m in range(40)]
    report.series = {"api": steady_api(minutes)}
    report.hops = {"db": {m: ({"7": 10} if m < "2026-11-29T09:30" else {"14": 10})
                          for m in minutes}}
    return report


def test_a_service_whose_calls_slowed_leads_in_its_own_words() -> None:
    report = slowed_db(report_of(routine(until=40)))
    pm = derive(report)
    assert pm.title == "db: calls into it slowed"
    assert pm.summary[0].startswith("db departed from its baseline at 09:30:00 (high): slow: "
                                    "10 calls into it took 4x its usual or longer")
    doc = json.loads(render_json(report))
    jsonschema.validate(doc, json.loads((ROOT / "schemas" / "report.schema.json").read_text()))
    assert doc["postmortem"]["incidents"][0]["evidence"][0]["kind"] == "slow"


def test_the_first_minutes_of_a_window_are_judged_against_the_window_before() -> None:
    evening = [f"2026-11-28T23:{m:02d}" for m in range(60)]
    midnight = [f"2026-11-29T00:{m:02d}" for m in range(3)]

    def lines(minutes: list[str], released: int) -> dict[str, dict[str, Series]]:
        return {"db": {"lock taken": Series(level="INFO", minutes=dict.fromkeys(minutes, 20)),
                       "lock released": Series(level="INFO",
                                               minutes=dict.fromkeys(minutes, released))},
                "api": {"GET done": Series(level="INFO", minutes=dict.fromkeys(minutes, 50))}}

    yesterday, today = report_of(routine(until=3)), report_of(routine(until=3))
    yesterday.series, today.series = lines(evening, 20), lines(midnight, 4)
    assert derive(today).incidents == []  # alone, three minutes teach it nothing
    today.follows(yesterday)
    incidents = derive(today).incidents
    assert [(i.origin, i.evidence[0].kind) for i in incidents] == [("db", "thin")]
    assert incidents[0].started == "2026-11-29T00:00:00Z"


def test_the_episodes_suspected_origin_is_left_out_when_an_incident_of_another_leads(
) -> None:
    callers = [frag("Service discovery: no instances of a downstream service", minute=31,
                    until=34, records=60, service=svc, severity="high",
                    examples=["No instances available for inventory-service"])
               for svc in ("checkout", "cart")]
    own = frag("Unclassified ERROR events", minute=30, until=34, records=9,
               service="inventory-service", cause="unclassified ERROR events: stock lookup failed",
               template="stock lookup failed")
    report = report_of(routine(until=40), *callers, own)
    guessed = derive(report)
    assert guessed.suspected and guessed.suspected in guessed.summary
    pm = derive(slowed_db(report))
    assert pm.title == "db: calls into it slowed"
    assert pm.episodes[0].origin is not None and pm.episodes[0].origin.service != "db"
    assert not any(s.startswith("Suspected origin") for s in pm.summary)


def cart_errors(minute: float, until: float) -> Fragment:
    """checkout's own errors, a failure of no other service's making."""
    return frag("Null pointer in cart", minute=minute, until=until, records=40,
                service="checkout", severity="high", cause="cart total was null")


def beside_cart_errors(own: Fragment, cart: Fragment, minutes: list[str],
                       lines: dict[str, dict[str, Series]]) -> Report:
    """A report of ``own`` failing beside checkout's ``cart`` errors, ``lines`` added
    to api's steady ones over ``minutes``: the story after the title is ``own``'s alone,
    checkout's errors are another incident."""
    report = report_of(routine(until=len(minutes)), own, cart)
    report.series = {**lines, "api": {**steady_api(minutes), **lines.get("api", {})}}
    pm = derive(report)
    assert [c.title for c in pm.episodes[0].causes] == [own.event]
    assert [c.title for ep in pm.episodes[1:] for c in ep.causes] == ["Null pointer in cart"]
    assert "Null pointer in cart" in section(render_markdown(report), "Other incidents")
    return report


def section(markdown: str, title: str) -> str:
    """The text of one ``## title`` section of a rendered post-mortem."""
    return markdown.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_a_lead_no_error_tells_of_is_told_by_its_departures_and_errors_are_others(
) -> None:
    """db's calls slowed and nothing of db failed, while checkout threw errors of its
    own: the chain, the actions and the timeline are db's; checkout's errors are
    another incident, not db's story."""
    elsewhere = cart_errors(30, 34)
    report = slowed_db(report_of(routine(until=40), elsewhere))
    pm = derive(report)
    assert pm.lead is not None and pm.lead.origin == "db"
    markdown = render_markdown(report)
    chain = section(markdown, "Root cause chain")
    assert "`db`" in chain and "calls into it took 4x" in chain
    assert "**high** db: calls into it slowed\n" in section(markdown, "Incidents")
    assert "checkout" not in chain and "checkout" not in section(markdown, "Impact")
    assert "Null pointer in cart" in section(markdown, "Other incidents")
    assert pm.actions[0].text.startswith("Find what slowed calls into db")
    assert "separate incident: Null pointer in cart" in " ".join(w for _, w in pm.timeline)
    # without the slowdown the errors are the story again
    alone = derive(report_of(routine(until=40), elsewhere))
    assert alone.lead is None and alone.episodes[0].top.title == "Null pointer in cart"


def test_the_story_after_the_lead_holds_its_origins_causes_not_anothers() -> None:
    """db's new error leads; checkout's errors at the same minutes are no part of the
    chain told after it, but an incident of their own."""
    own = frag("Deadlock detected", minute=30, until=34, records=30, service="db",
               severity="high", template="deadlock detected on orders")
    minutes = [f"2026-11-29T09:{m:02d}" for m in range(40)]
    report = beside_cart_errors(own, cart_errors(30.5, 34), minutes, {
        "db": {"deadlock detected on orders": Series(
            level="ERROR", minutes={m: 8 for m in minutes[30:34]})}})
    assert derive(report).title == "db: a new error"
    # the same report without db's departure tells both as one story, as before
    report.series = {"api": report.series["api"]}
    assert sorted(c.title for c in derive(report).episodes[0].causes) == [
        "Deadlock detected", "Null pointer in cart"]


def test_a_window_whose_lead_no_error_tells_of_is_an_incident_among_windows() -> None:
    slowed = slowed_db(report_of(routine(until=40)))
    quiet = report_of(routine(until=40))
    quiet.id = "2026-11-28/all"
    first, second = rank_reports([quiet, slowed])
    assert first.report is slowed and first.significant and not second.significant
    assert one_line(first) == ("2026-11-29/all: db: calls into it slowed (high; ongoing at "
                               "the end of the logs)")


def test_a_window_led_by_a_severe_slowdown_comes_before_a_heavier_milder_one() -> None:
    """Windows are ranked by what their titles name first: db's high slowdown, which no
    error tells of, before another day's medium timeouts of many records."""
    slowed = slowed_db(report_of(routine(until=40)))
    busy = report_of(routine(until=40), frag("Timeouts", minute=5, until=30, records=400,
                                             service="api", severity="medium"))
    busy.id = "2026-11-28/all"
    first, second = rank_reports([busy, slowed])
    assert first.report is slowed and second.report is busy
    assert (first.severity, second.severity) == (SEVERITY_WEIGHT["high"],
                                                 SEVERITY_WEIGHT["medium"])
    assert second.weight > first.weight  # by records alone the timeouts came first


def test_a_log_begun_mid_failure_tells_the_causes_of_what_was_failing() -> None:
    """api was failing when the log began, and checkout threw errors of its own: the
    story after the title is api's, checkout's an incident of its own."""
    failing = frag("Payment call failed", minute=0, until=2.9, records=24, service="api",
                   severity="high", template="payment call failed")
    minutes = [f"2026-11-29T09:0{m}" for m in range(3)]
    report = beside_cart_errors(failing, cart_errors(0.5, 2.9), minutes, {"api": {
        "payment call failed": Series(level="ERROR", minutes=dict.fromkeys(minutes, 8),
                                      first_seen="2026-11-29T09:00:12Z")}})
    assert derive(report).title == "api: already failing when the log begins"


def test_a_lead_is_told_from_its_own_minutes_of_a_cause_that_recurs() -> None:
    """db's deadlocks came twice, at 09:05 and from 09:30, and batch wrote the same
    line at 09:31 without calling db: one cause of the report. The story of the incident
    from 09:30 tells db's records of its minutes; the rest is told as the incidents it
    was."""
    minutes = [f"2026-11-29T09:{m:02d}" for m in range(40)]
    deadlock = "deadlock detected on orders"

    def deadlocks(service: str, minute: float, until: float, records: int) -> Fragment:
        return frag("Deadlock detected", minute=minute, until=until, records=records,
                    service=service, severity="high", template=deadlock)

    report = report_of(routine(until=40), deadlocks("db", 5, 6.9, 12),
                       deadlocks("db", 30, 33.9, 32), deadlocks("batch", 31, 31.9, 5))
    counts = {"db": {**dict.fromkeys(minutes[5:7], 6), **dict.fromkeys(minutes[30:34], 8)},
              "batch": {minutes[31]: 5}}
    report.series = {
        "api": steady_api(minutes),
        **{service: {deadlock: Series(level="ERROR", minutes=m,
                                      starts={k: f"{k}:07.000Z" for k in m})}
           for service, m in counts.items()}}
    pm = derive(report)
    top = pm.incidents[0]
    assert (top.origin, top.started) == ("db", "2026-11-29T09:30:07Z")
    told = pm.episodes[0].causes
    assert [(c.title, c.count, c.services, c.first_seen) for c in told] == [
        ("Deadlock detected", 32, ["db"], "2026-11-29T09:30:00.000Z")]  # its burst's start
    # the rest is told as the other incidents: db's at 09:05, batch's at 09:31
    others = [[(c.count, c.services, c.first_seen) for c in ep.causes]
              for ep in pm.episodes[1:]]
    assert sorted(others) == [[(5, ["batch"], "2026-11-29T09:31:07.000Z")],
                              [(12, ["db"], "2026-11-29T09:05:07.000Z")]]
    markdown = render_markdown(report)
    assert "`09:30:00` **Deadlock detected** (medium, 32 records, `db`)" in section(
        markdown, "Root cause chain")
    assert "09:05" not in section(markdown, "Impact")
    # each headed by its incident, as the list of incidents names it
    assert "`09:05:07`-`09:07:00` **db: a new error** (medium): Deadlock detected (medium, " \
           "12 records) in db\n" in section(markdown, "Other incidents")
    assert "separate incident: batch: a new error (Deadlock detected in batch) until " \
           "09:32:00" in section(markdown, "Timeline")
    # each incident in the list says which line departed
    assert "`09:30:07`-`09:34:00` **high** db: a new error: `deadlock detected on orders`" \
        in section(markdown, "Incidents")


def test_a_part_of_a_cause_is_high_only_as_a_whole_cause_would_be() -> None:
    """db's deadlocks are high: at 09:05 they burst beside api's timeouts calling db.
    Their part in that incident stays high, beside api's; their part at 09:30, with
    nothing else failing then, is medium, as a cause of one service alone is; unless a
    caller logs the same deadlocks then: a part in two services is high by itself."""
    minutes = [f"2026-11-29T09:{m:02d}" for m in range(40)]
    deadlock, timeout = "deadlock detected on orders", "timed out calling db"
    report_fragments = [
        routine(until=40),
        frag("Deadlock detected", minute=5, until=7.9, records=30, service="db",
             severity="high", template=deadlock),
        frag("Deadlock detected", minute=30, until=32.9, records=18, service="db",
             severity="high", template=deadlock),
        frag("Payment timeouts", minute=5, until=7.9, records=30, service="api",
             severity="high", template=timeout)]
    report = report_of(*report_fragments)
    db = {**dict.fromkeys(minutes[5:8], 10), **dict.fromkeys(minutes[30:33], 6)}
    series = {
        "api": {**steady_api(minutes),
                timeout: Series(level="ERROR", minutes=dict.fromkeys(minutes[5:8], 10),
                                named={"db": 30})},
        "db": {deadlock: Series(level="ERROR", minutes=db)}}
    report.series = series
    pm = derive(report)
    told = {ep.incident.started[11:16]: sorted((c.title, c.count, c.severity)
                                               for c in ep.causes)
            for ep in pm.episodes if ep.incident is not None}
    assert told == {"09:05": [("Deadlock detected", 30, "high"), ("Payment timeouts", 30, "high")],
                    "09:30": [("Deadlock detected", 18, "medium")]}
    report = report_of(*report_fragments, frag(
        "Deadlock detected", minute=30, until=32.9, records=18, service="batch",
        severity="high", template=deadlock))
    report.series = {**series, "batch": {deadlock: Series(
        level="ERROR", minutes=dict.fromkeys(minutes[30:33], 6), named={"db": 18})}}
    [at_half_past] = [ep.causes for ep in derive(report).episodes
                      if ep.incident is not None and ep.incident.started[11:16] == "09:30"]
    assert [(c.title, c.services, c.severity) for c in at_half_past] == [
        ("Deadlock detected", ["batch", "db"], "high")]


def test_a_failures_last_lines_go_with_its_incident_up_to_the_next_one() -> None:
    """db's deadlocks at 09:10, one more at 09:13, and again at 09:16: two incidents.
    The line at 09:13 is the first one winding down, told with it; the records at
    09:16 are the second's, however close."""
    minutes = [f"2026-11-29T09:{m:02d}" for m in range(30)]
    deadlock = "deadlock detected on orders"
    counts = {minutes[10]: 20, minutes[11]: 20, minutes[13]: 1, minutes[16]: 8}
    report = report_of(routine(until=30), *(
        frag("Deadlock detected", minute=m, until=m + 0.9, records=n, service="db",
             severity="high", template=deadlock) for m, n in ((10, 40), (13, 1), (16, 8))))
    report.series = {
        "api": steady_api(minutes),
        "db": {deadlock: Series(level="ERROR", minutes=counts,
                                starts={k: f"{k}:05.000Z" for k in counts})}}
    pm = derive(report)
    assert [i.started for i in pm.incidents] == ["2026-11-29T09:10:05Z",
                                                 "2026-11-29T09:16:05Z"]
    told = [[(c.first_seen, c.last_seen, c.count) for c in ep.causes] for ep in pm.episodes]
    assert told == [[("2026-11-29T09:10:00.000Z", "2026-11-29T09:14:00Z", 41)],
                    [("2026-11-29T09:16:05.000Z", "2026-11-29T09:16:54.000Z", 8)]]


def test_what_incidents_leave_of_a_cause_is_told_only_when_it_departs_itself() -> None:
    """db writes a deadlock every ten minutes all morning and bursts at 10:00: the burst
    is the incident, and the scattered rest is background, not another incident."""
    minutes = [(START + timedelta(minutes=m)).strftime("%Y-%m-%dT%H:%M") for m in range(120)]
    deadlock = "deadlock detected on orders"
    scattered = [m for m in range(5, 120, 10) if not 55 <= m <= 70]
    counts = {**{minutes[m]: 1 for m in scattered}, **dict.fromkeys(minutes[60:64], 8)}
    report = report_of(routine(until=120, records=2000), *(
        frag("Deadlock detected", minute=m, until=m + 0.5, records=1, service="db",
             severity="high", template=deadlock) for m in scattered),
        frag("Deadlock detected", minute=60, until=63.9, records=32, service="db",
             severity="high", template=deadlock))
    report.series = {
        "api": steady_api(minutes),
        "db": {deadlock: Series(level="ERROR", minutes=counts)}}
    pm = derive(report)
    assert [(i.origin, i.started[11:16]) for i in pm.incidents] == [("db", "10:00")]
    assert [(c.title, c.count) for c in pm.episodes[0].causes] == [("Deadlock detected", 32)]
    assert [c.title for ep in pm.episodes[1:] for c in ep.causes] == []


def test_the_impact_of_a_lead_names_its_callers() -> None:
    """inventory-service failed and four services failed calling it: the impact says so,
    as the summary does, and the list of incidents says there were more than it shows."""
    minutes = [f"2026-11-29T09:{m:02d}" for m in range(40)]
    stock, callee = "stock lookup failed", "No instances available for inventory-service"
    callers = ["cart", "checkout", "orders", "search"]
    report = report_of(
        routine(until=40),
        frag("Stock lookups failing", minute=30, until=33.9, records=32,
             service="inventory-service", severity="high", template=stock),
        *(frag("Service discovery: no instances of a downstream service", minute=30,
               until=33.9, records=32, service=caller, severity="high", template=callee)
          for caller in callers))
    failing = dict.fromkeys(minutes[30:34], 8)
    report.series = {
        "api": steady_api(minutes),
        "inventory-service": {stock: Series(level="ERROR", minutes=failing)},
        **{caller: {callee: Series(level="ERROR", minutes=failing,
                                   named={"inventory-service": 32})} for caller in callers}}
    pm = derive(report)
    assert (pm.incidents[0].origin, pm.incidents[0].callers) == ("inventory-service", callers)
    markdown = render_markdown(report)
    assert "- Callers: cart, checkout, orders and 1 more failed calling it\n" in section(
        markdown, "Impact")
    assert "(callers: cart, checkout, orders and 1 more)" in section(markdown, "Incidents")
