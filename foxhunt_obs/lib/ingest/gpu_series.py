"""Prometheus GPU and node series -> canonical `gpu_samples` / `node_samples` rows.

Each source series is fetched column-wise (sources/prometheus.py), its labels resolved through the
metric catalog, its values scaled to the canonical unit, and the long result pivoted to one row per
GPU (or node) per step in DuckDB. Nothing here knows about the lake or Dagster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.ingest.metric_catalog import (
    TARGET_LABELS,
    Catalog,
    ScrapeTargets,
    first_label,
    kube_label_name,
    node_of,
)
from foxhunt_obs.lib.ingest.mig import slice_share
from foxhunt_obs.lib.names import UNATTRIBUTED
from foxhunt_obs.lib.schemas import GPU_SAMPLES, NODE_SAMPLES
from foxhunt_obs.lib.side_by_side import in_order
from foxhunt_obs.lib.sources.prometheus import PrometheusClient, RangeResult


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
    def lookback(self) -> str:
        """For instant queries at the window's end that must see every series of the window: the window
        plus Prometheus's 5-minute look-back."""
        return f"{round(self.end - self.start + 300)}s"

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
    exporter_containers: tuple[str, ...] = (),
    columns: list[str] | None = None,
    run_id_label: str = "",
) -> pa.Table:
    """gpu_samples rows for the window. `columns` limits which canonical metrics are fetched;
    `run_id_label`: a pod label carrying the MLflow run id (kube_pod_labels), '' for none."""
    return gather_gpu_samples(
        client,
        catalog,
        window,
        node_labels=node_labels,
        experiment_label=experiment_label,
        exporter_containers=exporter_containers,
        columns=columns,
        run_id_label=run_id_label,
    )()


def gather_gpu_samples(
    client: PrometheusClient,
    catalog: Catalog,
    window: Window,
    *,
    node_labels: tuple[str, ...],
    experiment_label: str = "experiment",
    exporter_containers: tuple[str, ...] = (),
    columns: list[str] | None = None,
    run_id_label: str = "",
) -> Callable[[], pa.Table]:
    """collect_gpu_samples in two parts: this downloads the window's answers, and the function it returns
    builds the rows from them (so an ingest builds one hour's rows while the next hour downloads, and the
    download's threads do little besides, measured 3 % quicker a day than placing the points as they came)."""
    wanted = [m for m in catalog.gpu_metrics if columns is None or m.column in columns]
    # Last-listed source first, so the first-listed one wins where several report.
    queries = [
        (metric, source, fill(catalog.gpu_query, name=source.name, fresh=window.fresh))
        for metric in wanted
        for source in reversed(metric.sources)
    ]
    # every query of the window side by side (the client's bound), taken in this order as they are done
    answers = in_order(
        [
            partial(scrape_target_pods, client, window),
            partial(gpu_containers, client, catalog, window),
            partial(node_names_by_ip, client, catalog, window),
            *(
                partial(client.query_range, query, window.start, window.end, window.step, window.label)
                for _, _, query in queries
            ),
            partial(pod_experiments, client, catalog, window, experiment_label),
            partial(pod_experiments, client, catalog, window, run_id_label) if run_id_label else lambda: None,
        ],
        client.queries_at_once,
        "prometheus-ingest",
    )
    got = list(answers)

    def build() -> pa.Table:
        targets = ScrapeTargets(got[0], frozenset(exporter_containers), got[1])
        grid = _Grid(window, got[2])
        for (metric, source, query), res in zip(queries, got[3:]):
            if res.labels:
                _require_identity(res, catalog, node_labels, query, window)
                grid.add(res, catalog, node_labels, targets, metric.column, source.scale, source.name)
        return grid.table(catalog, {m.column for m in wanted}, got[-2], got[-1])

    return build


class IngestError(InputError, ValueError):
    """Series that cannot be turned into rows; the message names the query and the partition."""


def _require_identity(
    res: RangeResult, catalog: Catalog, node_labels: tuple[str, ...], query: str, window: Window
) -> None:
    """Series without a node, gpu or UUID label cannot be told apart: merged, they would pass for one
    GPU's samples. Refuse them, naming the query (a recording rule or relabelling that dropped labels)."""
    lab = catalog.labels
    anonymous = [
        x for x in res.labels
        if not (node_of(x, node_labels) or first_label(x, lab["gpu"]) or first_label(x, lab["uuid"]))
    ]  # fmt: skip
    if anonymous:
        raise IngestError(
            f"{window.label or 'gpu_samples'}: {len(anonymous)} of {len(res.labels)} series of {query} carry "
            f"no node ({', '.join(node_labels)}), gpu or UUID label, so they cannot be told apart "
            f"(first: {anonymous[0]}); keep those labels in the scrape config"
        )


