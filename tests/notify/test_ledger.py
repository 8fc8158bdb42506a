"""Deciding changes: each open, escalation and end once, whatever is read again."""

from __future__ import annotations

import json
from typing import Any

from streams.notify.incidents import Alert
from streams.notify.ledger import MAX_ENTRIES, Notices, Planner

RID = "2026-11-29/all"


def alert(severity: str = "high", *, keys: tuple[str, ...] = ("k1", "k2"), ended: bool = False,
          closed: bool = False, title: str = "Pool exhausted in api", **more: Any) -> Alert:
    fields: dict[str, Any] = {
        "report_id": RID, "keys": keys, "service": "api", "severity": severity, "title": title,
        "summary": "3 services failed.", "origin": "api, first anomaly at 10:00",
        "first_seen": "2026-11-29T10:00:00.000Z", "last_seen": "2026-11-29T10:05:00.000Z",
        "ended": ended or closed, "closed": closed}
    return Alert(**(fields | more))


def kinds(notices: Notices) -> list[list[tuple[str, str]]]:
    return [[(c.kind, c.severity) for c in e.changes] for e in notices.entries]


def test_an_incident_opens_once_however_often_its_version_is_read() -> None:
    planner, notices = Planner(), Notices(report_id=RID)
    assert planner.plan(notices, [alert()], now="t0", mono=0)
    for mono in range(1, 5):  # the same version, read again
        assert not planner.plan(notices, [alert()], now="t1", mono=mono)
    assert kinds(notices) == [[("opened", "high")]]
    entry = notices.entries[0]
    assert (entry.id, entry.service, entry.change_key(0)) == ("k1", "api", f"{RID}/k1/0:opened")


def test_below_the_minimum_nothing_opens_until_it_rises_to_it() -> None:
    planner, notices = Planner(min_severity="high"), Notices(report_id=RID)
    assert not planner.plan(notices, [alert("medium")], now="t0", mono=0)
    assert planner.plan(notices, [alert("high")], now="t1", mono=1)
    assert kinds(notices) == [[("opened", "high")]]


def test_severity_that_rises_escalates_once_and_never_steps_down() -> None:
    planner, notices = Planner(min_severity="medium"), Notices(report_id=RID)
    for n, sev in enumerate(["medium", "high", "high", "medium", "critical", "high",
                             "critical"]):
        planner.plan(notices, [alert(sev)], now=f"t{n}", mono=n)
    assert kinds(notices) == [[("opened", "medium"), ("escalated", "high"),
                               ("escalated", "critical")]]
    assert notices.entries[0].severity == "critical"
    assert notices.entries[0].severities == ["medium", "high", "critical"]


def test_an_end_waits_until_the_logs_have_shown_it_for_end_after() -> None:
    planner, notices = Planner(end_after=60), Notices(report_id=RID)
    planner.plan(notices, [alert()], now="t0", mono=0)
    assert not planner.plan(notices, [alert(ended=True)], now="t1", mono=10)
    # a share caught up: it goes on; the wait starts again from the next ended look
    assert not planner.plan(notices, [alert()], now="t2", mono=40)
    assert not planner.plan(notices, [alert(ended=True)], now="t3", mono=50)
    assert not planner.plan(notices, [alert(ended=True)], now="t3", mono=75)  # 65 s after t1
    assert not planner.plan(notices, [alert(ended=True)], now="t4", mono=109)
    assert planner.plan(notices, [alert(ended=True)], now="t5", mono=110)
    assert kinds(notices) == [[("opened", "high"), ("ended", "high")]]
    end = notices.entries[0].changes[-1]
    assert (end.why, end.at, end.last_seen) == ("resolved", "t5", "2026-11-29T10:05:00.000Z")
    assert not planner.plan(notices, [alert(ended=True)], now="t6", mono=500)


def test_an_incident_no_longer_in_the_report_ends_as_gone() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    planner.plan(notices, [alert()], now="t0", mono=0)
    assert planner.plan(notices, [], now="t1", mono=1)
    end = notices.entries[0].changes[-1]
    assert (end.kind, end.why, end.title) == ("ended", "gone", "Pool exhausted in api")


