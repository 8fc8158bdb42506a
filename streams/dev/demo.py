"""`retro demo`: the whole pipeline on one machine, from nothing to a report.

Checks its inputs, the Kafka address and the web port first, then starts the local
broker (unless RETRO_KAFKA__BOOTSTRAP names one or it already runs), creates the
topics, starts a worker process, produces a multi-source sample (the generated one,
or files you name), waits until the audit is clean, then prints the report and the
audit. Whatever happens, it stops what it started (unless --keep). The model is the
offline `rules` analyzer unless RETRO_MODEL__BASE_URL is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from pydantic import SecretStr

from streams.dev.broker.launcher import LocalBroker
from streams.errors import EXIT_AUDIT_FAILED, InputError, PortInUse, RetroError, UsageError
from streams.ingest.reader import check_inputs
from streams.kafka.connect import check_reachable
from streams.kafka.readers import read_topic
from streams.kafka.topics import ensure_topics
from streams.notify.incidents import alerts_for
from streams.notify.ledger import Notices, recognised
from streams.notify.sinks import configured_urls
from streams.notify.step import latest_windows, window_over
from streams.ports import free_port, port_free
from streams.report.analysis.rollup import needs_rollup
from streams.report.ops.audit import audit_until_clean, dumps
from streams.report.state.keys import UNDATED
from streams.report.state.model import SEVERITY_WEIGHT
from streams.report.store import read_reports
from streams.report.views.view import render_reports
from streams.settings import Settings, sink_urls
from streams.worker.web import check_web_port

SKIP_SUFFIXES = ("_structured.csv", "_templates.csv", ".json", ".md")
SKIP_NAMES = {"LICENSE", "CITATION"}


def data_files(data: str) -> list[str]:
    """The log files named by ``--data`` (files and folders, comma-separated).

    Checked before anything starts, so a typo costs no broker start-up.
    """
    found: list[str] = []
    for item in (i.strip() for i in data.split(",")):
        if not item:
            continue
        path = Path(item)
        if path.is_dir():
            inside = sorted(str(p) for p in path.rglob("*") if p.is_file()
                            and p.name not in SKIP_NAMES and not p.name.endswith(SKIP_SUFFIXES))
            if not inside:
                raise InputError(f"--data {item}: the folder holds no log files")
            found += inside
        elif not path.exists():
            raise InputError(f"--data {item}: no such file or folder")
        else:
            found.append(item)
    if not found:
        raise UsageError("--data names no files; give files or folders, comma-separated")
    check_inputs(found)
    return found


def sample_files(settings: Settings, records: int) -> list[str]:
    """The generated multi-source sample (with bad records), written under the state dir."""
    from streams.dev.sample import write_sample

    return [str(p) for p in write_sample(settings.state_dir / "sample", records=records,
                                         include_bad=True)]


def choose_web_port(settings: Settings, *, user_chose: bool) -> tuple[Settings, str | None]:
    """Settings with a web port the worker can listen on, and a note if it moved.

    A port the user chose (RETRO_WEB_PORT, ``--set web_port=``) is kept or refused;
    the default moves to a free one, since the demo is meant to just run.
    """
    host, port = settings.web_host, settings.web_port
    if port_free(host, port):
        return settings, None
    if user_chose:
        check_web_port(host, port)  # raises PortInUse naming RETRO_WEB_PORT
    chosen = free_port(host)
    note = (f"port {port} is in use; the worker serves on {chosen} instead "
            "(RETRO_WEB_PORT chooses)")
    return settings.model_copy(update={"web_port": chosen}), note


def run_demo(settings: Settings, *, data: str | None, records: int, keep: bool,
             timeout: float, notify_webhook: str | None = None) -> int:
    say = _printer()
    # everything that can be checked is checked before anything starts
    from streams.dev.sample import MIN_RECORDS

    paths = data_files(data) if data else None
    if paths is None and records < MIN_RECORDS:
        raise UsageError(f"--records must be at least {MIN_RECORDS} (got {records})")
    if notify_webhook:
        settings = with_webhook(settings, notify_webhook)
    notify_sinks = list(configured_urls(settings))
    if settings.kafka.bootstrap:
        check_reachable(settings)
    settings, moved = choose_web_port(
        settings, user_chose="web_port" in settings.model_fields_set)
    if moved:
        say(moved)
    env = dict(os.environ)
    env["RETRO_WEB_PORT"] = str(settings.web_port)
    env["RETRO_STATE_DIR"] = str(settings.state_dir.resolve())
    if not settings.report.rollup_seconds:
        # the demo shows incident summaries: with the offline model they cost nothing
        env.setdefault("RETRO_REPORT__ROLLUP_SECONDS", "2")
    if notify_webhook:
        env["RETRO_NOTIFY__WEBHOOK_URL"] = notify_webhook
    if notify_sinks and "end_after_seconds" not in settings.notify.model_fields_set:
        # the sample is replayed in seconds, not lived through in an hour
        env["RETRO_NOTIFY__END_AFTER_SECONDS"] = "5"
    started = _Started()
    try:
        if settings.kafka.bootstrap:
            env["RETRO_KAFKA__BOOTSTRAP"] = settings.kafka.bootstrap
        else:
            broker = LocalBroker(settings.state_dir)
            if broker.status() is None:  # a broker the user started is theirs to stop
                started.broker = broker
                say("starting the local Kafka broker (first run fetches the jars with "
                    "Maven)...")
            state = broker.start(timeout=180)
            say(f"broker ready at {state.bootstrap} (state in {state.directory})"
                + ("" if started.broker else "; it was running, so it stays running"))
            env["RETRO_KAFKA__BOOTSTRAP"] = state.bootstrap
            settings = settings.model_copy(update={"kafka": settings.kafka.model_copy(
                update={"bootstrap": state.bootstrap})})
        asyncio.run(ensure_topics(settings))
        model = settings.model.effective_backend
        say(f"model backend: {model}" + (f" at {settings.model.base_url}" if model == "openai"
                                         else " (offline analyzer, no key needed)"))
        if notify_sinks:
            say(f"incidents go to {' and '.join(notify_sinks)} as they open, escalate and end")

        log_path = settings.state_dir / "demo-worker.log"
        started.log = log_path.open("wb")
        started.worker = subprocess.Popen(
            [sys.executable, "-m", "streams", "worker"], env=env, stdout=started.log,
            stderr=subprocess.STDOUT, start_new_session=True)
        say(f"worker started (pid {started.worker.pid}, log {log_path}, "
            f"web http://{settings.web_host}:{settings.web_port}/)")
        if paths is None:
            paths = sample_files(settings, records)
        say(f"producing {len(paths)} files to {settings.topics.produce_topic}...")
        produce_cmd = [sys.executable, "-m", "streams", "produce", *paths]
        produced = subprocess.run(produce_cmd, env=env, check=False)
        if produced.returncode != 0:
            raise RetroError(f"`retro produce` failed (exit {produced.returncode})")
        began = time.monotonic()
        say("waiting for the pipeline to account for every record...")
        result = asyncio.run(_audit_while_running(settings, started.worker, timeout, log_path))
        say(f"pipeline settled in {time.monotonic() - began:.1f}s")
        reports = asyncio.run(_summarized_reports(settings, wait_seconds=30.0))
        # plain text: a terminal shows `<NUM>`, not Markdown's `\<NUM\>`
        print(render_reports(reports.values(), plain=True,
                             deadletter_count=result.claimed.get("deadletter"),
                             review_count=result.claimed.get("review")))
        print("## Audit\n\n```json\n" + dumps(result) + "\n```")
        if notify_sinks:
            say(asyncio.run(_notified(settings, notify_sinks, wait_seconds=30.0)))
        return 0 if result.ok else EXIT_AUDIT_FAILED
    finally:
        started.stop(keep=keep, say=say)


class _Started:
    """What the demo started, so that exactly that is stopped, whatever failed."""

    def __init__(self) -> None:
        self.broker: LocalBroker | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.log: IO[bytes] | None = None

    def stop(self, *, keep: bool, say: Callable[[str], None]) -> None:
        try:
            if keep:
                how = ([f"`kill {self.worker.pid}`"] if self.worker else []) + (
                    ["`retro broker stop`"] if self.broker else [])
                if how:
                    say(f"leaving what the demo started running (--keep); stop it with "
                        f"{' and '.join(how)}")
                return
            stopped = []
            if self.worker is not None:
                _stop_process_group(self.worker)
                stopped.append("worker")
            if self.broker is not None:
                self.broker.stop()
                stopped.append("broker")
            if stopped:
                say(f"stopped the {' and the '.join(stopped)}")
        finally:
            if self.log is not None:
                self.log.close()


def _stop_process_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 60 s; a process that already exited is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


async def _audit_while_running(settings: Settings, worker: subprocess.Popen[bytes],
                               timeout: float, log_path: Path):
    """Audit until clean, but stop waiting (with the reason) if the worker died."""
    deadline = time.monotonic() + timeout
    while True:
        result = await audit_until_clean(settings, wait_seconds=min(10.0, timeout))
        if result.ok or result.double_counted or time.monotonic() >= deadline:
            return result
        if worker.poll() is not None:
            raise worker_failure(log_path.read_text(errors="replace"), worker.returncode,
                                 settings.web_port, log_path)


def worker_failure(log: str, code: int, port: int, log_path: Path) -> RetroError:
    """Why the demo's worker exited, in one line: its last error line, then where the
    whole log is (settings were checked before it started; this is what remains)."""
    if "address already in use" in log:
        return PortInUse(f"the worker could not listen on port {port}: it is in use; set "
                         "RETRO_WEB_PORT to a free port")
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if _ERROR_LINE.search(line)),
                lines[-1] if lines else "")
    said = f": {last[:300]}" if last else ""
    return RetroError(f"the worker exited with code {code}{said} (whole log: {log_path})")


_ERROR_LINE = re.compile(r"^retro: |\b[A-Za-z]*(Error|Exception)\b|\bERROR\b")


async def _summarized_reports(settings: Settings, *, wait_seconds: float) -> dict:
    """The reports, once every incident's roll-up summary caught up (or time ran out)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        reports = await read_reports(settings)
        pending = [i for r in reports.values() for i in r.incidents if needs_rollup(i)]
        if not pending or time.monotonic() >= deadline:
            return reports
        await asyncio.sleep(1.0)