def scrape_target_pods(client: PrometheusClient, window: Window) -> frozenset[tuple[str, str, str, str]]:
    """(job, instance, namespace, pod) of every scrape target with a pod in the window, from `up`: the
    series Prometheus writes for each target with the target's own labels (catalog.ScrapeTargets)."""
    by = ", ".join((*TARGET_LABELS, "namespace", "pod"))
    q = f'max by ({by}) (last_over_time(up{{pod!=""}}[{window.lookback}]))'
    return frozenset(
        (x.get("job", ""), x.get("instance", ""), x.get("namespace", ""), x["pod"])
        for x, _ in client.query(q, window.end, window.label)
        if x.get("pod")
    )


def gpu_containers(
    client: PrometheusClient, catalog: Catalog, window: Window
) -> frozenset[tuple[str, str, str]]:
    """(namespace, pod, container) of every container given GPUs in the window, from kube-state-metrics'
    limits (catalog kube.gpu_limits): such a container holds the GPUs it reports on itself (ScrapeTargets).
    A limit seen up to kube.gpu_limits_lookback_s before the window's start counts, as in the recording
    rules (last_over_time over the same look-back)."""
    k = catalog.kube
    limits = f'{k["gpu_limits"]}{{resource=~"{k["gpu_resource_regex"]}"}}'
    lookback = f"{round(window.end - window.start) + int(k['gpu_limits_lookback_s'])}s"
    q = f"max by (namespace, pod, container) (last_over_time({limits}[{lookback}]) > 0)"
    return frozenset(
        (x.get("namespace", ""), x["pod"], x.get("container", ""))
        for x, _ in client.query(q, window.end, window.label)
        if x.get("pod")
    )


