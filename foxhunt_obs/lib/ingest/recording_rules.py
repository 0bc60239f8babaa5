"""Prometheus recording rules generated from the metric catalog.

One rule per canonical GPU metric (`foxhunt:gpu_util:ratio`, …): every source name of the catalog,
scaled to the canonical unit, its labels renamed to the canonical ones (node, gpu, uuid, model,
namespace, pod, container) with the same precedence as the ingest and reduced to exactly those
labels; two exporters on one GPU (a migration) give one series: the first-listed source wins.
Dashboards and alert rules query these names, so an exporter rename is a catalog change only.

The holder follows the ingest's rule (catalog.ScrapeTargets): a series whose pod is its own scrape
target's — the pod on `up` of the same job and instance — is a GPU no pod holds, so its pod, namespace and
container are blanked, unless kube-state-metrics says the container the series names was given GPUs (a
training container reporting its own). A MIG slice keeps its gpu_instance/gpu_profile labels: a series of
its own.
"""

from __future__ import annotations

import re

from foxhunt_obs.lib.ingest.metric_catalog import HOLDER_LABELS, TARGET_LABELS, Catalog, GpuMetric, Source

SOURCE = "foxhunt_obs/data/metric_catalog.yaml"  # what the generated files say they come from

CANONICAL_LABELS = (
    "node",
    "gpu",
    "uuid",
    "gpu_instance",
    "gpu_profile",
    "model",
    "namespace",
    "pod",
    "container",
)
GPU_IDENTITY = ("uuid", "gpu_instance")  # one series per GPU, or per MIG slice
GROUP = "foxhunt-gpu-canonical"
_DNS_LABEL = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?"


def _normalised(
    expr: str, catalog: Catalog, node_labels: tuple[str, ...], exporter_containers: tuple[str, ...]
) -> str:
    """expr with each canonical label set from its first non-empty candidate label.

    label_replace overwrites, so candidates are applied lowest precedence first. A label that is its
    own candidate (`node` in the node list) is copied aside first, so it still wins when present."""
    candidates = {**catalog.labels, "node": node_labels}
    if exporter_containers:
        # FOXHUNT_EXPORTER_CONTAINERS: such a container's plain labels are the exporter's; container last
        regex = "|".join(exporter_containers)
        for label in HOLDER_LABELS:
            expr = f'label_replace({expr}, "{label}", "", "container", "{regex}")'
    for label in CANONICAL_LABELS:
        names = list(candidates.get(label, ()))
        if label in names:
            if names == [label]:
                continue
            expr = f'label_replace({expr}, "{_aside(label)}", "$1", "{label}", "(.+)")'
            names[names.index(label)] = _aside(label)
        for source in reversed(names):
            # instance is host:port; the node is the host
            regex = "(.+?)(?::[0-9]+)?" if source == "instance" else "(.+)"
            expr = f'label_replace({expr}, "{label}", "$1", "{source}", "{regex}")'
    return expr


def _aside(label: str) -> str:
    return f"foxhunt_original_{label}"  # dropped again by the `max by` around each source


def _unheld_when_own_target(expr: str, catalog: Catalog) -> str:
    """expr with pod, namespace and container blanked on series whose pod is their scrape target's, unless
    the container the series names was given GPUs (catalog kube.gpu_limits) within the look-back the
    ingest uses too (kube.gpu_limits_lookback_s): an exporter container beside a trainer holds nothing."""
    k = catalog.kube
    limits = f'{k["gpu_limits"]}{{resource=~"{k["gpu_resource_regex"]}"}}'
    given = f"last_over_time({limits}[{int(k['gpu_limits_lookback_s'])}s]) > 0"
    own = f'{expr} and on ({", ".join((*TARGET_LABELS, "namespace", "pod"))}) up{{pod!=""}}'
    unheld = f"(({own}) unless on ({', '.join(HOLDER_LABELS)}) ({given}))"
    blanked = unheld
    for label in ("pod", "namespace", "container"):
        blanked = f'label_replace({blanked}, "{label}", "", "{label}", ".*")'
    return f"({expr} unless {unheld}) or {blanked}"


def _source_term(
    source: Source, catalog: Catalog, node_labels: tuple[str, ...], exporter_containers: tuple[str, ...]
) -> str:
    scaled = source.name if source.scale == 1 else f"{source.name} * {source.scale!r}"
    normalised = _normalised(scaled, catalog, node_labels, exporter_containers)
    return f"max by ({', '.join(CANONICAL_LABELS)}) ({_unheld_when_own_target(normalised, catalog)})"


def metric_rule(
    metric: GpuMetric,
    catalog: Catalog,
    node_labels: tuple[str, ...],
    exporter_containers: tuple[str, ...] = (),
) -> dict:
    terms = [_source_term(s, catalog, node_labels, exporter_containers) for s in metric.sources]
    if metric.otherwise_sum_of:
        total = " + ".join(catalog.gpu_metric(c).record for c in metric.otherwise_sum_of)
        first = catalog.gpu_metric(metric.otherwise_sum_of[0]).record
        for extra in metric.plus_if_present:  # where the GPU sends it; else + 0
            total += f" + ({catalog.gpu_metric(extra).record} or {first} * 0)"
        terms.append(total)
    if metric.otherwise:
        terms.append(catalog.gpu_metric(metric.otherwise).record)
    # One series per GPU (slice): a later term only where no earlier one has that GPU (a migration).
    return {"record": metric.record, "expr": f"\nor on ({', '.join(GPU_IDENTITY)})\n".join(terms) + "\n"}


def recording_rules(
    catalog: Catalog, node_labels: tuple[str, ...], exporter_containers: tuple[str, ...] = ()
) -> dict:
    """The rules file as a dict. Rules a metric reads (otherwise_sum_of, plus_if_present, otherwise)
    come before it: a group evaluates its rules in order."""
    for c in exporter_containers:
        if not re.fullmatch(_DNS_LABEL, c):
            raise ValueError(f"FOXHUNT_EXPORTER_CONTAINERS: {c!r} is not a container name (a DNS label)")
    ordered: list[GpuMetric] = []
    for m in catalog.gpu_metrics:
        for dep in (*m.otherwise_sum_of, *m.plus_if_present, *([m.otherwise] if m.otherwise else [])):
            d = catalog.gpu_metric(dep)
            if d not in ordered:
                ordered.append(d)
        if m not in ordered:
            ordered.append(m)
    rules = [metric_rule(m, catalog, node_labels, exporter_containers) for m in ordered]
    return {"groups": [{"name": GROUP, "interval": "15s", "rules": rules}]}
