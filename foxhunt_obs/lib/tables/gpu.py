"""The Prometheus ingest tables, one function each: gpu_samples (with its four checks) and node_samples.
Each hour of `hours` is collected, guarded against replacing good rows with fewer, and written; gpu_samples
downloads the next hour while it builds this hour's rows from their downloaded points, writes them with their
parts of gpu_hourly (gpu_hour_parts.py) and adds them to the run's checks (RunTally). It keeps no hour's
table after that: a run's memory is that of two hours, not of every hour it wrote."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from datetime import datetime, timedelta

import pandas as pd
import pyarrow as pa

from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.ingest.gpu_series import (
    Window,
    collect_node_samples,
    gather_gpu_samples,
    missing_core_columns,
)
from foxhunt_obs.lib.ingest.metric_catalog import Catalog
from foxhunt_obs.lib.lake import Lake, shrink_reason
from foxhunt_obs.lib.schemas import GPU_SAMPLES, NODE_SAMPLES, TableSpec
from foxhunt_obs.lib.settings import ClusterSettings
from foxhunt_obs.lib.side_by_side import one_ahead
from foxhunt_obs.lib.sources.prometheus import PrometheusClient
from foxhunt_obs.lib.tables import Built, Check, LakePath, Markdown, MissingInput, md_table
from foxhunt_obs.lib.tables.gpu_hour_parts import write_gpu_samples


class FewerRows(InputError, ValueError):
    """The source answered with far fewer GPUs or nodes than the partition has: not replaced."""


def hour_window(hour: datetime, step: float, what: str) -> Window:
    return Window(hour.timestamp(), (hour + timedelta(hours=1)).timestamp(), step, what)


def guard_fewer_rows(
    lake: Lake, spec: TableSpec, key: str, table: pa.Table, keys: list[str], allow_fewer_rows: bool
) -> None:
    if allow_fewer_rows:
        return
    why = shrink_reason(lake.read_partition(spec, key, columns=keys), table, keys)
    if why:
        raise FewerRows(
            f"{spec.name} partition {key}: {why}: not replacing it (retention passed, or "
            "the wrong Prometheus?). To replace it anyway, run with config allow_fewer_rows: true."
        )


def gpu_samples(
    lake: Lake,
    client: PrometheusClient,
    catalog: Catalog,
    settings: ClusterSettings,
    hours: Sequence[datetime],
    allow_fewer_rows: bool = False,
) -> Built:
    missing: dict[str, dict] = {}
    log: list[tuple[str, str]] = []
    tally = RunTally()

    def gather(hour: datetime) -> Callable[[], pa.Table]:
        return gather_gpu_samples(
            client,
            catalog,
            hour_window(hour, settings.scrape_step_s, f"gpu_samples partition {GPU_SAMPLES.key(hour)}"),
            node_labels=settings.node_labels,
            experiment_label=settings.experiment_label,
            exporter_containers=settings.exporter_containers,
            run_id_label=settings.run_id_label,
        )

    # the next hour is downloaded while this one is checked and written
    with scratch() as con:
        for hour, build in one_ahead(hours, gather, "gpu_samples-next-hour"):
            key = GPU_SAMPLES.key(hour)
            table = build()  # here, while the next hour downloads
            guard_fewer_rows(lake, GPU_SAMPLES, key, table, ["uuid", "gpu_instance"], allow_fewer_rows)
            write_gpu_samples(lake, hour, table, con)  # with the parts gpu_hourly reads
            tally.add(key, table, con)
            log.append(("info", f"gpu_samples {key}: {table.num_rows} rows"))
            for column, gap in missing_core_columns(table, catalog).items():
                log.append(
                    (
                        "warning",
                        f"gpu_samples {key}: {gap['gpus']} of {gap['of']} GPUs have no {column}; "
                        f"looked for {', '.join(gap['looked_for'])}",
                    )
                )
                missing.setdefault(column, {**gap, "partitions": []})["partitions"].append(key)
            del table  # not held while the next hour's rows are built
    summary = {**_gpu_summary(tally, lake.root), "missing_core_columns": missing}
    core = Check(
        "core_columns_reported",
        not missing,
        {
            "missing": Markdown(
                "\n".join(
                    f"- `{c}`: {g['gpus']} of {g['of']} GPUs in {', '.join(g['partitions'])}; "
                    f"looked for {', '.join(f'`{n}`' for n in g['looked_for'])}"
                    for c, g in missing.items()
                )
                or "none"
            )
        },
    )
    checks = [core, *gpu_checks(tally, lake, allow_fewer_rows)]
    return Built({}, summary, checks, extra={"log": log}, counts=dict(tally.counts))


_HOUR_FIGURES = """
SELECT min(ts), max(ts),
  -- NaN is a missing reading, not an out-of-range one (DuckDB orders NaN above every number)
  count(*) FILTER (WHERE NOT isnan(util) AND (util < 0 OR util > 1)),
  count(*) FILTER (WHERE NOT isnan(temp_celsius) AND (temp_celsius < -20 OR temp_celsius > 130)),
  count(*) FILTER (WHERE isnan(util)),
  (SELECT count(*) FROM (SELECT uuid, gpu_instance, vgpu, ts FROM t GROUP BY ALL HAVING count(*) > 1))