def test_a_restart_reads_the_ledger_and_decides_nothing_again() -> None:
    first, notices = Planner(end_after=0), Notices(report_id=RID)
    first.plan(notices, [alert("high")], now="t0", mono=0)
    first.plan(notices, [alert("critical")], now="t1", mono=1)
    notices.entries[0].delivered["webhook"] = 2
    stored = notices.to_bytes()
    again = Notices.from_bytes(stored)
    restarted = Planner(end_after=0)
    assert not restarted.plan(again, [alert("critical")], now="t9", mono=0)
    assert again.to_bytes() == stored
    assert again.entries[0].owed("webhook") == 0 and again.entries[0].owed("alertmanager") == 2


def test_an_incident_is_recognised_by_any_key_it_shares_and_keeps_the_new_ones() -> None:
    planner, notices = Planner(), Notices(report_id=RID)
    planner.plan(notices, [alert(keys=("k1",))], now="t0", mono=0)
    # the root cause is now another incident; one key in common is the same incident
    assert planner.plan(notices, [alert(keys=("k0", "k1"))], now="t1", mono=1)
    assert len(notices.entries) == 1 and notices.entries[0].keys == ["k1", "k0"]
    assert not planner.plan(notices, [alert(keys=("k0",))], now="t2", mono=2)
    assert kinds(notices) == [[("opened", "high")]]


def test_two_incidents_at_once_are_two_entries_matched_by_their_own_keys() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    a, b = alert(keys=("a1",), title="A"), alert(keys=("b1",), title="B", service="db")
    planner.plan(notices, [a, b], now="t0", mono=0)
    planner.plan(notices, [alert("critical", keys=("b1",)), a], now="t1", mono=1)
    assert [e.id for e in notices.entries] == ["a1", "b1"]
    assert kinds(notices) == [[("opened", "high")], [("opened", "high"), ("escalated", "critical")]]
    assert notices.entries[1].service == "db"


def test_an_ended_incident_failing_again_is_a_new_incident() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    planner.plan(notices, [alert()], now="t0", mono=0)
    planner.plan(notices, [alert(ended=True)], now="t1", mono=1)
    assert not planner.plan(notices, [alert(ended=True)], now="t2", mono=2)  # still over
    assert planner.plan(notices, [alert()], now="t3", mono=3)
    assert [e.id for e in notices.entries] == ["k1", "k1-2"]
    assert kinds(notices)[1] == [("opened", "high")]


def test_an_incident_already_over_when_first_seen_opens_then_ends() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    assert planner.plan(notices, [alert(ended=True)], now="t0", mono=0)
    assert planner.plan(notices, [alert(ended=True)], now="t1", mono=1)
    assert kinds(notices) == [[("opened", "high"), ("ended", "high")]]


def test_a_closed_window_opens_nothing_and_ends_what_was_open() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    assert not planner.plan(notices, [alert(closed=True)], now="t0", mono=0)
    planner.plan(notices, [alert()], now="t1", mono=1)
    assert planner.plan(notices, [alert(closed=True)], now="t2", mono=2)
    assert notices.entries[0].changes[-1].why == "window closed"


def test_the_ledger_keeps_a_bounded_number_of_incidents() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    for n in range(MAX_ENTRIES + 10):
        planner.plan(notices, [alert(keys=(f"k{n}",))], now=f"t{n}", mono=2 * n)
        planner.plan(notices, [], now=f"t{n}", mono=2 * n + 1)  # it ends
    assert len(notices.entries) == MAX_ENTRIES
    assert notices.entries[-1].id == f"k{MAX_ENTRIES + 9}"


def test_a_ledger_follows_its_json_schema() -> None:
    from streams.notify.ledger import Change, Entry
    from streams.schemas import load_schema, validator

    planner, notices = Planner(min_severity="medium", end_after=0), Notices(report_id=RID)
    for n, a in enumerate([alert("medium"), alert("critical"), alert(ended=True)]):
        planner.plan(notices, [a], now=f"2026-12-01T07:0{n}:00.000Z", mono=n)
    notices.entries[0].delivered = {"webhook": 3, "alertmanager": 2}
    doc = json.loads(notices.to_bytes())
    assert [e.message for e in validator("notices").iter_errors(doc)] == []
    doc["entries"][0]["changes"][0]["kind"] = "snoozed"
    assert list(validator("notices").iter_errors(doc))
    schema = load_schema("notices")
    for model, props in ((Notices, schema["properties"]),
                         (Entry, schema["$defs"]["entry"]["properties"]),
                         (Change, schema["$defs"]["change"]["properties"])):
        assert set(props) == set(model.model_fields), model
