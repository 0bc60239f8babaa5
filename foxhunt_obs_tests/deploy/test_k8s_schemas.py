"""Every Kubernetes object the project ships, validated against the schemas the API server enforces.

Built-in kinds (DaemonSet, Service, Job, ConfigMap, Secret, ...) go through `kubernetes_validate`'s strict
schemas for one current Kubernetes version (unknown fields rejected, as `kubectl apply`'s default
server-side field validation does). Custom resources (ServiceMonitor, PodMonitor, PrometheusRule) are not in
Kubernetes' schemas: they are validated with `jsonschema` against the `openAPIV3Schema` of the real
prometheus-operator CRDs (fixtures/real/prometheus-operator/, README there), made strict the same way, and
their `metadata` against Kubernetes' own ObjectMeta schema.

Which files: every `*.yaml`/`*.yml` under `exporter/deploy/` and `deploy/` (deploy/dagster/ included, globbed
when the tests are collected). A YAML document with `apiVersion` and `kind` is an object and is validated;
one with neither (Helm values, Dagster's instance file, Prometheus rule files) is not an object; one with
only one of the two is an error. The mutation tests show the validators reject real mistakes, so a pass
is never vacuous.

Not covered: CEL rules (`x-kubernetes-validations`, none in these CRDs), list-map key uniqueness, string
formats, and the API server's hand-written validation of built-in kinds (e.g. DNS-1123 names).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml
from referencing import Registry, Resource

from foxhunt_obs.lib import settings
from foxhunt_obs_tests.paths import REAL, REPO

# The newest Kubernetes release kubernetes-validate 1.37.0 (pyproject's dev extra) bundles schemas for;
# test_validates_against_the_newest_bundled_kubernetes says when an upgrade brings a newer one.
KUBERNETES = "1.37"
CRDS = REAL / "prometheus-operator"
OBJECT_META = (
    "https://kubernetes.io/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
)
ROOTS = ("exporter/deploy", "deploy")


# ---------------------------------------------------------------- what the project ships


@dataclass(frozen=True)
class Doc:
    path: str  # relative to the repository
    index: int  # the document's position in its file
    body: Any

    @property
    def id(self) -> str:
        name = self.body.get("metadata", {}).get("name", "?") if isinstance(self.body, dict) else "?"
        kind = self.body.get("kind", "?") if isinstance(self.body, dict) else "?"
        return f"{self.path}#{self.index}:{kind}/{name}"


def shipped_files() -> list[Path]:
    found: set[Path] = set()
    for root in ROOTS:
        for pattern in ("**/*.yaml", "**/*.yml"):
            found |= {p for p in (REPO / root).glob(pattern) if p.is_file()}
    return sorted(found)


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def documents(path: Path) -> list[Doc]:
    return [Doc(rel(path), i, d) for i, d in enumerate(yaml.safe_load_all(path.read_text())) if d is not None]


def is_object(doc: Doc) -> bool:
    return isinstance(doc.body, dict) and "apiVersion" in doc.body and "kind" in doc.body


def shipped_objects() -> list[Doc]:
    out = []
    for path in shipped_files():
        try:
            out += [d for d in documents(path) if is_object(d)]
        except yaml.YAMLError:
            pass  # test_every_shipped_yaml_file_parses names the file
    return out


def real_object(path: str, kind: str) -> dict:
    """A copy of the first object of that kind in a shipped file."""
    found = [d.body for d in documents(REPO / path) if is_object(d) and d.body["kind"] == kind]
    assert found, f"{path} has no {kind}"
    return copy.deepcopy(found[0])


# ---------------------------------------------------------------- the validators


def group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


@cache
def bundled_version() -> str:
    """kubernetes-validate's full version directory name for KUBERNETES, e.g. 1.37.0."""
    # all_versions() lists each version twice: its -local and its -local-strict schema directories
    (full,) = {v for v in kubernetes_validate.utils.all_versions() if v.rsplit(".", 1)[0] == KUBERNETES}
    return full


@cache
def kubernetes_definitions() -> Resource:
    """Kubernetes' own definitions (ObjectMeta, ...), strict flavour, as kubernetes-validate bundles them."""
    path = (
        files("kubernetes_validate")
        / "kubernetes-json-schema"
        / f"v{bundled_version()}-local-strict"
        / "_definitions.json"
    )
    return Resource.from_contents(json.loads(path.read_text()))


