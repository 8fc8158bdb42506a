"""retro: turn raw logs into a continuously updated AI post-mortem, streamed through Kafka.

Settings come from RETRO_* environment variables (README, "Configuration"); the
options before the command override them for one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from streams.errors import (
    EXIT_AUDIT_FAILED,
    EXIT_BROKEN_PIPE,
    DeliveryFailed,
    KafkaUnreachable,
    OutputError,
    PortInUse,
    RetroError,
    UsageError,
)
from streams.kafka.log_guard import LOG_FORMAT, limit_repeats
from streams.settings import Settings, load_settings

logger = logging.getLogger("streams")


def build_settings(args: argparse.Namespace) -> Settings:
    """Settings from RETRO_* variables with this command line's options on top."""
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
            raise UsageError(f"--set wants section.key=value, got {item!r}")
        put(key.strip(), value)
    return load_settings(**overrides)  # a bad value is one ConfigError line, before anything


# ----------------------------------------------------------------------- commands
def kafka(settings: Settings) -> None:
    """Fail fast with one line naming the address when Kafka is not there."""
    from streams.kafka.connect import check_reachable

    check_reachable(settings)


def cmd_broker(args: argparse.Namespace, settings: Settings) -> int:
    from streams.dev.broker.cluster import LocalCluster
    from streams.dev.broker.launcher import LocalBroker
    from streams.errors import BrokerError

    if args.brokers < 1:
        raise UsageError("--brokers: 1 or more")
    if args.brokers > 1 or (args.action != "start" and LocalCluster.exists(settings.state_dir)):
        return _broker_cluster(args, settings)
    if LocalCluster.exists(settings.state_dir):
        raise BrokerError(f"{settings.state_dir / 'broker'} holds a local cluster; start it "
                          "with --brokers N, or delete that folder for a single broker")
    kafka_users = None
    if args.secure or args.kafka_users:
        from streams.dev.broker.secure import default_manifest

        kafka_users = Path(args.kafka_users) if args.kafka_users else default_manifest()
    broker = LocalBroker(settings.state_dir, version=args.kafka_version,
                         kafka_users=kafka_users)
    if args.action == "start":
        state = broker.start()
        print(f"broker running: bootstrap={state.bootstrap} pid={state.pid} "
              f"dir={state.directory} log={state.log_file}")
        if kafka_users is not None:
            _secure_broker_topics(broker, settings, state.bootstrap)
            print(f"SASL/SCRAM users and ACLs from {kafka_users}; log in as one with "
                  f"`set -a; . {broker.env_file('<user>')}; set +a` (admin is the super user)")
    elif args.action == "stop":
        print("broker stopped" if broker.stop() else "no broker was running")
    else:
        state = broker.status()
        if state is None:
            print(f"no broker running (state dir {broker.root})")
            return 1
        print(json.dumps(state.__dict__, indent=2))
    return 0


def _broker_cluster(args: argparse.Namespace, settings: Settings) -> int:
    """`retro broker --brokers N`: N local KRaft nodes, topics replicated to all of them."""
    from streams.dev.broker.cluster import LocalCluster, min_insync
    from streams.kafka.topics import ensure_topics

    if args.secure or args.kafka_users:
        raise UsageError("--secure runs on one broker; leave out --brokers")
    if args.action == "start":
        cluster = LocalCluster(settings.state_dir, brokers=args.brokers,
                               version=args.kafka_version)
        bootstrap = cluster.start()
        # the workers' own RETRO_TOPICS__REPLICATION (1 by default) would leave a single copy
        topics = settings.topics.model_copy(update={"replication": args.brokers})
        kafka = settings.kafka.model_copy(update={"bootstrap": bootstrap})
        asyncio.run(ensure_topics(settings.model_copy(update={"topics": topics,
                                                              "kafka": kafka})))
        print(f"cluster of {args.brokers} running: bootstrap={bootstrap} "
              f"dir={cluster.root} (replication {args.brokers}, min.insync.replicas "
              f"{min_insync(args.brokers)}); set RETRO_TOPICS__REPLICATION={args.brokers} "
              "for topics the workers create")
        return 0
    cluster = LocalCluster.of(settings.state_dir)
    if args.action == "stop":
        print("cluster stopped" if cluster.stop() else "no broker was running")
        return 0
    status = cluster.status()
    print(json.dumps(status, indent=2))
    return 0 if status and any(n["pid"] for n in status["nodes"].values()) else 1


def _secure_broker_topics(broker: Any, settings: Settings, bootstrap: str) -> None:
    """Create the pipeline's topics as the admin: on a secured cluster no role may create
    topics (deploy/topics.yaml makes them), so the operator's part is done here."""
    from pydantic import SecretStr

    from streams.dev.broker.secure import ADMIN
    from streams.kafka.topics import ensure_topics

    kafka = settings.kafka.model_copy(update={
        "bootstrap": bootstrap, "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": ADMIN,
        "sasl_password": SecretStr(broker.credentials().passwords[ADMIN])})
    asyncio.run(ensure_topics(settings.model_copy(update={"kafka": kafka})))


def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from streams.app import ROLES
    from streams.runner import run_worker
    from streams.worker.web import check_web_port
    from streams.worker.web_auth import web_token

    roles = tuple(r.strip() for r in args.roles.split(",") if r.strip())
    if not roles or set(roles) - set(ROLES):
        raise UsageError(f"--roles {args.roles!r}: choose from {', '.join(ROLES)}")
    check_web_port(settings.web_host, settings.web_port)  # faust would fail after joining
    web_token(settings)  # off loopback the pages need a token: say so before joining
    kafka(settings)
    return run_worker(settings, roles=roles)


def cmd_topics(args: argparse.Namespace, settings: Settings) -> int:
    from streams.kafka.topics import ensure_topics

    kafka(settings)
    created = asyncio.run(ensure_topics(settings))
    print("created: " + (", ".join(created) if created else "nothing (all exist)"))
    return 0


def cmd_produce(args: argparse.Namespace, settings: Settings) -> int:
    from streams.ingest.produce import produce, total_bytes
    from streams.ingest.reader import check_inputs
    from streams.kafka.topics import ensure_topics
    from streams.redact import Redactor

    paths = args.paths
    if not paths:
        raise UsageError("produce needs log files, or - to read stdin "
                         "(e.g. `tail -F app.log | retro produce - --source app`)")
    check_inputs(paths)
    kafka(settings)
    asyncio.run(ensure_topics(settings))
    redactor = Redactor(allow=settings.clean.redact_allow,
                        opaque_tokens=settings.clean.redact_opaque_tokens)

    def redact(text: str) -> str:  # too-large records become redacted dead letters
        return redactor.redact(text)[0]

    show = sys.stderr.isatty() and not args.quiet
    if not show:
        summary = asyncio.run(produce(paths, settings, rate=args.rate, source=args.source,
                                      spread=args.spread, redact=redact))
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
                                          spread=args.spread, on_progress=on_progress,
                                          redact=redact))
    print(summary.line(), file=sys.stderr)
    if not summary.ok:
        rest = f", and input from {summary.stopped_at} on was not read" if summary.stopped_at \
            else ""
        raise DeliveryFailed(
            f"{summary.failed} of {summary.records} records did not reach Kafka, which took "
            f"nothing for {settings.kafka.delivery_timeout_seconds:.0f}s{rest}; send them "
            "again (records already delivered would then be in the raw topic twice)")
    return 0


def cmd_clean(args: argparse.Namespace, settings: Settings) -> int:
    from streams.clean.offline import run_clean
    from streams.ingest.reader import check_inputs

    check_inputs(args.paths)
    try:
        dead = open(args.deadletter, "w") if args.deadletter else None  # noqa: SIM115
    except OSError as exc:
        raise OutputError(f"--deadletter {args.deadletter}: cannot write "
                          f"({exc.strerror or exc})") from None
    try:
        run_clean(args.paths, settings=settings, out=sys.stdout, deadletter=dead,
                  summary=sys.stderr)
    finally:
        if dead is not None:
            dead.close()
    return 0


def cmd_postmortem(args: argparse.Namespace, settings: Settings) -> int:
    from streams.ingest.reader import check_inputs
    from streams.report.views.view import rank_reports, render_json, render_reports
    from streams.worker.offline import reports_of_files

    check_inputs(args.paths)
    # the run makes millions of short-lived objects beside the long-lived ones loaded so
    # far (modules, settings, schemas): the collector need not walk those again, nor
    # wake every 700 allocations (0.3 of 6 CPU s on 100k lines); output is unchanged
    gc.freeze()
    gc.set_threshold(5000, 10, 10)
    reports, dead = reports_of_files(args.paths, settings)
    if not reports:
        print("no log record in " + ", ".join(args.paths), file=sys.stderr)
        return 1
    if args.format == "json":
        print(render_json(rank_reports(reports)[0].report))
    else:
        print(render_reports(reports, plain=args.format == "text", deadletter_count=dead))
    return 0


def cmd_report(args: argparse.Namespace, settings: Settings) -> int:
    from streams.report.store import read_reports
    from streams.report.views.view import rank_reports, render_html, render_json, render_reports

    kafka(settings)
    reports = asyncio.run(read_reports(settings))
    chosen = matching_reports(reports, window=args.window, service=args.service)
    if not chosen:
        print("no report yet" + (f" for window {args.window}" if args.window else "")
              + (f" and service {args.service}" if args.service else ""), file=sys.stderr)
        return 1
    first = rank_reports(chosen)[0].report  # json and html are one document: this one
    if args.format == "json":
        print(render_json(first))
        return 0
    from streams.report.ops.deadletters import read_deadletters

    # dead letters carry no report of their own: name how many the pipeline rejected
    dead = asyncio.run(read_deadletters(settings, latest=0)).total
    from streams.report.ops.reviews import read_reviews, summarize

    entries, analysed, _ = asyncio.run(read_reviews(settings))
    parked = summarize(entries, analysed, topic=settings.topics.review, latest=0).parked
    if args.format == "html":
        print(render_html(first, deadletter_count=dead, parked_count=parked))
    else:
        print(render_reports(chosen, plain=args.format == "text", deadletter_count=dead,
                             parked_count=parked))
    return 0


def matching_reports(reports: dict[str, Any], *, window: str | None, service: str | None
                     ) -> list[Any]:
    """The reports matching the window prefix and group (service) name."""
    ids = sorted(reports)
    if window:
        ids = [i for i in ids if i.split("/", 1)[0].startswith(window)]
    if service:
        ids = [i for i in ids if i.split("/", 1)[-1] == service] or [
            i for i in ids if service in reports[i].services]
    return [reports[i] for i in ids]


def select_report(reports: dict[str, Any], *, window: str | None, service: str | None) -> Any:
    """The matching report printed first: the most significant (the latest among equals)."""
    from streams.report.views.view import rank_reports

    chosen = matching_reports(reports, window=window, service=service)
    return rank_reports(chosen)[0].report if chosen else None


def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    from streams.report.ops.audit import audit_until_clean, dumps, missing_hint, summary_line

    kafka(settings)
    result = asyncio.run(audit_until_clean(settings, wait_seconds=args.wait))
    print(dumps(result), flush=True)
    print(f"retro: {summary_line(result)}", file=sys.stderr)
    for problem in result.problems:
        print(f"retro: audit not ok: {problem}", file=sys.stderr)
    hint = missing_hint(result)
    if hint:
        print(f"retro: {hint}", file=sys.stderr)
    return 0 if result.ok else EXIT_AUDIT_FAILED


def cmd_deadletter(args: argparse.Namespace, settings: Settings) -> int:
    from streams.report.ops.deadletters import read_deadletters, render_json, render_text

    kafka(settings)
    summary = asyncio.run(read_deadletters(settings, latest=args.latest))
    print(render_json(summary, raw=args.raw) if args.format == "json" else render_text(summary))
    return 0


def cmd_review(args: argparse.Namespace, settings: Settings) -> int:
    from streams.report.ops.reviews import parked_reviews, read_reviews, render_json, render_text
    from streams.report.ops.reviews import summarize as summarize_reviews

    kafka(settings)
    entries, analysed, unreadable = asyncio.run(read_reviews(settings))
    if args.redrive:
        return _redrive(settings, parked_reviews(entries, analysed,
                                                 set(args.reason) if args.reason else None),
                        which=", ".join(args.reason) if args.reason else "every reason")
    summary = summarize_reviews(entries, analysed, topic=settings.topics.review,
                                latest=args.latest, unreadable=unreadable)
    print(render_json(summary) if args.format == "json" else render_text(summary))
    return 0


def _redrive(settings: Settings, chosen: list[Any], *, which: str) -> int:
    """Parked records back to the lanes (``streams.report.ops.redrive.redrive_parked``);
    a refusal of the raw topic is one line, said once the rest is sent."""
    from streams.report.ops.redrive import redrive_parked

    done = asyncio.run(redrive_parked(settings, chosen))
    print(f"re-drove {done.sent} parked records ({which}) to the lanes; a running worker "
          "analyses them and `retro audit` then counts them as analysed")
    if done.refused is not None:
        raise done.refused
    return 0


# the flags of ``retro fake-llm`` that set a field of its ``FakeLLMConfig``
FAKE_LLM_FIELDS = (
    "model", "rpm", "tpm", "window_seconds", "context", "base_latency", "per_input_token",
    "per_output_token", "error_rate", "timeout_rate", "malformed_rate", "wrong_ids_rate",
    "truncate_rate", "context_error_rate", "truncate_min_tokens", "context_error_min_tokens",
    "seed")


def cmd_fake_llm(args: argparse.Namespace, settings: Settings) -> int:
    from streams.dev.fakellm import FakeLLMConfig, serve
    from streams.ports import port_free

    # flags left out keep the provider's own defaults (``FakeLLMConfig``)
    given = {name: getattr(args, name) for name in FAKE_LLM_FIELDS
             if getattr(args, name) is not None}
    try:
        config = FakeLLMConfig(**given)
    except ValueError as exc:  # names the field: "error_rate must be a number in [0, 1]"
        raise UsageError(f"fake-llm: --{str(exc).replace('_', '-')}") from None
    if not port_free(args.host, args.port):
        raise PortInUse(f"port {args.port} on {args.host} is in use; choose another with --port")
    print(f"fake OpenAI-compatible provider on http://{args.host}:{args.port}/v1", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config, args.host, args.port))
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from streams.dev.demo import run_demo

    return run_demo(settings, data=args.data, records=args.records, keep=args.keep,
                    timeout=args.timeout, notify_webhook=args.notify_webhook)


# ------------------------------------------------------------------------ parser
EPILOG = """\
first steps:
  retro demo                        everything on this machine: broker, worker, sample, report
  retro demo --data app.log,logs/   the same with your logs

day to day:
  retro broker start                a local Kafka broker (or point --bootstrap at yours)
  retro worker                      clean, batch and compact records into reports
  retro produce app.log.gz ...      send logs; `tail -F app.log | retro produce -` streams
  retro report                      the post-mortems, most significant first (md, json, html)
  retro audit                       prove nothing was lost or counted twice
  retro deadletter                  what was rejected and why
  retro review                      what is parked in review; --redrive sends it again

`retro COMMAND --help` explains a command. Exit codes: 0 ok, 1 nothing found,
2 audit failed, 64 usage, 66 input file, 69 Kafka unreachable, 70 local broker,
73 output file, 74 records not delivered, 75 port in use, 77 a topic this Kafka user
may not read, 78 configuration.
"""


class _Parser(argparse.ArgumentParser):
    """argparse that exits with the usage code (64), keeping 2 for a failed audit."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(UsageError.exit_code, f"{self.prog}: error: {message}\n")


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="retro", description=__doc__,
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-dir", type=Path, metavar="DIR",
                   help="folder for the local broker, worker state and demo files "
                        "(default .retro; RETRO_STATE_DIR)")
    p.add_argument("--bootstrap", metavar="HOST:PORT[,...]",
                   help="Kafka bootstrap servers (default: the broker `retro broker start` "
                        "runs; RETRO_KAFKA__BOOTSTRAP)")
    p.add_argument("--partitions", type=int, metavar="N",
                   help="partitions of the data topics when retro creates them (default 4)")
    p.add_argument("--model-base-url", metavar="URL",
                   help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 "
                        "(default: the offline rules model; RETRO_MODEL__BASE_URL)")
    p.add_argument("--log-level", metavar="LEVEL",
                   help="DEBUG, INFO (default) or WARNING (RETRO_LOG_LEVEL)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="any setting by its dotted name, e.g. --set fast.input_budget=3000 "
                        "(repeatable)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, func: Any) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help, description=help)
        parser.set_defaults(func=func)
        return parser

    b = command("broker", "a local Apache Kafka broker (KRaft) for trying retro out",
                cmd_broker)
    b.add_argument("action", choices=["start", "stop", "status"],
                   help="start (or find the running one), stop, or show where it listens")
    b.add_argument("--kafka-version", default="4.1.1", metavar="X.Y.Z",
                   help="Apache Kafka release to fetch from Maven Central (default 4.1.1)")
    b.add_argument("--secure", action="store_true",
                   help="SASL/SCRAM logins and ACLs: one user per KafkaUser in "
                        "deploy/kafkausers.yaml with its ACLs, plus the super user admin")
    b.add_argument("--brokers", type=int, default=1, metavar="N",
                   help="start N nodes (KRaft), every topic replicated to all of them, "
                        "min.insync.replicas 2 from three nodes on (default 1)")
    b.add_argument("--kafka-users", metavar="FILE",
                   help="the KafkaUser manifests of --secure (default deploy/kafkausers.yaml)")

    w = command("worker", "run the pipeline's stage loops (scale by running more workers)",
                cmd_worker)
    w.add_argument("--roles", dest="roles", default="clean,batch,compactor",
                   metavar="ROLES",
                   help="comma-separated roles to run: clean, batch, compactor (default all); "
                        "each role set is its own consumer group")

    command("topics", "create the pipeline topics if missing (worker and produce do it too)",
            cmd_topics)

    pr = command("produce", "send log files to the raw topic, one message per log record",
                 cmd_produce)
    pr.add_argument("paths", nargs="*", metavar="PATH",
                    help="log files (gzip is detected) or - for stdin")
    pr.add_argument("--rate", type=float, metavar="N", help="send at most N records per second")
    pr.add_argument("--source", help="source name for every record (default: the file name)")
    pr.add_argument("--spread", type=int, default=1, metavar="N",
                    help="spread each source over N keys (partitions); default 1")
    pr.add_argument("--quiet", action="store_true",
                    help="no progress bar (it only shows on a terminal anyway)")

    c = command("clean", "clean files offline, without Kafka: normalized JSON lines on stdout",
                cmd_clean)
    c.add_argument("paths", nargs="+", metavar="PATH",
                   help="log files (gzip is detected) or - for stdin")
    c.add_argument("--deadletter", metavar="FILE",
                   help="write rejected records (JSON lines, reason and raw bytes) to FILE")

    m = command("postmortem", "the post-mortem of log files at once: the pipeline's steps "
                "in memory with the offline rules model, no broker", cmd_postmortem)
    m.add_argument("paths", nargs="+", metavar="PATH",
                   help="log files (gzip is detected) or - for stdin")
    m.add_argument("--format", choices=["md", "text", "json"], default="md",
                   help="output format (default md; json: the most significant window's "
                   "report with its post-mortem and incidents)")

    r = command("report", "print the reports, the most significant first", cmd_report)
    r.add_argument("--window", help="window prefix, e.g. 2026-11-29 (default: every window; "
                   "md and text show each quiet one in a line, json and html the first)")
    r.add_argument("--service", help="service group (with RETRO_REPORT__GROUP_BY=service)")
    r.add_argument("--format", choices=["md", "text", "json", "html"], default="md",
                   help="output format (default md; text: the same without Markdown escapes)")

    a = command("audit", "check every raw record is in a report, review or dead letter once",
                cmd_audit)
    a.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="keep auditing up to this many seconds while records are in flight")

    d = command("deadletter", "show what was dead-lettered and why (counts, latest entries)",
                cmd_deadletter)
    d.add_argument("--latest", type=int, default=10, metavar="N",
                   help="how many of the newest entries to list (default 10)")
    d.add_argument("--format", choices=["text", "json"], default="text",
                   help="output format (default text)")
    d.add_argument("--raw", action="store_true",
                   help="with --format json, include each record's redacted text sample "
                        "(and raw bytes, base64, where an older letter kept them)")

    rv = command("review", "show what is parked in review and why; re-drive it on demand",
                 cmd_review)
    rv.add_argument("--latest", type=int, default=10, metavar="N",
                    help="how many of the newest reviews to list (default 10)")
    rv.add_argument("--format", choices=["text", "json"], default="text",
                    help="output format (default text)")
    rv.add_argument("--redrive", action="store_true",
                    help="send the parked records to the lanes again (a worker analyses them), "
                         "read back from the lanes; records of reviews from before lane "
                         "coordinates come from the raw topic, cleaned again")
    rv.add_argument("--reason", action="append", metavar="R",
                    help="with --redrive, only reviews with this reason (repeatable)")

    f = command("fake-llm", "a simulated OpenAI-compatible provider (limits, latency, faults)",
                cmd_fake_llm)
    f.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    f.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    f.add_argument("--model", help="model name it answers to")
    f.add_argument("--rpm", type=int, metavar="N",
                   help="requests per sliding window before 429 (default unlimited)")
    f.add_argument("--tpm", type=int, metavar="N",
                   help="prompt + max_tokens per sliding window before 429 (default unlimited)")
    f.add_argument("--window-seconds", type=float, metavar="SECONDS",
                   help="the sliding window --rpm and --tpm count in (default: a minute)")
    f.add_argument("--context", type=int, metavar="TOKENS",
                   help="context window; longer prompts get 400 context_length_exceeded")
    f.add_argument("--base-latency", type=float, metavar="SECONDS",
                   help="latency of every request")
    f.add_argument("--per-input-token", type=float, metavar="SECONDS",
                   help="extra latency per prompt token")
    f.add_argument("--per-output-token", type=float, metavar="SECONDS",
                   help="extra latency per completion token")
    f.add_argument("--error-rate", type=float, metavar="SHARE",
                   help="share of requests answered 500/502/503 (0 to 1)")
    f.add_argument("--timeout-rate", type=float, metavar="SHARE",
                   help="share of requests that stall past any client timeout, then 504")
    f.add_argument("--malformed-rate", type=float, metavar="SHARE",
                   help="share of answers that are not the JSON asked for")
    f.add_argument("--wrong-ids-rate", type=float, metavar="SHARE",
                   help="share of answers that drop a record reference or invent one")
    f.add_argument("--truncate-rate", type=float, metavar="SHARE",
                   help="share of answers cut at half their length (finish_reason=length)")
    f.add_argument("--context-error-rate", type=float, metavar="SHARE",
                   help="share of requests refused as too long for the context (400)")
    f.add_argument("--truncate-min-tokens", type=int, metavar="TOKENS",
                   help="only answers longer than this are cut (default: any)")
    f.add_argument("--context-error-min-tokens", type=int, metavar="TOKENS",
                   help="only prompts longer than this are refused (default: any)")
    f.add_argument("--seed", type=int, help="random seed of the faults")

    dm = command("demo", "end to end on this machine: broker, worker, logs, report, audit",
                 cmd_demo)
    dm.add_argument("--data", metavar="PATH[,PATH...]",
                    help="comma-separated log files and/or folders to use instead of the "
                         "generated sample, e.g. --data app.log,/var/log/myapp")
    dm.add_argument("--records", type=int, default=3000, metavar="N",
                    help="size of the generated sample (default 3000, at least 300)")
    dm.add_argument("--keep", action="store_true",
                    help="leave the broker and worker running afterwards")
    dm.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                    help="give up waiting for the pipeline after this long (default 300)")
    dm.add_argument("--notify-webhook", metavar="URL",
                    help="post the demo's incidents to this Slack-compatible chat webhook as "
                         "they open, escalate and end (RETRO_NOTIFY__* work too)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        settings = build_settings(args)
        logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                            format=LOG_FORMAT)
        # client chatter (subscriptions, coordinator lookups) is not for a terminal
        for noisy in ("aiokafka", "aiohttp.access"):
            logging.getLogger(noisy).setLevel(
                max(logging.WARNING, logging.getLogger().getEffectiveLevel()))
        # a broker outage is a few lines on the terminal, not MB/s; handlers others put
        # on the root logger (a host's, a test runner's) are theirs to filter
        limit_repeats(h for h in logging.getLogger().handlers
                      if getattr(h, "stream", None) is sys.stderr)
        return int(args.func(args, settings) or 0)
    except RetroError as exc:
        print(f"retro: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # the reader went away (`retro clean ... | head`): nobody is left to tell
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so the exit-time flush stays quiet
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return 130  # 128 + SIGINT, as the shell reports it
    except Exception as exc:
        from aiokafka.errors import KafkaConnectionError

        if not isinstance(exc, KafkaConnectionError):
            raise
        # the broker went away after the start-up check passed
        print(f"retro: lost the connection to Kafka ({exc}); check that the broker is "
              "still running", file=sys.stderr)
        return KafkaUnreachable.exit_code


if __name__ == "__main__":
    sys.exit(main())
