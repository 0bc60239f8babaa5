"""The Prometheus ingest tables, one function each: gpu_samples (with its four checks) and node_samples.
Each hour of `hours` is collected, guarded against replacing good rows with fewer, and written; gpu_samples
downloads the next hour meanwhile, and writes each hour with its parts of gpu_hourly (gpu_hour_parts.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import pyarrow as pa

from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.ingest.gpu_series import (
    Window,
    collect_gpu_samples,
    collect_node_samples,
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


class FewerRows(ValueError):
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
    tables: dict[str, pa.Table] = {}
    missing: dict[str, dict] = {}
    log: list[tuple[str, str]] = []

    def collect(hour: datetime) -> pa.Table:
        return collect_gpu_samples(
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
        for hour, table in one_ahead(hours, collect, "gpu_samples-next-hour"):
            key = GPU_SAMPLES.key(hour)
            guard_fewer_rows(lake, GPU_SAMPLES, key, table, ["uuid", "gpu_instance"], allow_fewer_rows)
            write_gpu_samples(lake, hour, table, con)  # with the parts gpu_hourly reads
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
            tables[key] = table
    summary = {**_gpu_summary(tables, lake.root), "missing_core_columns": missing}
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
    return Built(tables, summary, [core, *gpu_checks(tables, lake, allow_fewer_rows)], extra={"log": log})


def _gpu_summary(tables: dict[str, pa.Table], root: str) -> dict:
    with scratch(t=pa.concat_tables(tables.values())) as con:
        rows, t0, t1, gpus, nodes = con.execute(
            "SELECT count(*), min(ts), max(ts), count(DISTINCT uuid), count(DISTINCT node) FROM t"
        ).fetchone()
        per_exp = con.execute(
            """SELECT experiment, count(DISTINCT uuid) AS gpus, round(avg(util), 3) AS mean_util,
                      round(sum(util * step_seconds * step_share * gpu_share) / 3600, 2) AS active_gpu_hours
               FROM t GROUP BY experiment ORDER BY experiment"""
        ).fetch_df()
        preview = con.execute(
            "SELECT ts, node, gpu, gpu_instance, pod, experiment, util, util_basis, mem_used_bytes, power_watts "
            "FROM t LIMIT 8"
        ).fetch_df()
    return {
        "dagster/row_count": int(rows),
        "partitions": ", ".join(tables),
        "time_range": f"{t0} .. {t1}" if rows else "empty",
        "gpus": int(gpus),
        "nodes": int(nodes),
        "experiments": md_table(per_exp, floatfmt=None),
        "preview": md_table(preview, empty="empty", floatfmt=None),
        "lake": LakePath(f"{root}/{GPU_SAMPLES.name}"),
    }


def gpu_checks(tables: dict[str, pa.Table], lake: Lake, allow_fewer_rows: bool = False) -> list[Check]:
    """values_in_range, unique_uuid_ts and not_empty_after_gpus over the run's partitions."""
    with scratch(t=pa.concat_tables(tables.values())) as con:
        # NaN is a missing reading, not an out-of-range one (DuckDB orders NaN above every number).
        bad = con.execute(
            """SELECT count(*) FILTER (WHERE NOT isnan(util) AND (util < 0 OR util > 1)),
                      count(*) FILTER (WHERE NOT isnan(temp_celsius) AND (temp_celsius < -20 OR temp_celsius > 130)),
                      count(*) FILTER (WHERE isnan(util)) FROM t"""
        ).fetchone()
        dupes = con.execute(
            "SELECT count(*) FROM (SELECT uuid, gpu_instance, vgpu, ts FROM t GROUP BY ALL HAVING count(*) > 1)"
        ).fetchone()[0]
    empty_after_gpus = []
    for key, table in tables.items():
        if table.num_rows:
            continue
        prev_key = GPU_SAMPLES.key(datetime.strptime(key, "%Y-%m-%dT%H") - timedelta(hours=1))
        prev = tables.get(prev_key) or lake.read_partition(GPU_SAMPLES, prev_key)
        if prev is not None and prev.num_rows:
            empty_after_gpus.append(key)
    return [
        Check(
            "values_in_range",
            bad[0] + bad[1] == 0,
            {"util_out_of_range": bad[0], "temperature_out_of_range": bad[1], "util_nan": bad[2]},
        ),
        Check("unique_uuid_ts", dupes == 0, {"duplicate_keys": dupes}),
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