FROM t
"""
_HOUR_EXPERIMENTS = """
SELECT experiment, list(DISTINCT uuid) FILTER (WHERE uuid IS NOT NULL), sum(util), count(util),
  sum(util * step_seconds * step_share * gpu_share), count(util * step_seconds * step_share * gpu_share)
FROM t GROUP BY experiment
"""


class RunTally:
    """The run's checks and summary, summed partition by partition as each is written (while the next one
    downloads), not over the whole run after its last: every figure is a count, a sum, an extreme or a
    set, and a duplicate (uuid, gpu_instance, vgpu, ts) lies within one hour's partition."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}  # partition -> rows, in the order written
        self.t0 = self.t1 = None
        self.util_out_of_range = self.temperature_out_of_range = self.util_nan = self.duplicate_keys = 0
        self.uuids: set[str] = set()
        self.nodes: set[str] = set()
        # experiment -> [GPU uuids, util sum, util count, util x GPU-seconds sum, its count]
        self.experiments: dict[str | None, list] = {}
        self.preview: list[pd.DataFrame] = []  # the run's first rows, in order

    @property
    def rows(self) -> int:
        return sum(self.counts.values())

    @staticmethod
    def of(tables: dict[str, pa.Table]) -> RunTally:
        tally = RunTally()
        for key, table in tables.items():
            tally.add(key, table)
        return tally

    def add(self, key: str, table: pa.Table, con=None) -> None:
        self.counts[key] = table.num_rows
        if not table.num_rows:
            return
        with nullcontext(con) if con is not None else scratch() as db:
            db.register("t", table)
            try:
                t0, t1, bad_util, bad_temp, nan_util, dupes = db.execute(_HOUR_FIGURES).fetchone()
                for exp, uuids, util_sum, util_n, active, active_n in db.execute(
                    _HOUR_EXPERIMENTS
                ).fetchall():
                    tally = self.experiments.setdefault(exp, [set(), 0.0, 0, 0.0, 0])
                    tally[0].update(uuids)
                    self.uuids.update(uuids)
                    tally[1] += util_sum or 0.0
                    tally[2] += util_n
                    tally[3] += active or 0.0
                    tally[4] += active_n
                if (wanted := _PREVIEW_ROWS - sum(len(p) for p in self.preview)) > 0:
                    self.preview.append(db.execute(f"SELECT {_PREVIEW} FROM t LIMIT {wanted}").fetch_df())
            finally:
                db.unregister("t")
        self.t0 = t0 if self.t0 is None else min(self.t0, t0)
        self.t1 = t1 if self.t1 is None else max(self.t1, t1)
        self.util_out_of_range += bad_util
        self.temperature_out_of_range += bad_temp
        self.util_nan += nan_util
        self.duplicate_keys += dupes
        self.nodes.update(v for v in table.column("node").unique().to_pylist() if v is not None)


_PREVIEW_ROWS = 8
_PREVIEW = "ts, node, gpu, gpu_instance, pod, experiment, util, util_basis, mem_used_bytes, power_watts"


