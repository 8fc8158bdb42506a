"""The OpenTelemetry Collector into a worker, outside CI: audit and fields, printed.

    .venv/bin/python bench/shippers/otel_check.py --otelcol PATH [--bootstrap HOST:PORT]
        [--batch 500] [--repeat 1]

Starts the built collector (bench/shippers/capture.py --build) on the inputs of
tests/fixtures/shippers/input/ (each line written ``--repeat`` times, to reach real
batch sizes) with ``otlp_json`` and ``otlp_proto`` exporters into two topics created
here, then one worker on both (``RETRO_TOPICS__RAW=a,b``), then ``retro audit``; prints
the audit and, per topic, each marked line's time/level/service against
expected.json. Exits 0 only when the audit is ok and every field is right.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from streams.dev import shippers

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "shippers"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--otelcol", required=True, help="the built collector binary")
    p.add_argument("--bootstrap", help="a running broker; default: start a local one")
    p.add_argument("--state-dir", default="/tmp/retro-otel-check")
    p.add_argument("--batch", type=int, default=500, help="collector send_batch_size")
    p.add_argument("--repeat", type=int, default=1, help="copies of each input line")
    p.add_argument("--wait", type=float, default=300, help="audit --wait seconds")
    args = p.parse_args()
    with (shippers.kafka(args.bootstrap, Path(args.state_dir)) as bootstrap,
          tempfile.TemporaryDirectory(prefix="otel-check-") as tmp):
        return check(Path(tmp), bootstrap, args)


def check(work: Path, bootstrap: str, args: argparse.Namespace) -> int:
    inputs = work / "input"
    inputs.mkdir()
    lines = 0
    for src in (FIXTURES / "input").iterdir():
        rows = src.read_text().splitlines()
        lines += len(rows) * args.repeat
        (inputs / src.name).write_text("".join(f"{r}\n" for r in rows for _ in range(args.repeat)))
    prefix = f"otel{uuid.uuid4().hex[:6]}"
    topics = {"otlp_json": f"{prefix}.otlp-json", "otlp_proto": f"{prefix}.otlp-proto"}
    asyncio.run(shippers.create_topics(bootstrap, list(topics.values()), partitions=2))
    env = {"SHIPPERS_INPUT": str(inputs), "SHIPPERS_BROKER": bootstrap,
           "SHIPPERS_BATCH": str(args.batch), "SHIPPERS_TOPIC_OTLP_JSON": topics["otlp_json"],
           "SHIPPERS_TOPIC_OTLP_PROTO": topics["otlp_proto"]}
    started = time.monotonic()
    with shippers.running(shippers.start_otelcol(Path(args.otelcol), HERE / "otelcol.yaml",
                                                 work, env)):
        sizes = {enc: [len(m.value) for m in shippers.read_messages_sync(
            bootstrap, topic, idle_seconds=5, timeout=120)] for enc, topic in topics.items()}
    for enc, sz in sizes.items():
        print(f"{enc}: {len(sz)} messages, {min(sz, default=0)}-{max(sz, default=0)} bytes "
              f"({time.monotonic() - started:.0f}s)")

    state = work / "pipeline"
    state.mkdir()
    penv = {**os.environ, "RETRO_KAFKA__BOOTSTRAP": bootstrap, "RETRO_STATE_DIR": str(state),
            "RETRO_APP_ID": f"{prefix}-retro", "RETRO_WEB_PORT": str(_free_port()),
            "RETRO_TOPICS__RAW": ",".join(topics.values())}
    for name in ("fast", "slow", "deadletter", "fragments", "traces", "review", "reports"):
        penv[f"RETRO_TOPICS__{name.upper()}"] = f"{prefix}.{name}"
    retro = [sys.executable, "-m", "streams"]
    with (state / "worker.log").open("wb") as log:
        worker = subprocess.Popen([*retro, "worker"], env=penv, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
        with shippers.running(worker):
            audit = subprocess.run([*retro, "audit", "--wait", str(args.wait)], env=penv,
                                   capture_output=True, text=True)
            print(audit.stdout.strip() or audit.stderr.strip()[-2000:])
            records = asyncio.run(_records(penv))
    expected = json.loads((FIXTURES / "expected.json").read_text())["lines"]
    ok = audit.returncode == 0
    for enc, topic in topics.items():
        mine = [r for r in records if r.raw.topic == topic]
        wrong = shippers.field_errors(mine, expected, copies=args.repeat)
        print(f"{enc}: {len(mine)} records of {lines} lines; {len(wrong)} wrong fields")
        for line in wrong[:25]:
            print(f"  {line}")
        ok = ok and not wrong
    if not ok:
        print(f"worker log: {(state / 'worker.log').read_text(errors='replace')[-1500:]}")
    return 0 if ok else 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _records(env: dict[str, str]) -> list:
    from streams.kafka.readers import read_topic
    from streams.records import NormalizedRecord
    from streams.settings import Settings

    saved = dict(os.environ)
    os.environ.update(env)
    try:
        settings = Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out = []
    for lane in (settings.topics.fast, settings.topics.slow):
        async for _key, value in read_topic(settings, lane):
            out.append(NormalizedRecord.model_validate_json(value))
    return out


if __name__ == "__main__":
    sys.exit(main())
