"""Behind a LiteLLM proxy: the same run direct to the simulated provider and through
the real proxy (PyPI ``litellm[proxy]``) in front of it, both at a low upstream limit.

The proxy runs with the config docs/model-gateways.md shows (read from that page, so
the documented config is the tested one), started by this test on a loopback port with
no database and no telemetry. Through the proxy, as direct: the audit is exact, nothing
is parked in review at the end, at most 5% of the upstream requests are answered 429,
and no answer is produced upstream and thrown away (every 200 the provider gave for a
batch is one the worker used). The time is not asserted; bench/gateway_bench.py runs
the two one after the other and compares their wall times. The two runs go side by
side (about 95 s in all: a limit that binds costs the provider's one-minute window).

litellm[proxy] pins rich<14 and so cannot share the test venv (the image's rich is
locked in deploy/constraints.txt); it lives in its own venv, by default
``.ci-cache/litellm`` (``RETRO_TEST_LITELLM=1 bash .ci/test`` makes it), or wherever
``RETRO_TEST_LITELLM`` points (the ``litellm`` executable). Without it the test skips.

Knobs, for the bench (defaults are the test's): ``RETRO_LITELLM_RECORDS`` (sample
records per run), ``RETRO_LITELLM_RPM`` (the upstream limit), ``RETRO_LITELLM_SEQUENTIAL=1``
(the proxy run after the direct one instead of beside it), ``RETRO_LITELLM_PROXY_RETRIES``
(``config``: as documented; ``default``: the proxy's own num_retries; or a number),
``RETRO_LITELLM_FIGURES`` (write the figures there as JSON).
"""

from __future__ import annotations

import collections
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from helpers import REPO, free_port
from helpers import start_fake_llm as _start_fake_llm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

DOC = REPO / "docs" / "model-gateways.md"
LITELLM_VENV = REPO / ".ci-cache" / "litellm"
RECORDS = int(os.environ.get("RETRO_LITELLM_RECORDS", "6000"))
RPM = int(os.environ.get("RETRO_LITELLM_RPM", "60"))
# records per fast-lane batch (default 500): more, smaller calls from the same records
BATCH_RECORDS = os.environ.get("RETRO_LITELLM_BATCH_RECORDS", "100")
SEQUENTIAL = os.environ.get("RETRO_LITELLM_SEQUENTIAL") == "1"
PROXY_RETRIES = os.environ.get("RETRO_LITELLM_PROXY_RETRIES", "config")
SETTLE_SECONDS = float(os.environ.get("RETRO_LITELLM_SETTLE_SECONDS", "150"))
MAX_429_SHARE = 0.05


def _litellm() -> str | None:
    """The ``litellm`` executable of the proxy's own venv, if there is one."""
    wanted = os.environ.get("RETRO_TEST_LITELLM", "")
    candidates = [wanted] if wanted not in ("", "1") else []
    candidates += [str(LITELLM_VENV / "bin" / "litellm"), shutil.which("litellm") or ""]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


LITELLM = _litellm()
needs_litellm = pytest.mark.skipif(
    LITELLM is None, reason="litellm[proxy] is not installed: `RETRO_TEST_LITELLM=1 bash "
    ".ci/test` puts it in .ci-cache/litellm (its own venv; see docs/model-gateways.md)")


def documented_config() -> dict[str, Any]:
    """The proxy config docs/model-gateways.md gives (its ``# litellm-config.yaml`` block)."""
    import yaml

    match = re.search(r"```yaml\n(# litellm-config\.yaml.*?)```", DOC.read_text("utf-8"),
                      re.DOTALL)
    assert match, f"{DOC} has no ```yaml block starting '# litellm-config.yaml'"
    return yaml.safe_load(match[1])


def test_the_documented_config_leaves_retries_to_the_worker() -> None:
    """Without the proxy installed, at least the page's config is checked: one
    OpenAI-compatible deployment, no retries in the proxy, keys from the environment."""
    config = documented_config()
    (model,) = config["model_list"]
    params = model["litellm_params"]
    assert params["model"].startswith("openai/") and params["api_base"].endswith("/v1")
    assert params["api_key"].startswith("os.environ/"), "no provider key in the file"
    assert config["general_settings"]["master_key"].startswith("os.environ/")
    for section in ("litellm_settings", "router_settings"):
        assert config[section]["num_retries"] == 0, section
    assert "rpm" not in params and "tpm" not in params  # limits: the provider's or ours


def _proxy_config(upstream: str, path: Path) -> Path:
    import yaml

    config = documented_config()
    (model,) = config["model_list"]
    model["litellm_params"]["api_base"] = upstream
    for section in ("litellm_settings", "router_settings"):
        settings = config.setdefault(section, {})
        if PROXY_RETRIES == "default":
            settings.pop("num_retries", None)
        elif PROXY_RETRIES != "config":
            settings["num_retries"] = int(PROXY_RETRIES)
    path.write_text(yaml.safe_dump(config, sort_keys=False), "utf-8")
    return path


def _start_proxy(tmp_path: Path, port: int, upstream: str, *, master_key: str,
                 upstream_key: str) -> subprocess.Popen[bytes]:
    config = _proxy_config(upstream, tmp_path / "litellm-config.yaml")
    # offline: the bundled model cost map (no fetch from GitHub at start), no telemetry,
    # no database (no DATABASE_URL: keys, budgets and spend logs stay off)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith(
        ("RETRO_", "LITELLM_", "OPENAI_"))}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP="true", LITELLM_TELEMETRY_DISABLED="true",
               LITELLM_MASTER_KEY=master_key, UPSTREAM_API_KEY=upstream_key,
               NO_DOCS="true", DISABLE_ADMIN_UI="true")
    log = open(tmp_path / "litellm.log", "wb")  # noqa: SIM115
    assert LITELLM is not None
    return subprocess.Popen([LITELLM, "--config", str(config), "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the LiteLLM proxy exited ({proc.returncode}):\n"
                                 f"{log.read_text(errors='replace')[-5000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health/liveliness", timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the LiteLLM proxy did not answer within {timeout:.0f} s:\n"
                         f"{log.read_text(errors='replace')[-5000:]}")


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        body = r.read().decode()
    return body if url.endswith("/metrics") else json.loads(body)


def _post(url: str, patch: dict[str, Any]) -> None:
    request = urllib.request.Request(url, data=json.dumps(patch).encode(),
                                     headers={"Content-Type": "application/json"})
    urllib.request.urlopen(request, timeout=10).read()


def _metrics(port: int) -> dict[tuple[str, str], float]:
    """``(name, labels) -> value`` of a worker's /metrics."""
    out: dict[tuple[str, str], float] = {}
    for line in _get(f"http://127.0.0.1:{port}/metrics").splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            out[(name, labels.rstrip("}"))] = float(value)
    return out


def _total(metrics: dict[tuple[str, str], float], name: str, *having: str) -> float:
    return sum(v for (n, labels), v in metrics.items()
               if n == name and all(h in labels for h in having))


def _audit(p) -> dict[str, Any]:
    proc = p.retro("audit", check=False, timeout=120)
    out = proc.stdout.decode()
    assert out.strip(), proc.stderr.decode()[-3000:]
    return json.loads(out)


def _settled(result: dict[str, Any]) -> bool:
    lanes = result["raw_records"] - result["dead_lettered"]
    return bool(result["ok"] and result["raw_records"] and result["analysed"] == lanes)


class Run:
    """One pipeline and its upstream (the simulated provider), direct or via the proxy."""

    def __init__(self, name: str, pipeline, fake_port: int) -> None:
        self.name, self.p, self.fake_port = name, pipeline, fake_port
        self.started = self.wall = None
        self.result: dict[str, Any] = {}
        self.parked_seen = 0  # the most records the audits saw parked at once

    def start(self) -> None:
        self.p.start_worker()
        self.started = time.monotonic()

    def poll(self) -> bool:
        self.result = _audit(self.p)
        self.parked_seen = max(self.parked_seen, self.result["parked"])
        if _settled(self.result):
            self.wall = time.monotonic() - self.started
            return True
        return False

    def figures(self) -> dict[str, Any]:
        fake = f"http://127.0.0.1:{self.fake_port}"
        stats = _get(f"{fake}/_fake/stats")
        requests = _get(f"{fake}/_fake/requests")
        metrics = _metrics(self.p.web_port)
        # a re-drive probe is a one-token "ping <nonce>"; every other call is a batch
        batches = [r for r in requests if not _is_probe(r)]
        answered = collections.Counter(_body_key(r) for r in batches if r["status"] == 200)
        used = (_total(metrics, "retro_model_requests_total", 'status="ok"')
                + _total(metrics, "retro_model_requests_total", 'status="truncated"'))
        return {
            "records": self.result.get("raw_records"),
            "analysed": self.result.get("analysed"),
            "parked_end": self.result.get("parked"),
            "parked_seen": self.parked_seen,
            "reviews_written": _total(metrics, "retro_review_total"),
            "upstream_requests": stats["requests"],
            "upstream_429": stats["rate_limited"],
            "upstream_batch_answers": sum(answered.values()),
            "bodies_answered_twice": sum(n - 1 for n in answered.values() if n > 1),
            "worker_answers_used": used,
            "upstream_cancelled": stats["cancelled"],
            "probes": len(requests) - len(batches),
            "worker_429": _total(metrics, "retro_model_rate_limited_total"),
            "worker_retries": _total(metrics, "retro_model_retries_total"),
            "worker_timeouts": _total(metrics, "retro_model_requests_total", 'status="timeout"'),
            "advertised_rpm": _total(metrics, "retro_model_rate_limit_per_minute",
                                     'kind="requests"', 'source="advertised"'),
            "wall_seconds": None if self.wall is None else round(self.wall, 1),
            # each upstream request: seconds after the first, status, "p" for a probe
            "timeline": [(round(r["received_at"] - requests[0]["received_at"], 1), r["status"])
                         + (("p",) if _is_probe(r) else ()) for r in requests],
        }


def _is_probe(record: dict[str, Any]) -> bool:
    messages = (record.get("body") or {}).get("messages") or [{}]
    content = messages[-1].get("content")
    return len(messages) == 1 and isinstance(content, str) and content.startswith("ping ")


def _body_key(record: dict[str, Any]) -> str:
    return json.dumps((record.get("body") or {}).get("messages"), sort_keys=True)


def _settle(runs: list[Run], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(runs)
    while pending and time.monotonic() < deadline:
        pending = [run for run in pending if not run.poll()]
        if pending:
            time.sleep(1)


def _sample(tmp_path: Path) -> list[str]:
    from streams.dev.sample import write_sample

    paths = write_sample(tmp_path / "sample", records=RECORDS, include_bad=True)
    return [str(p) for p in paths]


@needs_litellm
def test_through_a_litellm_proxy_as_direct(pipeline_factory, tmp_path: Path) -> None:
    t0, phases = time.monotonic(), {}
    upstream_key, master_key = f"sk-up-{secrets.token_hex(12)}", f"sk-{secrets.token_hex(16)}"
    direct_port, upstream_port, proxy_port = free_port(), free_port(), free_port()
    fakes = []
    for name, port in (("direct", direct_port), ("upstream", upstream_port)):
        (tmp_path / name).mkdir()
        fakes.append(_start_fake_llm(tmp_path / name, port, "--rpm", str(RPM), "--seed", "24"))
    proxy = None
    try:
        for port in (direct_port, upstream_port):  # both want the upstream's key
            _post(f"http://127.0.0.1:{port}/_fake/config", {"api_key": upstream_key})
        proxy = _start_proxy(tmp_path, proxy_port, f"http://127.0.0.1:{upstream_port}/v1",
                             master_key=master_key, upstream_key=upstream_key)
        direct = Run("direct", pipeline_factory(
            RETRO_MODEL__BASE_URL=f"http://127.0.0.1:{direct_port}/v1",
            RETRO_MODEL__NAME="fake-gpt", RETRO_MODEL__API_KEY=upstream_key,
            RETRO_FAST__MAX_RECORDS=BATCH_RECORDS), direct_port)
        proxied = Run("litellm", pipeline_factory(
            RETRO_MODEL__BASE_URL=f"http://127.0.0.1:{proxy_port}/v1",
            RETRO_MODEL__NAME="fake-gpt", RETRO_MODEL__API_KEY=master_key,
            RETRO_FAST__MAX_RECORDS=BATCH_RECORDS), upstream_port)
        paths = _sample(tmp_path)
        with ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(run.p.retro, "produce", "--quiet", *paths)
                         for run in (direct, proxied)]:
                done.result()
        phases["produced"] = round(time.monotonic() - t0, 1)
        direct.start()
        if SEQUENTIAL:
            _settle([direct], SETTLE_SECONDS)
        _wait_ready(proxy, proxy_port, tmp_path / "litellm.log")
        phases["proxy_ready"] = round(time.monotonic() - t0, 1)
        proxied.start()
        _settle([proxied] if SEQUENTIAL else [direct, proxied], SETTLE_SECONDS)
        phases["settled"] = round(time.monotonic() - t0, 1)

        figures = {run.name: run.figures() for run in (direct, proxied)}
        figures["settings"] = {"records": RECORDS, "rpm": RPM, "batch_records": BATCH_RECORDS,
                               "sequential": SEQUENTIAL,
                               "proxy_retries": PROXY_RETRIES, "litellm": LITELLM,
                               "phases": phases}
        print(json.dumps(figures, indent=1))
        if out := os.environ.get("RETRO_LITELLM_FIGURES"):
            Path(out).write_text(json.dumps(figures, indent=1), "utf-8")

        logs = "\n".join((direct.p.worker_logs()[-3000:], proxied.p.worker_logs()[-6000:],
                          (tmp_path / "litellm.log").read_text(errors="replace")[-3000:]))
        for run in (direct, proxied):
            # exact: nothing missing, nothing doubled, everything analysed, nothing parked
            assert run.result["ok"], (run.name, run.result, logs)
            assert _settled(run.result), (run.name, run.result, figures, logs)
            assert run.result["parked"] == 0, (run.name, run.result, logs)
        via = figures["litellm"]
        # the proxy forwarded every call (its upstream saw them, with its own key)
        assert via["upstream_batch_answers"] > 0, figures
        assert via["upstream_429"] <= MAX_429_SHARE * via["upstream_requests"], figures
        # no answer produced upstream and thrown away: each 200 for a batch is one the
        # worker used, and no batch was answered twice (paid twice)
        assert via["bodies_answered_twice"] == 0, figures
        assert via["upstream_batch_answers"] == via["worker_answers_used"], figures
    finally:
        if proxy is not None:
            os.killpg(proxy.pid, signal.SIGTERM)
            try:
                proxy.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proxy.pid, signal.SIGKILL)
                proxy.wait(timeout=10)
        for fake in fakes:
            fake.kill()
            fake.wait(timeout=10)
