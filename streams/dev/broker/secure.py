"""A secured local broker: SASL/SCRAM users and ACLs taken from Strimzi KafkaUser manifests.

``retro broker start --secure`` reads deploy/kafkausers.yaml (or ``--kafka-users``), so
the users and ACLs a local run is refused by are the ones a cluster gets from the same
file. The admin user is a super user; every other user has exactly its manifest's ACLs.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from streams.errors import BrokerError

MECHANISM = "SCRAM-SHA-512"
ADMIN = "admin"

# Kafka's wire codes (org.apache.kafka.common.resource / acl), for CreateAcls requests
RESOURCE_TYPES = {"topic": 2, "group": 3, "cluster": 4, "transactionalid": 5}
PATTERN_TYPES = {"literal": 3, "prefix": 4, "prefixed": 4}
OPERATIONS = {"all": 2, "read": 3, "write": 4, "create": 5, "delete": 6, "alter": 7,
              "describe": 8, "clusteraction": 9, "describeconfigs": 10,
              "alterconfigs": 11, "idempotentwrite": 12}
PERMISSIONS = {"deny": 2, "allow": 3}


@dataclass(frozen=True, order=True)
class Acl:
    """One ACL binding as Kafka stores it: one principal, resource and operation."""

    principal: str  # "User:<name>"
    resource_type: str  # topic, group, cluster, transactionalid
    resource_name: str
    pattern_type: str  # literal or prefixed
    operation: str  # lower case: read, write, describe, ...
    permission: str = "allow"
    host: str = "*"

    def wire(self) -> tuple[int, str, int, str, str, int, int]:
        """The CreateAcls v1 entry for this binding."""
        return (RESOURCE_TYPES[self.resource_type], self.resource_name,
                PATTERN_TYPES[self.pattern_type], self.principal, self.host,
                OPERATIONS[self.operation], PERMISSIONS[self.permission])


def load_kafka_users(path: Path) -> list[dict[str, Any]]:
    """The KafkaUser documents of a manifest file."""
    try:
        import yaml
    except ImportError as exc:  # a dev dependency: manifests live in a source checkout
        raise BrokerError("--secure reads KafkaUser manifests with PyYAML: "
                          "pip install pyyaml") from exc
    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
    except (OSError, yaml.YAMLError) as exc:
        raise BrokerError(f"cannot read KafkaUser manifests from {path}: {exc}") from exc
    users = [d for d in docs if d.get("kind") == "KafkaUser"]
    if not users:
        raise BrokerError(f"{path} defines no KafkaUser")
    return users


def user_names(users: list[dict[str, Any]]) -> list[str]:
    return [u["metadata"]["name"] for u in users]


def acls_of(users: list[dict[str, Any]]) -> list[Acl]:
    """Every binding the manifests grant, one per operation, as Strimzi's User Operator
    would create them for ``authorization.type: simple``."""
    out: set[Acl] = set()
    for user in users:
        name = user["metadata"]["name"]
        auth = (user.get("spec") or {}).get("authorization") or {}
        if auth and auth.get("type") != "simple":
            raise BrokerError(f"KafkaUser {name}: authorization type {auth.get('type')!r} "
                              "is not 'simple'")
        for rule in auth.get("acls") or []:
            resource = rule["resource"]
            rtype = str(resource["type"]).lower()
            if rtype not in RESOURCE_TYPES:
                raise BrokerError(f"KafkaUser {name}: unknown resource type {rtype!r}")
            rname = "kafka-cluster" if rtype == "cluster" else str(resource["name"])
            pattern = str(resource.get("patternType", "literal")).lower()
            if pattern not in PATTERN_TYPES:
                raise BrokerError(f"KafkaUser {name}: unknown patternType {pattern!r}")
            operations = rule.get("operations") or [rule["operation"]]
            for op in operations:
                key = str(op).lower()
                if key not in OPERATIONS:
                    raise BrokerError(f"KafkaUser {name}: unknown operation {op!r}")
                out.add(Acl(f"User:{name}", rtype, rname,
                            "prefixed" if pattern == "prefix" else pattern, key,
                            str(rule.get("type", "allow")).lower(),
                            str(rule.get("host", "*"))))
    return sorted(out)


@dataclass(frozen=True)
class Credentials:
    """Passwords of the admin and of each manifest user, made at storage format time."""

    passwords: dict[str, str]

    @classmethod
    def generate(cls, names: list[str]) -> Credentials:
        return cls({name: secrets.token_hex(16) for name in [ADMIN, *names]})

    @classmethod
    def load(cls, path: Path) -> Credentials:
        return cls(json.loads(Path(path).read_text())["passwords"])

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))
        os.chmod(path, 0o600)  # passwords: readable by their owner only

    def client_env(self, user: str) -> dict[str, str]:
        """The settings a command needs to log in as ``user``."""
        return {"RETRO_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "RETRO_KAFKA__SASL_MECHANISM": MECHANISM,
                "RETRO_KAFKA__SASL_USERNAME": user,
                "RETRO_KAFKA__SASL_PASSWORD": self.passwords[user]}

    def client_kwargs(self, user: str) -> dict[str, str]:
        """aiokafka keyword arguments that log in as ``user``."""
        return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": MECHANISM,
                "sasl_plain_username": user, "sasl_plain_password": self.passwords[user]}

    def format_args(self) -> list[str]:
        """StorageTool arguments that create every user in the bootstrap metadata."""
        args = []
        for name, password in self.passwords.items():
            args += ["--add-scram", f"{MECHANISM}=[name={name},password={password}]"]
        return args


def secure_config(port: int, controller_port: int, admin_password: str) -> dict[str, str]:
    """server.properties entries of a SASL/SCRAM broker with the StandardAuthorizer; the
    controller listener stays PLAINTEXT on loopback, so its ANONYMOUS principal (the
    broker's own registration) is a super user next to the admin."""
    jaas = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{ADMIN}" password="{admin_password}";')
    return {
        "listeners": (f"SASL_PLAINTEXT://127.0.0.1:{port},"
                      f"CONTROLLER://127.0.0.1:{controller_port}"),
        "advertised.listeners": f"SASL_PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        f"listener.name.sasl_plaintext.{MECHANISM.lower()}.sasl.jaas.config": jaas,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{ADMIN};User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
        "auto.create.topics.enable": "false",
    }


async def create_acls(admin: Any, acls: list[Acl]) -> None:
    """Create ``acls`` through an admin client logged in as a super user (CreateAcls v1;
    aiokafka's admin client has no create_acls)."""
    from aiokafka.protocol.admin import CreateAclsRequest

    for acl in acls:
        rtype, rname, pattern, principal, host, op, permission = acl.wire()
        response = await admin._send_request(
            CreateAclsRequest(rtype, rname, pattern, principal, host, op, permission))
        for code, message in response.creation_responses:
            if code:
                raise BrokerError(f"creating ACL {acl} failed: {message} (error {code})")


def default_manifest() -> Path:
    """deploy/kafkausers.yaml of the working directory, else of this source checkout."""
    here = Path("deploy") / "kafkausers.yaml"
    if here.exists():
        return here
    return Path(__file__).resolve().parents[3] / "deploy" / "kafkausers.yaml"