def strict(schema: Any) -> Any:
    """A CRD's structural schema as the API server applies it with field validation Strict: an object that
    lists its properties and does not preserve unknown fields rejects any other; `nullable` admits null."""
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) if k in ("items", "additionalProperties", "not") else v for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {k: strict(v) for k, v in schema["properties"].items()}
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            out[key] = [strict(s) for s in schema[key]]
    if schema.get("nullable") and "type" in schema:
        out["type"] = [schema["type"], "null"]
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def crd_schemas() -> dict[tuple[str, str, str], dict]:
    """(group, version, kind) -> the served version's strict openAPIV3Schema, from every CRD fixture."""
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        assert crd["kind"] == "CustomResourceDefinition", path
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served", True):
                schema = strict(version["schema"]["openAPIV3Schema"])
                schema["properties"]["metadata"] = {"$ref": OBJECT_META}
                out[(group, version["name"], kind)] = schema
    return out


def is_custom(body: dict) -> bool:
    group, _ = group_version(body["apiVersion"])
    return any(g == group for g, _, _ in crd_schemas())


def errors(body: dict) -> list[tuple[tuple, str]]:
    """Every schema violation of one object as (path, message); [] when it validates."""
    if is_custom(body):
        key = (*group_version(body["apiVersion"]), body["kind"])
        if key not in crd_schemas():
            return [
                ((), f"no CRD fixture serves {body['kind']} in {body['apiVersion']} (add it under {CRDS})")
            ]
        registry = Registry().with_resource(kubernetes_definitions().id(), kubernetes_definitions())
        validator = jsonschema.Draft202012Validator(crd_schemas()[key], registry=registry)
        found = sorted(validator.iter_errors(body), key=lambda e: list(map(str, e.absolute_path)))
        return [(tuple(e.absolute_path), e.message) for e in found]
    try:
        used = kubernetes_validate.validate(body, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [(tuple(e.absolute_path), e.message)]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [((), e.message + " (a custom resource? add its CRD under fixtures/real)")]
    assert used == KUBERNETES, f"validated against {used}, not {KUBERNETES}"
    return []


def explain(found: list[tuple[tuple, str]]) -> str:
    return "\n".join(f"  {'.'.join(map(str, path)) or '<root>'}: {message}" for path, message in found)


# ---------------------------------------------------------------- the shipped files validate


def test_validates_against_the_newest_bundled_kubernetes():
    newest = kubernetes_validate.latest_version()
    assert bundled_version() == newest, (
        f"kubernetes-validate bundles Kubernetes {newest}: move KUBERNETES ({KUBERNETES}) up to it"
    )


@pytest.mark.parametrize("path", shipped_files(), ids=rel)
def test_every_shipped_yaml_file_parses_into_objects_or_plain_config(path: Path):
    try:
        docs = documents(path)
    except yaml.YAMLError as e:
        pytest.fail(f"{rel(path)} is not YAML (an unrendered Helm template?): {e}")
    for doc in docs:
        has = {k for k in ("apiVersion", "kind") if isinstance(doc.body, dict) and k in doc.body}
        assert has != {"apiVersion"} and has != {"kind"}, (
            f"{rel(path)} document {doc.index} has {sorted(has)} only: an object needs apiVersion and kind"
        )


@pytest.mark.parametrize("doc", shipped_objects(), ids=lambda d: d.id)
def test_shipped_object_validates(doc: Doc):
    found = errors(doc.body)
    assert not found, f"{doc.id} does not validate:\n{explain(found)}"


def test_the_objects_this_project_must_ship_are_all_found():
    """The globs find every manifest the project is known to ship, so the validation above cannot pass by
    finding nothing; values files are recognised as such."""
    shipped = {(d.path, d.body["kind"]) for d in shipped_objects()}
    expected = {
        ("exporter/deploy/daemonset.yaml", "DaemonSet"),
        ("exporter/deploy/service.yaml", "Service"),
        ("exporter/deploy/servicemonitor.yaml", "ServiceMonitor"),
        ("exporter/deploy/sidecar-job.yaml", "Job"),
        ("exporter/deploy/sidecar-job.yaml", "PodMonitor"),
        ("deploy/kubernetes/dcgm-exporter-servicemonitor.yaml", "ServiceMonitor"),
        ("deploy/kubernetes/ray-podmonitor.yaml", "PodMonitor"),
        ("deploy/grafana/configmaps.yaml", "ConfigMap"),
        ("deploy/prometheus/foxhunt-rules.prometheusrule.yaml", "PrometheusRule"),
        ("deploy/prometheus/foxhunt-recording-rules.prometheusrule.yaml", "PrometheusRule"),
        ("deploy/prometheus/foxhunt-cost-rules.prometheusrule.yaml", "PrometheusRule"),
    }
    assert expected <= shipped, f"not found: {sorted(expected - shipped)}"
    configmaps = [d for d in shipped_objects() if d.path == "deploy/grafana/configmaps.yaml"]
    assert len(configmaps) == 4, [d.id for d in configmaps]
    values = documents(REPO / "deploy/kubernetes/kube-state-metrics-values.yaml")
    assert values and not any(is_object(d) for d in values)
    assert {k for (_, _, k) in crd_schemas()} == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


# ---------------------------------------------------------------- the validators catch real mistakes


def _set(body: dict, path: tuple, value: Any) -> None:
    *parents, last = path
    for p in parents:
        body = body[p]
    body[last] = value


def _rename(body: dict, path: tuple, new: str) -> None:
    *parents, last = path
    for p in parents:
        body = body[p]
    body[new] = body.pop(last)


DS = "exporter/deploy/daemonset.yaml"
DCGM_SM = "deploy/kubernetes/dcgm-exporter-servicemonitor.yaml"
RULES = "deploy/prometheus/foxhunt-rules.prometheusrule.yaml"
PORT0 = ("spec", "template", "spec", "containers", 0, "ports", 0)
ENDPOINT0 = ("spec", "endpoints", 0)

MISTAKES = {
    # built-in kinds, kubernetes-validate
    "container port as a string": (
        DS,
        "DaemonSet",
        lambda b: _set(b, (*PORT0, "containerPort"), "9094"),
        (*PORT0, "containerPort"),
    ),
    "misspelt container field": (
        DS,
        "DaemonSet",
        lambda b: _rename(b, ("spec", "template", "spec", "containers", 0, "ports"), "port"),
        ("spec", "template", "spec", "containers", 0),
    ),
    "unquoted number as a label value": (
        "deploy/grafana/configmaps.yaml",
        "ConfigMap",
        lambda b: _set(b, ("metadata", "labels", "grafana_dashboard"), 1),
        ("metadata", "labels", "grafana_dashboard"),
    ),
    # custom resources, the prometheus-operator CRDs
    "interval as an unquoted number": (
        DCGM_SM,
        "ServiceMonitor",
        lambda b: _set(b, (*ENDPOINT0, "interval"), 15),
        (*ENDPOINT0, "interval"),
    ),
    "interval not a Prometheus duration": (
        DCGM_SM,
        "ServiceMonitor",
        lambda b: _set(b, (*ENDPOINT0, "interval"), "15 seconds"),
        (*ENDPOINT0, "interval"),
    ),
    "unknown endpoint field": (
        DCGM_SM,
        "ServiceMonitor",
        lambda b: _rename(b, (*ENDPOINT0, "honorLabels"), "honourLabels"),
        ENDPOINT0,
    ),
    "relabel action outside the enum": (
        DCGM_SM,
        "ServiceMonitor",
        lambda b: _set(b, (*ENDPOINT0, "relabelings", 0, "action"), "rename"),
        (*ENDPOINT0, "relabelings", 0, "action"),
    ),
    "custom resource label as a number": (
        DCGM_SM,
        "ServiceMonitor",
        lambda b: _set(b, ("metadata", "labels", "app"), 1),
        ("metadata", "labels", "app"),
    ),
    "rule without expr": (
        RULES,
        "PrometheusRule",
        lambda b: b["spec"]["groups"][0]["rules"][0].pop("expr"),
        ("spec", "groups", 0, "rules", 0),
    ),
    "rule for not a duration": (
        RULES,
        "PrometheusRule",
        lambda b: _set(b, ("spec", "groups", 0, "rules", 0, "for"), "30 minutes"),
        ("spec", "groups", 0, "rules", 0, "for"),
    ),
}


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_validator_rejects_a_real_mistake(mistake: str):
    path, kind, mutate, where = MISTAKES[mistake]
    body = real_object(path, kind)
    assert not errors(body), f"{path} {kind} must validate before the mistake is made"
    mutate(body)
    found = errors(body)
    assert found, f"{mistake}: the validator accepted it"
    assert where in [p for p, _ in found], f"{mistake}: expected an error at {where}, got:\n{explain(found)}"


# ---------------------------------------------------------------- deploy/kubernetes says what it must

# NVIDIA/gpu-operator @ a22dbf671f2e26f9a1e342f8eea28e196235e110, assets/state-dcgm-exporter/0400_service.yaml:
# the Service the operator creates for dcgm-exporter in its own namespace
GPU_OPERATOR_SERVICE = {
    "name": "nvidia-dcgm-exporter",
    "labels": {"app": "nvidia-dcgm-exporter"},
    "ports": ["gpu-metrics"],
}


def test_dcgm_servicemonitor_scrapes_the_gpu_operator_service():
    sm = real_object(DCGM_SM, "ServiceMonitor")
    meta, spec = sm["metadata"], sm["spec"]
    assert meta["namespace"] == "gpu-operator" and spec["namespaceSelector"] == {
        "matchNames": ["gpu-operator"]
    }
    # the operator deletes a ServiceMonitor of its own service's name while its serviceMonitor is disabled
    # (controllers/object_controls.go ServiceMonitor())
    assert meta["name"] != GPU_OPERATOR_SERVICE["name"]
    selector = spec["selector"]["matchLabels"]
    assert selector == {"app": "nvidia-dcgm-exporter"}
    assert all(GPU_OPERATOR_SERVICE["labels"].get(k) == v for k, v in selector.items())
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] in GPU_OPERATOR_SERVICE["ports"]
    assert endpoint["interval"] == "15s" and endpoint["honorLabels"] is False
    (relabel,) = endpoint["relabelings"]
    assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_node_name"] and relabel["targetLabel"] == "node"
    assert relabel.get("action", "replace").lower() == "replace"
    assert settings.default("FOXHUNT_NODE_LABELS").split(",")[0] == "node", "the ingest reads `node` first"


def test_kube_state_metrics_values_allow_list_what_the_ingest_reads():
    (values,) = [d.body for d in documents(REPO / "deploy/kubernetes/kube-state-metrics-values.yaml")]
    allow = values["metricLabelsAllowlist"]  # the chart joins it with "," into --metric-labels-allowlist
    # resource=[label,label,...] per entry: kube-state-metrics' flag syntax
    listed = {k: set(v.strip("[]").split(",")) for k, _, v in (e.partition("=") for e in allow)}
    label = settings.default("FOXHUNT_EXPERIMENT_LABEL")
    assert label in listed["pods"] and label in listed["namespaces"], allow
    assert listed["nodes"] == {"node.kubernetes.io/instance-type"}, allow
    # the KubeRay pod labels the Ray ingest reads a node's cluster and role from
    kuberay = yaml.safe_load((REPO / "foxhunt_obs/data/ray_metrics.yaml").read_text())["kube"]
    assert {kuberay["cluster_label"], kuberay["node_type_label"]} <= listed["pods"], allow
    # kube-state-metrics exposes a label as label_<key, every character outside [a-zA-Z0-9_] as "_">
    catalog = yaml.safe_load((REPO / "foxhunt_obs/data/metric_catalog.yaml").read_text())
    exposed = "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", "node.kubernetes.io/instance-type")
    assert catalog["kube"]["instance_type_label"] == exposed


def test_ray_podmonitor_gives_the_ray_ingest_its_cluster_label():
    """The Ray ingest finds Ray targets by the cluster label on `up`: the PodMonitor must write exactly it,
    from KubeRay's pod label, on both roles."""
    (doc,) = documents(REPO / "deploy/kubernetes/ray-podmonitor.yaml")
    ray = yaml.safe_load((REPO / "foxhunt_obs/data/ray_metrics.yaml").read_text())
    spec = doc.body["spec"]
    (expr,) = spec["selector"]["matchExpressions"]
    assert expr["key"] == ray["kube"]["node_type_label"] and set(expr["values"]) == {"head", "worker"}
    (endpoint,) = spec["podMetricsEndpoints"]
    meta = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", ray["kube"]["cluster_label"])
    copies = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert copies[ray["target"]["cluster_label"]] == [meta], copies
