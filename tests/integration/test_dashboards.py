"""Every dashboard panel answers: a real Prometheus scrapes real workers under load.

Three workers (clean, batch, compactor, each its own process and port) run on the
test broker against the simulated provider, with a low RPM so 429s happen. Debian's
``prometheus`` scrapes them every second under the job name the ServiceMonitor gives
(``retro-stream-metrics``) with a ``role`` label. Every query of every panel is then
evaluated through the HTTP API; a query without a series fails the test, and the
table (dashboard, panel, returns data) is printed. kafka-exporter is not run here:
the lag panels answer from their fallback, the workers' own series.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from helpers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "grafana"
DASHBOARDS = ("retro-pipeline.json", "retro-rate-limits.json")
PROMETHEUS = shutil.which("prometheus")


def _get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _wait(predicate, *, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = predicate()
        except OSError:
            found = None
        if found:
            return found
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def _start_fake_llm(tmp_path: Path, port: int, *args: str) -> subprocess.Popen[bytes]:
    log = open(tmp_path / "fake-llm.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "streams", "fake-llm", "--port", str(port),
                             *args], stdout=log, stderr=subprocess.STDOUT)
    _wait(lambda: _get(f"http://127.0.0.1:{port}/v1/models"), timeout=30, what="fake-llm")
    return proc


def _start_prometheus(tmp_path: Path, targets: dict[str, int]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{
            "job_name": "retro-stream-metrics",
            "static_configs": [{"targets": [f"127.0.0.1:{p}"], "labels": {"role": role}}
                               for role, p in targets.items()],
        }],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115
    assert PROMETHEUS is not None
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    _wait(lambda: _get(f"{url}/-/ready"), timeout=60, what="prometheus ready")
    return proc, url


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    try:
        raw = _get(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{expr}: {exc.read().decode()[:300]}") from exc
    body = json.loads(raw)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _substitute(expr: str, group: str) -> str:
    expr = re.sub(r"\$__\w+", "1m", expr)
    return expr.replace("$namespace", ".*").replace("$group", group)


def _panel_queries() -> list[tuple[str, str, str]]:
    out = []
    for name in DASHBOARDS:
        d = json.loads((GRAFANA / name).read_text("utf-8"))
        for panel in d["panels"]:
            for t in panel.get("targets", []):
                out.append((d["title"], f"{panel['title']} [{t['refId']}]", t["expr"]))
    return out


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (Debian package)")
def test_every_panel_query_returns_series(pipeline_factory, tmp_path: Path) -> None:
    llm_port = free_port()
    fake = _start_fake_llm(tmp_path, llm_port, "--rpm", "5", "--tpm", "200000",
                           "--error-rate", "0.05",
                           "--seed", "5")
    prometheus = None
    try:
        p = pipeline_factory(RETRO_MODEL__BASE_URL=f"http://127.0.0.1:{llm_port}/v1",
                             RETRO_MODEL__NAME="fake-gpt",
                             RETRO_MODEL__BACKOFF_BASE_SECONDS="0.2",
                             # the rate-limit panels need 429s, which the worker would
                             # avoid by keeping under the fake's remaining count
                             RETRO_MODEL__ADVERTISED_LIMITS="false",
                             # only the teardown stops the workers: the batch worker's
                             # rate-limited batches need not get the 20 s grace
                             RETRO_SHUTDOWN_SECONDS="2")
        from streams.dev.sample import write_sample

        sample = [str(x) for x in write_sample(tmp_path / "sample", records=3000,
                                               include_bad=True)]
        p.retro("produce", "--quiet", *sample)
        ports = {role: (p.web_port if role == "compactor" else free_port())
                 for role in ("clean", "batch", "compactor")}
        # scraping from before the workers start, so their first calls are in the rates
        prometheus, url = _start_prometheus(tmp_path, ports)
        for role, port in ports.items():
            p.start_worker(role, log_name="worker", RETRO_WEB_PORT=str(port),
                           RETRO_STATE_DIR=str(p.state_dir / role))

        def loaded() -> bool:
            calls = _query(url, 'sum(gen_ai_client_operation_duration_seconds_count'
                                '{error_type=""})')  # successes, not only 429s
            limited = _query(url, 'sum(retro_model_requests_total{status="rate_limited"})')
            lag = _query(url, "retro_consumer_lag_messages")
            return bool(calls and float(calls[0]["value"][1]) > 0 and limited
                        and float(limited[0]["value"][1]) > 0 and lag)

        _wait(loaded, timeout=300, interval=3, what=f"successful calls and 429s\n{p.worker_logs()}")
        # more load while the panels are read
        more = [str(x) for x in write_sample(tmp_path / "more", records=800, include_bad=True)]
        p.retro("produce", "--quiet", *more)

        group = f"{p.settings().app_id}.*"

        def panel_rows() -> list[tuple[str, str, bool, bool]]:
            rows = []
            for dashboard, panel, expr in _panel_queries():
                result = _query(url, _substitute(expr, group))
                numeric = any(r["value"][1] not in ("NaN", "+Inf", "-Inf") for r in result)
                rows.append((dashboard, panel, bool(result), numeric))
            return rows

        # a rate needs a few scrapes of a series: read again until every panel answers
        deadline = time.monotonic() + 60
        rows = panel_rows()
        while not all(data for _, _, data, _ in rows) and time.monotonic() < deadline:
            time.sleep(2)
            rows = panel_rows()
        width = max(len(r[1]) for r in rows)
        print(f"\n{'dashboard':34} {'panel':{width}} returns data  (a number)")
        for dashboard, panel, data, numeric in rows:
            print(f"{dashboard:34} {panel:{width}} {'yes' if data else 'NO':12}  "
                  f"({'yes' if numeric else 'no'})")
        empty = [(d, pnl) for d, pnl, data, _ in rows if not data]
        assert not empty, f"panel queries without a series: {empty}"
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=30)
        fake.kill()
