"""Incidents reach a real Alertmanager and a chat webhook: one page per incident, each
change once.

The workload is a generated fault (``streams.dev.faults``, crash seed 1): a service
starts throwing at T and its callers fail on it; the offline rules model writes the
fragments, and the report's incidents of the day come from its series. Its logs are
produced in three slices, so the report says what the on-call would have seen live:
first the failing service's own errors up to T+1 min (its callers' logs lag behind:
an incident of medium severity; a minute more of its new errors alone makes it high),
then everything up to T+12 min (the callers fail too: the incident escalates;
callers' errors that do not name it are incidents of their own), then its end and 25
quiet minutes. Workers are killed and restarted between slices, and the report's
versions split and join its runs as the batches come; what reached Alertmanager and
the webhook is then counted.
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
CUTS = (timedelta(minutes=1), timedelta(minutes=12))  # after T: medium, then worse
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


def _one_page_each(ledger: dict[str, Any]) -> None:
    """Every incident of the ledger opened once and ended once, and none of them paged
    twice: two entries of one origin never share a minute, unless one ended merged into
    the other."""
    entries = ledger["entries"]
    assert entries, ledger
    for entry in entries:
        kinds = [c["kind"] for c in entry["changes"]]
        assert kinds[0] == "opened" and kinds.count("opened") == 1, entry
        assert kinds[-1] == "ended" and kinds.count("ended") == 1, entry
    for a in entries:
        for b in entries:
            if a["id"] < b["id"] and a["service"] == b["service"] and "merged" not in (
                    a["changes"][-1]["why"], b["changes"][-1]["why"]):
                assert a["last_seen"] <= b["first_seen"] or b["last_seen"] <= a["first_seen"], (
                    a, b)


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

        def followed() -> list[dict[str, Any]]:  # the incident of the failing service
            return [a for a in _active(am) if case.truth.service in a["labels"]["service"]]

        [alert] = wait_until(followed, timeout=90, interval=0.5,
                             what=f"an active alert\n{p.worker_logs()}")
        link = f"http://127.0.0.1:{p.web_port}/view/{REPORT}"
        labels = alert["labels"]
        # few labels, of low cardinality: the incident, its origin, its severity
        assert set(labels) == {"alertname", "report", "incident", "service", "severity"}
        assert {k: labels[k] for k in ("alertname", "report", "severity")} == {
            "alertname": "RetroIncident", "report": REPORT, "severity": "medium"}
        started = case.truth.time.strftime("%Y-%m-%dT%H:%M")
        assert labels["incident"] == f"{labels['service']}@{started}"
        assert alert["generatorURL"] == link and alert["annotations"]["report_url"] == link
        assert alert["annotations"]["origin"] == labels["service"]
        assert alert["annotations"]["first_seen"].startswith(started)
        assert alert["annotations"]["evidence"]
        assert alert["startsAt"].startswith(started)
        assert [r["name"] for r in alert["receivers"]] == ["retro-oncall"]  # the doc's route
        with urllib.request.urlopen(link, timeout=5) as page:  # the link opens the report
            assert page.status == 200 and "Post-mortem" in page.read().decode()

        # killed mid-incident; the next worker posts the same alert again, not a second
        loaded = p.worker_logs().count("notify: loaded the ledgers")
        p.kill(worker, signal.SIGKILL)
        p.start_worker()
        wait_until(lambda: _ledger_loaded(p, loaded), timeout=60, what="the ledger loaded")
        wait_until(lambda: followed()[0]["updatedAt"] != alert["updatedAt"], timeout=30,
                   interval=0.5, what="the restarted worker's post")
        [again] = followed()
        assert again["fingerprint"] == alert["fingerprint"]

        p.retro("produce", "--quiet", *slices[1])

        def worse() -> list[dict[str, Any]] | None:
            # this incident's alerts once its medium label set has ended and a higher one is
            # active; the callers' failures may be incidents of their own, not followed here
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
        ledger = _ledger(p)
        _one_page_each(ledger)
        [entry] = [e for e in ledger["entries"] if e["id"] == labels["incident"]]
        kinds = [c["kind"] for c in entry["changes"]]
        assert "escalated" in kinds and entry["changes"][-1]["why"] == "resolved"
        for e in ledger["entries"]:
            assert e["delivered"]["alertmanager"] == len(e["changes"])


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

    def said(self) -> list[tuple[str, str]]:
        """Each message as (incident id, '<verb>'): 'opened', 'escalated', 'ended'."""
        return [(m.split("(incident ")[-1].split(",")[0], m.split(" ")[2])
                for m in self.messages]

    def verbs(self, incident: str) -> list[str]:
        return [verb for i, verb in self.said() if i == incident]


def test_webhook_one_page_per_incident_each_change_once_through_kills_and_rereads(
        pipeline_factory, tmp_path: Path, wait_until) -> None:
    case, slices = _slices(tmp_path)
    with Receiver() as hook:
        url_file = tmp_path / "webhook-url"  # a mounted Secret's file, as deploy/ has it
        url_file.write_text(hook.url + "\n")
        p = pipeline_factory(**_env(RETRO_NOTIFY__WEBHOOK_URL_FILE=str(url_file)))
        p.retro("produce", "--quiet", *slices[0])
        first = p.start_worker()
        wait_until(lambda: [v for _, v in hook.said()] == ["opened"], timeout=90,
                   interval=0.3, what=f"the open message\n{p.worker_logs()}")
        [(incident, _)] = hook.said()  # the failing service's own errors, alone so far
        assert case.truth.service in incident, hook.messages  # its origin, at its start
        # killed once the message is recorded as sent; the ledger says so
        wait_until(lambda: _ledger(p).get("entries", [{}])[0].get("delivered"), timeout=30,
                   what="the delivery recorded")
        p.kill(first, signal.SIGKILL)

        # two workers share the reports and the notifier's partitions: one of them speaks
        p.retro("produce", "--quiet", *slices[1])
        ports = [p.web_port, free_port()]
        workers = [p.start_worker(RETRO_WEB_PORT=str(port), RETRO_STATE_DIR=str(tmp_path / f"w{i}"))
                   for i, port in enumerate(ports)]
        wait_until(lambda: "escalated" in hook.verbs(incident), timeout=90, interval=0.3,
                   what=f"the escalation\n{p.worker_logs()}")
        p.retro("produce", "--quiet", *slices[2])

        def all_ended() -> bool:
            said = hook.said()
            return all((i, "ended") in said for i, verb in said if verb == "opened")

        wait_until(lambda: "ended" in hook.verbs(incident) and all_ended(), timeout=90,
                   interval=0.3, what=f"the ends\n{p.worker_logs()}")

        # everything read again by a fresh worker: reports, ledger, the same versions
        for worker in workers:
            p.kill(worker, signal.SIGTERM)
        loaded = p.worker_logs().count("notify: loaded the ledgers")
        p.start_worker()
        wait_until(lambda: _ledger_loaded(p, loaded), timeout=60, what="the ledger re-read")
        time.sleep(5)  # several planning rounds over every report version
        # one page per incident: each opened once, ended once, nothing said twice
        for i in {i for i, _ in hook.said()}:
            verbs = hook.verbs(i)
            assert verbs[0] == "opened" and verbs[-1] == "ended", hook.messages
            assert verbs.count("opened") == 1 and verbs.count("ended") == 1, hook.messages
        _one_page_each(_ledger(p))
        mine = [m for m in hook.messages if f"(incident {incident}," in m]
        # the followed incident escalated once per severity reached, rising:
        # medium -> high [-> critical]
        rises = [re.search(r"escalated (\w+) -> (\w+):", m).groups() for m in mine
                 if re.search(r"escalated \w+ -> ", m)]
        assert rises and [a for a, _ in rises] == ["medium", *(b for _, b in rises[:-1])]
        assert [b for _, b in rises] in (["high"], ["critical"], ["high", "critical"])
        # the re-reading worker sent nothing
        assert _metric(p.web_port, "retro_notifications_total",
                       'sink="webhook",outcome="sent"') == 0
        opened, ended = mine[0], mine[-1]
        assert "opened (medium)" in opened and "last departure at" in ended
        origin = re.search(r"^Origin: (\S+), since (\S+)\. Callers failing: ", opened, re.M)
        assert origin and origin[2].startswith(case.truth.time.strftime("%Y-%m-%dT%H:%M"))
        assert re.search(r"^- \S+: ", opened, re.M)  # its evidence
        # a link, never a log line: every raw line of the case carries a request id
        ids = {m for f in case.files for m in _UUID.findall(f.read_text())}
        for message in hook.messages:
            assert f"/view/{REPORT}|Post-mortem {REPORT}>" in message
            assert not ids & set(_UUID.findall(message)), message
