"""A local Apache Kafka cluster of several KRaft nodes, for failover drills.

Each node is a broker and a controller on loopback ports of its own, rooted at
``<state_dir>/broker/node-<id>``; the jars are the single broker's
(``<state_dir>/broker/lib-<version>``). Topics get every node as a replica and need
two in sync (on three nodes), as deploy/kafka.yaml has it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from streams.dev.broker import launcher
from streams.dev.broker.launcher import DEFAULT_KAFKA_VERSION, LocalBroker
from streams.errors import BrokerError
from streams.kafka.local import pid_alive, port_open
from streams.ports import free_port


def min_insync(brokers: int) -> int:
    """Two in sync on three or more nodes (one may be down), all of them below."""
    return 2 if brokers >= 3 else 1


def cluster_config(node_id: int, ports: Mapping[int, tuple[int, int]],
                   data_dir: Path) -> dict[str, str]:
    """server.properties of node ``node_id``; ``ports``: (client, controller) by node id."""
    n = len(ports)
    port, controller_port = ports[node_id]
    insync = str(min_insync(n))
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": ",".join(f"{i}@127.0.0.1:{c}"
                                             for i, (_, c) in sorted(ports.items())),
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "true",
        "default.replication.factor": str(n),
        "min.insync.replicas": insync,
        "unclean.leader.election.enable": "false",
        "offsets.topic.replication.factor": str(n),
        "transaction.state.log.replication.factor": str(n),
        "transaction.state.log.min.isr": insync,
        "share.coordinator.state.topic.replication.factor": str(n),
        "share.coordinator.state.topic.min.isr": insync,
        "group.initial.rebalance.delay.ms": "0",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.num.partitions": "1",
        "log.cleaner.backoff.ms": "1000",
        # a restarted node takes its partitions back soon, so the drill sees the cluster settle
        "leader.imbalance.check.interval.seconds": "10",
    }


def busiest_leader(leaders: Iterable[int | None]) -> int:
    """The node id that leads the most of these partitions (the lowest id on a tie)."""
    counts = Counter(leader for leader in leaders if leader is not None and leader >= 0)
    if not counts:
        raise ValueError("no partition has a leader")
    return min(counts, key=lambda node: (-counts[node], node))


class _Node(LocalBroker):
    """One node of the cluster: the single broker's files, under its own folder."""

    def __init__(self, root: Path, lib_dir: Path, node_id: int, version: str,
                 heap: str) -> None:
        super().__init__(root.parent, version=version, heap=heap)
        self.root = root
        self.node_id = node_id
        self._lib_dir = lib_dir

    @property
    def lib_dir(self) -> Path:
        return self._lib_dir


