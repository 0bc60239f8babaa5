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

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "metric_catalog.yaml"
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
# a metric name, optionally with a label matcher: foxhunt_gpu_ecc_errors_total{error="corrected"}
_SELECTOR = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*(=|!=|=~|!~)"[^"]*",?)*\})?$')


class CatalogError(ValueError):
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
    exporter_containers: tuple[str, ...] = ()

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
        raw = yaml.safe_load(Path(path).read_text())
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
        exporters = tuple(raw.get("exporter_containers") or ())
        for c in exporters:
            if not isinstance(c, str) or not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", c):
                raise ValueError(f"exporter_containers: {c!r} is not a container name (a DNS label)")
        catalog = Catalog(labels, raw["gpu_query"], gpu, node, dict(raw["kube"]), exporters)
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
    )


def _ident(name: str) -> str:
    if not _IDENT.match(name):
        raise ValueError(f"{name!r} is not a valid column name")
    return name


HOLDER_LABELS = ("namespace", "pod", "container")  # the scrape target's own, when they are an exporter's


def holder_labels(labels: dict[str, str], catalog: Catalog) -> dict[str, str]:
    """``labels`` without the plain pod/namespace/container when they name an exporter's own pod
    (catalog.exporter_containers): those say who scraped the GPU, not who holds it."""
    if labels.get("container") in catalog.exporter_containers:
        return {k: v for k, v in labels.items() if k not in HOLDER_LABELS}
    return labels


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
    """kube-state-metrics' spelling of a Kubernetes label: label_<name, non [a-zA-Z0-9_] -> _>."""
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)