def with_webhook(settings: Settings, url: str) -> Settings:
    """The settings with ``--notify-webhook``'s URL, refused (before anything starts)
    unless it is an http(s) URL; its value is never repeated, it is a credential."""
    try:
        sink_urls(url, many=False)
    except ValueError as exc:
        raise UsageError(f"--notify-webhook: {exc}") from None
    notify = settings.notify.model_copy(update={"webhook_url": SecretStr(url.strip())})
    return settings.model_copy(update={"notify": notify})


async def _notified(settings: Settings, sinks: list[str], *, wait_seconds: float) -> str:
    """What the notifier told the sinks, once every incident of the reports is opened
    (and ended, if it has) and nothing is owed to a sink, or time ran out."""
    reports = await read_reports(settings)
    ids = [rid for rid in reports if not rid.startswith(UNDATED)]
    latest = latest_windows(ids)
    worth = {s for s, w in SEVERITY_WEIGHT.items()
             if w >= SEVERITY_WEIGHT[settings.notify.min_severity]}
    now = datetime.now(UTC)
    wanted = [a for rid in ids
              for a in alerts_for(
                  reports[rid], closed=window_over(reports[rid], latest, now),
                  resolve_after_minutes=settings.notify.resolve_after_minutes)
              if a.severity in worth and not a.closed]
    deadline = time.monotonic() + wait_seconds
    while True:
        latest_ledgers: dict[str, Notices] = {}
        async for key, value in read_topic(settings, settings.topics.notifications):
            if key is not None and value is not None:
                latest_ledgers[key.decode()] = Notices.from_bytes(value)
        entries = [e for n in latest_ledgers.values() for e in n.entries]
        owed = sum(e.owed(s) for e in entries for s in sinks)
        told = all(any(e.open != a.ended for e in own)
                   for a, own in zip(wanted, recognised(entries, wanted), strict=True))
        if (told and not owed) or time.monotonic() >= deadline:
            break
        await asyncio.sleep(1.0)
    kinds = [c.kind for e in entries for c in e.changes]
    said = ", ".join(f"{kinds.count(k)} {k}" for k in ("opened", "escalated", "ended"))
    tail = f"; {owed} change(s) still owed when the demo stopped" if owed else ""
    return f"notified {' and '.join(sinks)} of {len(entries)} incident(s): {said}{tail}"


def _printer():
    def say(text: str) -> None:
        print(f"[retro demo] {text}", file=sys.stderr, flush=True)

    return say