class _Grid:
    """Dense GPU x step arrays, one per canonical metric: series of the same GPU (a pod change starts
    a new series) land in the same row, so pivoting is array indexing, not a GROUP BY."""

    def __init__(self, window: Window, node_by_ip: dict[str, str] | None = None):
        self.window = window
        self.node_by_ip = node_by_ip or {}
        self.start_ms, self.step_ms = round(window.start * 1000), round(window.step * 1000)
        self.n_steps = max(0, -(-(round(window.end * 1000) - self.start_ms) // self.step_ms))
        # (node, gpu, uuid, MIG GPU instance id or None, vgpu) -> row: in MIG mode each slice is a row of its
        # own, and on a time-sliced GPU each pod's copy of the series (its replica, `vgpu`)
        self.gpus: dict[tuple[str, int | None, str, int | None, str], int] = {}
        self.profiles: dict[int, str] = {}  # row -> MIG profile ('' for a whole GPU)
        self.models: dict[int, str] = {}  # row -> GPU model (a slice's share depends on it)
        self.label_sets: dict[tuple[str, str, str, str], int] = {}  # (model, namespace, pod, container)
        self.sources: list[str] = []  # source names, indexed by the points' source id
        self.points: list[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]] = []

    def add(
        self,
        res: RangeResult,
        catalog: Catalog,
        node_labels: tuple[str, ...],
        targets: ScrapeTargets,
        column: str,
        scale: float,
        source: str,
    ):
        lab = catalog.labels
        gpu_of_series = np.empty(len(res.labels), np.int32)
        labels_of_series = np.empty(len(res.labels), np.int32)
        for i, x in enumerate(res.labels):
            node = node_of(x, node_labels)
            key = (
                self.node_by_ip.get(node, node),
                _int_or_none(first_label(x, lab["gpu"])),
                first_label(x, lab["uuid"]),
                _int_or_none(first_label(x, lab["gpu_instance"])),
                first_label(x, lab["vgpu"]),
            )
            row = gpu_of_series[i] = self.gpus.setdefault(key, len(self.gpus))
            names = (first_label(x, lab["model"]), *targets.holder(x, catalog))
            self.models.setdefault(row, names[0])
            if key[3] is not None:
                self.profiles.setdefault(row, first_label(x, lab["gpu_profile"]))
            labels_of_series[i] = self.label_sets.setdefault(names, len(self.label_sets))
        if source not in self.sources:
            self.sources.append(source)
        # Arrays of a day's points cost more to allocate than to compute on (first-touch page faults):
        # one array per quantity, arithmetic in place, no filtering copy when every point is in the window.
        counts = np.diff(res.offsets)
        step = np.rint(res.ts * 1000).astype(np.int64)
        step += self.step_ms // 2 - self.start_ms
        step //= self.step_ms
        ok = (step >= 0) & (step < self.n_steps)
        every = bool(ok.all())
        gpu, labels = np.repeat(gpu_of_series, counts), np.repeat(labels_of_series, counts)
        self.points.append(
            (
                column,
                gpu if every else gpu[ok],
                step if every else step[ok],
                (res.values if every else res.values[ok]) * scale,
                labels if every else labels[ok],
                self.sources.index(source),
            )
        )

    def table(
        self, catalog: Catalog, fetched: set[str], experiments: pa.Table, run_ids: pa.Table | None = None
    ) -> pa.Table:
        if not self.gpus:
            return GPU_SAMPLES.schema.empty_table()
        # Rows in (ts, node, gpu, uuid, gpu_instance, vgpu) order: GPUs sorted by key, cells step-major.
        # The grids are laid out in that order (cell = step * GPUs + rank of the GPU), so the rows are the
        # present cells in index order: one flatnonzero, then gathers that walk memory forwards.
        keys = list(self.gpus)
        order = np.array(
            sorted(
                range(len(keys)),
                key=lambda i: (
                    keys[i][0],
                    _sortable(keys[i][1]),
                    keys[i][2],
                    _sortable(keys[i][3]),
                    keys[i][4],
                ),
            )
        )
        order = order.astype(np.int32)
        n_gpus = len(keys)
        rank = np.empty(n_gpus, np.int64)
        rank[order] = np.arange(n_gpus)
        size = n_gpus * self.n_steps
        values = {c: np.full(size, np.nan) for c in fetched}
        present = {c: np.zeros(size, bool) for c in fetched}
        # which source gave a value: kept only for the columns a basis column names
        sourced = {c for m in catalog.gpu_metrics if m.basis_column for c in (m.column, m.otherwise) if c}
        source_of = {c: np.full(size, -1, np.int32) for c in fetched & sourced}
        label_set = np.full(size, -1, np.int32)
        for column, g, k, v, lab, src in self.points:
            cell = k * n_gpus
            cell += rank[g]
            values[column][cell] = v
            present[column][cell] = True
            if column in source_of:
                source_of[column][cell] = src
            label_set[cell] = lab
        any_present = np.logical_or.reduce([present[c] for c in fetched])
        dense = bool(any_present.all())  # every GPU at every step (the usual case): the grids are the columns
        if dense:
            k, g = np.repeat(np.arange(self.n_steps), n_gpus), np.tile(order, self.n_steps)
        else:
            cell = np.flatnonzero(any_present)
            k, r = np.divmod(cell, n_gpus)
            g = order[r]

        def pick(grid: np.ndarray) -> np.ndarray:
            return grid if dense else grid[cell]

        def source_ids(column: str) -> np.ndarray:
            """Per row, the id (in self.sources) of the source that gave `column`; -1 where none did."""
            return pick(source_of[column]) if column in source_of else np.full(len(k), -1, np.int32)

        names = list(self.label_sets)
        gpu_rows = g
        label_rows = pick(label_set)
        ts = k * self.step_ms
        ts += self.start_ms
        cols: dict[str, pa.Array] = {
            "ts": pa.array(ts, pa.timestamp("ms", tz="UTC")),
            "node": _labels(gpu_rows, [key[0] for key in keys]),
            "gpu": pa.array([key[1] for key in keys], pa.int32()).take(pa.array(gpu_rows)),
            "uuid": _labels(gpu_rows, [key[2] for key in keys]),
            "gpu_instance": pa.array([key[3] for key in keys], pa.int32()).take(pa.array(gpu_rows)),
            "gpu_profile": _labels(gpu_rows, [self.profiles.get(i, "") for i in range(len(keys))]),
        }
        shares = [
            slice_share(self.profiles[i], self.models.get(i, "")) if keys[i][3] is not None else 1.0
            for i in range(len(keys))
        ]
        cols["gpu_share"] = pa.array(np.array(shares)[gpu_rows])
        cols["vgpu"] = _labels(gpu_rows, [key[4] for key in keys])
        for j, name in enumerate(("model", "namespace", "pod", "container")):
            cols[name] = _labels(label_rows, [n[j] for n in names])
        cols["experiment"] = _labels(label_rows, _experiments_of(names, experiments))
        no_runs = [""] * len(names)
        run_of = no_runs if run_ids is None else _experiments_of(names, run_ids, "", namespace_fallback=False)
        cols["run_id"] = _labels(label_rows, run_of)
        for m in catalog.gpu_metrics:
            if m.column in fetched:
                cols[m.column] = pa.array(pick(values[m.column]), mask=~pick(present[m.column]))
            else:
                cols[m.column] = pa.nulls(len(k), pa.float64())
        cols["step_seconds"] = pa.array(np.full(len(k), self.window.step))
        for m in catalog.gpu_metrics:  # e.g. total memory = used + free where the exporter has no total
            # a sum with a null term is null, and coalescing with all nulls changes nothing: skip that work
            if m.otherwise_sum_of and not any(_all_null(cols[c]) for c in m.otherwise_sum_of):
                total = cols[m.otherwise_sum_of[0]]
                for other in m.otherwise_sum_of[1:]:
                    total = pc.add(total, cols[other])
                for extra in m.plus_if_present:
                    total = pc.add(total, pc.coalesce(cols[extra], 0.0))
                cols[m.column] = pc.coalesce(cols[m.column], total)
        for m in catalog.gpu_metrics:  # e.g. a MIG slice's util from GR_ENGINE_ACTIVE, with its basis named
            if not m.basis_column:
                continue
            src = source_ids(m.column)
            if m.otherwise:
                fallback = source_ids(m.otherwise)
                src = np.where(src >= 0, src, fallback)
                if not _all_null(cols[m.otherwise]):
                    cols[m.column] = pc.coalesce(cols[m.column], cols[m.otherwise])
            cols[m.basis_column] = _labels(src + 1, ["", *self.sources])
        held = np.array([bool(n[2]) for n in names], bool)[label_rows] if names else np.zeros(len(k), bool)
        devices: dict[tuple, int] = {}  # a GPU or slice, whatever copies (vgpu) of its series there are
        device = np.array([devices.setdefault(key[:4], len(devices)) for key in keys])
        cols["step_share"], util = time_slices(device[gpu_rows], k, held, cols["util"])
        cols["util"] = util
        table = pa.table(cols)
        return table.select(GPU_SAMPLES.schema.names).cast(GPU_SAMPLES.schema)


def _all_null(column: pa.Array) -> bool:
    return column.null_count == len(column) > 0


def _sortable(v: int | None) -> int:
    return -1 if v is None else v


def _labels(rows: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    """values[rows] as a dictionary array with a sorted, duplicate-free dictionary: the same rows
    always give the same bytes, however the series happened to arrive."""
    uniq, inverse = np.unique(np.array(values, dtype=object), return_inverse=True)
    # one value (no pod, no MIG profile, no run id): all-zero indices, allocated untouched (calloc)
    codes = np.zeros(len(rows), np.int32) if len(uniq) == 1 else inverse.astype(np.int32)[rows]
    return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(uniq, pa.string()))


def _int_or_none(s: str) -> int | None:
    return int(s) if s.isdigit() else None


def _experiments_of(
    label_sets: list[tuple[str, str, str, str]],
    experiments: pa.Table,
    default: str = UNATTRIBUTED,
    namespace_fallback: bool = True,
) -> list[str]:
    """Experiment of each (model, namespace, pod, container): the pod's label, else the namespace's."""
    by_pod = {
        (ns, pod): e
        for ns, pod, e in zip(*(experiments.column(c).to_pylist() for c in experiments.column_names))
    }
    out = []
    for _, ns, pod, _ in label_sets:
        found = (
            (by_pod.get((ns, pod)) or (by_pod.get((ns, "")) if namespace_fallback else None)) if pod else None
        )
        out.append(found or default)
    return out


def time_slices(
    device: np.ndarray, step: np.ndarray, held: np.ndarray, util: pa.Array
) -> tuple[pa.Array, pa.Array]:
    """Each row's share of its step, and util as the split counts it. A time-sliced GPU (several pods'
    copies of its series at one step) is split evenly over the k pods present: 1/k each. Its device-level
    row (no pod) then stands for nothing (share 0); alone, a GPU's rows share the step between them.
    Where the device row is there beside the pods' (dcgm-exporter's per-process GPU_UTIL), each pod's
    activity is the device's util, split like its cost: per-process util does not move dollars."""
    n = len(step)
    if n == 0:
        return pa.array(np.ones(0)), util
    width = int(step.max()) + 1
    inv = device.astype(np.int64) * width + step
    if (int(device.max()) + 1) * width > 4 * n + 1024:  # sparse cells: number them densely (a sort)
        _, inv = np.unique(inv, return_inverse=True)
    if np.bincount(inv).max() == 1:  # one row per GPU and step: the usual case, nothing to split
        return pa.array(np.ones(n)), util
    n_held = np.bincount(inv, weights=held)[inv]
    n_free = np.bincount(inv, weights=~held)[inv]
    share = np.where(held, 1 / np.maximum(n_held, 1), np.where(n_held == 0, 1 / np.maximum(n_free, 1), 0.0))
    u = util.to_numpy(zero_copy_only=False).astype(float)
    known = ~held & ~np.isnan(u)
    free_n = np.bincount(inv, weights=known)
    device_u = np.bincount(inv, weights=np.where(known, u, 0.0)) / np.maximum(free_n, 1)
    replace = held & (free_n[inv] > 0)
    nulls = util.is_null().to_numpy(zero_copy_only=False) & ~replace
    return pa.array(share), pa.array(np.where(replace, device_u[inv], u), mask=nulls)


def pod_experiments(client: PrometheusClient, catalog: Catalog, window: Window, label: str) -> pa.Table:
    """(namespace, pod, experiment) from kube_pod_labels; pod '' rows are namespace-level labels."""
    key = kube_label_name(label)
    rows: dict[tuple[str, str], str] = {}
    for metric, is_ns in ((catalog.kube["pod_labels"], False), (catalog.kube["namespace_labels"], True)):
        q = f'max by (namespace, pod, {key}) (last_over_time({metric}{{{key}!=""}}[{window.lookback}]))'
        # a pod with two values in the look-back (relabelled, or a reused name): the greatest, on every run
        answer = sorted(client.query(q, window.end, window.label), key=lambda r: r[0].get(key, ""))
        for labels, _ in answer:
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
    queries = [
        (metric, fill(metric.query, fresh=window.fresh, rate=window.rate)) for metric in catalog.node_metrics
    ]
    answers = in_order(
        [
            partial(node_names_by_ip, client, catalog, window),
            *(
                partial(client.query_range, query, window.start, window.end, window.step, window.label)
                for _, query in queries
            ),
            partial(node_instance_types, client, catalog, window),
            partial(node_instance_ids, client, catalog, window),
        ],
        client.queries_at_once,
        "prometheus-ingest",
    )
    parts = []
    by_ip = next(answers)
    for metric, _ in queries:
        res = next(answers)
        if not res.labels:
            continue
        names = [node_of(x, node_labels) for x in res.labels]
        nodes = pa.array([by_ip.get(n, n) for n in names]).take(pa.array(res.series_of_point()))
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
    types, ids = next(answers), next(answers)
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
    with scratch(long=long, types=types, gpus=gpu_counts, ids=ids) as con:
        table = con.execute(
            f"""
            WITH wide AS (SELECT epoch_ms(ts_ms) AS ts, node, {pivot} FROM long GROUP BY ts_ms, node),
            g AS (SELECT ts, node, gpus_reporting FROM gpus),
            i AS (  -- per (step, node): the instance whose kube_node_info sample is the newest
              SELECT epoch_ms(ts_ms) AS ts, node, arg_max(instance_id, (seen_ms, instance_id)) AS instance_id
              FROM ids GROUP BY ts_ms, node)
            SELECT coalesce(w.ts, g.ts) AS ts, coalesce(w.node, g.node) AS node,
              coalesce(t.instance_type, '') AS instance_type,
              coalesce(i.instance_id, '') AS instance_id,
              w.cpu_busy, w.mem_used_bytes, w.mem_total_bytes,
              w.net_tx_bytes_per_second, w.net_rx_bytes_per_second,
              coalesce(g.gpus_reporting, 0)::INTEGER AS gpus_reporting,
              coalesce(g.gpus_reporting, 0) > 0 AS gpu_node_up,
              {float(window.step)}::DOUBLE AS step_seconds
            FROM wide w FULL OUTER JOIN g ON w.ts = g.ts AND w.node = g.node
            LEFT JOIN types t ON t.node = coalesce(w.node, g.node)
            LEFT JOIN i ON i.ts = coalesce(w.ts, g.ts) AND i.node = coalesce(w.node, g.node)
            ORDER BY ts, node
            """
        ).to_arrow_table()
    return table.select(NODE_SAMPLES.schema.names).cast(NODE_SAMPLES.schema)


def node_instance_types(client: PrometheusClient, catalog: Catalog, window: Window) -> pa.Table:
    key = catalog.kube["instance_type_label"]
    q = f'max by (node, {key}) (last_over_time({catalog.kube["node_labels"]}{{{key}!=""}}[{window.lookback}]))'
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


def node_names_by_ip(client: PrometheusClient, catalog: Catalog, window: Window) -> dict[str, str]:
    """internal IP -> Kubernetes node name, from kube_node_info: a series whose node resolved to an
    address (node_exporter scraped by IP, `instance="10.0.1.23:9100"`) is put on the node so named, so
    node_samples and gpu_samples agree. An IP two nodes claimed in the window maps to neither."""
    key = catalog.kube["internal_ip_label"]
    q = f'max by (node, {key}) (last_over_time({catalog.kube["node_info"]}{{{key}!=""}}[{window.lookback}]))'
    seen: dict[str, set[str]] = {}
    for labels, _ in client.query(q, window.end, window.label):
        if labels.get("node") and labels.get(key):
            seen.setdefault(labels[key], set()).add(labels["node"])
    return {ip: next(iter(nodes)) for ip, nodes in seen.items() if len(nodes) == 1}


def instance_id_of(provider_id: str) -> str:
    """The cloud's id of a node's machine: the last path component of its Kubernetes providerID.

    ``aws:///us-east-1a/i-0123456789abcdef0`` -> ``i-0123456789abcdef0`` (the EC2 instance id, CUR's
    line_item_resource_id); ``gce://project/zone/name`` -> ``name``; '' when empty."""
    return provider_id.strip().rstrip("/").rpartition("/")[2]


def node_instance_ids(client: PrometheusClient, catalog: Catalog, window: Window) -> pa.Table:
    """(ts_ms, node, instance_id, seen_ms): every kube_node_info series visible at each step of the
    window, with the time of its newest sample. One range query; an instance replaced under the same
    node name is a new series, so a step may see both (the old one within Prometheus's look-back):
    the newest sample tells which instance the node is at that step."""
    key = catalog.kube["provider_id_label"]
    q = f'max by (node, {key}) (timestamp({catalog.kube["node_info"]}{{{key}!=""}}))'
    res = client.query_range(q, window.start, window.end, window.step, window.label)
    series = pa.array(res.series_of_point())
    nodes = [x.get("node", "") for x in res.labels]
    iids = [instance_id_of(x.get(key, "")) for x in res.labels]
    table = pa.table(
        {
            "ts_ms": pa.array(np.rint(res.ts * 1000).astype(np.int64)),
            "node": pa.array(nodes, pa.string()).take(series),
            "instance_id": pa.array(iids, pa.string()).take(series),
            "seen_ms": pa.array(np.rint(res.values * 1000).astype(np.int64)),
        }
    )
    return table.filter(pc.and_(pc.not_equal(table["node"], ""), pc.not_equal(table["instance_id"], "")))


def missing_core_columns(table: pa.Table, catalog: Catalog) -> dict[str, dict]:
    """Core columns (catalog `core: true`) that some reporting GPU has no value for in the whole table:
    column -> {gpus: how many GPUs (slices) lack it, of how many, looked_for: the source names tried}.

    An exporter whose counters file leaves util or power out must not pass for a 100 %-idle or
    zero-watt GPU: the asset check fails and names what it looked for."""
    if not table.num_rows:
        return {}
    keys = ["node", "gpu", "uuid", "gpu_instance"]
    core = [m for m in catalog.gpu_metrics if m.core]
    # per GPU (slice): whether any sample has a value (NULL and NaN are none); Arrow's group-by, as this
    # runs for every hour ingested (a DuckDB connection per hour cost more than the work)
    has = {m.column: pc.invert(pc.fill_null(pc.is_nan(table.column(m.column)), True)) for m in core}
    # chunks with dictionaries of their own (a concatenated table) must share one to be grouped
    labels = table.select(keys).unify_dictionaries()
    per_gpu = (
        pa.table({**{k: labels.column(k) for k in keys}, **has})
        .group_by(keys)
        .aggregate([(column, "any") for column in has])
    )
    out = {}
    for m in core:
        lacking = per_gpu.num_rows - pc.sum(per_gpu.column(f"{m.column}_any").cast(pa.int64())).as_py()
        if lacking:
            names = [s.name for s in m.sources]
            if m.otherwise:
                names += [s.name for s in catalog.gpu_metric(m.otherwise).sources]
            out[m.column] = {"gpus": lacking, "of": per_gpu.num_rows, "looked_for": names}
    return out
