"""Deciding changes: each open, escalation and end once, whatever is read again, and
one page per incident however report versions move, split or merge its minutes."""

from __future__ import annotations

import json
from typing import Any

from streams.notify.incidents import Alert
from streams.notify.ledger import MAX_ENTRIES, Notices, Planner, recognised

RID = "2026-11-29/all"


def at(minute: int) -> str:
    """10:00 plus ``minute`` minutes, as incidents give their times."""
    return f"2026-11-29T{10 + minute // 60:02d}:{minute % 60:02d}:00Z"


def alert(severity: str = "high", *, service: str = "api", start: int = 0, end: int = 5,
          callers: tuple[str, ...] = (), ended: bool = False, closed: bool = False,
          title: str = "api: a new error", **more: Any) -> Alert:
    fields: dict[str, Any] = {
        "report_id": RID, "service": service, "severity": severity, "started": at(start),
        "last_seen": at(end), "title": title, "summary": f"{service} departed.",
        "callers": callers, "services": tuple(sorted({service, *callers})),
        "evidence": (f"{service}: payment failed <*> (new line, 6 in its first minute)",),
        "ended": ended or closed, "closed": closed}
    return Alert(**(fields | more))


def kinds(notices: Notices) -> list[list[tuple[str, str]]]:
    return [[(c.kind, c.severity) for c in e.changes] for e in notices.entries]


def opened(notices: Notices) -> list[str]:
    return [e.id for e in notices.entries for c in e.changes if c.kind == "opened"]


def test_an_incident_opens_once_however_often_its_version_is_read() -> None:
    planner, notices = Planner(), Notices(report_id=RID)
    assert planner.plan(notices, [alert()], now="t0", mono=0)
    for mono in range(1, 5):  # the same version, read again
        assert not planner.plan(notices, [alert()], now="t1", mono=mono)
    assert kinds(notices) == [[("opened", "high")]]
    entry = notices.entries[0]
    assert (entry.id, entry.service) == ("api@2026-11-29T10:00", "api")
    assert entry.change_key(0) == f"{RID}/api@2026-11-29T10:00/0:opened"
    assert (entry.first_seen, entry.last_seen) == (at(0), at(5))


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


def test_callers_that_grow_escalate_once_each_and_one_that_comes_back_says_nothing() -> None:
    planner, notices = Planner(), Notices(report_id=RID)
    for n, callers in enumerate([(), ("checkout",), ("checkout",), (), ("checkout",),
                                 ("checkout", "web")]):
        planner.plan(notices, [alert(callers=callers)], now=f"t{n}", mono=n)
    changes = notices.entries[0].changes
    assert [(c.kind, c.severity, c.callers) for c in changes] == [
        ("opened", "high", []), ("escalated", "high", ["checkout"]),
        ("escalated", "high", ["checkout", "web"])]


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
    assert (end.why, end.at, end.last_seen) == ("resolved", "t5", at(5))
    assert not planner.plan(notices, [alert(ended=True)], now="t6", mono=500)


def test_an_incident_no_longer_in_the_report_ends_as_gone() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    planner.plan(notices, [alert()], now="t0", mono=0)
    assert planner.plan(notices, [], now="t1", mono=1)
    end = notices.entries[0].changes[-1]
    assert (end.kind, end.why, end.title) == ("ended", "gone", "api: a new error")


def test_a_restart_reads_the_ledger_and_decides_nothing_again() -> None:
    first, notices = Planner(end_after=0), Notices(report_id=RID)
    first.plan(notices, [alert("high")], now="t0", mono=0)
    first.plan(notices, [alert("critical", start=-2, end=9)], now="t1", mono=1)
    notices.entries[0].delivered["webhook"] = 2
    stored = notices.to_bytes()
    again = Notices.from_bytes(stored)
    restarted = Planner(end_after=0)
    # the span it grew to is in the ledger: a version of the late minutes only is it too
    assert not restarted.plan(again, [alert("critical", start=7, end=9)], now="t9", mono=0)
    assert again.to_bytes() == stored
    assert again.entries[0].owed("webhook") == 0 and again.entries[0].owed("alertmanager") == 2


