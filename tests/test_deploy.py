"""The Kubernetes manifests in deploy/ parse and agree with the code they deploy.

Nothing here talks to a cluster: the checks are structural (kinds, API versions,
labels and selectors that must meet) and cross-checks against streams.settings
(every RETRO_* name is a real setting, topic names, partitions, ports, timeouts).
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from streams.app import ROLES, consumer_groups
from streams.settings import Settings, TopicSettings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
# Which TopicSettings fields each autoscaled role consumes (streams/app.py).
ROLE_INPUTS = {"clean": {"raw"}, "batch": {"fast", "slow"}}
EXPECTED_KINDS: dict[str, set[tuple[str, str]]] = {
    "kustomization.yaml": {("kustomize.config.k8s.io/v1beta1", "Kustomization")},
    "configmap.yaml": {("v1", "ConfigMap")},
    "secret.example.yaml": {("v1", "Secret")},
    "worker-clean.yaml": {("apps/v1", "Deployment"), ("policy/v1", "PodDisruptionBudget")},
    "worker-batch.yaml": {("apps/v1", "Deployment"), ("policy/v1", "PodDisruptionBudget")},
    "worker-compactor.yaml": {("apps/v1", "Deployment"), ("policy/v1", "PodDisruptionBudget")},
    "service.yaml": {("v1", "Service")},
    "networkpolicy.yaml": {("networking.k8s.io/v1", "NetworkPolicy")},
    "servicemonitor.yaml": {("monitoring.coreos.com/v1", "ServiceMonitor")},
    "keda-scaledobjects.yaml": {
        ("keda.sh/v1alpha1", "ScaledObject"),
        ("keda.sh/v1alpha1", "TriggerAuthentication"),
    },
    "topics.yaml": {("kafka.strimzi.io/v1", "KafkaTopic")},
    "kafka-exporter.yaml": {("monitoring.coreos.com/v1", "PodMonitor")},
    "kafkausers.yaml": {("kafka.strimzi.io/v1", "KafkaUser")},
}
NOT_IN_KUSTOMIZATION = {"kustomization.yaml", "secret.example.yaml", "topics.yaml",
                        "kafka-exporter.yaml", "kafkausers.yaml"}
# KEDA's name for each RETRO_KAFKA__SASL_MECHANISM.
KEDA_SASL = {
    None: "none",
    "PLAIN": "plaintext",
    "SCRAM-SHA-256": "scram_sha256",
    "SCRAM-SHA-512": "scram_sha512",
}


# --- helpers -------------------------------------------------------------------


@functools.cache
def _parsed(name: str) -> tuple[dict[str, Any], ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    text = (DEPLOY / name).read_text(encoding="utf-8")
    return tuple(d for d in yaml.load_all(text, Loader=loader) if d is not None)


def load_docs(name: str) -> list[dict[str, Any]]:
    """The YAML documents of deploy/<name>; a fresh copy, so a test may not spoil others."""
    return copy.deepcopy(list(_parsed(name)))


def all_docs() -> list[dict[str, Any]]:
    return [d for name in sorted(EXPECTED_KINDS) for d in load_docs(name)]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in all_docs() if d["kind"] == kind]


def one(kind: str) -> dict[str, Any]:
    (doc,) = of_kind(kind)
    return doc


def settings_env_names(model: type[BaseModel] = Settings, prefix: str = "RETRO_") -> set[str]:
    """Every environment name pydantic-settings reads: leaves and nested groups."""
    names: set[str] = set()
    for name, field in model.model_fields.items():
        key = prefix + name.upper()
        names.add(key)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= settings_env_names(annotation, key + "__")
    return names


def unknown_settings(keys: set[str]) -> set[str]:
    return {k for k in keys if k.upper() not in settings_env_names()}


def configmap_env() -> dict[str, Any]:
    return dict(one("ConfigMap")["data"])


def secret_env() -> dict[str, Any]:
    return dict(one("Secret")["stringData"])


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings exactly as a pod sees them: the ConfigMap plus the Secret as env."""
    import os

    for key in list(os.environ):
        if key.upper().startswith("RETRO_"):
            monkeypatch.delenv(key)
    for key, value in {**configmap_env(), **secret_env()}.items():
        monkeypatch.setenv(key, str(value))
    return Settings()


def deployments() -> dict[str, dict[str, Any]]:
    """Deployments by the role their container command runs."""
    out = {}
    for d in of_kind("Deployment"):
        out[agents_role(d)] = d
    return out


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def agents_role(deployment: dict[str, Any]) -> str:
    argv = [*container(deployment).get("command", []), *container(deployment).get("args", [])]
    for i, arg in enumerate(argv):
        if arg == "--roles":
            return argv[i + 1]
        if arg.startswith("--roles="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{deployment['metadata']['name']}: no --roles in {argv}")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def quantity(value: str | int | float) -> float:
    """Kubernetes resource quantity to a float (cores or bytes)."""
    text = str(value)
    units = {
        "m": 1e-3,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
    }
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text)
    assert match, f"not a quantity: {text!r}"
    number, unit = match.groups()
    return float(number) * (units[unit] if unit else 1.0)


def topic_docs() -> dict[str, dict[str, Any]]:
    return {d["spec"]["topicName"]: d for d in load_docs("topics.yaml")}


def topic_names() -> dict[str, str]:
    """TopicSettings field -> topic name, for the fields that name a topic."""
    return {k: v for k, v in TopicSettings().model_dump().items() if isinstance(v, str)}


# --- files, kinds, kustomization -------------------------------------------------


def test_every_deploy_yaml_has_the_expected_kinds() -> None:
    assert {p.name for p in DEPLOY.glob("*.yaml")} == set(EXPECTED_KINDS)
    for name, expected in EXPECTED_KINDS.items():
        docs = load_docs(name)
        found = {(d.get("apiVersion"), d.get("kind")) for d in docs}
        assert found == expected, name
        for d in docs:
            if d["kind"] != "Kustomization":
                assert d["metadata"]["name"], name
                # the namespace comes from kustomization.yaml or `kubectl -n`
                assert "namespace" not in d["metadata"], f"{name}: {d['metadata']['name']}"


def test_kustomization_lists_the_applyable_manifests() -> None:
    (k,) = load_docs("kustomization.yaml")
    assert k["namespace"] == "retro"
    assert set(k["resources"]) == set(EXPECTED_KINDS) - NOT_IN_KUSTOMIZATION
    for resource in k["resources"]:
        assert (DEPLOY / resource).is_file(), resource


def test_resource_names_are_unique_per_kind() -> None:
    seen = [(d["kind"], d["metadata"]["name"]) for d in all_docs() if d["kind"] != "Kustomization"]
    assert len(seen) == len(set(seen))


# --- settings ------------------------------------------------------------------


def test_settings_walker_knows_nested_names() -> None:
    names = settings_env_names()
    assert {"RETRO_WEB_PORT", "RETRO_FAST__INPUT_BUDGET", "RETRO_KAFKA__SASL_PASSWORD"} <= names
    assert unknown_settings({"RETRO_FAST__INPUT_BUGDET", "RETRO_WEB_PORT"}) == {
        "RETRO_FAST__INPUT_BUGDET"
    }


def test_configmap_and_secret_keys_are_settings() -> None:
    data, secret = configmap_env(), secret_env()
    assert unknown_settings(set(data)) == set()
    assert unknown_settings(set(secret)) == set()
    # ConfigMap data is string -> string; an unquoted 12 would be rejected by the API
    assert all(isinstance(v, str) for v in data.values()), data
    assert not set(data) & set(secret), "a setting must live in one place"


def test_every_retro_name_mentioned_in_deploy_and_grafana_is_a_setting() -> None:
    """Docs and comments too: a misspelt variable in a README is a bug report waiting."""
    files = [*DEPLOY.iterdir(), *(ROOT / "grafana").iterdir()]
    mentioned: dict[str, set[str]] = {}
    for path in files:
        if path.is_file() and path.suffix in {".yaml", ".md", ".json", ""}:
            for name in re.findall(r"\bRETRO_[A-Z0-9_]*[A-Z0-9]", path.read_text("utf-8")):
                mentioned.setdefault(name, set()).add(path.name)
    assert mentioned, "expected RETRO_* names in deploy/"
    bad = {n: sorted(f) for n, f in mentioned.items() if n not in settings_env_names()}
    assert bad == {}


def test_configmap_builds_settings_fit_for_a_pod(settings: Settings) -> None:
    assert settings.web_host == "0.0.0.0"  # probes and scrapes come from outside the pod
    assert settings.state_dir.is_absolute()
    assert settings.kafka.bootstrap
    if settings.kafka.security_protocol.startswith("SASL"):
        assert settings.kafka.sasl_mechanism and settings.kafka.sasl_username
        assert settings.kafka.sasl_password is not None


# --- deployments -------------------------------------------------------------------


