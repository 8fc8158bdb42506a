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

from streams.app import ROLES, build_app, consumer_groups, group_id
from streams.settings import Settings, TopicSettings

from helpers import ci_tool

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
    "kafka.yaml": {("kafka.strimzi.io/v1", "Kafka"), ("kafka.strimzi.io/v1", "KafkaNodePool")},
}
NOT_IN_KUSTOMIZATION = {"kustomization.yaml", "secret.example.yaml", "topics.yaml",
                        "kafka-exporter.yaml", "kafkausers.yaml", "kafka.yaml"}
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


def pod_env(role: str) -> dict[str, str]:
    """The environment of a role's pod: the ConfigMap, then the container's own env (a
    Secret's value stands in as a placeholder)."""
    env = {k: str(v) for k, v in configmap_env().items()}
    for item in container(deployments()[role]).get("env", []):
        env[item["name"]] = str(item.get("value", "from-a-secret"))
    return env


def pod_settings(monkeypatch: pytest.MonkeyPatch, role: str) -> Settings:
    import os

    for key in list(os.environ):
        if key.upper().startswith("RETRO_"):
            monkeypatch.delenv(key)
    for key, value in pod_env(role).items():
        monkeypatch.setenv(key, value)
    return Settings()


def deployments() -> dict[str, dict[str, Any]]:
    """Deployments by the role their container command runs."""
    out = {}
    for d in of_kind("Deployment"):
        out[roles_of(d)] = d
    return out


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def roles_of(deployment: dict[str, Any]) -> str:
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
    files = [r for r in k["resources"] if not r.startswith("../")]
    assert set(files) == set(EXPECTED_KINDS) - NOT_IN_KUSTOMIZATION
    for resource in files:
        assert (DEPLOY / resource).is_file(), resource
    # the alert rules and dashboards come from grafana/'s own kustomization
    assert [r for r in k["resources"] if r.startswith("../")] == ["../grafana"]
    assert (ROOT / "grafana" / "kustomization.yaml").is_file()


def test_grafana_kustomization_ships_the_rules_and_every_dashboard() -> None:
    k = yaml.safe_load((ROOT / "grafana" / "kustomization.yaml").read_text("utf-8"))
    assert k["resources"] == ["prometheusrule.yaml"]
    [dashboards] = k["configMapGenerator"]
    assert set(dashboards["files"]) == {p.name for p in (ROOT / "grafana").glob("*.json")}
    options = dashboards["options"]
    assert options["labels"]["grafana_dashboard"] == "1"  # the sidecar's default label
    # a hash suffix would leave the old ConfigMap behind: two copies of each dashboard
    assert options["disableNameSuffixHash"] is True


def _package_version() -> str:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["version"]


def test_the_image_is_pinned_to_a_version() -> None:
    """`latest` with IfNotPresent runs whichever image a node pulled first."""
    (k,) = load_docs("kustomization.yaml")
    version = _package_version()
    names = set()
    for d in of_kind("Deployment"):
        c = container(d)
        name, _, tag = c["image"].rpartition(":")
        names.add(name)
        assert tag == version, c["image"]
        assert c["imagePullPolicy"] == "IfNotPresent"
    [image] = [i for i in k["images"] if i["name"] in names]
    assert image.get("digest", "").startswith("sha256:") or image["newTag"] == version
    assert image.get("newTag") != "latest"


def _kustomize() -> list[str] | None:
    """`kustomize build` (.ci/test builds it into .ci-cache/go/bin) or `kubectl kustomize`."""
    if kustomize := ci_tool("kustomize"):
        return [kustomize, "build"]
    if kubectl := ci_tool("kubectl"):
        return [kubectl, "kustomize"]
    return None


@pytest.mark.skipif(_kustomize() is None, reason="neither kustomize nor kubectl is installed")
def test_kustomize_build_holds_the_rules_dashboards_and_pinned_image() -> None:
    import json
    import subprocess

    done = subprocess.run([*(_kustomize() or []), str(DEPLOY)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    built = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert {d["metadata"].get("namespace") for d in built} == {"retro"}
    [rule] = [d for d in built if d["kind"] == "PrometheusRule"]
    assert rule["spec"] == yaml.safe_load((ROOT / "grafana" / "alerts.yaml").read_text("utf-8"))
    [dashboards] = [d for d in built if d["kind"] == "ConfigMap"
                    and d["metadata"]["name"] == "retro-stream-dashboards"]
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"
    for name, text in dashboards["data"].items():
        assert json.loads(text) == json.loads((ROOT / "grafana" / name).read_text("utf-8"))
    images = {c["image"] for d in built if d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert images == {f"registry.example.com/platform/retro-stream:{_package_version()}"}


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


@pytest.mark.parametrize("role", ROLES)
def test_configmap_builds_settings_fit_for_a_pod(role: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    settings = pod_settings(monkeypatch, role)
    assert settings.web_host == "0.0.0.0"  # probes and scrapes come from outside the pod
    assert settings.web_token is not None  # required off loopback
    assert settings.state_dir.is_absolute()
    assert settings.kafka.bootstrap
    if settings.kafka.security_protocol.startswith("SASL"):
        assert settings.kafka.sasl_mechanism and settings.kafka.sasl_username
        assert settings.kafka.sasl_password is not None


# --- deployments -------------------------------------------------------------------


def test_one_deployment_per_role_running_its_stage_loops() -> None:
    by_role = deployments()
    assert set(by_role) == set(ROLES)
    for role, d in by_role.items():
        assert container(d)["command"][:3] == ["retro", "worker", "--roles"]
        assert d["metadata"]["name"] == f"retro-worker-{role}"
        assert load_docs(f"worker-{role}.yaml")[0] is not None


def test_every_container_runs_a_known_role() -> None:
    for d in of_kind("Deployment"):
        assert roles_of(d) in ROLES


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
        if env["name"] == "RETRO_SHUTDOWN_SECONDS":  # sized to the role's grace period
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


def test_the_model_quota_is_the_accounts_and_only_the_code_divides_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch pods share RETRO_MODEL__RPM/TPM by their lane partitions: a full fleet
    uses the ConfigMap's quota, so the ConfigMap gives the account's, undivided."""
    from streams.gateway.factory import build_gateways

    pod_settings(monkeypatch, "batch")
    monkeypatch.setenv("RETRO_MODEL__BASE_URL", "https://llm.example.internal/v1")  # a provider
    settings = Settings()
    comment = (DEPLOY / "configmap.yaml").read_text("utf-8")
    stated = re.search(r"account quota of (\d+) requests and (\d+) tokens a minute", comment)
    assert stated, "configmap.yaml states the account's quota it sets"
    assert (settings.model.rpm, settings.model.tpm) == tuple(map(int, stated.groups()))
    [batch] = [so for so in of_kind("ScaledObject")
               if so["spec"]["scaleTargetRef"]["name"] == "retro-worker-batch"]
    partitions = {settings.topics.fast: settings.topics.partitions,
                  settings.topics.slow: settings.topics.partitions}
    for pods in (1, batch["spec"]["maxReplicaCount"]):
        rpm = tpm = 0.0
        for pod in range(pods):  # round-robin: pod N gets partition N (mod pods) of both lanes
            gateways = build_gateways(settings)
            gateways.follow_assignment([(t, p) for t, n in partitions.items()
                                        for p in range(n) if p % pods == pod], partitions)
            rpm += gateways.quota.rpm.rate_per_minute
            tpm += gateways.quota.tpm.rate_per_minute
        assert (round(rpm), round(tpm)) == (settings.model.rpm, settings.model.tpm), pods


# After the stage loops drained (RETRO_SHUTDOWN_SECONDS, all loops together), a worker
# still commits, leaves its groups, closes its clients and lets faust stop.
SHUTDOWN_MARGIN_SECONDS = 20


@pytest.mark.parametrize("role", ROLES)
def test_shutdown_drain_fits_the_grace_period(role: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    settings = pod_settings(monkeypatch, role)
    grace = deployments()[role]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    drain = settings.shutdown_seconds
    assert "RETRO_SHUTDOWN_SECONDS" in {e["name"] for e in container(deployments()[role])["env"]}
    # killed before it has drained, a pod loses what it holds: the next owner redoes it
    assert drain + SHUTDOWN_MARGIN_SECONDS <= grace, (role, drain, grace)
    assert drain >= grace / 3, (role, drain, grace)  # the grace period is there to be used
    if role == "batch":  # a model call in flight at SIGTERM is answered, not paid twice
        assert drain >= max(settings.fast.timeout_seconds, settings.slow.timeout_seconds)


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
        roles_of(d)
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
        role = roles_of(by_name[so["spec"]["scaleTargetRef"]["name"]])
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


def test_trigger_authentication_logs_in_as_the_keda_user() -> None:
    """Not as a worker: KEDA's user may only describe what it scales on."""
    users = {u["metadata"]["name"] for u in load_docs("kafkausers.yaml")}
    copied = readme_copied_user_secrets()
    mounted = {
        v["secret"]["secretName"]
        for d in of_kind("Deployment")
        for v in d["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    for auth in of_kind("TriggerAuthentication"):
        refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
        assert refs["username"]["name"] == refs["password"]["name"] == KEDA_USER
        assert KEDA_USER in users
        # the User Operator's Secret, copied into the namespace with a username key
        assert {refs["username"]["key"], refs["password"]["key"]} <= copied[KEDA_USER]
        for parameter, ref in refs.items():
            if parameter not in ("username", "password"):
                assert ref["name"] in mounted, ref  # the Kafka CA the workers mount


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


def test_readme_says_what_the_network_policy_does() -> None:
    (k,) = load_docs("kustomization.yaml")
    readme = " ".join((DEPLOY / "README.md").read_text("utf-8").split())
    assert "networkpolicy.yaml" in k["resources"]
    assert not re.search(r"no NetworkPolicy is included", readme, flags=re.I)
    assert "`networkpolicy.yaml` admits to port 6066" in readme


def _acls(user: dict[str, Any]) -> dict[tuple[str, str, str], set[str]]:
    acls = user["spec"]["authorization"]["acls"]
    out = {(a["resource"]["type"], a["resource"]["name"], a["resource"]["patternType"]):
           set(a["operations"]) for a in acls}
    assert len(out) == len(acls), f"{user['metadata']['name']}: one entry per resource"
    return out


READ, WRITE, DESCRIBE = {"Read", "Describe"}, {"Write", "Describe"}, {"Describe"}
KEDA_USER = "retro-stream-keda"
Access = dict[tuple[str, str, str], set[str]]


def _grant(access: Access, kind: str, name: str, ops: set[str]) -> None:
    access.setdefault((kind, name, "literal"), set()).update(ops)


def role_access(settings: Settings, role: str, state_dir: Path) -> Access:
    """What a pod running ``retro worker --roles <role>`` does on Kafka, read off the
    worker build_app builds for it: its loops' groups and subscriptions, what each step
    writes and reads outside a group, and what every worker does at start."""
    from streams.batch.step import LaneStep
    from streams.clean.step import CleanStep
    from streams.kafka.readers import LatestPerKey, Reader
    from streams.kafka.topics import topic_specs
    from streams.notify.step import NotifyStep
    from streams.report.compactor.step import CompactStep
    from streams.report.ops.redrive import RedriveStep
    from streams.traces.step import TraceStep

    worker = build_app(settings.model_copy(update={"state_dir": state_dir}), roles=(role,))
    t = settings.topics
    access: Access = {}
    # at start ensure_topics lists the topics and creates those it cannot see
    for spec in topic_specs(settings):
        _grant(access, "topic", spec.name, DESCRIBE)
    # at start ensure_group_offsets commits the missing offsets; every 15 s the lag
    # monitor reads committed and end offsets and the oldest uncommitted record
    for group, topics in consumer_groups(settings, (role,)).items():
        _grant(access, "group", group, READ)
        for topic in topics:
            _grant(access, "topic", topic, READ)
    if worker.follower is not None:  # the HTTP views follow the reports, in no group
        _grant(access, "topic", t.reports, READ)
    for loop in worker.loops:
        assert loop.subscription.pattern is None, (
            "RETRO_TOPICS__RAW_PATTERN: give clean and batch prefix ACLs on its topics "
            "and teach this test the prefix")
        _grant(access, "group", loop.group, READ)  # join, heartbeat, commit, fetch offsets
        for topic in loop.subscription.topics:
            _grant(access, "topic", topic, READ)
        step = loop.step
        if isinstance(step, CleanStep):  # the lanes and dead letters, and trace marks
            writes = [*step.targets.values(), step.traces]
        elif isinstance(step, LaneStep):  # outcome_outs, and lane messages that are no record
            writes = [t.fragments, t.review, t.deadletter]
        elif isinstance(step, RedriveStep):  # lane messages again by offset, to the lanes
            assert isinstance(step.reader, Reader)
            for topic in step.lanes.values():
                _grant(access, "topic", topic, READ)
            writes = list(step.lanes.values())
        elif isinstance(step, CompactStep):  # reports read back; rejected fragments, roll-ups
            assert isinstance(step.source, LatestPerKey)
            assert (step.source.topic, step.source.homes) == (t.reports, t.fragments)
            _grant(access, "topic", t.reports, READ)
            writes = [t.reports, t.review, t.fragments]
        elif isinstance(step, TraceStep):  # hops, to the reports through the fragments
            writes = [step.fragments]
        elif isinstance(step, NotifyStep):  # ledgers loaded on assignment, then written
            assert isinstance(step.source, LatestPerKey)
            assert step.source.topic == t.notifications
            _grant(access, "topic", t.notifications, READ)
            writes = [t.notifications]
        else:
            raise AssertionError(f"{step.name}: say here what it reads and writes")
        for topic in writes:
            _grant(access, "topic", topic, WRITE)
    return access


def kafka_users() -> dict[str, dict[str, Any]]:
    return {u["metadata"]["name"]: u for u in load_docs("kafkausers.yaml")}


@pytest.mark.parametrize("role", ROLES)
def test_each_role_user_grants_exactly_what_its_worker_does(
        role: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = pod_settings(monkeypatch, role)
    user = pod_env(role)["RETRO_KAFKA__SASL_USERNAME"]
    assert user == f"retro-stream-{role}"
    assert _acls(kafka_users()[user]) == role_access(settings, role, tmp_path)


def test_role_access_sees_the_redrive_and_the_groups(settings: Settings,
                                                     tmp_path: Path) -> None:
    batch = role_access(settings, "batch", tmp_path)
    t = settings.topics
    assert batch[("topic", t.raw, "literal")] == DESCRIBE  # the re-drive reads the lanes
    assert batch[("topic", t.fast, "literal")] == READ | WRITE
    assert {name for kind, name, _ in batch if kind == "group"} == {
        "retro-stream-batch-lanes", "retro-stream-batch-review"}


def test_the_keda_user_may_describe_what_the_triggers_read() -> None:
    expected: Access = {}
    for so in of_kind("ScaledObject"):
        for trigger in so["spec"]["triggers"]:
            _grant(expected, "topic", trigger["metadata"]["topic"], DESCRIBE)
            _grant(expected, "group", trigger["metadata"]["consumerGroup"], DESCRIBE)
    assert _acls(kafka_users()[KEDA_USER]) == expected


def test_the_producer_user_may_do_what_retro_produce_does(settings: Settings) -> None:
    from streams.kafka.topics import topic_specs

    t = settings.topics
    expected: Access = {}
    for spec in topic_specs(settings):  # ensure_topics
        _grant(expected, "topic", spec.name, DESCRIBE)
    _grant(expected, "topic", t.produce_topic, WRITE | {"DescribeConfigs"})  # max.message.bytes
    _grant(expected, "topic", t.deadletter, WRITE)  # records too large to send
    assert _acls(kafka_users()["retro-stream-producer"]) == expected


def test_kafka_users_are_scram_and_never_administer(settings: Settings) -> None:
    users = kafka_users()
    t = settings.topics
    assert set(users) == {f"retro-stream-{r}" for r in (*ROLES, "reader", "producer", "keda")}
    for name, user in users.items():
        acls = _acls(user)
        assert user["spec"]["authentication"]["type"] == "scram-sha-512", name
        for (kind, resource, pattern), ops in acls.items():
            assert not ops & {"All", "Delete", "Alter", "AlterConfigs", "Create"}, (name, resource)
            assert kind in ("topic", "group") and pattern == "literal", (name, resource)
            if kind == "topic":
                assert resource in t.model_dump().values(), (name, resource)
    raw_readers = sorted(n for n, u in users.items()
                         if "Read" in _acls(u).get(("topic", t.raw, "literal"), set()))
    # unredacted lines: the clean role alone (the re-drive reads the redacted lanes)
    assert raw_readers == ["retro-stream-clean"]
    reader = _acls(users["retro-stream-reader"])
    assert not any("Write" in ops for ops in reader.values())
    assert reader[("topic", t.raw, "literal")] == {"Describe"}  # audit: offsets only


# --- the Kafka cluster: listener, authorization, exporter ----------------------------------


def every_group_the_code_names(settings: Settings) -> set[str]:
    """Consumer groups of a worker with any one role, and of the all-in-one worker."""
    from streams.worker.stages import (
        clean_group,
        fragments_group,
        lanes_group,
        review_group,
        traces_group,
    )

    stages = (clean_group, lanes_group, review_group, traces_group, fragments_group)
    roles = [(r,) for r in ROLES] + [ROLES]
    return {stage(group_id(settings, r)) for r in roles for stage in stages}


def test_kafka_example_is_the_cluster_the_manifests_assume(settings: Settings) -> None:
    kafka = one("Kafka")
    name = kafka["metadata"]["name"]
    spec = kafka["spec"]["kafka"]
    host, port = settings.kafka.bootstrap.rsplit(":", 1)
    assert host.startswith(f"{name}-kafka-bootstrap.")
    [listener] = [li for li in spec["listeners"] if li["port"] == int(port)]
    assert listener["tls"] == (settings.kafka.security_protocol in ("SSL", "SASL_SSL"))
    assert listener["authentication"]["type"] == settings.kafka.sasl_mechanism.lower()
    assert spec["authorization"]["type"] == "simple"  # what the KafkaUsers' ACLs need
    config = spec["config"]
    assert config["default.replication.factor"] == settings.topics.replication
    assert config["min.insync.replicas"] < settings.topics.replication
    pools = of_kind("KafkaNodePool")
    assert sum(p["spec"]["replicas"] for p in pools if "broker" in p["spec"]["roles"]) >= (
        settings.topics.replication)
    labelled = [*pools, *load_docs("kafkausers.yaml"), *load_docs("topics.yaml")]
    assert {d["metadata"]["labels"]["strimzi.io/cluster"] for d in labelled} == {name}
    assert {"topicOperator", "userOperator"} <= set(kafka["spec"]["entityOperator"])


def test_kafka_exporter_reports_every_group_and_topic_of_the_pipeline(
        settings: Settings) -> None:
    kafka = one("Kafka")
    exporter = kafka["spec"]["kafkaExporter"]
    # Go regular expressions, matched anywhere in the name (kafka_exporter)
    groups, topics = re.compile(exporter["groupRegex"]), re.compile(exporter["topicRegex"])
    for group in sorted(every_group_the_code_names(settings)):
        assert groups.search(group), group
    for topic in sorted(topic_names().values()):
        assert topics.search(topic), topic
    monitor = one("PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "strimzi.io/kind": "Kafka",
        "strimzi.io/name": f"{kafka['metadata']['name']}-kafka-exporter"}


def test_the_exporter_patch_for_an_existing_cluster_is_the_example_block() -> None:
    import json

    text = (DEPLOY / "kafka.yaml").read_text("utf-8")
    match = re.search(r"#\s+kubectl -n \w+ patch kafka (\S+) --type merge -p \\\n#\s+'(.*)'",
                      text)
    assert match, "kafka.yaml shows no patch for an existing cluster"
    kafka = one("Kafka")
    assert match.group(1) == kafka["metadata"]["name"]
    assert json.loads(match.group(2)) == {"spec": {"kafkaExporter": kafka["spec"]["kafkaExporter"]}}


# --- README: what step 3 and 4 create is what the pods and KEDA read ---------------------


def _readme_commands() -> list[str]:
    """The shell commands of deploy/README.md's code blocks, continuation lines joined."""
    text = (DEPLOY / "README.md").read_text("utf-8")
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    return [c for b in blocks for c in re.sub(r"\\\n\s*", " ", b).splitlines()]


def readme_copied_user_secrets() -> dict[str, set[str]]:
    """Secret name -> keys, for the Kafka users' Secrets README.md copies into `retro`."""
    text = "\n".join(_readme_commands())
    match = re.search(r"for user in ([\w -]+); do\n(.*?)\ndone", text, flags=re.S)
    assert match, "README.md copies no Kafka user Secrets"
    keys = set(re.findall(r"--from-literal=(\w+)=", match.group(2)))
    return {user: keys for user in match.group(1).split()}


def test_readme_creates_the_secret_keys_the_pods_read() -> None:
    secret = one("Secret")
    name = secret["metadata"]["name"]
    read = {e["valueFrom"]["secretKeyRef"]["key"] for d in of_kind("Deployment")
            for e in container(d).get("env", [])
            if e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == name}
    [command] = [c for c in _readme_commands() if f"create secret generic {name}" in c]
    created = set(re.findall(r"--from-literal=(\w+)=", command))
    assert created == read == set(secret["stringData"])  # RETRO_WEB_TOKEN among them
    assert "RETRO_WEB_TOKEN" in created


def test_readme_copies_every_kafka_user_secret_the_pods_read() -> None:
    copied = readme_copied_user_secrets()
    for role, d in deployments().items():
        env = {e["name"]: e for e in container(d).get("env", [])}
        ref = env["RETRO_KAFKA__SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref["key"] in copied.get(ref["name"], set()), role
    assert set(copied) <= set(kafka_users())
