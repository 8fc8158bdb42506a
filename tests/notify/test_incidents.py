"""A report's incidents as alerts: the post-mortem's episodes, never a log line."""

from __future__ import annotations

from streams.notify.incidents import alerts_for
from streams.records import Evidence, TimeWindow
from streams.report.state.merge import merge
from streams.report.state.model import Report
from tests.helpers import make_fragment, pool_and_disk_report


def test_each_episode_is_an_alert_with_its_origin_severity_and_whether_it_ended() -> None:
    pool, disk = alerts_for(pool_and_disk_report())
    assert (pool.report_id, pool.severity, pool.service) == ("2026-11-29/all", "critical", "api")
    assert pool.title.startswith("Connection pool exhausted")
    assert pool.origin is not None and pool.origin.startswith("api, first anomaly at")
    assert pool.summary.endswith(".") and "3 service(s) failed" in pool.summary
    assert not pool.ended  # the report's last records are its own
    assert (disk.service, disk.severity, disk.ended) == ("hdfs", "medium", True)
    assert pool.keys and not set(pool.keys) & set(disk.keys)


def test_a_closed_window_ends_every_incident() -> None:
    alerts = alerts_for(pool_and_disk_report(), closed=True)
    assert alerts and all(a.ended and a.closed for a in alerts)


def test_routine_and_quiet_reports_have_no_incidents() -> None:
    quiet = make_fragment("r", {"raw/0": [[0, 99]]}, record_count=100, severity="info",
                          event="Routine request handling", cause="normal traffic")
    report, _ = merge(None, quiet, report_id="2026-11-29/all", now="2026-11-29T12:00:00Z")
    assert alerts_for(report) == []
    assert alerts_for(Report(id="2026-11-29/all")) == []


def test_alerts_carry_titles_and_counts_redacted_never_the_examples() -> None:
    window = TimeWindow(start="2026-11-29T10:00:00Z", end="2026-11-29T10:05:00Z")
    report = None
    for i, svc in enumerate(["api", "checkout"]):
        frag = make_fragment(
            f"s{i}", {f"raw/{i}": [[0, 49]]}, record_count=50, service=svc, severity="critical",
            event="Login failing for password=hunter2 with 503",
            cause="auth backend answers 503", timestamp=window.start, window=window,
            evidence=[Evidence(template="login failed <*>", count=50,
                               examples=["login failed user=alice@example.com 503"])])
        report, _ = merge(report, frag, report_id="2026-11-29/all", now="2026-11-29T12:00:00Z")
    assert report is not None
    [alert] = alerts_for(report)
    said = " ".join(str(v) for v in (alert.title, alert.summary, alert.origin))
    assert "hunter2" not in said and "[REDACTED:password]" in said
    assert "alice@example.com" not in said and "login failed user" not in said
