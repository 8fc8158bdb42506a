"""Start, stop and inspect a real single-node Apache Kafka 4.x broker in KRaft mode.

The jars come from Maven Central through ``mvn`` (cached in ``~/.m2`` and in
``<state_dir>/broker/lib-<version>`` after the first fetch); Java 17 runs them.
Everything the broker writes lives under ``<state_dir>/broker`` so a user can see
and delete it. The broker listens on free loopback ports only.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any

from streams.dev.broker import secure
from streams.errors import BrokerError
from streams.kafka.local import BrokerState, local_broker_state, pid_alive, port_open
from streams.ports import free_port, port_free

logger = logging.getLogger(__name__)

DEFAULT_KAFKA_VERSION = "4.1.1"
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"


class LocalBroker:
    """A local broker rooted at ``<state_dir>/broker``."""

    def __init__(self, state_dir: Path, *, version: str = DEFAULT_KAFKA_VERSION,
                 heap: str = "512m", kafka_users: Path | None = None) -> None:
        """``kafka_users``: a file of Strimzi KafkaUser manifests; the broker then takes
        SASL/SCRAM logins only and grants each user its manifest's ACLs."""
        self.root = Path(state_dir).resolve() / "broker"
        self.version = version
        self.heap = heap
        self.kafka_users = Path(kafka_users) if kafka_users is not None else None

    # -- paths ---------------------------------------------------------------------------
    @property
    def lib_dir(self) -> Path:
        return self.root / f"lib-{self.version}"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def ports_file(self) -> Path:
        """The ports of the last start: a restart listens there again (state.json goes on stop)."""
        return self.root / "ports.json"

    @property
    def log_file(self) -> Path:
        return self.root / "logs" / "broker.log"

    @property
    def credentials_file(self) -> Path:
        """The SCRAM users' passwords of a secured broker (made when its storage is formatted)."""
        return self.root / "users.json"

    def credentials(self) -> secure.Credentials:
        return secure.Credentials.load(self.credentials_file)

    def env_file(self, user: str) -> Path:
        """RETRO_KAFKA__* settings that log in as ``user``: `set -a; . <file>; set +a`."""
        return self.root / "users" / f"{user}.env"

    # -- jars ----------------------------------------------------------------------------
    def ensure_jars(self) -> Path:
        """Fetch the broker jars once; later calls reuse the folder."""
        marker = self.lib_dir / ".complete"
        if marker.exists():
            return self.lib_dir
        for tool in ("java", "mvn"):
            if shutil.which(tool) is None:
                raise BrokerError(
                    f"`{tool}` is not on PATH: the local broker needs Java 17+ and Maven "
                    "(Debian: apt-get install openjdk-17-jre-headless maven), or point "
                    "RETRO_KAFKA__BOOTSTRAP at an existing Kafka cluster."
                )
        build = self.root / "fetch"
        build.mkdir(parents=True, exist_ok=True)
        pom = resources.files("streams.dev.broker").joinpath("pom.xml").read_text()
        (build / "pom.xml").write_text(pom.replace("@KAFKA_VERSION@", self.version))
        tmp_lib = self.root / f"lib-{self.version}.tmp"
        shutil.rmtree(tmp_lib, ignore_errors=True)
        cmd = ["mvn", "-B", "-q", f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
               f"-DoutputDirectory={tmp_lib}", "-DincludeScope=runtime"]
        logger.info("fetching Kafka %s jars with Maven into %s", self.version, self.lib_dir)
        proc = subprocess.run(cmd, cwd=build, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BrokerError(
                f"Maven could not fetch Kafka {self.version} (exit {proc.returncode}); "
                f"check network access to Maven Central. Output:\n{proc.stdout[-2000:]}"
                f"{proc.stderr[-2000:]}"
            )
        shutil.rmtree(self.lib_dir, ignore_errors=True)
        tmp_lib.rename(self.lib_dir)
        marker.touch()
        return self.lib_dir

    # -- lifecycle -----------------------------------------------------------------------
    def status(self) -> BrokerState | None:
        """The running broker's state, or None (stale state files are removed)."""
        return local_broker_state(self.root.parent)

    def start(self, *, timeout: float = 90.0) -> BrokerState:
        """Start the broker (or return the running one) and wait until it answers."""
        running = self.status()
        if running is not None:
            if self.credentials_file.exists() != (self.kafka_users is not None):
                raise BrokerError(
                    f"the broker running in {self.root} is "
                    f"{'secured' if self.credentials_file.exists() else 'open'}; stop it "
                    "first, or start it as it is")
            self._wait_ready(running, timeout)
            return running
        lib = self.ensure_jars()
        port, controller_port = self._ports()
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        formatted = (self.data_dir / "meta.properties").exists()
        credentials = self._credentials(formatted)
        config = self._write_config(port, controller_port, credentials)
        java = self._java_cmd(lib)
        if not formatted:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            fmt = subprocess.run(
                [*java, "kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c",
                 str(config), *(credentials.format_args() if credentials else [])],
                capture_output=True, text=True, check=False)
            if fmt.returncode != 0:
                raise BrokerError(f"formatting Kafka storage failed:\n{fmt.stdout}{fmt.stderr}")
        with self.log_file.open("ab") as log:
            proc = subprocess.Popen(
                [*java, "kafka.Kafka", str(config)], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.root)
        state = BrokerState(pid=proc.pid, port=port, controller_port=controller_port,
                            bootstrap=f"127.0.0.1:{port}", version=self.version,
                            directory=str(self.root), log_file=str(self.log_file))
        self.state_file.write_text(json.dumps(asdict(state), indent=2))
        self.ports_file.write_text(json.dumps({"port": port, "controller_port": controller_port}))
        try:
            self._wait_ready(state, timeout)
            if self.kafka_users is not None:
                acls = secure.acls_of(secure.load_kafka_users(self.kafka_users))
                _in_thread(_apply_acls(state.bootstrap, self._client_kwargs(), acls))
        except Exception:
            self.stop()
            raise
        return state

    def stop(self, *, timeout: float = 30.0) -> bool:
        """Stop the broker; True if one was running."""
        if not self.state_file.exists():
            return False
        state = BrokerState(**json.loads(self.state_file.read_text()))
        stopped = False
        if pid_alive(state.pid):
            os.killpg(state.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while pid_alive(state.pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if pid_alive(state.pid):
                os.killpg(state.pid, signal.SIGKILL)
            stopped = True
        self.state_file.unlink(missing_ok=True)
        return stopped

    # -- internals -----------------------------------------------------------------------
    def _ports(self) -> tuple[int, int]:
        """The ports of the previous start on this state dir when both are free, so that
        workers and producers started before a restart find the broker again; new free
        ports otherwise (said in a warning: those clients then need a restart)."""
        try:
            previous = json.loads(self.ports_file.read_text())
            port, controller_port = int(previous["port"]), int(previous["controller_port"])
        except (OSError, ValueError, KeyError, TypeError):
            return free_port(), free_port()
        if port_free("127.0.0.1", port) and port_free("127.0.0.1", controller_port):
            return port, controller_port
        fresh = free_port(), free_port()
        logger.warning("port %s or %s of the previous start is taken; the broker now listens "
                       "on 127.0.0.1:%s: restart clients that were started before",
                       port, controller_port, fresh[0])
        return fresh

    def _java_cmd(self, lib: Path) -> list[str]:
        log4j = self.root / "log4j2.properties"
        log4j.write_text(
            "status = warn\nappender.file.type = File\nappender.file.name = FILE\n"
            f"appender.file.fileName = {self.log_file}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = INFO\nrootLogger.appenderRef.file.ref = FILE\n"
            "logger.kafka.name = kafka\nlogger.kafka.level = WARN\n"
            "logger.apache.name = org.apache.kafka\nlogger.apache.level = WARN\n"
        )
        return ["java", "-cp", f"{lib}/*", f"-Xmx{self.heap}", "-Xms128m", "-XX:+UseG1GC",
                "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
                f"-Dkafka.logs.dir={self.log_file.parent}",
                f"-Dlog4j2.configurationFile={log4j}"]

    def _credentials(self, formatted: bool) -> secure.Credentials | None:
        """The SCRAM users of a secured broker: new ones for fresh storage, else those
        it was formatted with; an open and a secured broker never share a directory."""
        has_users = self.credentials_file.exists()
        if formatted and has_users != (self.kafka_users is not None):
            raise BrokerError(
                f"{self.root} holds {'a secured' if has_users else 'an open'} broker; stop it "
                "and delete that folder, or use another --state-dir, to start "
                f"{'an open' if has_users else 'a secured'} one")
        if self.kafka_users is None:
            if not formatted:  # left by a secured broker whose storage was deleted
                self.credentials_file.unlink(missing_ok=True)
            return None
        names = secure.user_names(secure.load_kafka_users(self.kafka_users))
        if formatted:
            credentials = self.credentials()
            absent = sorted(set(names) - set(credentials.passwords))
            if absent:
                raise BrokerError(
                    f"users {', '.join(absent)} were added to {self.kafka_users} after "
                    f"{self.root} was formatted; stop the broker and delete that folder")
            return credentials
        credentials = secure.Credentials.generate(names)
        credentials.save(self.credentials_file)
        self.env_file(secure.ADMIN).parent.mkdir(parents=True, exist_ok=True)
        for user in credentials.passwords:
            path = self.env_file(user)
            path.write_text("".join(f"{k}={v}\n" for k, v in credentials.client_env(user).items()))
            os.chmod(path, 0o600)  # a password: readable by its owner only
        return credentials

    def _client_kwargs(self) -> dict[str, str]:
        """How the launcher's own admin requests log in: as the super user when secured."""
        if not self.credentials_file.exists():
            return {}
        return self.credentials().client_kwargs(secure.ADMIN)

    def _write_config(self, port: int, controller_port: int,
                      credentials: secure.Credentials | None = None) -> Path:
        config = self.root / "server.properties"
        lines = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.num.partitions": "1",
            "log.cleaner.backoff.ms": "1000",
        }
        if credentials is not None:
            lines.update(secure.secure_config(port, controller_port,
                                              credentials.passwords[secure.ADMIN]))
        config.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
        return config

    def _wait_ready(self, state: BrokerState, timeout: float) -> None:
        """Poll with a real metadata request, not a log line."""
        deadline = time.monotonic() + timeout
        last_error = "no answer"
        while time.monotonic() < deadline:
            if not pid_alive(state.pid):
                raise BrokerError(f"the broker exited during start-up; see {state.log_file}")
            try:
                if port_open(state.port) and _metadata_ok(state.bootstrap,
                                                          self._client_kwargs()):
                    return
            except Exception as exc:
                last_error = str(exc)
            time.sleep(0.5)
        raise BrokerError(
            f"the broker did not answer on {state.bootstrap} within {timeout:.0f}s "
            f"({last_error}); see {state.log_file}")


def _metadata_ok(bootstrap: str, login: dict[str, str] | None = None) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient

    async def probe() -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000,
                                    **(login or {}))
        await admin.start()
        try:
            cluster = await admin.describe_cluster()
            return bool(cluster.get("brokers"))
        finally:
            await admin.close()

    return _in_thread(probe())


async def _apply_acls(bootstrap: str, login: dict[str, str], acls: list[secure.Acl]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000, **login)
    await admin.start()
    try:
        await secure.create_acls(admin, acls)
    finally:
        await admin.close()


def _in_thread(coro: Any) -> Any:
    """Run ``coro`` on a loop of its own, so start() also works from code that runs one."""
    import asyncio

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _cluster_id() -> str:
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid
