"""Ray's own Prometheus series -> canonical `ray_samples` rows: one per Ray node (a KubeRay pod) per step.

The Ray catalog (`foxhunt_obs/data/ray_metrics.yaml`) names the series of each column, every known spelling
with where it was verified. Rows come from the Ray targets' `up` (a node whose scrape fails is a row with
alive false and no values, never a missing row), the columns from per-pod sums of the catalog's sources,
the experiment from the Ray cluster's head pod (kube_pod_labels). Nothing here knows about the lake.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import yaml

from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.ingest.gpu_series import IngestError, Window, fill, pod_experiments
from foxhunt_obs.lib.ingest.metric_catalog import Catalog, CatalogError, kube_label_name
from foxhunt_obs.lib.names import UNATTRIBUTED
from foxhunt_obs.lib.schemas import RAY_SAMPLES
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.lib.yaml_text import load_yaml

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "ray_metrics.yaml"
_SELECTOR = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*(=|!=|=~|!~)"[^"]*",?)*\})?$')
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_PORT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")  # a container port's name, or its number
# Per pod: the sum over the processes that report a series (ray_tasks, ray_actors), taken per scrape target,
# then the largest target's: a pod scraped by two jobs (Ray's guide's monitors left beside
# deploy/kubernetes/ray-podmonitor.yaml) is counted once. Two PodMonitors on one pod's port differ in `job`
# and in their own relabelings (ours adds `node`), so the targets are told apart by job and instance, not by
# listing the labels that may differ (prometheus-operator@6adcebc pkg/prometheus/promcfg.go
# generatePodMonitorConfig: job, namespace, container, pod, endpoint, then the monitor's relabelings).
PER_POD = "max by (namespace, pod) (sum by (namespace, pod, job, instance) (last_over_time({name}[{fresh}])))"


class RayCatalogError(CatalogError):
    """A malformed Ray catalog (a CatalogError: an asset reports it as a failure, not a crash)."""


@dataclass(frozen=True)
class RaySource:
    names: tuple[str, ...]  # selectors whose per-pod sums add up to the value
    since: str  # where this spelling was verified

    def query(self, fresh: str) -> str:
        return " + ".join(fill(PER_POD, name=n, fresh=fresh) for n in self.names)


@dataclass(frozen=True)
class RayColumn:
    name: str
    unit: str
    sources: tuple[RaySource, ...]
    core: bool = False


@dataclass(frozen=True)
class RayCatalog:
    target_cluster_label: str  # the label Ray targets carry (ray_io_cluster)
    metrics_endpoint: str  # the `endpoint` of Ray's metrics port (prometheus-operator: the port's name)
    cluster_label: str  # KubeRay's pod label (ray.io/cluster)
    node_type_label: str  # ray.io/node-type
    head: str  # its value on the head pod
    columns: tuple[RayColumn, ...]

    def up(self) -> str:
        """The Ray targets' `up`: those carrying the cluster label, on Ray's metrics port. Ray's guide also
        scrapes the head's autoscaler and dashboard ports, whose `up` is 0 where no autoscaler runs; a
        target without an `endpoint` label (a scrape config without prometheus-operator) counts too."""
        return f'up{{{self.target_cluster_label}!="",endpoint=~"{self.metrics_endpoint}|"}}'

    def metric_names(self) -> set[str]:
        """Every metric name the catalog reads (without label matchers)."""
        return {n.split("{")[0] for c in self.columns for s in c.sources for n in s.names}


def load_ray_catalog(path: str | Path | None = None) -> RayCatalog:
    return _load(str(Path(path) if path else DEFAULT_PATH))


@cache
def _load(path: str) -> RayCatalog:
    try:
        raw = load_yaml(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise RayCatalogError(f"Ray catalog {path}: {e}") from e
    try:
        columns = []
        for name, spec in raw["columns"].items():
            if name not in RAY_SAMPLES.schema.names:
                raise ValueError(f"{name}: not a ray_samples column")
            sources = tuple(RaySource(tuple(s["names"]), str(s.get("since", ""))) for s in spec["sources"])
            bad = [n for s in sources for n in s.names if not _SELECTOR.match(n)]
            if not sources or bad:
                raise ValueError(f"{name}: no sources, or not a metric selector: {bad}")
            columns.append(RayColumn(name, spec["unit"], sources, bool(spec.get("core", False))))
        label, endpoint = raw["target"]["cluster_label"], str(raw["target"]["metrics_endpoint"])
        if not _LABEL.match(label):
            raise ValueError(f"target.cluster_label {label!r} is not a Prometheus label name")
        if not _PORT_NAME.match(endpoint):
            raise ValueError(f"target.metrics_endpoint {endpoint!r} is not a port name or number")
        kube = raw["kube"]
        return RayCatalog(
            label, endpoint, kube["cluster_label"], kube["node_type_label"], kube["head"], tuple(columns)
        )
    except (KeyError, TypeError, ValueError) as e:
        raise RayCatalogError(f"Ray catalog {path}: malformed entry: {e!r}") from e


def collect_ray_samples(
    client: PrometheusClient,
    ray: RayCatalog,
    catalog: Catalog,
    window: Window,
    *,
    experiment_label: str = "experiment",
) -> pa.Table:
    """ray_samples rows for the window: every Ray target at every step it was scraped (up 0 or 1)."""
    label = ray.target_cluster_label
    targets = client.query_range(
        f"max by (namespace, pod, {label}) (last_over_time({ray.up()}[{window.fresh}]))",
        window.start, window.end, window.step, window.label,
    )  # fmt: skip
    anonymous = [x for x in targets.labels if not (x.get("namespace") and x.get("pod"))]
    if anonymous:
        raise IngestError(
            f"{window.label or 'ray_samples'}: {len(anonymous)} Ray target(s) carry no namespace/pod label "
            f"(first: {anonymous[0]}): scrape Ray pods through a PodMonitor/ServiceMonitor, which adds them"
        )
    rows = _long(targets, {"cluster": lambda x: x.get(label, "")}, "alive")
    parts = []
    for column in ray.columns:
        # the last-listed source first, so that the first-listed one wins where several report
        for rank, source in enumerate(reversed(column.sources)):
            res = client.query_range(
                source.query(window.fresh), window.start, window.end, window.step, window.label
            )
            if res.labels:
                parts.append(_long(res, {}, column.name, rank=rank))
    long = pa.concat_tables(parts) if parts else _long_empty()
    heads, node_types = ray_pods(client, ray, catalog, window)
    head_steps = ray_heads_by_step(client, ray, catalog, window)
    experiments = pod_experiments(client, catalog, window, experiment_label)
    pivot = ", ".join(
        f"arg_max(value, rank) FILTER (WHERE metric = '{c.name}') AS {c.name}" for c in ray.columns
    )
    with scratch(
        t=rows,
        long=long,
        heads=heads,
        head_steps=head_steps,
        types=node_types,
        exps=experiments,  # (namespace, pod, experiment); pod '' for a namespace's label
    ) as con:
        table = con.execute(
            f"""
            WITH wide AS (SELECT ts_ms, namespace, pod, {pivot} FROM long GROUP BY ALL),
            -- the cluster's head at each step (the greatest name where two overlap), else the window's
            step_head AS (SELECT ts_ms, namespace, cluster, max(pod) AS pod FROM head_steps GROUP BY ALL),
            t AS (  -- a head pod is its own head (the old one's rows keep its experiment while both run)
              SELECT t.*, ty.node_type,
                CASE WHEN ty.node_type = '{ray.head}' THEN t.pod ELSE coalesce(sh.pod, h.pod) END AS head
              FROM (SELECT ts_ms, namespace, pod, cluster, max(value) AS value FROM t GROUP BY ALL) t
              LEFT JOIN step_head sh USING (ts_ms, namespace, cluster)
              LEFT JOIN heads h ON h.namespace = t.namespace AND h.cluster = t.cluster
              LEFT JOIN types ty ON ty.namespace = t.namespace AND ty.pod = t.pod
            )
            SELECT epoch_ms(t.ts_ms) AS ts, t.cluster AS ray_cluster, t.namespace, t.pod,
              coalesce(t.node_type, CASE WHEN t.head = t.pod THEN '{ray.head}' ELSE '' END) AS node_type,
              coalesce(he.experiment, pe.experiment, ne.experiment, '{UNATTRIBUTED}') AS experiment,
              t.value = 1 AS alive,
              {", ".join(f"CASE WHEN t.value = 1 THEN w.{c.name} END AS {c.name}" for c in ray.columns)},
              {float(window.step)}::DOUBLE AS step_seconds
            FROM t
            LEFT JOIN wide w USING (ts_ms, namespace, pod)
            LEFT JOIN exps he ON he.namespace = t.namespace AND he.pod = t.head
            LEFT JOIN exps pe ON pe.namespace = t.namespace AND pe.pod = t.pod
            LEFT JOIN exps ne ON ne.namespace = t.namespace AND ne.pod = ''
            ORDER BY ts, ray_cluster, namespace, pod
            """
        ).to_arrow_table()
    return table.select(RAY_SAMPLES.schema.names).cast(RAY_SAMPLES.schema)


def _long(res, extra: dict, metric: str, rank: int = 0) -> pa.Table:
    """A range result as (ts_ms, namespace, pod, <extra>, metric, rank, value) rows."""
    series = pa.array(res.series_of_point())
    cols = {
        "ts_ms": pa.array(np.rint(res.ts * 1000).astype(np.int64)),
        "namespace": pa.array([x.get("namespace", "") for x in res.labels], pa.string()).take(series),
        "pod": pa.array([x.get("pod", "") for x in res.labels], pa.string()).take(series),
    }
    for name, get in extra.items():
        cols[name] = pa.array([get(x) for x in res.labels], pa.string()).take(series)
    cols["metric"] = pa.array(np.full(res.n_points, metric, dtype=object), pa.string())
    cols["rank"] = pa.array(np.full(res.n_points, rank, dtype=np.int64))
    cols["value"] = pa.array(res.values)
    return pa.table(cols)


def _long_empty() -> pa.Table:
    return pa.table(
        {
            "ts_ms": pa.array([], pa.int64()),
            "namespace": pa.array([], pa.string()),
            "pod": pa.array([], pa.string()),
            "metric": pa.array([], pa.string()),
            "rank": pa.array([], pa.int64()),
            "value": pa.array([], pa.float64()),
        }
    )


def ray_pods(
    client: PrometheusClient, ray: RayCatalog, catalog: Catalog, window: Window
) -> tuple[pa.Table, pa.Table]:
    """From kube_pod_labels over the window: (namespace, cluster, pod) of each Ray cluster's head, and
    (namespace, pod, node_type) of every Ray pod. A cluster with two heads in the window (recreated): the
    greatest name, on every run (rows take the head of their own step where kube_pod_labels has one:
    ray_heads_by_step)."""
    cl, ty = kube_label_name(ray.cluster_label), kube_label_name(ray.node_type_label)
    q = (
        f"max by (namespace, pod, {cl}, {ty}) "
        f'(last_over_time({catalog.kube["pod_labels"]}{{{ty}!=""}}[{window.lookback}]))'
    )
    heads: dict[tuple[str, str], str] = {}
    types: dict[tuple[str, str], str] = {}
    for labels, _ in client.query(q, window.end, window.label):
        ns, pod = labels.get("namespace", ""), labels.get("pod", "")
        if not (ns and pod):
            continue
        types[(ns, pod)] = labels.get(ty, "")
        if labels.get(ty) == ray.head and labels.get(cl):
            heads[(ns, labels[cl])] = max(pod, heads.get((ns, labels[cl]), ""))
    h, t = sorted(heads.items()), sorted(types.items())
    return (
        pa.table(
            {
                "namespace": pa.array([k[0] for k, _ in h], pa.string()),
                "cluster": pa.array([k[1] for k, _ in h], pa.string()),
                "pod": pa.array([v for _, v in h], pa.string()),
            }
        ),
        pa.table(
            {
                "namespace": pa.array([k[0] for k, _ in t], pa.string()),
                "pod": pa.array([k[1] for k, _ in t], pa.string()),
                "node_type": pa.array([v for _, v in t], pa.string()),
            }
        ),
    )


def ray_heads_by_step(
    client: PrometheusClient, ray: RayCatalog, catalog: Catalog, window: Window
) -> pa.Table:
    """(ts_ms, namespace, cluster, pod) of each Ray cluster's head pod at each step, from kube_pod_labels:
    a recreated head's experiment applies from the step it appears. Prometheus' 5-minute look-back bridges
    kube-state-metrics scrapes longer than the step; steps without a head fall back to ray_pods' heads."""
    cl, ty = kube_label_name(ray.cluster_label), kube_label_name(ray.node_type_label)
    res = client.query_range(
        f'max by (namespace, pod, {cl}) ({catalog.kube["pod_labels"]}{{{ty}="{ray.head}",{cl}!=""}})',
        window.start, window.end, window.step, window.label,
    )  # fmt: skip
    series = pa.array(res.series_of_point())
    return pa.table(
        {
            "ts_ms": pa.array(np.rint(res.ts * 1000).astype(np.int64)),
            "namespace": pa.array([x.get("namespace", "") for x in res.labels], pa.string()).take(series),
            "cluster": pa.array([x.get(cl, "") for x in res.labels], pa.string()).take(series),
            "pod": pa.array([x.get("pod", "") for x in res.labels], pa.string()).take(series),
        }
    )


def unscraped_ray_pods(
    client: PrometheusClient, ray: RayCatalog, catalog: Catalog, window: Window
) -> list[str]:
    """Ray pods (kube_pod_labels with a node type) that no Ray target (`up` with the cluster label) covered
    in the window, as namespace/pod: a missing PodMonitor, or one without the cluster target label."""
    _, types = ray_pods(client, ray, catalog, window)
    q = f"max by (namespace, pod) (last_over_time({ray.up()}[{window.lookback}]))"
    scraped = {
        (x.get("namespace", ""), x.get("pod", "")) for x, _ in client.query(q, window.end, window.label)
    }
    return [
        f"{ns}/{pod}"
        for ns, pod in zip(types.column("namespace").to_pylist(), types.column("pod").to_pylist())
        if (ns, pod) not in scraped
    ]


def missing_core_columns(table: pa.Table, ray: RayCatalog) -> dict[str, dict]:
    """Core columns that some Ray node, up at least once, has no value for in the whole table: column ->
    {pods: the namespace/pod lacking it, looked_for: the source names tried}."""
    core = [c for c in ray.columns if c.core]
    if not table.num_rows or not core:
        return {}
    out = {}
    with scratch(t=table.select(["namespace", "pod", "alive", *(c.name for c in core)])) as con:
        for c in core:
            pods = con.execute(
                f"""SELECT namespace || '/' || pod FROM t GROUP BY namespace, pod
                    HAVING bool_or(alive) AND count({c.name}) = 0 ORDER BY 1"""
            ).fetchall()
            if pods:
                out[c.name] = {
                    "pods": [p[0] for p in pods],
                    "looked_for": [n for s in c.sources for n in s.names],
                }
    return out
