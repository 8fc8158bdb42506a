"""Alertmanager alerts and chat messages as they go out."""

from __future__ import annotations

from datetime import UTC, datetime

from streams.notify.ledger import Notices, Planner
from streams.notify.messages import (
    ALERTNAME,
    alertmanager_alerts,
    report_link,
    webhook_message,
)
from streams.settings import Settings
from tests.notify.test_ledger import RID, alert, at

NOW = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
LINK = "https://retro.example.com/view/2026-11-29/all"
ID = "api@2026-11-29T10:00"


def history(*steps: tuple[str, bool]) -> Notices:
    """A ledger after one planning round per (severity, ended) step."""
    planner, notices = Planner(min_severity="medium", end_after=0), Notices(report_id=RID)
    for n, (severity, ended) in enumerate(steps):
        planner.plan(notices, [alert(severity, ended=ended, callers=("checkout",))],
                     now=f"2026-12-01T07:0{n}:00.000Z", mono=n)
    return notices


def test_an_open_incident_is_one_active_alert_with_few_stable_labels_and_a_link() -> None:
    entry = history(("high", False)).entries[0]
    [posted] = alertmanager_alerts(entry, link=LINK, now=NOW, refresh_seconds=60)
    assert posted["labels"] == {"alertname": ALERTNAME, "report": RID, "incident": ID,
                                "service": "api", "severity": "high"}
    assert posted["generatorURL"] == LINK and posted["annotations"]["report_url"] == LINK
    annotations = posted["annotations"]
    assert annotations["summary"] == "api departed."
    assert (annotations["origin"], annotations["callers"]) == ("api", "checkout")
    assert annotations["first_seen"] == at(0) and annotations["last_seen"] == at(5)
    assert annotations["evidence"].startswith("api: payment failed <*>")
    assert posted["startsAt"] == "2026-11-29T10:00:00.000Z"  # its first departure
    assert posted["endsAt"] == "2026-12-01T08:04:00.000Z"  # four refreshes ahead


def test_an_escalation_ends_the_lower_label_set_and_an_end_ends_the_rest() -> None:
    escalated = history(("medium", False), ("critical", False)).entries[0]
    low, high = alertmanager_alerts(escalated, link=LINK, now=NOW, refresh_seconds=60)
    assert (low["labels"]["severity"], low["endsAt"]) == ("medium", "2026-12-01T07:01:00.000Z")
    assert (high["labels"]["severity"], high["endsAt"]) == ("critical",
                                                            "2026-12-01T08:04:00.000Z")
    ended = history(("medium", False), ("critical", False), ("critical", True)).entries[0]
    ends = [a["endsAt"] for a in alertmanager_alerts(ended, link=LINK, now=NOW,
                                                     refresh_seconds=60)]
    assert ends == ["2026-12-01T07:01:00.000Z", "2026-12-01T07:02:00.000Z"]


def test_callers_that_grow_keep_the_label_set_and_update_the_annotations() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    planner.plan(notices, [alert()], now="2026-12-01T07:00:00.000Z", mono=0)
    planner.plan(notices, [alert(callers=("web",))], now="2026-12-01T07:01:00.000Z", mono=1)
    [posted] = alertmanager_alerts(notices.entries[0], link=LINK, now=NOW, refresh_seconds=60)
    assert posted["labels"]["severity"] == "high" and posted["annotations"]["callers"] == "web"


def test_starts_precede_ends_for_logs_stamped_ahead_of_the_clock() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    planner.plan(notices, [alert(started="2027-01-01T00:00:00Z", last_seen="2027-01-01T00:05:00Z")],
                 now="2026-12-01T07:00:00.000Z", mono=0)
    planner.plan(notices, [], now="2026-12-01T07:01:00.000Z", mono=1)
    [posted] = alertmanager_alerts(notices.entries[0], link=LINK, now=NOW, refresh_seconds=60)
    assert posted["startsAt"] == "2026-12-01T07:00:00.000Z" < posted["endsAt"]


def test_chat_messages_name_origin_callers_start_and_evidence_escaped() -> None:
    planner, notices = Planner(min_severity="medium", end_after=0), Notices(report_id=RID)
    steps = [alert("medium", title="Errors <*> & 503s"), alert("critical"),
             alert("critical", callers=("checkout", "web")), alert("critical", ended=True)]
    for n, a in enumerate(steps):
        planner.plan(notices, [a], now=f"t{n}", mono=n)
    entry = notices.entries[0]
    texts = [webhook_message(entry, n, link=LINK)["text"] for n in range(4)]
    assert texts[0].startswith("[retro] Incident opened (medium): Errors &lt;*&gt; &amp; 503s\n")
    assert f"Origin: api, since {at(0)}. Callers failing: none reported." in texts[0]
    assert "\n- api: payment failed &lt;*&gt; (new line, 6 in its first minute)\n" in texts[0]
    assert texts[1].startswith("[retro] Incident escalated medium -> critical:")
    assert texts[2].startswith("[retro] Incident escalated (critical, more callers failing: "
                               "checkout, web):")
    assert "Callers failing: checkout, web." in texts[2]
    assert texts[3].startswith(f"[retro] Incident ended (last departure at {at(5)}):")
    assert "Origin:" not in texts[3]
    for text in texts:
        assert f"<{LINK}|Post-mortem {RID}> (incident {ID}, service api)" in text


def test_a_merged_incident_says_which_one_it_goes_on_as() -> None:
    planner, notices = Planner(end_after=0), Notices(report_id=RID)
    planner.plan(notices, [alert(start=0, end=6), alert(start=10, end=16)], now="t0", mono=0)
    planner.plan(notices, [alert(start=0, end=16)], now="t1", mono=1)
    text = webhook_message(notices.entries[1], 1, link=LINK)["text"]
    assert text.startswith("[retro] Incident ended (merged into another incident):")
    assert f"It goes on as incident {ID}." in text


def test_links_go_to_the_external_url_or_this_workers_address() -> None:
    assert report_link(Settings(notify={"external_url": "https://retro.example.com/"}),
                       "2026-11-29/all") == LINK
    assert report_link(Settings(web_host="0.0.0.0", web_port=7000), "2026-11-29T10/a b") == (
        "http://127.0.0.1:7000/view/2026-11-29T10/a%20b")
