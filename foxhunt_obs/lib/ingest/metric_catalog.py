"""The metric catalog (`foxhunt_obs/data/metric_catalog.yaml`) as typed objects.

What to collect, under which names and in which unit is data; this module only loads it, checks it
and resolves labels. Units are converted once, on ingest, with each source's `scale`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.yaml_text import load_yaml

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "metric_catalog.yaml"
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
# a metric name, optionally with a label matcher: foxhunt_gpu_ecc_errors_total{error="corrected"}
_SELECTOR = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*(=|!=|=~|!~)"[^"]*",?)*\})?$')


class CatalogError(InputError, ValueError):
    pass


@dataclass(frozen=True)
class Source:
    name: str  # Prometheus metric name, optionally with label matchers
    exporter: str
    unit: str
    scale: float  # source value * scale = canonical value


@dataclass(frozen=True)
class GpuMetric:
    column: str
    record: str  # the recording rule with canonical labels (dashboards and alerts query it)
    unit: str
    sources: tuple[Source, ...]
    counter: bool = False
    otherwise_sum_of: tuple[str, ...] = ()  # where no source reported: the sum of these columns
    plus_if_present: tuple[str, ...] = ()  # ... plus these where they report (FB_RESERVED)
    otherwise: str = ""  # where no source reported: this column's value (MIG slices: GR_ENGINE_ACTIVE)
    basis_column: str = ""  # a gpu_samples column naming the source each row's value came from
    core: bool = False  # gpu_samples' check fails when GPUs report but this column has no source


@dataclass(frozen=True)
class NodeMetric:
    column: str
    unit: str
    query: str  # PromQL template with {fresh} and {rate}
    significant_digits: int | None = None  # round aggregates so re-runs are identical


@dataclass(frozen=True)
class Catalog:
    labels: dict[str, tuple[str, ...]]
    gpu_query: str
    gpu_metrics: tuple[GpuMetric, ...]
    node_metrics: tuple[NodeMetric, ...]
    kube: dict[str, str]

    def gpu_metric(self, column: str) -> GpuMetric:
        for m in self.gpu_metrics:
            if m.column == column:
                return m
        raise KeyError(column)

    def source_names(self) -> dict[str, tuple[str, float]]:
        """Prometheus name -> (canonical column, scale)."""
        return {s.name: (m.column, s.scale) for m in self.gpu_metrics for s in m.sources}


def load_catalog(path: str | Path | None = None) -> Catalog:
    path = Path(path) if path else DEFAULT_PATH
    return _load(str(path))


@cache
def _load(path: str) -> Catalog:
    try:
        raw = load_yaml(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise CatalogError(f"metric catalog {path}: {e}") from e
    try:
        gpu = tuple(_gpu_metric(col, spec) for col, spec in raw["gpu_metrics"].items())
        node = tuple(
            NodeMetric(
                column=_ident(col),
                unit=spec["unit"],
                query=" ".join(spec["query"].split()),
                significant_digits=spec.get("significant_digits"),
            )
            for col, spec in raw["node_metrics"].items()
        )
        labels = {k: tuple(v) for k, v in raw["labels"].items()}
        catalog = Catalog(labels, raw["gpu_query"], gpu, node, dict(raw["kube"]))
        columns = {m.column for m in gpu}
        for m in gpu:
            for ref in (*m.otherwise_sum_of, *m.plus_if_present, *([m.otherwise] if m.otherwise else [])):
                if ref not in columns:
                    raise ValueError(f"{m.column}: refers to {ref!r}, which is not a gpu metric")
    except (KeyError, TypeError, ValueError) as e:
        raise CatalogError(f"metric catalog {path}: malformed entry: {e!r}") from e
    names = [s.name for m in gpu for s in m.sources]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise CatalogError(f"metric catalog {path}: source names listed twice: {sorted(dupes)}")
    return catalog


def _gpu_metric(column: str, spec: dict) -> GpuMetric:
    sources = tuple(
        Source(name=s["name"], exporter=s["exporter"], unit=s["unit"], scale=float(s["scale"]))
        for s in spec.get("sources", [])
    )
    for s in sources:
        if not _SELECTOR.match(s.name):
            raise ValueError(f"{column}: {s.name!r} is not a Prometheus metric name or selector")
    if not sources:
        raise ValueError(f"{column}: no sources")
    if not re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$", spec["record"]):
        raise ValueError(f"{column}: {spec['record']!r} is not a recording rule name")
    return GpuMetric(
        column=_ident(column),
        record=spec["record"],
        unit=spec["unit"],
        sources=sources,
        counter=bool(spec.get("counter", False)),
        otherwise_sum_of=tuple(_ident(c) for c in spec.get("otherwise_sum_of", ())),
        plus_if_present=tuple(_ident(c) for c in spec.get("plus_if_present", ())),
        otherwise=_ident(spec["otherwise"]) if spec.get("otherwise") else "",
        basis_column=_ident(spec["basis_column"]) if spec.get("basis_column") else "",
        core=bool(spec.get("core", False)),
    )


def _ident(name: str) -> str:
    if not _IDENT.match(name):
        raise ValueError(f"{name!r} is not a valid column name")
    return name


HOLDER_LABELS = ("namespace", "pod", "container")
TARGET_LABELS = ("job", "instance")  # what identifies a scrape target on every series it yields


@dataclass(frozen=True)
class ScrapeTargets:
    """Which pods are scrape targets (exporters), so that no exporter pod is taken for a GPU's holder.

    Kubernetes service discovery (a ServiceMonitor or PodMonitor, or a kubernetes_sd_configs pod or
    endpoints role relabelled to `namespace`/`pod`) attaches the target's pod to every series the target
    yields, `up` included. With honor_labels off the exporter's own `pod` label is renamed exported_pod, so
    the plain `pod` is always the target's; with honor_labels on the exporter's label wins, and a series
    without one (an unheld GPU) keeps the target's. Either way a series whose holder is its own target's
    pod — the pod `up{job, instance}` carries — is a GPU that no pod holds, unless the container the series
    names was given GPUs (`gpu_containers`, from kube-state-metrics' GPU limits): an exporter container
    never is, even in a pod whose other container is, while a training container that reports its own GPUs
    is their holder. Labels alone cannot tell the two apart: the trainers' in-process poller exposes no pod
    label, so its series carry exactly `up`'s pod and container (the trainer's), as an unheld GPU's do
    under dcgm-exporter (the exporter's); our exporter's sidecar mode names the training pod, its target's
    pod too, and the training container. Without kube-state-metrics' limits (`gpu_containers` empty) such
    GPUs count as held by no pod.

    `containers`: FOXHUNT_EXPORTER_CONTAINERS, for scrape setups whose `up` does not carry the target's
    pod (static configs, federation): a series whose plain `container` is one of them keeps none of its
    plain pod/namespace/container labels."""

    pods: frozenset[tuple[str, str, str, str]] = frozenset()  # (job, instance, namespace, pod)
    containers: frozenset[str] = frozenset()
    gpu_containers: frozenset[tuple[str, str, str]] = frozenset()  # (namespace, pod, container) given GPUs

    def holder(self, labels: dict[str, str], catalog: Catalog) -> tuple[str, str, str]:
        """(namespace, pod, container) of the pod holding the series' GPU; ('', '', '') for none."""
        lab = catalog.labels
        held = labels
        if self.containers and labels.get("container") in self.containers:
            held = {k: v for k, v in labels.items() if k not in HOLDER_LABELS}
        ns, pod, container = (first_label(held, lab[k]) for k in HOLDER_LABELS)
        own_target = (labels.get("job", ""), labels.get("instance", ""), ns, pod) in self.pods
        if pod and own_target and (ns, pod, container) not in self.gpu_containers:
            return "", "", ""
        return ns, pod, container


def first_label(labels: dict[str, str], candidates: tuple[str, ...] | list[str]) -> str:
    """The first non-empty label among candidates, or ''."""
    for c in candidates:
        v = labels.get(c)
        if v:
            return v
    return ""


def node_of(labels: dict[str, str], node_labels: tuple[str, ...]) -> str:
    """The node a series belongs to; `instance` values lose their :port (host:9400 -> host)."""
    for c in node_labels:
        v = labels.get(c)
        if v:
            return _strip_port(v) if c == "instance" else v
    return ""


def _strip_port(instance: str) -> str:
    if instance.startswith("["):  # [ipv6]:port
        return instance[1:].split("]", 1)[0]
    host, sep, port = instance.rpartition(":")
    return host if sep and port.isdigit() else instance


def kube_label_name(label: str) -> str:
    """kube-state-metrics' spelling of a Kubernetes label (its SanitizeLabelName, then toSnakeCase):
    every character outside [a-zA-Z0-9_] becomes _, camelCase is split, all lower-cased:
    `app.kubernetes.io/name` -> `label_app_kubernetes_io_name`, `expName` -> `label_exp_name`
    (kubernetes/kube-state-metrics v2.20.0 internal/store/utils.go, utils_test.go)."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", label)
    return "label_" + re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()
