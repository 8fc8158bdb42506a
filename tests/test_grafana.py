"""Grafana dashboards and alert rules only query metrics and labels that exist.

The truth is what ``streams.metrics.Metrics`` exposes on /metrics: every metric is
given one child, the registry is rendered in the Prometheus text format and parsed
back, so counter names carry ``_total`` and histograms ``_bucket`` (with ``le``),
``_sum`` and ``_count`` exactly as Prometheus scrapes them.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from streams.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "grafana"
DASHBOARDS = ("retro-pipeline.json", "retro-rate-limits.json")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Labels the scrape adds (ServiceMonitor defaults plus its `role` relabeling).
SCRAPE_LABELS = frozenset(
    {"namespace", "pod", "instance", "job", "service", "container", "endpoint", "role"}
)
FUNCTIONS = frozenset(
    {
        "abs",
        "absent",
        "avg",
        "avg_over_time",
        "ceil",
        "clamp",
        "clamp_max",
        "clamp_min",
        "count",
        "count_over_time",
        "delta",
        "deriv",
        "floor",
        "histogram_quantile",
        "increase",
        "irate",
        "label_replace",
        "max",
        "max_over_time",
        "min",
        "min_over_time",
        "predict_linear",
        "quantile",
        "rate",
        "resets",
        "round",
        "scalar",
        "sort",
        "sort_desc",
        "sum",
        "sum_over_time",
        "time",
        "topk",
        "bottomk",
        "vector",
        "changes",
        "group",
        "last_over_time",
    }
)
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset"})
GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
SELECTOR = re.compile(r"(?P<name>[A-Za-z_:][\w:]*)?\s*\{(?P<body>[^{}]*)\}")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
NUMBER = re.compile(r"(?<![\w:])\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[a-zA-Z]*")
# Series other exporters add: kafka-exporter (Strimzi's kafkaExporter) for lag that
# survives dead workers, and Prometheus's own `up` per scrape target.
EXTERNAL = {
    "kafka_consumergroup_lag": frozenset({"consumergroup", "topic", "partition"}),
    "kafka_consumergroup_current_offset": frozenset({"consumergroup", "topic", "partition"}),
    "up": frozenset(),
}
AGGREGATIONS = re.compile(
    r"\b(sum|max|min|avg|count|topk|bottomk|quantile|group)\b\s*(\(|by|without)"
)
# Pipeline and rate-limit views must keep answering the questions they were built for.
REQUIRED = {
    "retro-pipeline.json": {
        "retro_consumer_lag_messages",
        "retro_offset_rereads_total",
        "retro_records_routed_total",
        "retro_deadletter_total",
        "retro_batches_total",
        "retro_batch_records_bucket",
        "retro_batch_input_tokens_bucket",
        "retro_model_tokens_total",
        "retro_fragments_total",
        "retro_review_total",
        "retro_report_updates_total",
        "kafka_consumergroup_lag",  # lag that survives dead workers
        "retro_consumer_oldest_unprocessed_age_seconds",
        "retro_notifications_total",  # does the on-call hear of incidents
        "up",
    },
    "retro-rate-limits.json": {
        "retro_model_concurrency_limit",
        "retro_model_requests_in_flight",
        "retro_model_rate_limited_total",
        "retro_model_retries_total",
        "retro_model_retry_budget_exhausted_total",
        "retro_model_request_duration_seconds_bucket",
        "retro_model_requests_total",
        "retro_model_cache_total",
        "retro_batch_splits_total",
        # headroom: limits, bucket levels, the provider's own quota, latency by outcome
        "retro_model_quota_limit_per_minute",
        "retro_model_bucket_available",
        "retro_model_provider_remaining",
        "retro_model_provider_limit",
        "retro_model_quota_share",
        "gen_ai_client_operation_duration_seconds_bucket",
        "gen_ai_client_token_usage_bucket",
    },
}


# --- what /metrics exposes ------------------------------------------------------------


@functools.cache
def exposed() -> dict[str, frozenset[str]]:
    """Sample name -> label names, as scraped from a fresh Metrics()."""
    metrics = Metrics()
    for collector in vars(metrics).values():
        if isinstance(collector, MetricWrapperBase) and collector._labelnames:
            # a labelled metric has no samples until it has a child
            collector.labels(*["x"] * len(collector._labelnames))
    text = generate_latest(metrics.registry).decode()
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    known = {name: frozenset(labels) for name, labels in out.items()} | EXTERNAL
    for rule in recording_rules():  # a recorded series keeps what its expression keeps
        known[rule["record"]] = frozenset(GROUPING.findall(rule["expr"])[0][1].replace(" ", "")
                                          .split(","))
    return known


# --- a small PromQL checker --------------------------------------------------------------


def _without_templates(expr: str) -> str:
    expr = re.sub(r"\$__\w+", "5m", expr)  # $__rate_interval and friends sit in ranges
    return re.sub(r"\$\{?\w+(?::\w+)?\}?", "x", expr)


def analyse(expr: str) -> tuple[set[str], set[str], list[str]]:
    """(metric names, grouping labels, problems) of one PromQL expression."""
    problems: list[str] = []
    rest = STRING.sub('""', _without_templates(expr))
    if rest.count("(") != rest.count(")"):
        problems.append("unbalanced parentheses")

    grouping: set[str] = set()
    for match in GROUPING.finditer(rest):
        grouping |= {x.strip() for x in match.group(2).split(",") if x.strip()}
    rest = GROUPING.sub(" ", rest)

    metrics: set[str] = set()
    matched: list[tuple[str | None, set[str]]] = []
    for match in SELECTOR.finditer(rest):
        labels = set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", match.group("body")))
        matched.append((match.group("name"), labels))
    rest = SELECTOR.sub(lambda m: f" {m.group('name') or ''} ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)  # ranges and subqueries
    rest = NUMBER.sub(" ", rest)

    for match in re.finditer(r"[A-Za-z_:][\w:]*", rest):
        word = match.group(0)
        if rest[match.end() :].lstrip().startswith("("):
            if word not in FUNCTIONS:
                problems.append(f"unknown function {word}")
        elif word.lower() not in KEYWORDS:
            metrics.add(word)

    known = exposed()
    for name in sorted(metrics):
        if name not in known:
            problems.append(f"no metric {name}")
    for name, labels in matched:
        if name is None:
            problems.append("selector without a metric name")
            continue
        for label in sorted(labels - known.get(name, frozenset()) - SCRAPE_LABELS):
            problems.append(f"{name} has no label {label}")
    available = set(SCRAPE_LABELS).union(*(known.get(m, frozenset()) for m in metrics))
    for label in sorted(grouping - available):
        problems.append(f"grouping by {label}, which none of {sorted(metrics)} has")
    if "histogram_quantile" in rest and "le" not in grouping:
        problems.append("histogram_quantile without `le` in the aggregation")
    if not metrics:
        problems.append("no metric in expression")
    return metrics, grouping, problems


def template_labels(text: str, pattern: str) -> set[str]:
    return set(re.findall(pattern, text))


# --- dashboards --------------------------------------------------------------------------


def load_dashboard(name: str) -> dict[str, Any]:
    return json.loads((GRAFANA / name).read_text("utf-8"))


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows keep their children
    return out


def walk(node: Any, key: str) -> list[Any]:
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k == key]
        return found + [x for v in node.values() for x in walk(v, key)]
    if isinstance(node, list):
        return [x for v in node for x in walk(v, key)]
    return []


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, expr, legendFormat) for every query of the dashboard."""
    return [
        (p["title"], t["expr"], t.get("legendFormat", ""))
        for p in panels(dashboard)
        for t in p.get("targets", [])
    ]


