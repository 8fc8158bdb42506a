"""Incidents reach a real Alertmanager and a chat webhook, each change once.

The workload is a generated fault (``streams.dev.faults``, crash seed 1): a service
starts throwing at T and its callers fail on it; the offline rules model writes the
fragments. Its logs are produced in three slices, so the report says what the on-call
would have seen live: first the failing service's own errors up to T+2 min (its callers'
logs lag behind: an incident of medium severity), then everything up to T+12 min (the
callers fail too: high, or critical when a batch holds enough of their errors), then
its end and 25 quiet minutes. Workers are killed and restarted between slices; what
reached Alertmanager and the webhook is then counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from helpers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
ROOT = Path(__file__).resolve().parents[2]
CUTS = (timedelta(minutes=2), timedelta(minutes=12))  # after T: medium, then worse
REPORT = "2025-12-20/all"  # the day of crash seed 1
_STAMP = re.compile(r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _env(**extra: str) -> dict[str, str]:
    return {"RETRO_NOTIFY__END_AFTER_SECONDS": "6", "RETRO_NOTIFY__MIN_SEVERITY": "medium",
            "RETRO_NOTIFY__BACKOFF_BASE_SECONDS": "0.2",
            "RETRO_KAFKA__SESSION_TIMEOUT_SECONDS": "6", **extra}


def _slices(folder: Path) -> tuple[Any, list[list[str]]]:
    """The crash case in three slices of time, each a folder of files named as the
    case's (the file name is the record's source); the callers' first slice ends at T."""
    from streams.dev.faults import write_case

    case = write_case(folder / "case", "crash", 1)
    assert case.truth.time is not None and case.truth.time.strftime("%Y-%m-%d") == REPORT[:10]
    slices: list[list[str]] = [[], [], []]
    for path in case.files:
        first = timedelta(0) if path.stem in case.truth.callers else CUTS[0]
        bounds = [case.truth.time + first, case.truth.time + CUTS[1]]
        parts: list[list[str]] = [[], [], []]
        n = 0
        for line in path.read_text().splitlines(keepends=True):
            stamp = _STAMP.search(line)
            if stamp:  # a trace's later lines go with the line that starts it
                when = datetime.fromisoformat(f"{stamp[1]}T{stamp[2]}+00:00")
                n = sum(when > b for b in bounds)
            parts[n].append(line)
        for n, lines in enumerate(parts):
            target = folder / f"slice{n}" / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(lines))
            slices[n].append(str(target))
    return case, slices


def _metric(port: int, name: str, labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    found = re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.M)
    return float(found[1]) if found else 0.0


def _ledger(p) -> dict[str, Any]:
    """The report's ledger as the notifications topic holds it now."""
    from streams.kafka.readers import read_topic

    async def read() -> dict[str, Any]:
        latest: dict[str, Any] = {}
        async for key, value in read_topic(p.settings(), p.settings().topics.notifications):
            latest[(key or b"").decode()] = json.loads(value)
        return latest.get(REPORT, {})

    return asyncio.run(read())


def _ledger_loaded(p, since: int) -> bool:
    """A worker started after ``since`` log lines has loaded the ledgers it owns."""
    return p.worker_logs().count("notify: loaded the ledgers") > since


# ---------------------------------------------------------------- Alertmanager


