"""Change events of a post-mortem read for what their lines say (streams.report.analysis.causes)."""

from __future__ import annotations

import pytest

from streams.records import Evidence, Fragment, TimeWindow
from streams.report.analysis.causes import change_kind
from streams.report.analysis.postmortem import derive
from streams.report.state.merge import merge_all
from streams.report.state.model import Incident, TemplateEvidence

from helpers import make_fragment


def incident(event: str, *templates: str, severity: str = "info") -> Incident:
    return Incident(key=event.lower(), event=event, cause=f"{event.lower()}.", severity=severity,
                    services=["svc"], count=len(templates) or 1,
                    evidence=[TemplateEvidence(template=t, count=1, examples=[t])
                              for t in templates])


@pytest.mark.parametrize(
    ("says", "does_not", "kind"),
    [
        # a title and templates that name a change; the same title over a negated one
        (incident("Configuration change", "configuration reloaded from /etc/app.yaml"),
         incident("Configuration change", "[ib_sm_sweep.c:<*>]: No configuration change required"),
         "config"),
        (incident("Restarts", "broker <*> restarted"),
         incident("Restarts", "restart required to apply the new certificate"), "restart"),
        # a link or an interface that is up is the network back, not a restart
        (incident("Backends back", "Server web1 is up", severity="low"),
         incident("Network link up", "eth0: e1000_watchdog: NIC Link is Up <*> Mbps Full Duplex"),
         "restart"),
        # "config" as a word, not the start of a daemon's name or a file name
        (incident("Slow I/O operations", "config updated by admin", severity="low"),
         incident("Slow I/O operations", "configd: loaded config.plist in <*> ms",
                  severity="low"),
         "config"),
        (incident("Deploy", "deploy of checkout v2.3.0 completed"),
         incident("Deploy", "deploy of checkout v2.3.0 skipped"), "deploy"),
    ],
)
def test_a_change_is_a_change_its_lines_assert(says: Incident, does_not: Incident,
                                               kind: str) -> None:
    assert change_kind(says) == kind
    assert change_kind(does_not) is None


def test_a_title_without_templates_still_names_its_change() -> None:
    assert change_kind(incident("Configuration change")) == "config"
    assert change_kind(incident("No configuration change")) is None


def _fragment(n: int, event: str, severity: str, template: str, at: str, until: str,
              service: str) -> Fragment:
    return make_fragment(f"f{n}", {"raw/0": [[n * 100, n * 100 + 9]]}, event=event,
                         cause=f"{event.lower()}.", severity=severity, service=service,
                         timestamp=at, window=TimeWindow(start=at, end=until), record_count=10,
                         evidence=[Evidence(template=template, count=10, examples=[template])])


def test_a_negated_change_before_a_failure_is_not_its_trigger() -> None:
    """The subnet manager's "no configuration change required" 5 s before errors is no
    config change, so it neither triggers the episode nor gets a gating action."""
    report, _ = merge_all(None, [
        _fragment(1, "Configuration change", "info",
                  "[ib_sm_sweep.c:<*>]: No configuration change required",
                  "2026-11-29T10:00:00Z", "2026-11-29T10:30:00Z", "ib_sm"),
        _fragment(2, "Connection failures", "high", "connect to <*>: Connection refused",
                  "2026-11-29T10:00:05Z", "2026-11-29T10:10:00Z", "api"),
    ], report_id="2026-11-29/all", now="2026-11-29T12:00:00Z")
    pm = derive(report)
    assert pm.changes == []
    assert pm.episodes and pm.episodes[0].trigger is None
    assert "after a config change" not in " ".join(pm.summary)
    assert not any("No configuration change required" in a.text for a in pm.actions)