def test_checker_accepts_a_good_expression() -> None:
    metrics, grouping, problems = analyse(
        "histogram_quantile(0.95, sum by (lane, le) "
        '(rate(retro_model_request_duration_seconds_bucket{namespace=~"$namespace"}[5m])))'
    )
    assert problems == []
    assert metrics == {"retro_model_request_duration_seconds_bucket"}
    assert grouping == {"lane", "le"}


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("sum(rate(retro_records_routd_total[5m]))", "no metric retro_records_routd_total"),
        ("sum(rate(retro_records_routed[5m]))", "no metric retro_records_routed"),  # no _total
        ('retro_batches_total{lanes="fast"}', "retro_batches_total has no label lanes"),
        ("sum by (stage) (rate(retro_batches_total[5m]))", "grouping by stage"),
        ("sum by (le) (rate(retro_batches_total[5m]))", "grouping by le"),
        ("sum(rates(retro_batches_total[5m]))", "unknown function rates"),
        (
            "histogram_quantile(0.9, sum by (lane) (rate(retro_batch_records_bucket[5m])))",
            "without `le`",
        ),
        ("retro_model_requests_in_flight_total", "no metric"),  # gauges have no _total
    ],
)
def test_checker_rejects_a_bad_expression(expr: str, problem: str) -> None:
    _, _, problems = analyse(expr)
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_is_grafana_10_with_a_datasource_variable(name: str) -> None:
    d = load_dashboard(name)
    assert d["schemaVersion"] >= 36  # Grafana 10 writes 37-39
    assert "__inputs" not in d
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    # no hard-coded data source UIDs: the only uid below the top is the variable
    assert set(map(str, walk({k: v for k, v in d.items() if k != "uid"}, "uid"))) == {
        "${datasource}"}
    assert all(ds == DATASOURCE for ds in walk(d, "datasource"))


