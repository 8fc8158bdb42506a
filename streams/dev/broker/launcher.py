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
import socket
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from importlib import resources
from pathlib import Path

from streams.errors import BrokerError
from streams.kafka.local import BrokerState, local_broker_state, pid_alive, port_open

logger = logging.getLogger(__name__)

DEFAULT_KAFKA_VERSION = "4.1.1"
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"


class LocalBroker:
    """A local broker rooted at ``<state_dir>/broker``."""

    def __init__(self, state_dir: Path, *, version: str = DEFAULT_KAFKA_VERSION,
                 heap: str = "512m") -> None:
        self.root = Path(state_dir).resolve() / "broker"
        self.version = version
        self.heap = heap

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
            self._wait_ready(running, timeout)
            return running
        lib = self.ensure_jars()
        port, controller_port = self._ports()
        self.root.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        config = self._write_config(port, controller_port)
        java = self._java_cmd(lib)
        if not (self.data_dir / "meta.properties").exists():
            shutil.rmtree(self.data_dir, ignore_errors=True)
            fmt = subprocess.run(
                [*java, "kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c",
                 str(config)], capture_output=True, text=True, check=False)
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
        except BrokerError:
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
            return _free_port(), _free_port()
        if _bindable(port) and _bindable(controller_port):
            return port, controller_port
        fresh = _free_port(), _free_port()
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

    def _write_config(self, port: int, controller_port: int) -> Path:
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
                if port_open(state.port) and _metadata_ok(state.bootstrap):
                    return
            except Exception as exc:
                last_error = str(exc)
            time.sleep(0.5)
        raise BrokerError(
            f"the broker did not answer on {state.bootstrap} within {timeout:.0f}s "
            f"({last_error}); see {state.log_file}")


def _metadata_ok(bootstrap: str) -> bool:
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient

    async def probe() -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
        await admin.start()
        try:
            cluster = await admin.describe_cluster()
            return bool(cluster.get("brokers"))
        finally:
            await admin.close()

    # a thread of its own, so start() also works from code that runs an event loop
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, probe()).result()


def _cluster_id() -> str:
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
