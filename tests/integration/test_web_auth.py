"""The worker's HTTP views off loopback: report pages need the token, probes do not."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "d6c1f0b0e3a44b7f9c2e5a8d"


def _status(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers)


def test_a_worker_off_loopback_refuses_to_start_without_a_token(pipeline_factory) -> None:
    p = pipeline_factory(RETRO_WEB_HOST="0.0.0.0")
    proc = p.retro("worker", check=False, timeout=60)
    assert proc.returncode == 78, proc.stderr.decode()[-2000:]
    assert "RETRO_WEB_TOKEN" in proc.stderr.decode()


def test_report_pages_need_the_token_and_probes_stay_open(pipeline_factory) -> None:
    p = pipeline_factory(RETRO_WEB_HOST="0.0.0.0", RETRO_WEB_TOKEN=TOKEN)
    p.start_worker("compactor")
    base = f"http://127.0.0.1:{p.web_port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if _status(base + "/livez")[0] == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, p.worker_logs()
        time.sleep(1)
    for path in ("/livez", "/metrics"):
        assert _status(base + path)[0] == 200, path
    assert _status(base + "/healthz")[0] in (200, 503)  # readiness, never 401
    for path in ("/", "/reports", "/reports/2026-11-29/all", "/view/2026-11-29/all"):
        status, headers = _status(base + path)
        assert status == 401, path
        assert headers.get("WWW-Authenticate", "").startswith("Bearer")
        assert _status(base + path, {"Authorization": "Bearer wrong"})[0] == 401
    assert _status(base + "/reports", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    status, headers = _status(base + f"/?token={TOKEN}")
    assert status == 200 and "HttpOnly" in headers.get("Set-Cookie", "")
    assert _status(base + "/reports", {"Cookie": f"retro_token={TOKEN}"})[0] == 200
