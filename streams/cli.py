"""`retro`: the command line. Each subcommand builds Settings once and calls one module.

Global flags override RETRO_* environment variables; ``--set section.key=value``
reaches any setting (``--set fast.input_budget=3000``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

from streams.errors import RetroError
from streams.settings import Settings

logger = logging.getLogger("streams")


def build_settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}

    def put(path: str, value: Any) -> None:
        node = overrides
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value

    if args.state_dir:
        put("state_dir", args.state_dir)
    if args.bootstrap:
        put("kafka.bootstrap", args.bootstrap)
    if args.partitions:
        put("topics.partitions", args.partitions)
    if args.model_base_url:
        put("model.base_url", args.model_base_url)
    if args.log_level:
        put("log_level", args.log_level)
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set wants section.key=value, got {item!r}")
        put(key.strip(), value)
    return Settings(**overrides)


# ----------------------------------------------------------------------- commands
def cmd_broker(args: argparse.Namespace, settings: Settings) -> int:
    from streams.dev.broker.launcher import LocalBroker

    broker = LocalBroker(settings.state_dir, version=args.kafka_version)
    if args.action == "start":
        state = broker.start()
        print(f"broker running: bootstrap={state.bootstrap} pid={state.pid} "
              f"dir={state.directory} log={state.log_file}")
    elif args.action == "stop":
        print("broker stopped" if broker.stop() else "no broker was running")
    else:
        state = broker.status()
        if state is None:
            print(f"no broker running (state dir {broker.root})")
            return 1
        print(json.dumps(state.__dict__, indent=2))
    return 0


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from streams.runner import run_worker

    roles = tuple(r.strip() for r in args.agents.split(",") if r.strip())
    return run_worker(settings, roles=roles)


def cmd_topics(args: argparse.Namespace, settings: Settings) -> int:
    from streams.kafka.topics import ensure_topics

    created = asyncio.run(ensure_topics(settings))
    print("created: " + (", ".join(created) if created else "nothing (all exist)"))
    return 0


def cmd_produce(args: argparse.Namespace, settings: Settings) -> int:
    from streams.ingest.produce import produce, total_bytes
    from streams.kafka.topics import ensure_topics

    asyncio.run(ensure_topics(settings))
    paths = args.paths or ["-"]
    show = sys.stderr.isatty() and not args.quiet
    if not show:
        summary = asyncio.run(produce(paths, settings, rate=args.rate, source=args.source,
                                      spread=args.spread))
    else:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        gz = any(p.endswith(".gz") for p in paths)
        with Progress(TextColumn("producing"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("records {task.fields[records]}"), TimeElapsedColumn(),
                      transient=True) as progress:
            task = progress.add_task("produce", total=None if gz else total_bytes(paths),
                                     records=0)

            def on_progress(records: int, size: int) -> None:
                progress.update(task, advance=size, records=records)

            summary = asyncio.run(produce(paths, settings, rate=args.rate, source=args.source,
                                          spread=args.spread, on_progress=on_progress))
    print(summary.line(), file=sys.stderr)
    return 0


def cmd_clean(args: argparse.Namespace, settings: Settings) -> int:
    from streams.clean.offline import run_clean

    dead = open(args.deadletter, "w") if args.deadletter else None  # noqa: SIM115
    try:
        run_clean(args.paths, settings=settings, out=sys.stdout, deadletter=dead,
                  summary=sys.stderr)
    finally:
        if dead is not None:
            dead.close()
    return 0


def cmd_report(args: argparse.Namespace, settings: Settings) -> int:
    from streams.report.store import read_reports
    from streams.report.view import render_html, render_json, render_markdown

    reports = asyncio.run(read_reports(settings))
    chosen = select_report(reports, window=args.window, service=args.service)
    if chosen is None:
        print("no report yet" + (f" for window {args.window}" if args.window else "")
              + (f" and service {args.service}" if args.service else ""), file=sys.stderr)
        return 1
    render = {"md": render_markdown, "json": render_json, "html": render_html}[args.format]
    print(render(chosen))
    return 0


def select_report(reports: dict[str, Any], *, window: str | None, service: str | None) -> Any:
    """The latest report matching the window prefix and group (service) name."""
    ids = sorted(reports)
    if window:
        ids = [i for i in ids if i.split("/", 1)[0].startswith(window)]
    if service:
        ids = [i for i in ids if i.split("/", 1)[-1] == service] or [
            i for i in ids if service in reports[i].services]
    if not ids:
        return None
    dated = [i for i in ids if not i.startswith("undated")]
    return reports[(dated or ids)[-1]]


def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    from streams.dev.audit import audit_until_clean, dumps

    result = asyncio.run(audit_until_clean(settings, wait_seconds=args.wait))
    print(dumps(result))
    return 0 if result.ok else 2


def cmd_fake_llm(args: argparse.Namespace, settings: Settings) -> int:
    from streams.dev.fakellm import FakeLLMConfig, serve

    config = FakeLLMConfig(
        model=args.model, rpm=args.rpm, tpm=args.tpm, context=args.context,
        base_latency=args.base_latency, per_input_token=args.per_input_token,
        per_output_token=args.per_output_token, error_rate=args.error_rate,
        timeout_rate=args.timeout_rate, malformed_rate=args.malformed_rate,
        wrong_ids_rate=args.wrong_ids_rate, seed=args.seed)
    print(f"fake OpenAI-compatible provider on http://{args.host}:{args.port}/v1", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, args.host, args.port))
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from streams.dev.demo import run_demo

    return run_demo(settings, data=args.data, records=args.records, keep=args.keep,
                    timeout=args.timeout)


# ------------------------------------------------------------------------ parser
def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="retro", description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", type=Path, help="where the broker and worker keep state")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: local broker)")
    p.add_argument("--partitions", type=int, help="partitions of the data topics")
    p.add_argument("--model-base-url", help="OpenAI-compatible endpoint (default: rules)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="any setting")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("broker", help="a local Apache Kafka broker (KRaft)")
    b.add_argument("action", choices=["start", "stop", "status"])
    b.add_argument("--kafka-version", default="4.1.1")
    b.set_defaults(func=cmd_broker)

    w = sub.add_parser("worker", help="run the faust worker with its agents")
    w.add_argument("--agents", default="clean,batch,compactor",
                   help="comma-separated roles: clean, batch, compactor")
    w.set_defaults(func=cmd_worker)

    sub.add_parser("topics", help="create the pipeline topics").set_defaults(func=cmd_topics)

    pr = sub.add_parser("produce", help="send log files to retro.logs.raw")
    pr.add_argument("paths", nargs="*", help="files (gzip ok) or - for stdin")
    pr.add_argument("--rate", type=float, help="records per second at most")
    pr.add_argument("--source", help="source name (default: the file name)")
    pr.add_argument("--spread", type=int, default=1, metavar="N",
                    help="spread each source over N keys (partitions); default 1")
    pr.add_argument("--quiet", action="store_true")
    pr.set_defaults(func=cmd_produce)

    c = sub.add_parser("clean", help="clean files offline: normalized JSON lines on stdout")
    c.add_argument("paths", nargs="+")
    c.add_argument("--deadletter", help="write dead letters (JSON lines) to this file")
    c.set_defaults(func=cmd_clean)

    r = sub.add_parser("report", help="print the latest report")
    r.add_argument("--window", help="window prefix, e.g. 2026-11-29")
    r.add_argument("--service", help="service group")
    r.add_argument("--format", choices=["md", "json", "html"], default="md")
    r.set_defaults(func=cmd_report)

    a = sub.add_parser("audit", help="reconcile raw offsets with reports, review, dead letter")
    a.add_argument("--wait", type=float, default=0.0,
                   help="keep auditing up to this many seconds while records are in flight")
    a.set_defaults(func=cmd_audit)

    f = sub.add_parser("fake-llm", help="a simulated OpenAI-compatible provider")
    f.add_argument("--host", default="127.0.0.1")
    f.add_argument("--port", type=int, default=8000)
    f.add_argument("--model", default="fake-gpt")
    f.add_argument("--rpm", type=int)
    f.add_argument("--tpm", type=int)
    f.add_argument("--context", type=int, default=8192)
    f.add_argument("--base-latency", type=float, default=0.02)
    f.add_argument("--per-input-token", type=float, default=0.00002)
    f.add_argument("--per-output-token", type=float, default=0.0002)
    f.add_argument("--error-rate", type=float, default=0.0)
    f.add_argument("--timeout-rate", type=float, default=0.0)
    f.add_argument("--malformed-rate", type=float, default=0.0)
    f.add_argument("--wrong-ids-rate", type=float, default=0.0)
    f.add_argument("--seed", type=int, default=0)
    f.set_defaults(func=cmd_fake_llm)

    d = sub.add_parser("demo", help="end to end: broker, worker, sample logs, report, audit")
    d.add_argument("--data", help="log files or folders to use instead of the built-in sample")
    d.add_argument("--records", type=int, default=3000, help="size of the generated sample")
    d.add_argument("--keep", action="store_true", help="leave broker and worker running")
    d.add_argument("--timeout", type=float, default=300.0)
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        settings = build_settings(args)
        logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        # client chatter (subscriptions, coordinator lookups) is not for a terminal
        for noisy in ("aiokafka", "aiohttp.access"):
            logging.getLogger(noisy).setLevel(
                max(logging.WARNING, logging.getLogger().getEffectiveLevel()))
        return int(args.func(args, settings) or 0)
    except RetroError as exc:
        print(f"retro: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