def _gpu_summary(tally: RunTally, root: str) -> dict:
    per_exp = pd.DataFrame(
        [
            {
                "experiment": exp,
                "gpus": len(uuids),
                # avg(util) as SQL has it: NULLs left out, a NaN makes it NaN
                "mean_util": round(util_sum / util_n, 3) if util_n else None,
                "active_gpu_hours": round(active / 3600, 2) if active_n else None,
            }
            for exp, (uuids, util_sum, util_n, active, active_n) in sorted(
                tally.experiments.items(), key=lambda kv: (kv[0] is None, kv[0] or "")
            )
        ],
        columns=["experiment", "gpus", "mean_util", "active_gpu_hours"],
    )
    return {
        "dagster/row_count": tally.rows,
        "partitions": ", ".join(tally.counts),
        "time_range": f"{tally.t0} .. {tally.t1}" if tally.rows else "empty",
        "gpus": len(tally.uuids),
        "nodes": len(tally.nodes),
        "experiments": md_table(per_exp, floatfmt=None),
        "preview": md_table(
            pd.concat(tally.preview, ignore_index=True) if tally.preview else pd.DataFrame(),
            empty="empty",
            floatfmt=None,
        ),
        "lake": LakePath(f"{root}/{GPU_SAMPLES.name}"),
    }


def gpu_checks(tally: RunTally, lake: Lake, allow_fewer_rows: bool = False) -> list[Check]:
    """values_in_range, unique_uuid_ts and not_empty_after_gpus over the run's partitions, from their
    figures summed as they were written (`tally`)."""
    empty_after_gpus = []
    for key, rows in tally.counts.items():
        if rows:
            continue
        prev_key = GPU_SAMPLES.key(datetime.strptime(key, "%Y-%m-%dT%H") - timedelta(hours=1))
        prev = tally.counts.get(prev_key)
        if prev is None:  # the hour before is not of this run: as the lake has it
            table = lake.read_partition(GPU_SAMPLES, prev_key, columns=["uuid"])
            prev = table.num_rows if table is not None else 0
        if prev:
            empty_after_gpus.append(key)
    bad = (tally.util_out_of_range, tally.temperature_out_of_range)
    return [
        Check(
            "values_in_range",
            sum(bad) == 0,
            {"util_out_of_range": bad[0], "temperature_out_of_range": bad[1], "util_nan": tally.util_nan},
        ),
        Check("unique_uuid_ts", tally.duplicate_keys == 0, {"duplicate_keys": tally.duplicate_keys}),
        Check(
            "not_empty_after_gpus",
            not empty_after_gpus,
            {
                "empty_hours_after_gpus": ", ".join(empty_after_gpus) or "none",
                "allow_fewer_rows": allow_fewer_rows,
            },
            # an empty hour reads downstream as a cluster without GPUs: loud, unless the run said it may be
            severity="WARN" if allow_fewer_rows else "ERROR",
        ),
    ]


def node_samples(
    lake: Lake,
    client: PrometheusClient,
    catalog: Catalog,
    settings: ClusterSettings,
    hours: Sequence[datetime],
    allow_fewer_rows: bool = False,
) -> Built:
    tables: dict[str, pa.Table] = {}
    for hour in hours:
        key = NODE_SAMPLES.key(hour)
        gpus = lake.read_partition(GPU_SAMPLES, key)
        if gpus is None:
            raise MissingInput(
                f"node_samples partition {key}: gpu_samples {key} is not in the lake at {lake.root}"
            )
        with scratch(g=gpus) as con:
            counts = con.execute(
                "SELECT ts, node, count(DISTINCT uuid) AS gpus_reporting FROM g GROUP BY ALL"
            ).to_arrow_table()
        table = collect_node_samples(
            client,
            catalog,
            hour_window(hour, settings.scrape_step_s, f"node_samples partition {key}"),
            node_labels=settings.node_labels,
            gpu_counts=counts,
        )
        guard_fewer_rows(lake, NODE_SAMPLES, key, table, ["node"], allow_fewer_rows)
        lake.write_partition(NODE_SAMPLES, key, table)
        tables[key] = table
    with scratch(t=pa.concat_tables(tables.values())) as con:
        rows, t0, t1, down = con.execute(
            "SELECT count(*), min(ts), max(ts), count(*) FILTER (WHERE NOT gpu_node_up) FROM t"
        ).fetchone()
        per_node = con.execute(
            """SELECT node, any_value(instance_type) AS instance_type, count(*) AS steps,
                      round(avg(cpu_busy), 3) AS cpu_busy, round(max(mem_used_bytes) / 2^30, 1) AS mem_used_max_gib,
                      max(gpus_reporting) AS gpus
               FROM t GROUP BY node ORDER BY node"""
        ).fetch_df()
    summary = {
        "dagster/row_count": int(rows),
        "partitions": ", ".join(tables),
        "time_range": f"{t0} .. {t1}" if rows else "empty",
        "rows_without_gpus": int(down),
        "nodes": md_table(per_node, floatfmt=None),
    }
    return Built(tables, summary)
