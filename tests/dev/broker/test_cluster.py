"""The local cluster's pure parts: node configs and which node to kill (no Java)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.dev.broker.cluster import LocalCluster, busiest_leader, cluster_config, min_insync
from streams.errors import BrokerError

PORTS = {1: (9092, 9093), 2: (9192, 9193), 3: (9292, 9293)}


def test_every_node_knows_all_voters_and_listens_on_its_own_ports(tmp_path: Path) -> None:
    configs = {i: cluster_config(i, PORTS, tmp_path / f"n{i}") for i in PORTS}
    voters = "1@127.0.0.1:9093,2@127.0.0.1:9193,3@127.0.0.1:9293"
    for i, props in configs.items():
        port, controller = PORTS[i]
        assert props["node.id"] == str(i)
        assert props["controller.quorum.voters"] == voters
        assert props["listeners"] == (f"PLAINTEXT://127.0.0.1:{port},"
                                      f"CONTROLLER://127.0.0.1:{controller}")
        assert props["advertised.listeners"] == f"PLAINTEXT://127.0.0.1:{port}"
        assert props["log.dirs"] == str(tmp_path / f"n{i}")
        assert "0.0.0.0" not in "".join(props.values())


def test_three_nodes_replicate_everything_three_times_and_need_two_in_sync(
        tmp_path: Path) -> None:
    props = cluster_config(2, PORTS, tmp_path)
    assert props["default.replication.factor"] == "3"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.replication.factor"] == "3"
    assert props["min.insync.replicas"] == "2"
    assert props["transaction.state.log.min.isr"] == "2"
    assert props["unclean.leader.election.enable"] == "false"


@pytest.mark.parametrize(("brokers", "insync"), [(2, 1), (3, 2), (5, 2)])
def test_min_insync_leaves_room_for_one_node_down(brokers: int, insync: int) -> None:
    ports = {i: (9000 + 2 * i, 9001 + 2 * i) for i in range(1, brokers + 1)}
    props = cluster_config(1, ports, Path("/data"))
    assert min_insync(brokers) == insync
    assert props["min.insync.replicas"] == str(insync)
    assert props["default.replication.factor"] == str(brokers)
    assert len(props["controller.quorum.voters"].split(",")) == brokers


def test_the_node_leading_most_partitions_is_chosen() -> None:
    assert busiest_leader([1, 2, 2, 3, 2, 1]) == 2
    assert busiest_leader([3, 3, 1, 1, 2]) == 1  # a tie: the lowest id
    assert busiest_leader([-1, None, 3, -1]) == 3  # leaderless partitions do not count
    with pytest.raises(ValueError):
        busiest_leader([-1, None])


def test_a_cluster_has_two_nodes_or_more(tmp_path: Path) -> None:
    with pytest.raises(BrokerError):
        LocalCluster(tmp_path, brokers=1)
    cluster = LocalCluster(tmp_path, brokers=3)
    assert not LocalCluster.exists(tmp_path)
    assert cluster.status() is None
    assert sorted(cluster.nodes) == [1, 2, 3]
    assert {n.lib_dir for n in cluster.nodes.values()} == {cluster.jars.lib_dir}
    assert len({n.data_dir for n in cluster.nodes.values()}) == 3


def test_a_single_broker_folder_is_not_taken_over(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = LocalCluster(tmp_path)
    (cluster.root / "data").mkdir(parents=True)
    (cluster.root / "data" / "meta.properties").write_text("node.id=1\n")
    with pytest.raises(BrokerError, match="single broker"):
        cluster.start()


def test_retro_broker_refuses_a_secured_cluster_and_no_brokers(tmp_path: Path) -> None:
    from streams.cli import main
    from streams.errors import UsageError

    state = str(tmp_path / "state")
    assert main(["--state-dir", state, "broker", "start", "--brokers", "3", "--secure"]) \
        == UsageError.exit_code
    assert main(["--state-dir", state, "broker", "start", "--brokers", "0"]) \
        == UsageError.exit_code
    assert main(["--state-dir", state, "broker", "status"]) == 1  # nothing started


def test_a_single_broker_is_not_started_in_a_cluster_folder(tmp_path: Path) -> None:
    from streams.cli import main

    cluster = LocalCluster(tmp_path / "state")
    cluster.root.mkdir(parents=True)
    cluster.cluster_file.write_text('{"version": "4.1.1", "nodes": {"1": [1, 2], "2": [3, 4]}}')
    assert main(["--state-dir", str(tmp_path / "state"), "broker", "start"]) \
        == BrokerError.exit_code
