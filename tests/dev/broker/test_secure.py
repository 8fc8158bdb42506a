"""The secured local broker's pure parts: KafkaUser manifests -> ACLs, and its config."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from streams.dev.broker import secure
from streams.dev.broker.launcher import LocalBroker
from streams.dev.broker.secure import Acl, Credentials
from streams.errors import BrokerError

DEPLOY_USERS = Path(__file__).resolve().parents[3] / "deploy" / "kafkausers.yaml"

MANIFEST = """\
apiVersion: kafka.strimzi.io/v1
kind: KafkaTopic
metadata: {name: not-a-user}
---
apiVersion: kafka.strimzi.io/v1
kind: KafkaUser
metadata: {name: alice}
spec:
  authentication: {type: scram-sha-512}
  authorization:
    type: simple
    acls:
      - resource: {type: topic, name: logs, patternType: literal}
        operations: [Read, Describe]
      - resource: {type: group, name: alice-, patternType: prefix}
        operation: Read
      - resource: {type: cluster}
        operations: [IdempotentWrite]
        host: 127.0.0.1
      - resource: {type: topic, name: secrets}
        operations: [All]
        type: deny
---
apiVersion: kafka.strimzi.io/v1
kind: KafkaUser
metadata: {name: bob}
spec:
  authentication: {type: scram-sha-512}
"""


def _manifest(tmp_path: Path, text: str = MANIFEST) -> Path:
    path = tmp_path / "users.yaml"
    path.write_text(text)
    return path


def test_each_operation_of_a_rule_is_one_binding(tmp_path: Path) -> None:
    users = secure.load_kafka_users(_manifest(tmp_path))
    assert secure.user_names(users) == ["alice", "bob"]
    assert secure.acls_of(users) == sorted([
        Acl("User:alice", "topic", "logs", "literal", "read"),
        Acl("User:alice", "topic", "logs", "literal", "describe"),
        Acl("User:alice", "group", "alice-", "prefixed", "read"),
        Acl("User:alice", "cluster", "kafka-cluster", "literal", "idempotentwrite",
            host="127.0.0.1"),
        Acl("User:alice", "topic", "secrets", "literal", "all", permission="deny"),
    ])


def test_bindings_go_on_the_wire_as_kafkas_codes() -> None:
    acl = Acl("User:alice", "group", "alice-", "prefixed", "describe")
    assert acl.wire() == (3, "alice-", 4, "User:alice", "*", 8, 3)
    assert Acl("User:a", "topic", "t", "literal", "write").wire() == (
        2, "t", 3, "User:a", "*", 4, 3)


@pytest.mark.parametrize("broken", [
    MANIFEST.replace("operation: Read", "operation: Reed"),
    MANIFEST.replace("patternType: prefix", "patternType: regex"),
    MANIFEST.replace("{type: cluster}", "{type: broker}"),
    MANIFEST.replace("type: simple", "type: opa"),
])
def test_a_rule_the_broker_could_not_enforce_is_an_error(tmp_path: Path, broken: str) -> None:
    with pytest.raises(BrokerError, match="KafkaUser alice"):
        secure.acls_of(secure.load_kafka_users(_manifest(tmp_path, broken)))


def test_a_file_without_users_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(BrokerError, match="no KafkaUser"):
        secure.load_kafka_users(_manifest(tmp_path, "kind: KafkaTopic\n"))


def test_deploys_users_become_bindings_that_only_clean_reads_raw() -> None:
    acls = secure.acls_of(secure.load_kafka_users(DEPLOY_USERS))
    assert acls and all(a.permission == "allow" and a.principal.startswith("User:retro-stream-")
                        for a in acls)
    readers = {a.principal for a in acls
               if a.resource_name == "retro.logs.raw" and a.operation in ("read", "all")}
    assert readers == {"User:retro-stream-clean"}  # the re-drive reads the redacted lanes
    assert not [a for a in acls if a.operation in ("create", "all", "alter", "delete")]


def test_secured_config_takes_only_scram_logins_and_denies_without_an_acl(
        tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path, kafka_users=DEPLOY_USERS)
    broker.root.mkdir(parents=True)
    credentials = Credentials({"admin": "pw-a", "alice": "pw-b"})
    text = broker._write_config(9092, 9093, credentials).read_text()
    props = dict(line.split("=", 1) for line in text.splitlines())
    assert props["listeners"] == "SASL_PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert props["advertised.listeners"] == "SASL_PLAINTEXT://127.0.0.1:9092"
    assert props["listener.security.protocol.map"] == (
        "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT")
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["authorizer.class.name"] == (
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer")
    assert props["super.users"] == "User:admin;User:ANONYMOUS"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["auto.create.topics.enable"] == "false"
    assert 'username="admin" password="pw-a"' in props[
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config"]
    assert "0.0.0.0" not in text
    open_props = LocalBroker(tmp_path / "open")
    open_props.root.mkdir(parents=True)
    assert "SASL" not in open_props._write_config(9092, 9093).read_text()


def test_users_are_created_at_format_time_with_passwords_only_their_owner_reads(
        tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path, kafka_users=_manifest(tmp_path))
    broker.root.mkdir(parents=True)
    credentials = broker._credentials(formatted=False)
    assert set(credentials.passwords) == {"admin", "alice", "bob"}
    args = credentials.format_args()
    assert args[0] == "--add-scram" and args[1] == (
        f"SCRAM-SHA-512=[name=admin,password={credentials.passwords['admin']}]")
    assert len(args) == 6
    for path in (broker.credentials_file, broker.env_file("alice")):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    env = dict(line.split("=", 1) for line in broker.env_file("alice").read_text().splitlines())
    assert env == credentials.client_env("alice")
    assert env["RETRO_KAFKA__SASL_USERNAME"] == "alice"
    assert broker.credentials() == credentials


def test_an_open_and_a_secured_broker_never_share_a_folder(tmp_path: Path) -> None:
    secured = LocalBroker(tmp_path, kafka_users=_manifest(tmp_path))
    secured.root.mkdir(parents=True)
    secured._credentials(formatted=False)
    with pytest.raises(BrokerError, match="holds a secured broker"):
        LocalBroker(tmp_path)._credentials(formatted=True)
    (secured.credentials_file).unlink()
    with pytest.raises(BrokerError, match="holds an open broker"):
        secured._credentials(formatted=True)


def test_a_user_added_after_formatting_asks_for_a_fresh_folder(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path, kafka_users=_manifest(tmp_path))
    broker.root.mkdir(parents=True)
    broker._credentials(formatted=False)
    grown = MANIFEST + "---\nkind: KafkaUser\nmetadata: {name: carol}\n"
    later = LocalBroker(tmp_path, kafka_users=_manifest(tmp_path, grown))
    with pytest.raises(BrokerError, match="carol"):
        later._credentials(formatted=True)


def test_the_launcher_logs_in_as_admin_wherever_the_folder_holds_a_secured_broker(
        tmp_path: Path) -> None:
    secured = LocalBroker(tmp_path, kafka_users=_manifest(tmp_path))
    secured.root.mkdir(parents=True)
    password = secured._credentials(formatted=False).passwords["admin"]
    assert LocalBroker(tmp_path)._client_kwargs()["sasl_plain_password"] == password
    LocalBroker(tmp_path)._credentials(formatted=False)  # its storage was deleted
    assert LocalBroker(tmp_path)._client_kwargs() == {}
