"""The alert rules under promtool: they load, and every alert fires in its scenario.

``promtool`` comes from Debian's ``prometheus`` package (.ci/test installs it when
root); without it these tests skip. They run the shipped files with the standard
commands: promtool compares annotations verbatim, so every expected alert in
alerts.test.yaml lists its rendered annotations.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "grafana"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed "
                                    "(Debian package prometheus)")


def _rules() -> list[dict]:
    doc = yaml.safe_load((GRAFANA / "alerts.yaml").read_text("utf-8"))
    return [r for g in doc["groups"] for r in g["rules"]]


def _alerts() -> set[str]:
    return {r["alert"] for r in _rules() if "alert" in r}


def _unit_tests() -> dict:
    return yaml.safe_load((GRAFANA / "alerts.test.yaml").read_text("utf-8"))


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    print(done.stdout + done.stderr)
    return done


@needs_promtool
def test_promtool_check_rules() -> None:
    done = _promtool("check", "rules", "alerts.yaml", cwd=GRAFANA)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout


@needs_promtool
def test_promtool_unit_tests_pass_on_the_shipped_files() -> None:
    """`promtool test rules grafana/alerts.test.yaml`, as an operator would run it."""
    done = _promtool("test", "rules", "grafana/alerts.test.yaml", cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_the_prometheus_rule_is_alerts_yaml() -> None:
    """grafana/prometheusrule.yaml is generated from alerts.yaml by the command in its
    header: its header up to `spec:`, then alerts.yaml indented."""
    text = (GRAFANA / "prometheusrule.yaml").read_text("utf-8")
    head = text[:text.index("\nspec:\n") + len("\nspec:\n")]
    rules = (GRAFANA / "alerts.yaml").read_text("utf-8")
    indented = "".join("  " + line if line.strip("\n") else line
                       for line in rules.splitlines(keepends=True))
    assert text == head + indented, "regenerate grafana/prometheusrule.yaml (see its header)"
    rule = yaml.safe_load(text)
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_every_expected_alert_lists_its_annotations() -> None:
    """Without them promtool expects none and fails on every alert that has some."""
    annotated = {r["alert"]: set(r.get("annotations", {})) for r in _rules() if "alert" in r}
    missing = []
    for case in _unit_tests()["tests"]:
        for check in case.get("alert_rule_test", []):
            for alert in check.get("exp_alerts", []):
                keys = set(alert.get("exp_annotations", {}))
                if keys != annotated[check["alertname"]]:
                    missing.append((case["name"], check["alertname"], check["eval_time"]))
    assert missing == []


def test_alerts_on_recorded_series_follow_their_rules_in_one_group() -> None:
    """Rules of one group are evaluated in order, groups side by side: an alert in
    another group than the rule it reads sees the rule's value of this evaluation or of
    the last one, as it happens (and its annotations' $value with it)."""
    doc = yaml.safe_load((GRAFANA / "alerts.yaml").read_text("utf-8"))
    where = {}
    for group in doc["groups"]:
        for n, rule in enumerate(group["rules"]):
            if "record" in rule:
                where[rule["record"]] = (group["name"], n)
    for group in doc["groups"]:
        for n, rule in enumerate(group["rules"]):
            for record, (home, at) in where.items():
                if record in rule["expr"]:
                    assert (group["name"], n > at) == (home, True), (rule.get("alert"), record)


def test_every_alert_has_a_scenario_where_it_fires() -> None:
    fired, quiet = set(), set()
    for case in _unit_tests()["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert fired == _alerts(), f"never shown firing: {sorted(_alerts() - fired)}"
    assert {"RetroStreamBacklogNotMoving", "RetroStreamConsumerLagGrowing"} <= quiet


def test_an_all_in_one_worker_is_no_absent_role() -> None:
    (case,) = [c for c in _unit_tests()["tests"] if c["name"] == "all-in-one worker"]
    pods = {re.search(r'pod="([^"]+)"', s["series"]).group(1) for s in case["input_series"]}
    assert len(pods) == 1
    quiet = {c["alertname"] for c in case["alert_rule_test"] if not c.get("exp_alerts")}
    assert "RetroStreamRoleAbsent" in quiet


def test_the_dead_worker_and_flat_backlog_scenario_is_there() -> None:
    (case,) = [c for c in _unit_tests()["tests"] if c["name"] == "dead worker, flat backlog"]
    series = " ".join(s["series"] for s in case["input_series"])
    assert "kafka_consumergroup_lag" in series  # lag from the exporter, not the dead pod
    firing = {c["alertname"] for c in case["alert_rule_test"] if c.get("exp_alerts")}
    assert {"RetroStreamTargetDown", "RetroStreamRoleAbsent",
            "RetroStreamBacklogNotMoving"} <= firing


def test_readme_alert_table_lists_every_rule() -> None:
    readme = (GRAFANA / "README.md").read_text("utf-8")
    listed = set(re.findall(r"^\| `(RetroStream\w+)` \|", readme, flags=re.M))
    assert listed == _alerts()


@needs_promtool
def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """promtool parses each panel query as a recording rule's expression (Grafana's
    variables filled in): a query Prometheus would reject fails here, without a server."""
    rules = []
    for n, name in enumerate(("retro-pipeline.json", "retro-rate-limits.json")):
        dashboard = json.loads((GRAFANA / name).read_text("utf-8"))
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                expr = re.sub(r"\$__\w+", "5m", target["expr"])
                expr = expr.replace("$namespace", ".*").replace("$group", "retro-stream.*")
                rules.append({"record": f"dashboard{n}_panel{panel['id']}_{target['refId']}",
                              "expr": expr})
    doc = {"groups": [{"name": "dashboards", "rules": rules}]}
    (tmp_path / "panels.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    done = _promtool("check", "rules", "panels.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout
