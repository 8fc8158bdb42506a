"""The whole pipeline on a secured broker whose users and ACLs are deploy/kafkausers.yaml.

A second broker of its own (SASL/SCRAM, StandardAuthorizer, no ACL means no access)
runs only for this module. The admin creates the topics, as topics.yaml does on a
cluster; then each role runs as its own worker process logged in as its own
KafkaUser, the producer user sends the logs, the reader user audits, KEDA's user reads
the lag, and every user is refused what its manifest does not grant. Every reading
command runs as every user, on the empty topics and on full ones: a topic the user may
not read (not even describe, or describe only) is one "not authorized" line and exit
77, never an empty answer. A refusal the pipeline needs shows up here as a stuck stage
or a failed audit, named in the logs.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import fake_control, free_port, scraped_sum, start_fake_llm

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "kafkausers.yaml"
USER = {"clean": "retro-stream-clean", "batch": "retro-stream-batch",
        "compactor": "retro-stream-compactor", "keda": "retro-stream-keda",
        "reader": "retro-stream-reader", "producer": "retro-stream-producer"}


@pytest.fixture(scope="module")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from streams.dev.broker.launcher import LocalBroker
    from streams.errors import BrokerError

    broker = LocalBroker(tmp_path_factory.mktemp("secured-broker"), kafka_users=MANIFEST)
    try:
        broker.ensure_jars()
    except BrokerError as exc:
        pytest.skip(f"no Kafka distribution: {exc}")
    state = broker.start(timeout=120)
    try:
        yield broker, state
    finally:
        broker.stop()


@pytest.fixture
def kafka_bootstrap(secured_broker) -> str:
    """The session broker's name, pointed at the secured one for this module's pipelines."""
    return secured_broker[1].bootstrap


def _deploy_names() -> dict[str, str]:
    """The app id and topic names deploy/ assumes: the settings' defaults."""
    from streams.settings import TopicSettings

    names = {"RETRO_APP_ID": "retro-stream"}
    for name, value in TopicSettings().model_dump().items():
        if isinstance(value, str) and value.startswith("retro."):  # every topic's name
            names[f"RETRO_TOPICS__{name.upper()}"] = value
    return names


def _kwargs(broker, state, user: str) -> dict:
    return {"bootstrap_servers": state.bootstrap, **broker.credentials().client_kwargs(user)}


async def _read(kwargs: dict, topic: str) -> str:
    """"ok" when ``topic``'s first partition can be fetched, else the refusal's name."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(**kwargs, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning()
        await consumer.getmany(timeout_ms=1000)
        return "ok"
    except Exception as exc:  # the refusal is the answer
        return type(exc).__name__
    finally:
        await consumer.stop()


async def _write(kwargs: dict, topic: str) -> str:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**kwargs, request_timeout_ms=5000)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"must not land")
        return "ok"
    except Exception as exc:  # the refusal is the answer
        return type(exc).__name__
    finally:
        await producer.stop()


async def _create_topic(kwargs: dict) -> int:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(**kwargs)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic("retro.not.allowed", 1, 1)])
        return response.topic_errors[0][1]
    finally:
        await admin.close()


async def _lag_as(kwargs: dict, group: str, topics: list[str]) -> dict[str, int]:
    """What KEDA's kafka scaler reads: the group's committed offsets and the topics' end
    offsets, no records; total lag per topic."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient

    from streams.kafka.connect import partition_leaders

    admin = AIOKafkaAdminClient(**kwargs)
    consumer = AIOKafkaConsumer(**kwargs, enable_auto_commit=False)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        described = await admin.describe_consumer_groups([group])
        assert described, group
        tps = [TopicPartition(*tp) for tp in sorted(await partition_leaders(admin, topics))]
        ends = await consumer.end_offsets(tps)
        return {t: sum(ends[tp] - max(committed[tp].offset, 0) if tp in committed else ends[tp]
                       for tp in tps if tp.topic == t) for t in topics}
    finally:
        await consumer.stop()
        await admin.close()


def _audit_until(p, reader: dict[str, str], done, timeout: float = 120) -> dict:
    """``retro audit`` as the reader user until it is exact and ``done(audit, lanes)``."""
    audit: dict = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = _retro_as(p, reader, "audit")
        assert proc.stdout.strip(), proc.stderr.decode()[-3000:]
        audit = json.loads(proc.stdout)
        lanes = audit["raw_records"] - audit["dead_lettered"]
        if audit["ok"] and done(audit, lanes):
            return audit
        time.sleep(2)
    raise AssertionError(f"{audit}\n{_refused_in(p)}")


def _webhook_sink():
    """A chat webhook on loopback that takes every post."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.server.posts += 1  # type: ignore[attr-defined]
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    server.posts = 0  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _retrying(call, timeout: float = 30):
    """``call()`` again while Kafka answers a retriable error (a fresh cluster creates
    its offsets topic, and so its group coordinator, on first use)."""
    from aiokafka.errors import KafkaError

    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except KafkaError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _authorization_lines(p) -> list[str]:
    lines = [f"{log.name}: {line}" for log in sorted(p.state_dir.glob("worker-*.log"))
             for line in log.read_text(errors="replace").splitlines()
             if "authoriz" in line.lower()]
    return list(dict.fromkeys(lines))


def _refused_in(p) -> str:
    """The workers' authorization failures first (they name the missing ACL), then logs."""
    return "\n".join([*_authorization_lines(p), p.worker_logs()])


def _retro_as(p, env: dict[str, str], *args: str, timeout: float = 120
              ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "streams", *args],
                          env={**os.environ, **p.env, **env}, capture_output=True,
                          timeout=timeout, cwd=p.state_dir)


# what each reading command reads, in order, and the operation it needs there; `retro
# report` reads the dead letters and the review only once it has a report to print
READS = {
    "deadletter": [("retro.deadletter", "Read")],
    "review": [("retro.review", "Read"), ("retro.reports", "Read")],
    "report": [("retro.reports", "Read"), ("retro.deadletter", "Read"), ("retro.review", "Read")],
    "audit": [("retro.logs.raw", "Describe"), ("retro.reports", "Read"), ("retro.review", "Read"),
              ("retro.deadletter", "Read")],
}
EXITS = {"deadletter": {0}, "review": {0}, "report": {0, 1}, "audit": {0, 2}}  # not refused


def _topic_acls() -> dict[str, dict[str, set[str]]]:
    """user -> topic -> the operations deploy/kafkausers.yaml grants it there."""
    import yaml

    acls: dict[str, dict[str, set[str]]] = {}
    for doc in yaml.safe_load_all(MANIFEST.read_text()):
        if not doc or doc.get("kind") != "KafkaUser":
            continue
        topics = acls.setdefault(doc["metadata"]["name"], {})
        for acl in doc["spec"]["authorization"]["acls"]:
            resource = acl["resource"]
            assert resource.get("patternType", "literal") == "literal", resource
            if resource["type"] == "topic":
                topics.setdefault(resource["name"], set()).update(acl["operations"])
    return acls


def _may(operations: set[str], need: str) -> bool:
    # Kafka: a user who may read, write, delete or alter a topic may describe it
    return need in operations or (need == "Describe" and bool(
        operations & {"Read", "Write", "Delete", "Alter"}))


def _every_reading_command_refuses_honestly(p, credentials, *, reports: bool) -> int:
    """Each reading command run as each user: one that may not read a topic the command
    reads (whether it may describe it or not, whether the topic holds anything or not)
    gets one "not authorized" line and exit 77, never an empty answer; the others are
    not refused. How many refusals were checked."""
    from concurrent.futures import ThreadPoolExecutor

    acls = _topic_acls()
    cases = [(role, command) for role in USER for command in READS]

    def run(case: tuple[str, str]) -> subprocess.CompletedProcess[bytes]:
        return _retro_as(p, credentials.client_env(USER[case[0]]), case[1])

    with ThreadPoolExecutor(8) as pool:
        procs = list(pool.map(run, cases))
    wrong, refusals = [], 0
    for (role, command), proc in zip(cases, procs, strict=True):
        reads = READS[command] if reports or command != "report" else READS[command][:1]
        granted = acls[USER[role]]
        refused = next((t for t, need in reads if not _may(granted.get(t, set()), need)), None)
        out, err = proc.stdout.decode(), proc.stderr.decode()
        if refused is None:
            ok = proc.returncode in EXITS[command] and "authoriz" not in err.lower()
        else:
            refusals += 1
            ok = (proc.returncode == 77 and not out.strip() and "Traceback" not in err
                  and len(err.strip().splitlines()) == 1
                  and f"not authorized to read {refused}" in err)
        if not ok:
            wrong.append(f"{role} `retro {command}`: exit {proc.returncode}, expected "
                         f"{f'77 for {refused}' if refused else 'no refusal'}\n{out[-300:]}"
                         f"{err[-800:]}")
    assert not wrong, "\n".join(wrong)
    return refusals


def _rejected_fragment_review(settings, count: int):
    """What the compactor parks for a fragment it could not merge: a review of
    ``count`` raw records that clean into lane records, naming no lane coordinates."""
    from streams.clean.cleaner import Cleaner
    from streams.clean.step import route
    from streams.intervals import Coverage
    from streams.kafka.readers import read_messages
    from streams.report.compactor.step import rejected_review

    from helpers import make_fragment

    async def clean_ones() -> list:
        cleaner, found = Cleaner.from_settings(settings), []
        async for m in read_messages(settings, settings.topics.raw_topics[0]):
            routed = route(cleaner, value=m.value, key=m.key, topic=m.topic,
                           partition=m.partition, offset=m.offset, timestamp_ms=m.timestamp)
            if len(routed) == 1 and routed[0].lane in ("fast", "slow"):
                found.append(m)
                if len(found) == count:
                    return found
        raise AssertionError("too few raw records clean into lane records")

    chosen = asyncio.run(clean_ones())
    covered = Coverage.from_coords([(m.topic, m.partition, m.offset) for m in chosen])
    return rejected_review(make_fragment("f-refused", covered.to_json()), "it names no report",
                           "(none)")


def test_each_role_runs_as_its_own_user_and_is_refused_the_rest(
        secured_broker, pipeline_factory, tmp_path: Path) -> None:
    from streams.dev.sample import write_sample
    from streams.kafka.topics import ensure_topics

    broker, state = secured_broker
    credentials = broker.credentials()
    started = time.monotonic()
    sink = None
    llm = free_port()
    fake = start_fake_llm(tmp_path, llm, "--seed", "22")
    try:
        p = pipeline_factory(**_deploy_names(), **credentials.client_env("admin"),
                             RETRO_MODEL__BASE_URL=f"http://127.0.0.1:{llm}/v1",
                             RETRO_MODEL__NAME="fake-gpt",
                             RETRO_MODEL__BACKOFF_BASE_SECONDS="0.2",
                             RETRO_REVIEW__BACKOFF_BASE_SECONDS="1",
                             RETRO_REVIEW__BACKOFF_MAX_SECONDS="2")
        # the operator's part: no role may create topics
        asyncio.run(ensure_topics(p.settings()))
        # nothing written yet: a user who may not read a topic is still told so
        refusals = _every_reading_command_refuses_honestly(p, credentials, reports=False)
        sample = [str(f) for f in write_sample(tmp_path / "sample", records=300,
                                               include_bad=True)]
        produced = _retro_as(p, credentials.client_env(USER["producer"]),
                             "produce", "--quiet", *sample)
        assert produced.returncode == 0, produced.stderr.decode()[-3000:]

        keda = _kwargs(broker, state, USER["keda"])
        raw_lag = _retrying(lambda: asyncio.run(
            _lag_as(keda, "retro-stream-clean-raw", ["retro.logs.raw"])))
        assert raw_lag == {"retro.logs.raw": 300}, raw_lag  # what KEDA would scale clean on

        # a fragment the compactor could not merge names only raw records: batch, who may
        # describe raw but not read it, is told so instead of re-driving nothing quietly
        from streams.kafka.connect import produce_all
        from streams.runtime.step import Out

        review = _rejected_fragment_review(p.settings(), 3)
        asyncio.run(produce_all(p.settings(), [Out("retro.review", review.id.encode(),
                                                   review.model_dump_json().encode())]))
        refused = _retro_as(p, credentials.client_env(USER["batch"]), "review", "--redrive",
                            "--reason", "bad_fragment")
        err = refused.stderr.decode()
        assert refused.returncode == 77 and len(err.strip().splitlines()) == 1, err
        assert refused.stdout.decode().startswith("re-drove 0 parked records (bad_fragment)")
        assert "3 parked records are in reviews without lane coordinates" in err, err
        assert "not authorized to read retro.logs.raw" in err, err

        # the provider is down at first, so batch parks transient reviews and re-drives them
        fake_control(llm, "/_fake/config", {"error_rate": 1.0})
        ports = {}
        # a webhook sink, so the compactor also runs its notify loop and ledger topic
        sink = _webhook_sink()
        notify = {"RETRO_NOTIFY__WEBHOOK_URL": f"http://127.0.0.1:{sink.server_port}/hook"}
        for role in ("clean", "batch", "compactor"):
            ports[role] = free_port()
            p.start_worker(role, log_name=f"worker-{role}",
                           **credentials.client_env(USER[role]),
                           RETRO_WEB_PORT=str(ports[role]),
                           **(notify if role == "compactor" else {}))
        deadline = time.monotonic() + 60
        while scraped_sum(ports["batch"], "retro_review_total") == 0:
            assert time.monotonic() < deadline, _refused_in(p)
            time.sleep(0.5)
        fake_control(llm, "/_fake/config", {"error_rate": 0.0})

        reader = credentials.client_env(USER["reader"])
        audit = _audit_until(p, reader, lambda a, lanes: a["analysed"] >= lanes)
        assert scraped_sum(ports["batch"], "retro_review_redriven_records_total") > 0, \
            _refused_in(p)
        pipeline_seconds = time.monotonic() - started

        # answers that stay malformed park records for good: the re-drive by hand reads
        # them back from the lanes and writes them there, so people run it as the batch
        # user; the reader, who may read neither lane, is refused
        fake_control(llm, "/_fake/config", {"malformed_rate": 1.0})
        # half the malformed answers are JSON wrapped in prose, which the gateway reads,
        # so a slice parks nothing now and then: another slice, until one parks
        for slice_no in range(1, 6):
            sample = write_sample(tmp_path / f"more-{slice_no}", records=300, seed=22 + slice_no)
            more = _retro_as(p, credentials.client_env(USER["producer"]), "produce", "--quiet",
                             *[str(f) for f in sample])
            assert more.returncode == 0, more.stderr.decode()[-3000:]
            audit = _audit_until(p, reader, lambda a, lanes, n=slice_no: a["raw_records"]
                                 > 300 * (n + 1) - 10 and a["analysed"] + a["parked"] >= lanes)
            if audit["parked"]:
                break
        parked = audit["parked"]
        assert parked, audit
        fake_control(llm, "/_fake/config", {"malformed_rate": 0.0})
        # people's commands, the reader's among them, now that every topic holds records
        refusals += _every_reading_command_refuses_honestly(p, credentials, reports=True)
        denied = _retro_as(p, reader, "review", "--redrive", "--reason", "malformed_output")
        assert denied.returncode != 0 and "authoriz" in denied.stderr.decode().lower(), (
            denied.stdout.decode(), denied.stderr.decode()[-3000:])
        redriven = _retro_as(p, credentials.client_env(USER["batch"]), "review", "--redrive",
                             "--reason", "malformed_output")
        assert f"re-drove {parked} parked records" in redriven.stdout.decode(), (
            redriven.stdout.decode(), redriven.stderr.decode()[-3000:])
        audit = _audit_until(p, reader, lambda a, lanes: a["analysed"] >= lanes)

        assert not _authorization_lines(p), _refused_in(p)  # no stage was refused anything
        assert "notify loop consuming" in (p.state_dir / "worker-compactor-2.log").read_text()

        # KEDA's user reads lag through to zero on what it scales on
        lag = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lag = {**asyncio.run(_lag_as(keda, "retro-stream-clean-raw", ["retro.logs.raw"])),
                   **asyncio.run(_lag_as(keda, "retro-stream-batch-lanes",
                                         ["retro.records.fast", "retro.records.slow"]))}
            if not any(lag.values()):
                break
            time.sleep(1)
        assert not any(lag.values()), lag

        refused = _refusals(broker, state)
        assert not [r for r, outcome in refused.items() if outcome == "ok"], refused
        print(f"secured pipeline: {audit['raw_records']} raw records audited by the reader "
              f"user, the first 300 in {pipeline_seconds:.0f} s, {parked} re-driven by hand, "
              f"re-driven automatically "
              f"{scraped_sum(ports['batch'], 'retro_review_redriven_records_total'):g}; "
              f"refused: {len(refused)} checks, {refusals} reading commands; webhook "
              f"posts {sink.posts}")
    finally:
        fake.kill()
        if sink is not None:
            sink.shutdown()


def _refusals(broker, state) -> dict[str, str]:
    """What each user must not do, and the broker's answer ("ok" would be a hole)."""
    def as_user(role: str) -> dict:
        return _kwargs(broker, state, USER[role])

    async def checks() -> dict[str, str]:
        out = {}
        # raw log lines still hold secrets: nobody but clean reads them (the re-drive
        # reads the redacted lanes)
        for role in sorted(set(USER) - {"clean"}):
            out[f"{role} reads retro.logs.raw"] = await _read(as_user(role), "retro.logs.raw")
        out["keda reads retro.records.fast"] = await _read(as_user("keda"), "retro.records.fast")
        out["clean reads retro.fragments"] = await _read(as_user("clean"), "retro.fragments")
        out["clean writes retro.reports"] = await _write(as_user("clean"), "retro.reports")
        out["batch writes retro.reports"] = await _write(as_user("batch"), "retro.reports")
        out["compactor writes retro.records.fast"] = await _write(as_user("compactor"),
                                                                  "retro.records.fast")
        out["reader writes retro.review"] = await _write(as_user("reader"), "retro.review")
        out["producer writes retro.reports"] = await _write(as_user("producer"),
                                                            "retro.reports")
        for role in ("clean", "batch", "compactor", "producer"):
            code = await _create_topic(as_user(role))
            out[f"{role} creates a topic"] = "ok" if code == 0 else f"error {code}"
        return out

    return asyncio.run(checks())
