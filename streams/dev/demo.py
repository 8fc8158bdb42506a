"""`retro demo`: the whole pipeline on one machine, from nothing to a report.

Starts the local broker (unless RETRO_KAFKA__BOOTSTRAP names one), creates the
topics, starts a worker process, produces a multi-source sample (the generated one,
or files you name), waits until the audit is clean, then prints the report and the
audit. The model is the offline `rules` analyzer unless RETRO_MODEL__BASE_URL is set.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from streams.dev.audit import audit_until_clean, dumps
from streams.dev.broker.launcher import LocalBroker
from streams.errors import RetroError
from streams.kafka.topics import ensure_topics
from streams.report.rollup import needs_rollup
from streams.report.store import read_reports
from streams.report.view import render_markdown
from streams.settings import Settings

SKIP_SUFFIXES = ("_structured.csv", "_templates.csv", ".json", ".md")
SKIP_NAMES = {"LICENSE", "CITATION"}


def input_files(data: str | None, settings: Settings, records: int) -> list[str]:
    if not data:
        from streams.dev.sample import write_sample

        return [str(p) for p in write_sample(settings.state_dir / "sample", records=records,
                                             include_bad=True)]
    found: list[str] = []
    for item in data.split(","):
        path = Path(item)
        if path.is_dir():
            found += sorted(str(p) for p in path.rglob("*") if p.is_file()
                            and p.name not in SKIP_NAMES and not p.name.endswith(SKIP_SUFFIXES))
        else:
            found.append(str(path))
    return found


def run_demo(settings: Settings, *, data: str | None, records: int, keep: bool,
             timeout: float) -> int:
    say = _printer()
    broker = None
    env = dict(os.environ)
    if not settings.kafka.bootstrap:
        broker = LocalBroker(settings.state_dir)
        say("starting the local Kafka broker (first run fetches the jars with Maven)...")
        state = broker.start(timeout=180)
        say(f"broker ready at {state.bootstrap} (state in {state.directory})")
        env["RETRO_KAFKA__BOOTSTRAP"] = state.bootstrap
        settings = settings.model_copy(update={"kafka": settings.kafka.model_copy(
            update={"bootstrap": state.bootstrap})})
    env["RETRO_STATE_DIR"] = str(settings.state_dir.resolve())
    if not settings.report.rollup_seconds:
        # the demo shows incident summaries: with the offline model they cost nothing
        env.setdefault("RETRO_REPORT__ROLLUP_SECONDS", "2")
    asyncio.run(ensure_topics(settings))
    model = settings.model.effective_backend
    say(f"model backend: {model}" + (f" at {settings.model.base_url}" if model == "openai"
                                     else " (offline analyzer, no key needed)"))

    log_path = settings.state_dir / "demo-worker.log"
    log = log_path.open("wb")
    worker = subprocess.Popen([sys.executable, "-m", "streams", "worker"], env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    say(f"worker started (pid {worker.pid}, log {log_path}, "
        f"web http://{settings.web_host}:{settings.web_port}/)")
    try:
        paths = input_files(data, settings, records)
        say(f"producing {len(paths)} files to {settings.topics.raw}...")
        produce_cmd = [sys.executable, "-m", "streams", "produce", *paths]
        subprocess.run(produce_cmd, env=env, check=True)
        started = time.monotonic()
        say("waiting for the pipeline to account for every record...")
        result = asyncio.run(_audit_while_running(settings, worker, timeout, log_path))
        say(f"pipeline settled in {time.monotonic() - started:.1f}s")
        reports = asyncio.run(_summarized_reports(settings, wait_seconds=30.0))
        for report_id in sorted(reports):
            print(render_markdown(reports[report_id]))
            print()
        print("## Audit\n\n```json\n" + dumps(result) + "\n```")
        return 0 if result.ok else 2
    finally:
        if keep:
            say("leaving the worker and broker running (--keep); stop with "
                f"`kill {worker.pid}` and `retro broker stop`")
        else:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
            if broker is not None:
                broker.stop()
                say("worker and broker stopped")
        log.close()


async def _audit_while_running(settings: Settings, worker: subprocess.Popen[bytes],
                               timeout: float, log_path: Path):
    """Audit until clean, but stop waiting (with the reason) if the worker died."""
    deadline = time.monotonic() + timeout
    while True:
        result = await audit_until_clean(settings, wait_seconds=min(10.0, timeout))
        if result.ok or result.double_counted or time.monotonic() >= deadline:
            return result
        if worker.poll() is not None:
            raise RetroError(f"the worker exited with code {worker.returncode}; see {log_path}")


async def _summarized_reports(settings: Settings, *, wait_seconds: float) -> dict:
    """The reports, once every incident's roll-up summary caught up (or time ran out)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        reports = await read_reports(settings)
        pending = [i for r in reports.values() for i in r.incidents if needs_rollup(i)]
        if not pending or time.monotonic() >= deadline:
            return reports
        await asyncio.sleep(1.0)


def _printer():
    def say(text: str) -> None:
        print(f"[retro demo] {text}", file=sys.stderr, flush=True)

    return say
