"""Prometheus GPU and node series -> canonical `gpu_samples` / `node_samples` rows.

Each source series is fetched column-wise (sources/prometheus.py), its labels resolved through the
metric catalog, its values scaled to the canonical unit, and the long result pivoted to one row per
GPU (or node) per step in DuckDB. Nothing here knows about the lake or Dagster.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from foxhunt_obs.lib.analysis.catalog import Catalog, first_label, kube_label_name, node_of
from foxhunt_obs.lib.schemas import GPU_SAMPLES, NODE_SAMPLES
from foxhunt_obs.lib.sources.prometheus import PrometheusClient, RangeResult

UNATTRIBUTED = "unattributed"


@dataclass(frozen=True)
class Window:
    """The half-open range [start, end) in epoch seconds, sampled every `step` seconds."""

    start: float
    end: float
    step: float
    label: str = ""  # what is being built, for error messages: "gpu_samples 2026-11-29-13:00"

    @property
    def fresh(self) -> str:
        return f"{max(1, round(self.step * 1000) - 1)}ms"

    @property
    def rate(self) -> str:
        return f"{round(self.step * 4 * 1000)}ms"


def fill(template: str, **values: str) -> str:
    """Fill {name} placeholders; unlike str.format, PromQL's own braces ({mode="idle"}) stay as they are."""
    for k, v in values.items():
        template = template.replace("{" + k + "}", v)
    return template


def collect_gpu_samples(
    client: PrometheusClient,
    catalog: Catalog,
    window: Window,
    *,
    node_labels: tuple[str, ...],
    experiment_label: str = "experiment",
    columns: list[str] | None = None,
) -> pa.Table:
    """gpu_samples rows for the window. `columns` limits which canonical metrics are fetched."""
    wanted = [m for m in catalog.gpu_metrics if columns is None or m.column in columns]
    parts: list[pa.Table] = []
    for metric in wanted:
        for priority, source in enumerate(metric.sources):
            query = fill(catalog.gpu_query, name=source.name, fresh=window.fresh)
            res = client.query_range(query, window.start, window.end, window.step, window.label)
            if res.labels:
                parts.append(_gpu_long(res, catalog, node_labels, metric.column, priority, source.scale))
    experiments = pod_experiments(client, catalog, window, experiment_label)
    return _pivot_gpu(parts, catalog, wanted, experiments, window.step)


def _gpu_long(
    res: RangeResult, catalog: Catalog, node_labels: tuple[str, ...], column: str, priority: int, scale: float
) -> pa.Table:
    """One row per point: the series' resolved labels, the canonical metric and the scaled value."""
    lab = catalog.labels
    per_series = {
        "node": [node_of(x, node_labels) for x in res.labels],
        "gpu": [_int_or_none(first_label(x, lab["gpu"])) for x in res.labels],
        "uuid": [first_label(x, lab["uuid"]) for x in res.labels],
        "model": [first_label(x, lab["model"]) for x in res.labels],
        "namespace": [first_label(x, lab["namespace"]) for x in res.labels],
        "pod": [first_label(x, lab["pod"]) for x in res.labels],
        "container": [first_label(x, lab["container"]) for x in res.labels],
    }
    idx = pa.array(res.series_of_point())
    cols = {k: pa.array(v).take(idx) for k, v in per_series.items()}
    n = res.n_points
    cols["ts_ms"] = pa.array(np.rint(res.ts * 1000).astype(np.int64))
    cols["metric"] = pa.array(np.full(n, column, dtype=object), pa.string())
    cols["priority"] = pa.array(np.full(n, priority, dtype=np.int32))
    cols["value"] = pa.array(res.values * scale)
    return pa.table(cols)


def _int_or_none(s: str) -> int | None:
    return int(s) if s.isdigit() else None


def _pivot_gpu(parts, catalog: Catalog, wanted, experiments: pa.Table, step: float) -> pa.Table:
    if not parts:
        return GPU_SAMPLES.schema.empty_table()
    long = pa.concat_tables(parts, promote_options="permissive")
    fetched = {m.column for m in wanted}
    metric_cols = []
    for m in catalog.gpu_metrics:
        # arg_min over the catalog's source order: the first-listed source wins when several report.
        expr = (
            f"arg_min(value, priority) FILTER (WHERE metric = '{m.column}')"
            if m.column in fetched
            else "NULL"
        )
        metric_cols.append((m.column, expr))
    pivot = ",\n      ".join(f"{expr} AS {col}" for col, expr in metric_cols)
    final = []
    for m in catalog.gpu_metrics:
        final.append(f"coalesce({m.column}, {m.otherwise}) AS {m.column}" if m.otherwise else m.column)
    con = duckdb.connect(":memory:")
    try:
        con.register("long", long)
        con.register("experiments", experiments)
        sql = f"""
        WITH wide AS (
          SELECT ts_ms, node, gpu, uuid,
            max(model) AS model, max(namespace) AS namespace, max(pod) AS pod, max(container) AS container,
            {pivot}
          FROM long GROUP BY ts_ms, node, gpu, uuid
        )
        SELECT epoch_ms(ts_ms) AS ts, w.node, w.gpu, w.uuid, w.model, w.namespace, w.pod, w.container,
          CASE WHEN w.pod = '' THEN '{UNATTRIBUTED}'
               ELSE coalesce(e.experiment, n.experiment, '{UNATTRIBUTED}') END AS experiment,
          {", ".join(final)},
          {float(step)}::DOUBLE AS step_seconds
        FROM wide w
        LEFT JOIN (SELECT * FROM experiments WHERE pod <> '') e ON e.namespace = w.namespace AND e.pod = w.pod
        LEFT JOIN (SELECT * FROM experiments WHERE pod = '') n ON n.namespace = w.namespace
        ORDER BY ts, w.node, w.gpu, w.uuid
        """
        table = con.execute(sql).to_arrow_table()
    finally:
        con.close()
    return table.select(GPU_SAMPLES.schema.names).cast(GPU_SAMPLES.schema)


