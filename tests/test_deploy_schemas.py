"""deploy/ against real schemas: Kubernetes core objects against the API's own OpenAPI
schemas (kubernetes-validate, strict: unknown fields fail), custom resources against
their CRDs.

Core: every version from 1.29 to the newest the package ships. Custom resources:
with ``DEPLOY_CRDS_DIR`` naming a folder of CRD files (Strimzi's ``040-Crd-kafka.yaml``,
``043-Crd-kafkatopic.yaml``, ``044-Crd-kafkauser.yaml`` and
``045-Crd-kafkanodepool.yaml``, KEDA's ``keda.sh_scaledobjects.yaml`` and
``keda.sh_triggerauthentications.yaml``, prometheus-operator's
``monitoring.coreos.com_servicemonitors.yaml``, ``_podmonitors.yaml`` and
``_prometheusrules.yaml``; any file names), each object is
validated against the openAPIV3Schema of the version its apiVersion names, which
must be served; unknown fields fail as ``kubectl apply`` (strict field validation)
fails them. Without the folder, the fields this project uses are checked against
what those CRDs define (CRD_FIELDS, read from Strimzi 1.0 v1, KEDA 2.x v1alpha1 and
prometheus-operator v1).

kubeconform (strict, built by .ci/test into .ci-cache/go/bin) checks what
``kustomize build deploy`` yields, grafana/'s objects included, and the manifests
kustomize leaves out, against those core schemas and the CRDs (DEPLOY_CRDS_DIR); a
kind without a schema fails.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from helpers import ci_tool

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
MANIFESTS = ("configmap.yaml", "secret.example.yaml", "service.yaml", "worker-clean.yaml",
             "worker-batch.yaml", "worker-compactor.yaml", "servicemonitor.yaml",
             "keda-scaledobjects.yaml", "topics.yaml", "kafka-exporter.yaml",
             "kafkausers.yaml", "kafka.yaml")
CUSTOM_GROUPS = ("kafka.strimzi.io", "keda.sh", "monitoring.coreos.com")

# The spec fields of each custom resource, as its CRD defines them (a subset: what a
# manifest here may use). dict: an object with these fields and no others; a type:
# a leaf; [x]: a list of x; "map": an object of arbitrary keys.
CRD_FIELDS: dict[tuple[str, str], dict[str, Any]] = {
    ("kafka.strimzi.io/v1", "KafkaTopic"): {
        "topicName": str, "partitions": int, "replicas": int, "config": "map",
    },
    ("kafka.strimzi.io/v1", "KafkaUser"): {
        "authentication": {"type": str},
        "authorization": {"type": str, "acls": [{
            "type": str, "host": str, "operations": [str],
            "resource": {"type": str, "name": str, "patternType": str}}]},
        "quotas": "map", "template": "map",
    },
    ("kafka.strimzi.io/v1", "KafkaNodePool"): {
        "replicas": int, "roles": [str], "storage": "map", "resources": "map",
        "jvmOptions": "map", "template": "map",
    },
    ("kafka.strimzi.io/v1", "Kafka"): {
        "kafka": {"version": str, "metadataVersion": str, "image": str,
                  "listeners": [{"name": str, "port": int, "type": str, "tls": bool,
                                 "authentication": {"type": str}, "configuration": "map",
                                 "networkPolicyPeers": [dict]}],
                  "authorization": {"type": str, "superUsers": [str]},
                  "config": "map", "rack": "map", "metricsConfig": "map",
                  "logging": "map", "template": "map", "quotas": "map"},
        "entityOperator": {"topicOperator": "map", "userOperator": "map", "template": "map"},
        "kafkaExporter": {"groupRegex": str, "topicRegex": str, "groupExcludeRegex": str,
                          "topicExcludeRegex": str, "image": str, "resources": "map",
                          "logging": str, "enableSaramaLogging": bool,
                          "showAllOffsets": bool, "template": "map",
                          "livenessProbe": "map", "readinessProbe": "map"},
        "clientsCa": "map", "clusterCa": "map", "cruiseControl": "map",
        "maintenanceTimeWindows": [str],
    },
    ("keda.sh/v1alpha1", "ScaledObject"): {
        "scaleTargetRef": {"name": str, "kind": str, "apiVersion": str,
                           "envSourceContainerName": str},
        "pollingInterval": int, "cooldownPeriod": int, "initialCooldownPeriod": int,
        "idleReplicaCount": int, "minReplicaCount": int, "maxReplicaCount": int,
        "advanced": {"horizontalPodAutoscalerConfig": {"name": str, "behavior": "map"},
                     "restoreToOriginalReplicaCount": bool, "scalingModifiers": "map"},
        "fallback": "map",
        "triggers": [{"type": str, "name": str, "metadata": "map", "metricType": str,
                      "useCachedMetrics": bool,
                      "authenticationRef": {"name": str, "kind": str}}],
    },
    ("keda.sh/v1alpha1", "TriggerAuthentication"): {
        "secretTargetRef": [{"parameter": str, "name": str, "key": str}],
        "env": [{"parameter": str, "name": str, "containerName": str}],
        "podIdentity": "map",
    },
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "selector": {"matchLabels": "map", "matchExpressions": [dict]},
        "namespaceSelector": "map", "jobLabel": str, "targetLabels": [str],
        "podTargetLabels": [str], "sampleLimit": int,
        "endpoints": [{"port": str, "targetPort": (int, str), "path": str, "scheme": str,
                       "interval": str, "scrapeTimeout": str, "honorLabels": bool,
                       "params": "map", "tlsConfig": "map", "bearerTokenSecret": "map",
                       "relabelings": [{"sourceLabels": [str], "targetLabel": str,
                                        "regex": str, "replacement": str, "action": str,
                                        "separator": str, "modulus": int}],
                       "metricRelabelings": [dict]}],
    },
    ("monitoring.coreos.com/v1", "PodMonitor"): {
        "selector": {"matchLabels": "map", "matchExpressions": [dict]},
        "namespaceSelector": "map", "jobLabel": str, "podTargetLabels": [str],
        "podMetricsEndpoints": [{"port": str, "path": str, "scheme": str, "interval": str,
                                 "scrapeTimeout": str, "honorLabels": bool,
                                 "relabelings": [dict], "metricRelabelings": [dict]}],
    },
}


def _file_docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text("utf-8")) if d]


def _docs() -> list[dict[str, Any]]:
    return [d for name in MANIFESTS for d in _file_docs(name)]


def _custom(doc: dict[str, Any]) -> bool:
    return doc["apiVersion"].split("/")[0] in CUSTOM_GROUPS


# --- core -------------------------------------------------------------------------------


def _core_versions() -> list[str]:
    kv = pytest.importorskip("kubernetes_validate")
    newest = tuple(int(x) for x in kv.latest_version().split(".")[:2])
    return [f"1.{minor}.0" for minor in range(29, newest[1] + 1)]


def test_core_objects_pass_strict_schema_validation() -> None:
    import kubernetes_validate as kv

    problems = []
    for version in _core_versions():
        for doc in _docs():
            if _custom(doc):
                continue
            try:
                kv.validate(doc, version, strict=True)
            except kv.ValidationError as exc:
                problems.append(f"{version} {doc['kind']}/{doc['metadata']['name']}: {exc}")
    assert problems == []


# --- custom resources against CRD files ---------------------------------------------------


@functools.cache
def _crd_schemas() -> dict[tuple[str, str], dict[str, Any] | None]:
    """(apiVersion, kind) -> openAPIV3Schema of every version the CRDs define (None: not
    served)."""
    folder = Path(os.environ["DEPLOY_CRDS_DIR"])
    out: dict[tuple[str, str], dict[str, Any] | None] = {}
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # Strimzi's Kafka: 330 kB
        for crd in yaml.load_all(path.read_text("utf-8"), Loader=loader):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                schema = version["schema"]["openAPIV3Schema"] if version["served"] else None
                out[(f"{group}/{version['name']}", kind)] = schema
    return out


def strict(schema: dict[str, Any], *, close: bool = True) -> dict[str, Any]:
    """A structural CRD schema as JSON Schema that rejects unknown fields.

    The branches of anyOf/allOf/oneOf/not only constrain fields the object defines
    (Strimzi's ``oneOf: [{properties: {secret: {}}, required: [secret]}, ...]``), so they
    are never closed: closing them would refuse the object's other fields.
    """
    out = dict(schema)
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = out.pop("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in out:
        out["properties"] = {k: strict(v, close=close) for k, v in out["properties"].items()}
        if close and not preserve and "additionalProperties" not in out:
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = strict(out["additionalProperties"], close=close)
    if isinstance(out.get("items"), dict):
        out["items"] = strict(out["items"], close=close)
    for key in ("anyOf", "allOf", "oneOf"):
        if key in out:
            out[key] = [strict(s, close=False) for s in out[key]]
    if isinstance(out.get("not"), dict):
        out["not"] = strict(out["not"], close=False)
    return out


@pytest.mark.skipif(not os.environ.get("DEPLOY_CRDS_DIR"),
                    reason="set DEPLOY_CRDS_DIR to a folder of the CRD files")
def test_custom_resources_match_their_crds() -> None:
    schemas = _crd_schemas()
    problems = []
    for doc in filter(_custom, _docs()):
        key = (doc["apiVersion"], doc["kind"])
        if key not in schemas:
            problems.append(f"{key}: no CRD defines it")
            continue
        if schemas[key] is None:
            problems.append(f"{key}: defined but not served")
            continue
        body = {k: v for k, v in doc.items() if k != "metadata"}
        schema = strict(schemas[key])  # type: ignore[arg-type]
        schema["properties"].pop("metadata", None)
        for error in jsonschema.Draft7Validator(schema).iter_errors(body):
            where = "/".join(map(str, error.absolute_path))
            problems.append(f"{doc['kind']}/{doc['metadata']['name']} {where}: {error.message}")
    assert problems == []


@pytest.mark.skipif(not os.environ.get("DEPLOY_CRDS_DIR"),
                    reason="set DEPLOY_CRDS_DIR to a folder of the CRD files")
def test_the_prometheus_rule_matches_the_crd() -> None:
    """grafana/prometheusrule.yaml, alerts.yaml for the operator (kustomization)."""
    schema = strict(_crd_schemas()[("monitoring.coreos.com/v1", "PrometheusRule")] or {})
    schema["properties"].pop("metadata", None)
    rule = yaml.safe_load((ROOT / "grafana" / "prometheusrule.yaml").read_text("utf-8"))
    body = {k: v for k, v in rule.items() if k != "metadata"}
    errors = [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(body)]
    assert errors == []


# --- kubeconform: what `kubectl apply -k deploy/` sends, against all the schemas --------
# .ci/test builds kustomize and kubeconform into .ci-cache/go/bin and fetches the CRDs
# (DEPLOY_CRDS_DIR). Core schemas: kubernetes-validate's strict ones for its newest
# Kubernetes, copied with their $refs made file-relative (as shipped they point at
# https://kubernetes.io/api/_definitions.json). CRD schemas: strict() of each served
# version, in kubeconform's {{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}
# layout. No -ignore-missing-schemas: a kind without a schema fails.

# what kustomize leaves out (kustomization.yaml says why): validated as they are
UNLISTED = ("secret.example.yaml", "topics.yaml", "kafkausers.yaml", "kafka.yaml",
            "kafka-exporter.yaml")
CRD_KINDS = {"Kafka", "KafkaTopic", "KafkaUser", "KafkaNodePool", "ScaledObject",
             "TriggerAuthentication", "ServiceMonitor", "PodMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def kubeconform_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """kubeconform's command line, less the input; skips without the tools or CRDs."""
    kubeconform = ci_tool("kubeconform")
    if kubeconform is None:
        pytest.skip("kubeconform is not installed (.ci/test builds it with Go)")
    if not os.environ.get("DEPLOY_CRDS_DIR"):
        pytest.skip("set DEPLOY_CRDS_DIR to a folder of the CRD files (.ci/test does)")
    kv = pytest.importorskip("kubernetes_validate")
    version = kv.latest_version()
    shipped = (Path(kv.__file__).parent / "kubernetes-json-schema"
               / f"v{version}-local-strict")
    root = tmp_path_factory.mktemp("schemas")
    core = root / "core" / f"v{version}"
    core.mkdir(parents=True)
    for path in shipped.glob("*.json"):
        text = path.read_text("utf-8").replace('"/api/_definitions.json#',
                                               '"_definitions.json#')
        schema = json.loads(text)
        schema.pop("$id", None)
        (core / path.name).write_text(json.dumps(schema), "utf-8")
    for (api_version, kind), crd_schema in _crd_schemas().items():
        if crd_schema is None:  # not served: no schema, so kubeconform refuses it
            continue
        group, served = api_version.split("/")
        (root / "crds" / group).mkdir(parents=True, exist_ok=True)
        (root / "crds" / group / f"{kind.lower()}_{served}.json").write_text(
            json.dumps(strict(crd_schema)), "utf-8")
    return [kubeconform, "-strict", "-summary", "-output", "json", "-verbose",
            "-kubernetes-version", version,
            "-schema-location",
            f"{root}/core/{{{{ .NormalizedKubernetesVersion }}}}/"
            "{{ .ResourceKind }}{{ .KindSuffix }}.json",
            "-schema-location",
            f"{root}/crds/{{{{ .Group }}}}/"
            "{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json"]


def kubeconform_results(args: list[str], manifests: str) -> dict[str, Any]:
    """kubeconform's JSON report on ``manifests`` (YAML documents): resources, summary."""
    done = subprocess.run([*args, "-"], input=manifests, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout, done.stderr
    report = json.loads(done.stdout)
    # an empty document (comments only, a trailing ---) has no status: not an object
    report["resources"] = [r for r in report["resources"] if r["status"]]
    return report


def _refused(report: dict[str, Any]) -> list[str]:
    return [f"{r['kind']}/{r['name']}: {r['status']} {r['msg']}"
            for r in report["resources"] if r["status"] != "statusValid"]


def test_the_kustomize_build_passes_kubeconform(kubeconform_args: list[str]) -> None:
    kustomize = ci_tool("kustomize")
    if kustomize is None:
        pytest.skip("kustomize is not installed (.ci/test builds it with Go)")
    built = subprocess.run([kustomize, "build", str(DEPLOY)], capture_output=True,
                           text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    report = kubeconform_results(kubeconform_args, built.stdout)
    assert _refused(report) == []
    assert report["summary"] == {"valid": len(docs), "invalid": 0, "errors": 0, "skipped": 0}
    # every object, grafana/'s rules and dashboards too, was checked against a schema
    assert sorted((r["kind"], r["name"]) for r in report["resources"]) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in docs)
    assert {"PrometheusRule", "ScaledObject", "TriggerAuthentication", "ServiceMonitor",
            "Deployment", "ConfigMap"} <= {d["kind"] for d in docs}


def test_the_manifests_kustomize_leaves_out_pass_kubeconform(
        kubeconform_args: list[str]) -> None:
    text = "\n---\n".join((DEPLOY / name).read_text("utf-8") for name in UNLISTED)
    docs = [d for d in yaml.safe_load_all(text) if d]
    report = kubeconform_results(kubeconform_args, text)
    assert _refused(report) == []
    assert report["summary"] == {"valid": len(docs), "invalid": 0, "errors": 0, "skipped": 0}
    kinds = {d["kind"] for d in docs} | {"ScaledObject", "TriggerAuthentication",
                                          "ServiceMonitor", "PrometheusRule"}
    assert kinds >= CRD_KINDS  # with the build above, every custom kind is covered


def test_kubeconform_refuses_unknown_fields_and_kinds(kubeconform_args: list[str]) -> None:
    """The same command refuses a typo in a core object and in a custom resource, and a
    kind it has no schema for: the checks above can fail."""
    [deployment] = [d for d in _file_docs("worker-clean.yaml") if d["kind"] == "Deployment"]
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    [topic, *_] = _file_docs("topics.yaml")
    topic["spec"]["replica"] = 3
    [scaled, *_] = [d for d in _file_docs("keda-scaledobjects.yaml")
                    if d["kind"] == "ScaledObject"]
    scaled["spec"]["maxReplicas"] = 4
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    report = kubeconform_results(kubeconform_args, yaml.safe_dump_all(
        [deployment, topic, scaled, widget]))
    status = {r["kind"]: (r["status"], r["msg"]) for r in report["resources"]}
    assert status["Deployment"][0] == "statusInvalid"
    assert "imagePullPolicyy" in status["Deployment"][1]
    assert status["KafkaTopic"][0] == "statusInvalid" and "replica" in status["KafkaTopic"][1]
    assert status["ScaledObject"][0] == "statusInvalid"
    assert "maxReplicas" in status["ScaledObject"][1]
    assert status["Widget"] == ("statusError", "could not find schema for Widget")
    assert report["summary"] == {"valid": 0, "invalid": 3, "errors": 1, "skipped": 0}


# --- custom resources against the known fields ----------------------------------------------


def _check(value: Any, shape: Any, where: str) -> list[str]:
    if shape == "map":
        return [] if isinstance(value, dict) else [f"{where}: not an object"]
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return [f"{where}: not an object"]
        problems = [f"{where}.{k}: no such field" for k in value if k not in shape]
        for k, v in value.items():
            if k in shape:
                problems += _check(v, shape[k], f"{where}.{k}")
        return problems
    if isinstance(shape, list):
        if not isinstance(value, list):
            return [f"{where}: not a list"]
        return [p for i, v in enumerate(value) for p in _check(v, shape[0], f"{where}[{i}]")]
    if shape is dict:
        return [] if isinstance(value, dict) else [f"{where}: not an object"]
    kinds = shape if isinstance(shape, tuple) else (shape,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    return [] if ok else [f"{where}: {value!r} is not {'/'.join(k.__name__ for k in kinds)}"]


def test_custom_resources_use_only_fields_their_crds_define() -> None:
    problems = []
    for doc in filter(_custom, _docs()):
        key = (doc["apiVersion"], doc["kind"])
        if key not in CRD_FIELDS:
            problems.append(f"{key}: not a served version we know (Strimzi serves only v1)")
            continue
        problems += _check(doc["spec"], CRD_FIELDS[key], f"{doc['kind']}/"
                           f"{doc['metadata']['name']}.spec")
    assert problems == []


def test_the_field_checker_catches_a_typo_and_a_wrong_type() -> None:
    shape = CRD_FIELDS[("kafka.strimzi.io/v1", "KafkaTopic")]
    assert _check({"partitions": "12", "replica": 3}, shape, "spec") == [
        "spec.replica: no such field", "spec.partitions: '12' is not int"]
    strict_schema = strict({"type": "object", "properties": {"a": {"type": "integer"}}})
    errors = list(jsonschema.Draft7Validator(strict_schema).iter_errors({"a": 1, "b": 2}))
    assert len(errors) == 1 and "'b'" in errors[0].message
    # Strimzi's one-of-these-fields branches constrain; they do not close the object
    one_of = strict({"type": "object",
                     "properties": {"name": {"type": "string"}, "secret": {}, "configMap": {}},
                     "oneOf": [{"properties": {"secret": {}}, "required": ["secret"]},
                               {"properties": {"configMap": {}}, "required": ["configMap"]}]})
    validator = jsonschema.Draft7Validator(one_of)
    assert list(validator.iter_errors({"name": "a", "secret": {}})) == []
    assert len(list(validator.iter_errors({"name": "a", "secret": {}, "secrte": {}}))) == 1


def test_ca_secret_volumes_are_optional() -> None:
    """A plaintext cluster has no CA secret; the pods must start anyway."""
    for doc in _docs():
        if doc["kind"] != "Deployment":
            continue
        for volume in doc["spec"]["template"]["spec"]["volumes"]:
            if "secret" in volume:
                assert volume["secret"].get("optional") is True, volume