def test_a_start_that_moves_as_late_records_come_is_the_same_incident() -> None:
    planner, notices = Planner(), Notices(report_id=RID)
    planner.plan(notices, [alert(start=3, end=6)], now="t0", mono=0)
    # late records: it began earlier; then the baseline judged its first minutes usual
    assert planner.plan(notices, [alert(start=1, end=7)], now="t1", mono=1)
    assert not planner.plan(notices, [alert(start=5, end=7)], now="t2", mono=2)
    assert opened(notices) == ["api@2026-11-29T10:03"]  # the id it opened with stays
    assert (notices.entries[0].first_seen, notices.entries[0].last_seen) == (at(1), at(7))


def test_a_version_that_splits_a_paged_run_in_two_pages_nothing_again() -> None:
    """One run paged; a later version judges a minute in its middle otherwise, so the
    report holds two incidents where it held one: both are the incident paged, which
    follows them and ends once both have."""
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    planner.plan(notices, [alert(start=0, end=20)], now="t0", mono=0)
    split = [alert(start=0, end=8), alert("critical", start=14, end=20, callers=("web",))]
    assert planner.plan(notices, split, now="t1", mono=1)  # the second piece escalates it
    for n in range(2, 6):  # the versions flip between one run and two
        planner.plan(notices, [alert(start=0, end=20)] if n % 2 else split, now=f"t{n}", mono=n)
    assert opened(notices) == ["api@2026-11-29T10:00"]
    assert kinds(notices) == [[("opened", "high"), ("escalated", "critical")]]
    # the first piece is over, the second goes on: so does the incident
    assert not planner.plan(notices, [alert(start=0, end=8, ended=True), split[1]],
                            now="t6", mono=6)
    assert planner.plan(notices, [alert(start=0, end=8, ended=True),
                                  alert("critical", start=14, end=20, ended=True)],
                        now="t7", mono=7)
    assert kinds(notices)[0][-1] == ("ended", "critical")


def test_a_later_version_with_a_second_incident_pages_each_once() -> None:
    """An earlier version held one incident; a later one holds it and another, of the
    same origin after it and of another service: each is paged once, never twice."""
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    earlier = [alert(start=0, end=5)]
    later = [alert(start=0, end=6), alert(start=30, end=34),
             alert(service="db", start=2, end=6, title="db: a new error")]
    planner.plan(notices, earlier, now="t0", mono=0)
    for n in range(1, 6):  # read again, in either order
        planner.plan(notices, later if n % 2 else later[::-1], now=f"t{n}", mono=n)
    assert sorted(opened(notices)) == ["api@2026-11-29T10:00", "api@2026-11-29T10:30",
                                       "db@2026-11-29T10:02"]
    assert all(len(changes) == 1 for changes in kinds(notices))


def test_a_version_holding_a_run_split_in_two_pages_each_and_a_merge_pages_none() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    two = [alert(start=0, end=6), alert(start=10, end=16)]
    assert planner.plan(notices, two, now="t0", mono=0)
    assert opened(notices) == ["api@2026-11-29T10:00", "api@2026-11-29T10:10"]
    # a departure fills the gap: one incident, the one opened first follows it
    assert planner.plan(notices, [alert(start=0, end=16)], now="t1", mono=1)
    first, second = notices.entries
    assert first.open and [c.kind for c in second.changes] == ["opened", "ended"]
    assert second.changes[-1].why == "merged"
    assert "api@2026-11-29T10:00" in second.changes[-1].summary
    # and split again: the ended one still holds its minutes, nothing is paged again
    assert not planner.plan(notices, two, now="t2", mono=2)
    assert len(opened(notices)) == 2 and len(notices.entries) == 2