class LocalCluster:
    """``brokers`` local KRaft nodes rooted at ``<state_dir>/broker``."""

    def __init__(self, state_dir: Path, *, brokers: int = 3,
                 version: str = DEFAULT_KAFKA_VERSION, heap: str = "384m") -> None:
        if brokers < 2:
            raise BrokerError("a cluster has two nodes or more; one is `LocalBroker`")
        self.jars = LocalBroker(state_dir, version=version)
        self.root = self.jars.root
        self.brokers = brokers
        self.nodes = {i: _Node(self.root / f"node-{i}", self.jars.lib_dir, i, version, heap)
                      for i in range(1, brokers + 1)}

    @property
    def cluster_file(self) -> Path:
        """The nodes' ports and pids; `retro broker stop` finds a cluster by it."""
        return self.root / "cluster.json"

    @staticmethod
    def exists(state_dir: Path) -> bool:
        return (Path(state_dir).resolve() / "broker" / "cluster.json").exists()

    @classmethod
    def of(cls, state_dir: Path) -> LocalCluster:
        """The cluster last started in ``state_dir``, as it was started."""
        doc = json.loads((Path(state_dir).resolve() / "broker" / "cluster.json").read_text())
        return cls(state_dir, brokers=len(doc["nodes"]), version=doc["version"])

    @property
    def bootstrap(self) -> str:
        ports = self._ports()
        return ",".join(f"127.0.0.1:{ports[i][0]}" for i in sorted(ports))

    def pid(self, node_id: int) -> int | None:
        node = self.nodes[node_id]
        if not node.state_file.exists():
            return None
        pid = int(json.loads(node.state_file.read_text())["pid"])
        return pid if pid_alive(pid) else None

    def status(self) -> dict[str, object] | None:
        if not self.cluster_file.exists():
            return None
        ports = self._ports()
        return {"bootstrap": self.bootstrap, "version": self.jars.version,
                "directory": str(self.root),
                "nodes": {i: {"port": ports[i][0], "controller_port": ports[i][1],
                              "pid": self.pid(i), "log_file": str(self.nodes[i].log_file)}
                          for i in sorted(self.nodes)}}

    def start(self, *, timeout: float = 180.0) -> str:
        """Start every node that is not running and wait until all answer; the bootstrap."""
        if (self.root / "data" / "meta.properties").exists():
            raise BrokerError(f"{self.root} holds a single broker; stop it and delete that "
                              "folder, or use another --state-dir, to start a cluster")
        lib = self.jars.ensure_jars()
        self.root.mkdir(parents=True, exist_ok=True)
        ports = self._ports()
        self.cluster_file.write_text(json.dumps({
            "version": self.jars.version,
            "nodes": {str(i): list(p) for i, p in sorted(ports.items())}}))
        cluster_id = self._cluster_id()
        for node_id in self.nodes:
            if self.pid(node_id) is None:
                self._launch(node_id, lib, ports, cluster_id)
        try:
            self.wait_ready(timeout=timeout)
        except Exception:
            self.stop()
            raise
        return self.bootstrap

    def start_node(self, node_id: int, *, timeout: float = 120.0) -> None:
        """Start one stopped (or killed) node again on its ports and wait for it."""
        self._launch(node_id, self.jars.lib_dir, self._ports(), self._cluster_id())
        self.wait_ready(timeout=timeout, nodes=[node_id])

    def kill_node(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        pid = self.pid(node_id)
        if pid is not None:
            os.killpg(pid, sig)
            deadline = time.monotonic() + 30
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)

    def stop(self) -> bool:
        """Stop every node at once; True if one was running. One at a time, the last
        node has lost its quorum and waits out its shutdown timeout."""
        with ThreadPoolExecutor(max(1, len(self.nodes))) as pool:
            stopped = list(pool.map(lambda node: node.stop(), self.nodes.values()))
        self.jars.state_file.unlink(missing_ok=True)
        return any(stopped)

    def wait_ready(self, *, timeout: float, nodes: Iterable[int] | None = None) -> None:
        """Each node answers a metadata request on its own port (so the quorum formed)."""
        deadline = time.monotonic() + timeout
        for node_id in nodes or sorted(self.nodes):
            node = self.nodes[node_id]
            port = self._ports()[node_id][0]
            while True:
                if self.pid(node_id) is None:
                    raise BrokerError(f"node {node_id} exited during start-up; see "
                                      f"{node.log_file}")
                try:
                    if port_open(port) and launcher._metadata_ok(f"127.0.0.1:{port}"):
                        break
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise BrokerError(f"node {node_id} did not answer within {timeout:.0f}s; "
                                      f"see {node.log_file}")
                time.sleep(0.5)

    # -- internals -----------------------------------------------------------------------
    def _ports(self) -> dict[int, tuple[int, int]]:
        """The ports of the last start (a node restarts where its peers expect it), or new."""
        try:
            doc = json.loads(self.cluster_file.read_text())
            return {int(i): (int(p[0]), int(p[1])) for i, p in doc["nodes"].items()}
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return {i: (free_port(), free_port()) for i in self.nodes}

    def _cluster_id(self) -> str:
        path = self.root / "cluster.id"
        if not path.exists():
            path.write_text(launcher._cluster_id())
        return path.read_text().strip()

    def _launch(self, node_id: int, lib: Path, ports: Mapping[int, tuple[int, int]],
                cluster_id: str) -> None:
        node = self.nodes[node_id]
        node.root.mkdir(parents=True, exist_ok=True)
        node.log_file.parent.mkdir(parents=True, exist_ok=True)
        config = node.root / "server.properties"
        lines = cluster_config(node_id, ports, node.data_dir)
        config.write_text("".join(f"{k}={v}\n" for k, v in lines.items()))
        java = node._java_cmd(lib)
        if not (node.data_dir / "meta.properties").exists():
            shutil.rmtree(node.data_dir, ignore_errors=True)
            fmt = subprocess.run([*java, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                                  "-c", str(config)], capture_output=True, text=True, check=False)
            if fmt.returncode != 0:
                raise BrokerError(f"formatting node {node_id} failed:\n{fmt.stdout}{fmt.stderr}")
        with node.log_file.open("ab") as log:
            proc = subprocess.Popen([*java, "kafka.Kafka", str(config)], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=node.root)
        port, controller_port = ports[node_id]
        node.state_file.write_text(json.dumps({
            "pid": proc.pid, "port": port, "controller_port": controller_port,
            "bootstrap": f"127.0.0.1:{port}", "version": node.version,
            "directory": str(node.root), "log_file": str(node.log_file)}, indent=2))
        if node_id == min(self.nodes):
            # commands without RETRO_KAFKA__BOOTSTRAP find the cluster where they find a broker
            self.jars.state_file.write_text(json.dumps({
                "pid": proc.pid, "port": port, "controller_port": controller_port,
                "bootstrap": ",".join(f"127.0.0.1:{ports[i][0]}" for i in sorted(ports)),
                "version": node.version, "directory": str(self.root),
                "log_file": str(node.log_file)}, indent=2))