def test_one_deployment_per_role_running_its_agents() -> None:
    by_role = deployments()
    assert set(by_role) == set(ROLES)
    for role, d in by_role.items():
        assert container(d)["command"][:3] == ["retro", "worker", "--roles"]
        assert d["metadata"]["name"] == f"retro-worker-{role}"
        assert load_docs(f"worker-{role}.yaml")[0] is not None


def test_every_container_runs_a_known_role() -> None:
    for d in of_kind("Deployment"):
        assert agents_role(d) in ROLES


@pytest.mark.parametrize("role", ROLES)
def test_deployment_pod_spec(role: str, settings: Settings) -> None:
    d = deployments()[role]
    spec = d["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    c = container(d)
    assert selects(spec["selector"]["matchLabels"], labels)

    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert settings.web_port in ports.values()
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if probe == "startupProbe" and probe not in c:
            continue
        get = c[probe]["httpGet"]
        # a stall takes a pod out of readiness; only an unanswering process is restarted
        assert get["path"] == ("/healthz" if probe == "readinessProbe" else "/livez"), probe
        assert ports.get(get["port"], get["port"]) == settings.web_port, probe

    notes = spec["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/port"] == str(settings.web_port)
    assert notes["prometheus.io/path"] == "/metrics"

    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert pod["enableServiceLinks"] is False  # else Services named retro-* inject RETRO_*

    # a read-only root needs writable state and tmp; the CA file must be mounted
    mounts = {Path(m["mountPath"]) for m in c["volumeMounts"]}
    assert settings.state_dir in mounts
    assert Path("/tmp") in mounts
    if settings.kafka.ssl_cafile:
        assert settings.kafka.ssl_cafile.parent in mounts

    res = c["resources"]
    for kind in ("cpu", "memory"):
        assert quantity(res["requests"][kind]) <= quantity(res["limits"][kind]), kind

    spreads = pod["topologySpreadConstraints"]
    assert {s["topologyKey"] for s in spreads} >= {"kubernetes.io/hostname"}
    assert all(selects(s["labelSelector"]["matchLabels"], labels) for s in spreads)


@pytest.mark.parametrize("role", ROLES)
def test_deployment_env_comes_from_the_configmap_and_secret(role: str) -> None:
    c = container(deployments()[role])
    configmap, secret = one("ConfigMap"), one("Secret")
    assert {e["configMapRef"]["name"] for e in c["envFrom"]} == {configmap["metadata"]["name"]}
    users = {u["metadata"]["name"] for u in load_docs("kafkausers.yaml")
             if u["kind"] == "KafkaUser"}
    for env in c.get("env", []):
        assert not unknown_settings({env["name"]}), env["name"]
        if env["name"] == "RETRO_KAFKA__SASL_USERNAME":  # the role's own KafkaUser
            assert env["value"] == f"retro-stream-{role}" and env["value"] in users
            continue
        ref = env["valueFrom"]["secretKeyRef"]
        if env["name"] == "RETRO_KAFKA__SASL_PASSWORD":  # Strimzi writes it for the user
            assert ref == {"name": f"retro-stream-{role}", "key": "password"}
            continue
        assert ref["name"] == secret["metadata"]["name"]
        assert ref["key"] in secret["stringData"]
    names = {e["name"] for e in c.get("env", [])}
    assert {"RETRO_KAFKA__SASL_USERNAME", "RETRO_KAFKA__SASL_PASSWORD"} <= names
    # the pods bind 0.0.0.0: the report pages need the bearer token
    assert "RETRO_WEB_TOKEN" in names
    # only the role that calls the model gets its key
    assert ("RETRO_MODEL__API_KEY" in names) == (role == "batch")


def test_grace_periods_cover_in_flight_work(settings: Settings) -> None:
    by_role = deployments()
    grace = {
        r: d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        for r, d in by_role.items()
    }
    longest_call = max(settings.fast.timeout_seconds, settings.slow.timeout_seconds)
    assert grace["batch"] >= longest_call + 30
    assert all(g >= 30 for g in grace.values()), grace


def test_pod_disruption_budgets_cover_each_role() -> None:
    pdbs = of_kind("PodDisruptionBudget")
    for role, d in deployments().items():
        labels = d["spec"]["template"]["metadata"]["labels"]
        matching = [p for p in pdbs if selects(p["spec"]["selector"]["matchLabels"], labels)]
        assert len(matching) == 1, role
        # maxUnavailable, so single-replica roles do not block node drains
        assert matching[0]["spec"].get("maxUnavailable") == 1, role


def test_autoscaled_deployments_leave_replicas_to_keda() -> None:
    scaled = {s["spec"]["scaleTargetRef"]["name"] for s in of_kind("ScaledObject")}
    for d in of_kind("Deployment"):
        if d["metadata"]["name"] in scaled:
            assert "replicas" not in d["spec"], d["metadata"]["name"]
        else:
            assert d["spec"]["replicas"] >= 1, d["metadata"]["name"]


# --- services and scraping ---------------------------------------------------------


def test_services_reach_worker_pods_on_the_web_port(settings: Settings) -> None:
    pods = [d["spec"]["template"] for d in of_kind("Deployment")]
    for svc in of_kind("Service"):
        targets = [p for p in pods if selects(svc["spec"]["selector"], p["metadata"]["labels"])]
        assert targets, svc["metadata"]["name"]
        for port in svc["spec"]["ports"]:
            for pod in targets:
                (c,) = pod["spec"]["containers"]
                named = {p["name"]: p["containerPort"] for p in c["ports"]}
                target = named.get(port["targetPort"], port["targetPort"])
                assert target == settings.web_port, svc["metadata"]["name"]


def test_service_monitor_scrapes_every_role() -> None:
    monitor = one("ServiceMonitor")
    services = [
        s
        for s in of_kind("Service")
        if selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert len(services) == 1
    (svc,) = services
    port_names = {p["name"] for p in svc["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"
    roles = {
        agents_role(d)
        for d in of_kind("Deployment")
        if selects(svc["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
    }
    assert roles == set(ROLES)


# --- KEDA ----------------------------------------------------------------------------


def test_keda_triggers_point_at_real_topics_and_groups(settings: Settings) -> None:
    names = topic_names()
    by_name = {d["metadata"]["name"]: d for d in of_kind("Deployment")}
    auths = {a["metadata"]["name"] for a in of_kind("TriggerAuthentication")}
    scaled_roles = set()
    for so in of_kind("ScaledObject"):
        role = agents_role(by_name[so["spec"]["scaleTargetRef"]["name"]])
        scaled_roles.add(role)
        triggers = so["spec"]["triggers"]
        assert {t["type"] for t in triggers} == {"kafka"}
        topics = {t["metadata"]["topic"] for t in triggers}
        assert topics <= set(names.values()), topics - set(names.values())
        assert topics == {names[field] for field in ROLE_INPUTS[role]}, role
        groups = consumer_groups(settings, (role,))
        for t in triggers:
            meta = t["metadata"]
            # the group that really commits the trigger's topic (the clean loop's own)
            assert meta["topic"] in groups[meta["consumerGroup"]], (role, meta)
            assert meta["bootstrapServers"] == settings.kafka.bootstrap
            assert int(meta["lagThreshold"]) > 0
            assert meta.get("allowIdleConsumers", "false") in ("false", False)
            assert t["authenticationRef"]["name"] in auths
            assert meta.get("sasl", "none") == KEDA_SASL[settings.kafka.sasl_mechanism]
            uses_tls = settings.kafka.security_protocol in ("SSL", "SASL_SSL")
            assert (meta.get("tls") == "enable") == uses_tls
    assert scaled_roles == set(ROLE_INPUTS)


def test_keda_max_replicas_equal_partitions(settings: Settings) -> None:
    topics = topic_docs()
    for so in of_kind("ScaledObject"):
        spec = so["spec"]
        partitions = {
            topics[t["metadata"]["topic"]]["spec"]["partitions"] for t in spec["triggers"]
        }
        # more pods than partitions sit idle in the group
        assert spec["maxReplicaCount"] == max(partitions) == settings.topics.partitions
        assert spec["minReplicaCount"] == 1
        assert spec["cooldownPeriod"] > 0


def test_trigger_authentication_reads_existing_secrets() -> None:
    secret = one("Secret")
    mounted = {
        v["secret"]["secretName"]
        for d in of_kind("Deployment")
        for v in d["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    for auth in of_kind("TriggerAuthentication"):
        refs = auth["spec"]["secretTargetRef"]
        assert {r["parameter"] for r in refs} >= {"username", "password"}
        for ref in refs:
            if ref["name"] == secret["metadata"]["name"]:
                assert ref["key"] in secret["stringData"], ref
            else:
                assert ref["name"] in mounted, ref  # e.g. the Kafka CA the workers mount


# --- topics ------------------------------------------------------------------------------


def test_topics_cover_every_topic_setting(settings: Settings) -> None:
    topics = topic_docs()
    assert set(topics) == set(topic_names().values())
    clusters = {d["metadata"]["labels"]["strimzi.io/cluster"] for d in topics.values()}
    assert len(clusters) == 1
    for name, d in topics.items():
        assert d["spec"]["partitions"] == settings.topics.partitions, name
        assert d["spec"]["replicas"] == settings.topics.replication, name


def test_topic_retention_and_compaction(settings: Settings) -> None:
    t = settings.topics
    config = {name: d["spec"]["config"] for name, d in topic_docs().items()}
    assert config[t.reports]["cleanup.policy"] == "compact"
    for name in (t.raw, t.fast, t.slow, t.fragments, t.deadletter, t.review):
        assert config[name].get("cleanup.policy", "delete") == "delete", name
    for name in (t.raw, t.fast, t.slow):
        assert int(config[name]["retention.ms"]) == t.retention_ms, name
    for name in (t.deadletter, t.review):
        assert int(config[name]["retention.ms"]) > t.retention_ms, name


def test_topics_agree_with_what_the_worker_would_create(settings: Settings) -> None:
    from streams.kafka.topics import topic_specs

    topics = topic_docs()
    for spec in topic_specs(settings):
        doc = topics[spec.name]["spec"]
        assert doc["partitions"] == spec.partitions, spec.name
        config = {k: str(v) for k, v in doc["config"].items()}
        assert config.items() >= spec.config.items(), spec.name


# --- image -------------------------------------------------------------------------------


def test_dockerfile_runs_retro_as_the_pods_user() -> None:
    lines = [
        ln.strip()
        for ln in (DEPLOY / "Dockerfile").read_text("utf-8").splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    # the base is pinned by a digest build argument; an unset one fails the build
    assert lines[:3] == ["ARG PYTHON_IMAGE=python:3.11-slim", "ARG PYTHON_DIGEST",
                         "FROM ${PYTHON_IMAGE}@${PYTHON_DIGEST}"]
    assert 'ENTRYPOINT ["retro"]' in lines
    (user,) = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    uid = int(user.split(":")[0])
    assert uid > 0
    for d in of_kind("Deployment"):
        assert d["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid


def test_network_policy_admits_only_the_http_port_to_worker_pods() -> None:
    [policy] = load_docs("networkpolicy.yaml")
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "retro-stream"}
    assert spec["policyTypes"] == ["Ingress"]
    [rule] = spec["ingress"]
    assert [p["port"] for p in rule["ports"]] == ["http"]  # the containers' named port
    for role, deployment in deployments().items():
        ports = {p["name"] for p in container(deployment)["ports"]}
        assert "http" in ports, role
    assert rule["from"], "an empty from would admit everyone"


def _acls(user: dict[str, Any]) -> dict[tuple[str, str, str], set[str]]:
    return {(a["resource"]["type"], a["resource"]["name"], a["resource"]["patternType"]):
            set(a["operations"]) for a in user["spec"]["authorization"]["acls"]}


def test_kafka_users_give_each_role_only_what_it_uses(settings: Settings) -> None:
    users = {u["metadata"]["name"]: u for u in load_docs("kafkausers.yaml")}
    t = settings.topics
    assert set(users) == {f"retro-stream-{r}" for r in (*ROLES, "reader", "producer")}
    for name, user in users.items():
        acls = _acls(user)
        assert user["spec"]["authentication"]["type"] == "scram-sha-512", name
        for (kind, resource, pattern), ops in acls.items():
            assert not ops & {"All", "Delete", "Alter", "AlterConfigs"}, (name, resource)
            if kind == "topic" and pattern == "literal":
                assert resource in t.model_dump().values(), (name, resource)
                assert "Create" not in ops, (name, resource)  # data topics: topics.yaml
    for role in ROLES:  # reads exactly its inputs (plus reports, for the HTTP views)
        acls = _acls(users[f"retro-stream-{role}"])
        reads = {r for (k, r, p), ops in acls.items() if k == "topic" and p == "literal"
                 and "Read" in ops}
        [(group, inputs)] = consumer_groups(settings, (role,)).items()
        assert reads == set(inputs) | {t.reports}, role
        assert any(k == "group" and p == "prefix" and group.startswith(r)
                   for (k, r, p) in acls), role
    raw_readers = [n for n, u in users.items()
                   if "Read" in _acls(u).get(("topic", t.raw, "literal"), set())]
    assert raw_readers == ["retro-stream-clean"]  # unredacted lines: one role only
    reader = _acls(users["retro-stream-reader"])
    assert not any("Write" in ops for ops in reader.values())
    assert reader[("topic", t.raw, "literal")] == {"Describe"}  # audit: offsets only