@contextlib.contextmanager
def _alertmanager(tmp_path: Path, route: str) -> Iterator[str]:
    port = free_port()
    config = tmp_path / "alertmanager.yml"
    config.write_text(route)
    log = open(tmp_path / "alertmanager.log", "wb")  # noqa: SIM115
    assert ALERTMANAGER is not None
    proc = subprocess.Popen(
        [ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp_path / 'am-data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/-/ready", timeout=2).read()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, (
                    (tmp_path / "alertmanager.log").read_text())
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _route() -> str:
    """The Alertmanager route of docs/notifications.md, as documented."""
    text = (ROOT / "docs" / "notifications.md").read_text()
    block = re.search(r"```yaml\n(# alertmanager\.yml.*?)```", text, re.S)
    assert block, "docs/notifications.md has no alertmanager.yml block"
    return block[1]


def _active(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v2/alerts?active=true", timeout=5) as r:
        alerts = json.loads(r.read())
    return [a for a in alerts if a["labels"].get("alertname") == "RetroIncident"]


@pytest.mark.skipif(ALERTMANAGER is None,
                    reason="prometheus-alertmanager is not installed (Debian package)")
def test_an_incident_is_one_alertmanager_alert_through_a_restart_until_it_ends(
        pipeline_factory, tmp_path: Path, wait_until) -> None:
    case, slices = _slices(tmp_path)
    with _alertmanager(tmp_path, _route()) as am:
        p = pipeline_factory(**_env(RETRO_NOTIFY__ALERTMANAGER_URL=am,
                                    RETRO_NOTIFY__REFRESH_SECONDS="30"))
        p.retro("produce", "--quiet", *slices[0])
        worker = p.start_worker()

        [alert] = wait_until(lambda: _active(am), timeout=90, interval=0.5,
                             what=f"an active alert\n{p.worker_logs()}")
        link = f"http://127.0.0.1:{p.web_port}/view/{REPORT}"
        labels = alert["labels"]
        assert {k: labels[k] for k in ("alertname", "report", "severity")} == {
            "alertname": "RetroIncident", "report": REPORT, "severity": "medium"}
        assert case.truth.service in labels["service"]  # the suspected origin
        assert labels["incident"] and alert["generatorURL"] == link
        assert alert["annotations"]["report_url"] == link
        assert case.truth.service in alert["annotations"]["origin"]
        assert alert["startsAt"].startswith(case.truth.time.strftime("%Y-%m-%dT%H:%M"))
        assert [r["name"] for r in alert["receivers"]] == ["retro-oncall"]  # the doc's route
        with urllib.request.urlopen(link, timeout=5) as page:  # the link opens the report
            assert page.status == 200 and "Post-mortem" in page.read().decode()

        # killed mid-incident; the next worker posts the same alert again, not a second
        loaded = p.worker_logs().count("notify: loaded the ledgers")
        p.kill(worker, signal.SIGKILL)
        p.start_worker()
        wait_until(lambda: _ledger_loaded(p, loaded), timeout=60, what="the ledger loaded")
        wait_until(lambda: _active(am)[0]["updatedAt"] != alert["updatedAt"], timeout=30,
                   interval=0.5, what="the restarted worker's post")
        [again] = _active(am)
        assert again["fingerprint"] == alert["fingerprint"]

        p.retro("produce", "--quiet", *slices[1])

        def worse() -> list[dict[str, Any]] | None:
            # this incident's alerts once its medium label set has ended and a higher one is
            # active; under load the batches may also open another incident, which is not
            # the one followed here
            mine = [a for a in _active(am) if a["labels"]["incident"] == labels["incident"]]
            return mine if len(mine) == 1 and mine[0]["labels"]["severity"] != "medium" else None

        escalated = wait_until(worse, timeout=60, interval=0.5, what="the escalation")
        # the same incident, higher: its medium label set ended at the escalation
        [higher] = escalated
        assert higher["labels"] == {**labels, "severity": higher["labels"]["severity"]}
        assert higher["labels"]["severity"] in ("high", "critical")

        began = time.monotonic()
        p.retro("produce", "--quiet", *slices[2])
        wait_until(lambda: not _active(am), timeout=60, interval=0.5, what="the end")
        # ended by the worker, not lapsed: open alerts are posted 4 x 30 s ahead
        assert time.monotonic() - began < 100
        [entry] = [e for e in _ledger(p)["entries"] if e["id"] == labels["incident"]]
        kinds = [c["kind"] for c in entry["changes"]]
        assert kinds[0] == "opened" and kinds[-1] == "ended" and "escalated" in kinds
        assert entry["delivered"]["alertmanager"] == len(kinds)


# ---------------------------------------------------------------- chat webhook


class Receiver:
    """A Slack-compatible incoming webhook on a loopback port (aiohttp, own thread)."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        from aiohttp import web

        async def hook(request: web.Request) -> web.Response:
            self.messages.append((await request.json())["text"])
            return web.Response(text="ok")

        async def start() -> None:
            app = web.Application()
            app.router.add_post("/services/T000/B000/hook-secret", hook)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", 0).start()
            host, port = self._runner.addresses[0][:2]
            self.url = f"http://{host}:{port}/services/T000/B000/hook-secret"
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def __enter__(self) -> Receiver:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def said(self) -> list[str]:
        """Each message as '<verb>' ('opened', 'escalated', 'ended')."""
        return [m.split(" ")[2] for m in self.messages]


def test_webhook_open_escalate_end_each_once_through_kills_and_rereads(
        pipeline_factory, tmp_path: Path, wait_until) -> None:
    case, slices = _slices(tmp_path)
    with Receiver() as hook:
        url_file = tmp_path / "webhook-url"  # a mounted Secret's file, as deploy/ has it
        url_file.write_text(hook.url + "\n")
        p = pipeline_factory(**_env(RETRO_NOTIFY__WEBHOOK_URL_FILE=str(url_file)))
        p.retro("produce", "--quiet", *slices[0])
        first = p.start_worker()
        wait_until(lambda: hook.said() == ["opened"], timeout=90, interval=0.3,
                   what=f"the open message\n{p.worker_logs()}")
        # killed once the message is recorded as sent; the ledger says so
        wait_until(lambda: _ledger(p).get("entries", [{}])[0].get("delivered"), timeout=30,
                   what="the delivery recorded")
        p.kill(first, signal.SIGKILL)

        # two workers share the reports and the notifier's partitions: one of them speaks
        p.retro("produce", "--quiet", *slices[1])
        ports = [p.web_port, free_port()]
        workers = [p.start_worker(RETRO_WEB_PORT=str(port), RETRO_STATE_DIR=str(tmp_path / f"w{i}"))
                   for i, port in enumerate(ports)]
        wait_until(lambda: "escalated" in hook.said(), timeout=90, interval=0.3,
                   what=f"the escalation\n{p.worker_logs()}")
        p.retro("produce", "--quiet", *slices[2])
        wait_until(lambda: "ended" in hook.said(), timeout=90, interval=0.3,
                   what=f"the end\n{p.worker_logs()}")

        # everything read again by a fresh worker: reports, ledger, the same versions
        for worker in workers:
            p.kill(worker, signal.SIGTERM)
        loaded = p.worker_logs().count("notify: loaded the ledgers")
        p.start_worker()
        wait_until(lambda: _ledger_loaded(p, loaded), timeout=60, what="the ledger re-read")
        time.sleep(5)  # several planning rounds over every report version
        said = hook.said()
        assert said[0] == "opened" and said[-1] == "ended", hook.messages
        assert said.count("opened") == 1 and said.count("ended") == 1, hook.messages
        # one escalation per severity reached, rising: medium -> high [-> critical]
        rises = [re.search(r"escalated (\w+) -> (\w+):", m).groups() for m in hook.messages
                 if " escalated " in m]
        assert rises and said[1:-1] == ["escalated"] * len(rises), hook.messages
        assert [a for a, _ in rises] == ["medium", *(b for _, b in rises[:-1])]
        assert [b for _, b in rises] in (["high"], ["critical"], ["high", "critical"])
        # the re-reading worker sent nothing
        assert _metric(p.web_port, "retro_notifications_total",
                       'sink="webhook",outcome="sent"') == 0
        opened, ended = hook.messages[0], hook.messages[-1]
        assert "opened (medium)" in opened and "last error at" in ended
        incident = re.search(r"\(incident (\S+),", opened)
        assert incident and all(f"(incident {incident[1]}," in m for m in hook.messages)
        # a link, never a log line: every raw line of the case carries a request id
        ids = {m for f in case.files for m in _UUID.findall(f.read_text())}
        for message in hook.messages:
            assert f"/view/{REPORT}|Post-mortem {REPORT}>" in message
            assert not ids & set(_UUID.findall(message)), message