def test_an_incident_whose_origin_becomes_clearer_keeps_its_page() -> None:
    planner, notices = Planner(), Notices(report_id=RID)
    planner.plan(notices, [alert(service="checkout", start=1, end=4)], now="t0", mono=0)
    # its callee is now known: the incident is db's, checkout its caller
    clearer = alert("critical", service="db", start=0, end=5, callers=("checkout",))
    assert planner.plan(notices, [clearer], now="t1", mono=1)
    [entry] = notices.entries
    assert [(c.kind, c.origin) for c in entry.changes] == [("opened", "checkout"),
                                                          ("escalated", "db")]
    assert entry.service == "checkout"  # its labels stay as they were
    assert recognised(notices.entries, [clearer]) == [[entry]]


def test_two_incidents_at_once_are_two_entries_followed_each_by_its_own() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    a, b = alert(title="A"), alert(title="B", service="db")
    planner.plan(notices, [a, b], now="t0", mono=0)
    planner.plan(notices, [alert("critical", service="db"), a], now="t1", mono=1)
    assert [e.id for e in notices.entries] == ["api@2026-11-29T10:00", "db@2026-11-29T10:00"]
    assert kinds(notices) == [[("opened", "high")], [("opened", "high"), ("escalated", "critical")]]
    assert notices.entries[1].service == "db"


def test_an_ended_incident_is_not_paged_again_and_a_later_run_is_a_new_one() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    planner.plan(notices, [alert()], now="t0", mono=0)
    planner.plan(notices, [alert(ended=True)], now="t1", mono=1)
    assert not planner.plan(notices, [alert(ended=True)], now="t2", mono=2)  # still over
    assert not planner.plan(notices, [alert(start=0, end=7)], now="t3", mono=3)  # its minutes
    assert planner.plan(notices, [alert(start=0, end=7), alert(start=20, end=22)],
                        now="t4", mono=4)
    assert opened(notices) == ["api@2026-11-29T10:00", "api@2026-11-29T10:20"]


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


def test_the_ledger_keeps_a_bounded_number_of_incidents_and_opens_none_it_forgot() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    runs = [alert(start=10 * n, end=10 * n + 2) for n in range(MAX_ENTRIES + 10)]
    for n, run in enumerate(runs):
        planner.plan(notices, [run], now=f"t{n}", mono=2 * n)
        planner.plan(notices, [], now=f"t{n}", mono=2 * n + 1)  # it ends
    assert len(notices.entries) == MAX_ENTRIES
    assert notices.entries[-1].id == runs[-1].service + "@" + runs[-1].started[:16]
    assert notices.forgotten_until == runs[9].last_seen
    # a version holding every run again (ended) opens none of those trimmed off
    ended = [alert(start=10 * n, end=10 * n + 2, ended=True) for n in range(len(runs))]
    assert not planner.plan(notices, ended, now="t-last", mono=10_000)


def test_a_ledger_follows_its_json_schema() -> None:
    from streams.notify.ledger import Change, Entry
    from streams.schemas import load_schema, validator

    planner, notices = Planner(min_severity="medium", end_after=0), Notices(report_id=RID)
    for n, a in enumerate([alert("medium"), alert("critical", callers=("web",)),
                           alert(ended=True)]):
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


def test_fallen_volume_alone_pages_only_once_it_outlasts_a_catching_up_partition() -> None:
    planner, notices = Planner(silent_after=120), Notices(report_id=RID)
    quiet = alert(service="cart", title="cart: its volume fell", silent=True)
    assert not planner.plan(notices, [quiet], now="t0", mono=0)
    assert not planner.plan(notices, [quiet], now="t1", mono=100)
    # its records came (the partition caught up): it is gone, and nothing was paged
    assert not planner.plan(notices, [], now="t2", mono=110)
    assert not planner.plan(notices, [quiet], now="t3", mono=200)  # the wait starts again
    assert not planner.plan(notices, [quiet], now="t4", mono=319)
    assert planner.plan(notices, [quiet], now="t5", mono=320)
    assert opened(notices) == ["cart@2026-11-29T10:00"]
    # a failure of its own, or callers naming it, pages at once as before
    other = Notices(report_id=RID)
    assert planner.plan(other, [alert(service="cart")], now="t0", mono=0)
