"""Run real shippers into a Kafka broker and save what they write as test fixtures.

    .venv/bin/python bench/shippers/capture.py [--bootstrap HOST:PORT] [--only rsyslog,kcat]
        [--otelcol PATH | --build] [--batch 40] [--out tests/fixtures/shippers]

Each shipper reads the small logs in tests/fixtures/shippers/input/ (known event
times in 2017, four line formats, a service name per file) and writes to a topic
created here; every message is saved, key, headers and value, one JSON line each, to
``<out>/<shipper>.jsonl`` (``value_b64`` when the value is binary). Without
``--bootstrap`` a local broker is started (``retro broker`` code) in --state-dir.
Shippers that are not installed are skipped with a note. The versions used are
printed for the fixtures' README.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
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
SYSLOG_NG_ROOTS = [REPO / ".ci-cache" / "syslog-ng" / "root", Path("/tmp/shippers-build/sng/root")]
ALL = ("rsyslog", "syslog-ng", "kcat", "otelcol")
GO_BUILDER = "go.opentelemetry.io/collector/cmd/builder@v0.165.0"


def main() -> int:
    args = _args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with shippers.kafka(args.bootstrap, Path(args.state_dir)) as bootstrap:
        for name in args.only.split(","):
            with tempfile.TemporaryDirectory(prefix=f"capture-{name}-") as tmp:
                work = Path(tmp)
                shutil.copytree(FIXTURES / "input", work / "input")
                captured = CAPTURES[name](bootstrap, work, args)
                for fixture, messages in captured.items():
                    if not messages:  # the shipper's own log says why
                        for log in work.glob("*.log"):
                            print(f"{fixture}: nothing captured; {log.name}:\n"
                                  f"{log.read_text(errors='replace')[-2000:]}")
                        continue
                    path = out / f"{fixture}.jsonl"
                    path.write_text("".join(json.dumps(_as_json(m)) + "\n" for m in messages))
                    print(f"{fixture}: {len(messages)} messages, {path.stat().st_size} bytes "
                          f"-> {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", help="a running broker; default: start a local one")
    p.add_argument("--state-dir", default="/tmp/retro-shippers-broker")
    p.add_argument("--only", default=",".join(ALL), help=f"comma-separated of {ALL}")
    p.add_argument("--out", default=str(FIXTURES))
    p.add_argument("--otelcol", help="a built collector binary (see --build)")
    p.add_argument("--build", action="store_true",
                   help="build the collector from bench/shippers/otelcol-builder.yaml first")
    p.add_argument("--build-dir", default="/tmp/shippers-build")
    p.add_argument("--batch", type=int, default=8, help="collector batch size")
    return p.parse_args()


def _as_json(m: shippers.Captured) -> dict[str, object]:
    row: dict[str, object] = {"partition": m.partition, "offset": m.offset,
                              "timestamp_ms": m.timestamp_ms,
                              "key": m.key.decode("utf-8", "replace") if m.key else None,
                              "headers": {k: v.decode("utf-8", "replace") for k, v in m.headers}}
    try:
        row["value"] = m.value.decode("utf-8")
    except UnicodeDecodeError:
        row["value_b64"] = base64.b64encode(m.value).decode()
    return row


def _new_topics(bootstrap: str, *names: str) -> list[str]:
    topics = [f"shippers.{n}.{uuid.uuid4().hex[:6]}" for n in names]
    asyncio.run(shippers.create_topics(bootstrap, topics))
    return topics


def _lines() -> int:
    return sum(len(p.read_text().splitlines()) for p in (FIXTURES / "input").iterdir())


def capture_rsyslog(bootstrap: str, work: Path, args: argparse.Namespace) -> dict:
    if shippers.rsyslogd() is None:
        print("rsyslog: skipped (apt-get install rsyslog-kafka)")
        return {}
    print(subprocess.run(["rsyslogd", "-v"], capture_output=True, text=True).stdout.split("\n")[0])
    template, jsonmesg = _new_topics(bootstrap, "rsyslog-template", "rsyslog-jsonmesg")
    shippers.ship_rsyslog(HERE / "rsyslog.conf", work, bootstrap=bootstrap,
                          input_dir=work / "input", lines=_lines(),
                          topics={"TOPIC_TEMPLATE": template, "TOPIC_JSONMESG": jsonmesg})
    return {"rsyslog-template": _read(bootstrap, template),
            "rsyslog-jsonmesg": _read(bootstrap, jsonmesg)}


def capture_syslog_ng(bootstrap: str, work: Path, args: argparse.Namespace) -> dict:
    root = shippers.syslog_ng_root(SYSLOG_NG_ROOTS)
    if root is None:
        print("syslog-ng: skipped (apt-get download syslog-ng-core syslog-ng-mod-rdkafka "
              "libivykis0 libnet1 libpcre3 libwrap0, dpkg -x each into .ci-cache/syslog-ng/root)")
        return {}
    (topic,) = _new_topics(bootstrap, "syslog-ng-json")
    shippers.ship_syslog_ng(root, HERE / "syslog-ng.conf", work, bootstrap=bootstrap,
                            input_dir=work / "input", lines=_lines(),
                            topics={"TOPIC_JSON": topic})
    return {"syslog-ng-json": _read(bootstrap, topic)}


def _read(bootstrap: str, topic: str) -> list[shippers.Captured]:
    return shippers.read_messages_sync(bootstrap, topic, idle_seconds=1)


def capture_kcat(bootstrap: str, work: Path, args: argparse.Namespace) -> dict:
    if shippers.kcat() is None:
        print("kcat: skipped (apt-get install kcat)")
        return {}
    (topic,) = _new_topics(bootstrap, "kcat")
    services = json.loads((FIXTURES / "services.json").read_text())
    for name, service in services.items():  # the key names the source, as retro produce does
        shippers.run_kcat(bootstrap, topic, work / "input" / name, key=service)
    return {"kcat": shippers.read_messages_sync(bootstrap, topic, min_messages=_lines())}


def capture_otelcol(bootstrap: str, work: Path, args: argparse.Namespace) -> dict:
    binary = Path(args.otelcol) if args.otelcol else None
    if args.build:
        binary = build_otelcol(Path(args.build_dir))
    if binary is None or not binary.exists():
        print("otelcol: skipped (give --otelcol PATH or --build)")
        return {}
    json_topic, proto_topic = _new_topics(bootstrap, "otlp-json", "otlp-proto")
    env = {"SHIPPERS_INPUT": str(work / "input"), "SHIPPERS_BROKER": bootstrap,
           "SHIPPERS_BATCH": str(args.batch), "SHIPPERS_TOPIC_OTLP_JSON": json_topic,
           "SHIPPERS_TOPIC_OTLP_PROTO": proto_topic}
    with shippers.running(shippers.start_otelcol(binary, HERE / "otelcol.yaml", work, env)):
        got = {"otlp-json": shippers.read_messages_sync(bootstrap, json_topic, timeout=90)}
    got["otlp-proto"] = shippers.read_messages_sync(bootstrap, proto_topic, idle_seconds=1)
    return got


def build_otelcol(build_dir: Path) -> Path:
    """The collector builder from the Go module proxy, then the manifest (about 6 min)."""
    build_dir.mkdir(parents=True, exist_ok=True)
    env = {"GOMAXPROCS": "1", "GOPATH": str(build_dir / "gopath"),
           "GOCACHE": str(build_dir / "gocache"),
           "PATH": f"/usr/local/go/bin:{os.environ.get('PATH', '')}"}
    subprocess.run(["go", "install", GO_BUILDER], check=True, env=env)
    manifest = build_dir / "builder-config.yaml"
    shutil.copy(HERE / "otelcol-builder.yaml", manifest)
    started = time.monotonic()
    subprocess.run([str(build_dir / "gopath/bin/builder"), "--config", str(manifest)],
                   check=True, cwd=build_dir, env={**env, "GOFLAGS": "-mod=mod"})
    print(f"collector built in {time.monotonic() - started:.0f}s")
    return build_dir / "otelcol-retro" / "otelcol-retro"


CAPTURES = {"rsyslog": capture_rsyslog, "syslog-ng": capture_syslog_ng, "kcat": capture_kcat,
            "otelcol": capture_otelcol}

if __name__ == "__main__":
    sys.exit(main())