def test_dashboards_have_stable_distinct_uids() -> None:
    """A stable uid keeps links, bookmarks and alert annotations pointing at the same
    dashboard across imports, and lets provisioning update it instead of adding a copy."""
    uids = [load_dashboard(name).get("uid") for name in DASHBOARDS]
    assert all(isinstance(u, str) and re.fullmatch(r"[a-z0-9-]{1,40}", u) for u in uids), uids
    assert len(set(uids)) == len(uids)


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_panels_are_complete_and_laid_out(name: str) -> None:
    d = load_dashboard(name)
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids))
    titles = [p["title"] for p in panels(d) if p["type"] != "row"]
    assert len(titles) == len(set(titles))
    for p in panels(d):
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["description"].strip(), p["title"]
        assert p["datasource"] == DATASOURCE, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_queries_use_real_metrics_and_labels(name: str) -> None:
    d = load_dashboard(name)
    problems = {}
    for title, expr, legend in dashboard_exprs(d):
        _, grouping, found = analyse(expr)
        for label in template_labels(legend, r"\{\{\s*(\w+)\s*\}\}") - grouping:
            found.append(f"legend uses {label}, which the query does not keep")
        if found:
            problems[title] = found
    for var in d["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\(\s*([\w:]+)\s*,\s*(\w+)\s*\)", var["query"])
            assert match, var["query"]
            metric, label = match.groups()
            if label not in exposed().get(metric, frozenset()) | SCRAPE_LABELS:
                problems[f"${var['name']}"] = [f"{metric} has no label {label}"]
    assert problems == {}


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_covers_its_metrics(name: str) -> None:
    used = set().union(*(analyse(expr)[0] for _, expr, _ in dashboard_exprs(load_dashboard(name))))
    assert REQUIRED[name] <= used, REQUIRED[name] - used


# --- alert rules ---------------------------------------------------------------------------


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((GRAFANA / "alerts.yaml").read_text("utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def alert_rules() -> list[dict[str, Any]]:
    return [rule for rule in _rules() if "alert" in rule]


def recording_rules() -> list[dict[str, Any]]:
    return [rule for rule in _rules() if "record" in rule]


def kept_labels(expr: str, metrics: set[str], grouping: set[str]) -> set[str]:
    """Labels an expression's result can carry: its grouping, what label_replace sets,
    and every label of its metrics when nothing aggregates them away."""
    kept = set(grouping) | set(re.findall(r'label_replace\([^"]*"(\w+)"', expr))
    if not AGGREGATIONS.search(expr):
        kept |= SCRAPE_LABELS.union(*(exposed().get(m, frozenset()) for m in metrics))
    return kept


def test_alert_rules_are_well_formed() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        for key in ("summary", "description", "runbook"):
            assert rule["annotations"][key].strip(), (rule["alert"], key)


def test_alerts_cover_the_agreed_conditions() -> None:
    used = set().union(*(analyse(r["expr"])[0] for r in alert_rules() + recording_rules()))
    assert {
        "retro_consumer_lag_messages",
        "kafka_consumergroup_lag",  # lag that outlives the workers
        "kafka_consumergroup_current_offset",
        "retro_consumer_committed_offset",
        "retro_consumer_oldest_unprocessed_age_seconds",
        "up",
        "retro_offset_rereads_total",
        "retro_deadletter_total",
        "retro_model_rate_limited_total",
        "retro_model_retry_budget_exhausted_total",
        "retro_review_total",
        "retro_broker_reachable",  # Kafka gone
        "retro_worker_role_info",  # a role nobody runs, all-in-one workers included
    } <= used


def test_alert_expressions_use_real_metrics_and_labels() -> None:
    problems = {}
    for rule in alert_rules() + recording_rules():
        metrics, grouping, found = analyse(rule["expr"])
        text = " ".join(rule.get("annotations", {}).values()) + " ".join(
            rule.get("labels", {}).values())
        for label in template_labels(text, r"\$labels\.(\w+)") - kept_labels(
                rule["expr"], metrics, grouping):
            found.append(f"annotation uses $labels.{label}, which the expression drops")
        if found:
            problems[rule.get("alert") or rule["record"]] = found
    assert problems == {}
