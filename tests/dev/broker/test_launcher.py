"""The local broker launcher, without starting Java (the integration suite does that)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streams.dev.broker import launcher
from streams.dev.broker.launcher import LocalBroker
from streams.errors import BrokerError


def test_cluster_ids_are_kafka_shaped() -> None:
    for _ in range(200):
        cid = launcher._cluster_id()
        assert len(cid) == 22 and not cid.startswith("-")


def test_kraft_config_is_single_node_on_loopback(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path)
    broker.root.mkdir(parents=True)
    text = broker._write_config(9092, 9093).read_text()
    props = dict(line.split("=", 1) for line in text.splitlines())
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert "0.0.0.0" not in text
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"


def test_a_stale_state_file_means_no_broker(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path)
    broker.root.mkdir(parents=True)
    broker.state_file.write_text(json.dumps({
        "pid": 2**22 + 12345, "port": 1, "controller_port": 2, "bootstrap": "127.0.0.1:1",
        "version": "4.1.1", "directory": str(broker.root), "log_file": "x"}))
    assert broker.status() is None
    assert not broker.state_file.exists()


def test_missing_java_or_maven_is_an_actionable_error(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher.shutil, "which", lambda tool: None)
    with pytest.raises(BrokerError, match="RETRO_KAFKA__BOOTSTRAP"):
        LocalBroker(tmp_path).ensure_jars()


def test_a_restart_listens_on_the_ports_of_the_previous_start(tmp_path: Path) -> None:
    from helpers import busy_port

    broker = LocalBroker(tmp_path)
    assert broker._ports()  # no previous start: fresh ports
    broker.root.mkdir(parents=True)
    with busy_port() as taken:
        pass  # a port that was free a moment ago
    broker.ports_file.write_text(json.dumps({"port": taken, "controller_port": taken}))
    assert broker._ports() == (taken, taken)
    with busy_port() as taken:  # someone else took it meanwhile: new ports, not a failure
        broker.ports_file.write_text(json.dumps({"port": taken, "controller_port": taken}))
        port, controller = broker._ports()
        assert taken not in (port, controller)