def pod_experiments(client: PrometheusClient, catalog: Catalog, window: Window, label: str) -> pa.Table:
    """(namespace, pod, experiment) from kube_pod_labels; pod '' rows are namespace-level labels."""
    key = kube_label_name(label)
    lookback = f"{round(window.end - window.start + 300)}s"  # the window plus Prometheus's look-back
    rows: dict[tuple[str, str], str] = {}
    for metric, is_ns in ((catalog.kube["pod_labels"], False), (catalog.kube["namespace_labels"], True)):
        q = f'max by (namespace, pod, {key}) (last_over_time({metric}{{{key}!=""}}[{lookback}]))'
        for labels, _ in client.query(q, window.end, window.label):
            ns, pod = labels.get("namespace", ""), "" if is_ns else labels.get("pod", "")
            if ns and (pod or is_ns):
                rows[(ns, pod)] = labels[key]
    items = sorted(rows.items())
    return pa.table(
        {
            "namespace": pa.array([k[0] for k, _ in items], pa.string()),
            "pod": pa.array([k[1] for k, _ in items], pa.string()),
            "experiment": pa.array([v for _, v in items], pa.string()),
        }
    )


def round_significant(values: np.ndarray, digits: int) -> np.ndarray:
    """values rounded to `digits` significant digits; NaN, ±Inf and 0 unchanged."""
    with np.errstate(divide="ignore", invalid="ignore"):
        mag = np.floor(np.log10(np.abs(values)))
    scale = 10.0 ** (digits - 1 - np.where(np.isfinite(mag), mag, 0))
    return np.where(np.isfinite(values) & (values != 0), np.round(values * scale) / scale, values)


def collect_node_samples(
    client: PrometheusClient,
    catalog: Catalog,
    window: Window,
    *,
    node_labels: tuple[str, ...],
    gpu_counts: pa.Table | None = None,
) -> pa.Table:
    """node_samples rows. gpu_counts: (ts, node, gpus_reporting) from the same window's gpu_samples."""
    parts = []
    for metric in catalog.node_metrics:
        query = fill(metric.query, fresh=window.fresh, rate=window.rate)
        res = client.query_range(query, window.start, window.end, window.step, window.label)
        if not res.labels:
            continue
        nodes = pa.array([node_of(x, node_labels) for x in res.labels]).take(pa.array(res.series_of_point()))
        parts.append(
            pa.table(
                {
                    "ts_ms": pa.array(np.rint(res.ts * 1000).astype(np.int64)),
                    "node": nodes,
                    "metric": pa.array(np.full(res.n_points, metric.column, dtype=object), pa.string()),
                    "value": pa.array(
                        round_significant(res.values, metric.significant_digits)
                        if metric.significant_digits
                        else res.values
                    ),
                }
            )
        )
    types = node_instance_types(client, catalog, window)
    if gpu_counts is None:
        gpu_counts = pa.table(
            {
                "ts": pa.array([], GPU_SAMPLES.schema.field("ts").type),
                "node": pa.array([], pa.string()),
                "gpus_reporting": pa.array([], pa.int64()),
            }
        )
    long = (
        pa.concat_tables(parts)
        if parts
        else pa.table(
            {
                "ts_ms": pa.array([], pa.int64()),
                "node": pa.array([], pa.string()),
                "metric": pa.array([], pa.string()),
                "value": pa.array([], pa.float64()),
            }
        )
    )
    pivot = ", ".join(
        f"max(value) FILTER (WHERE metric = '{m.column}') AS {m.column}" for m in catalog.node_metrics
    )
    con = duckdb.connect(":memory:")
    try:
        con.register("long", long)
        con.register("types", types)
        con.register("gpus", gpu_counts)
        table = con.execute(
            f"""
            WITH wide AS (SELECT epoch_ms(ts_ms) AS ts, node, {pivot} FROM long GROUP BY ts_ms, node),
            g AS (SELECT ts, node, gpus_reporting FROM gpus)
            SELECT coalesce(w.ts, g.ts) AS ts, coalesce(w.node, g.node) AS node,
              coalesce(t.instance_type, '') AS instance_type,
              w.cpu_busy, w.mem_used_bytes, w.mem_total_bytes,
              w.net_tx_bytes_per_second, w.net_rx_bytes_per_second,
              coalesce(g.gpus_reporting, 0)::INTEGER AS gpus_reporting,
              coalesce(g.gpus_reporting, 0) > 0 AS gpu_node_up,
              {float(window.step)}::DOUBLE AS step_seconds
            FROM wide w FULL OUTER JOIN g ON w.ts = g.ts AND w.node = g.node
            LEFT JOIN types t ON t.node = coalesce(w.node, g.node)
            ORDER BY ts, node
            """
        ).to_arrow_table()
    finally:
        con.close()
    return table.select(NODE_SAMPLES.schema.names).cast(NODE_SAMPLES.schema)


def node_instance_types(client: PrometheusClient, catalog: Catalog, window: Window) -> pa.Table:
    key = catalog.kube["instance_type_label"]
    lookback = f"{round(window.end - window.start + 300)}s"
    q = f'max by (node, {key}) (last_over_time({catalog.kube["node_labels"]}{{{key}!=""}}[{lookback}]))'
    found = {
        labels["node"]: labels[key]
        for labels, _ in client.query(q, window.end, window.label)
        if labels.get("node")
    }
    return pa.table(
        {
            "node": pa.array(sorted(found), pa.string()),
            "instance_type": pa.array([found[n] for n in sorted(found)], pa.string()),
        }
    )
