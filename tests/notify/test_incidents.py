"""A report's incidents of the day as alerts: origin, callers, start, evidence, never a
log line; ended once the report's records go on past them."""

from __future__ import annotations

from streams.notify.incidents import alerts_for
from streams.report.state.model import Report
from tests.helpers import pool_and_disk_report
from tests.notify.days import DAY, RID, day_report, minutes

REFUSED = ("db", "connection refused by <*>", minutes(40, 44))
CALLERS = [("checkout", "payment failed calling db <*>", "db", minutes(41, 44, 8)),
           ("api", "orders failed: db unreachable <*>", "db", minutes(41, 44, 8))]


def test_each_incident_is_an_alert_with_its_origin_callers_start_and_evidence() -> None:
    [alert] = alerts_for(day_report(errors=[REFUSED], callers=CALLERS, until=46))
    assert (alert.report_id, alert.service, alert.severity) == (RID, "db", "critical")
    assert (alert.started, alert.last_seen) == ("2026-11-29T10:40:00Z", "2026-11-29T10:45:00Z")
    assert alert.callers == ("api", "checkout") and alert.services == ("api", "checkout", "db")
    assert alert.title.startswith("db")
    assert "db departed from its baseline from 2026-11-29T10:40:00Z" in alert.summary
    assert "api, checkout failed calling it" in alert.summary
    assert alert.evidence[0] == "db: connection refused by <*> (new line, 6 in its first minute)"
    assert len(alert.evidence) == 3 and not alert.ended


def test_an_incident_has_ended_once_the_records_go_on_past_it_for_a_while() -> None:
    def ended(until: int, after: float = 5) -> bool:
        [alert] = alerts_for(day_report(errors=[REFUSED], until=until),
                             resolve_after_minutes=after)
        return alert.ended

    last = DAY.index("2026-11-29T10:44")  # its last departure's minute ends at 10:45
    assert not ended(last + 5)  # records up to 10:49:59, 4 min 59 s past its end
    assert ended(last + 6)  # up to 10:50:59
    assert not ended(last + 10, after=10) and ended(last + 11, after=10)


def test_a_closed_window_ends_every_incident() -> None:
    alerts = alerts_for(day_report(errors=[REFUSED], callers=CALLERS, until=46), closed=True)
    assert alerts and all(a.ended and a.closed for a in alerts)


def test_steady_reports_and_reports_without_series_have_no_incidents() -> None:
    assert alerts_for(day_report()) == []
    assert alerts_for(Report(id=RID)) == []
    # causes the model found, with no departure from the baseline behind them, page nobody
    assert alerts_for(pool_and_disk_report()) == []


def test_alerts_carry_templates_redacted_never_the_examples() -> None:
    secret = ("db", "login failed for password=hunter2 user alice@example.com <*>",
              minutes(40, 44))
    [alert] = alerts_for(day_report(errors=[secret], until=46))
    said = " ".join([alert.title, alert.summary, *alert.evidence])
    assert "hunter2" not in said and "[REDACTED:password]" in said
    assert "alice@example.com" not in said
