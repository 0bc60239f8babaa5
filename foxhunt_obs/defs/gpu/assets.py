"""GPU and node series from Prometheus into the lake, and their hourly roll-up."""

from datetime import datetime, timedelta

import dagster as dg
import duckdb
import pyarrow as pa

from foxhunt_obs import assetkit
from foxhunt_obs.defs.failures import failure
from foxhunt_obs.defs.partitions import DAILY, HOURLY, days_of, hours_of
from foxhunt_obs.defs.resources import LakeResource, PrometheusResource
from foxhunt_obs.lib.analysis.catalog import load_catalog
from foxhunt_obs.lib.analysis.gpu_hourly import hour_key
from foxhunt_obs.lib.analysis.gpu_series import (
    IngestError,
    Window,
    collect_gpu_samples,
    collect_node_samples,
    missing_core_columns,
)
from foxhunt_obs.lib.analysis.mig import MigError
from foxhunt_obs.lib.lake import LakeError, shrink_reason
from foxhunt_obs.lib.schemas import GPU_SAMPLES, NODE_SAMPLES
from foxhunt_obs.lib.settings import Settings
from foxhunt_obs.lib.sources.prometheus import PrometheusError
from foxhunt_obs.lib.tables import daily as tables

GPU_SAMPLES_CHECKS = [
    dg.AssetCheckSpec(
        "values_in_range", asset="gpu_samples", description="util in 0-1, temperature -20..130 °C"
    ),
    dg.AssetCheckSpec(
        "unique_uuid_ts",
        asset="gpu_samples",
        description="one row per GPU (uuid, and MIG slice, and time-slicing replica) per timestamp",
    ),
    dg.AssetCheckSpec(
        "core_columns_reported",
        asset="gpu_samples",
        description="every reporting GPU has util (or GR_ENGINE_ACTIVE on a MIG slice), memory used and "
        "power: a missing source is named, never read as an idle GPU",
    ),
    dg.AssetCheckSpec(
        "not_empty_after_gpus",
        asset="gpu_samples",
        description="an hour is not empty when the hour before it had GPUs (exporter or Prometheus gone?): "
        "an error, a warning where the run allowed fewer rows (GPU nodes scaled away on purpose)",
    ),
]


def _window(hour: datetime, step: float, what: str) -> Window:
    return Window(hour.timestamp(), (hour + timedelta(hours=1)).timestamp(), step, what)


class IngestConfig(dg.Config):
    """Run config of the Prometheus ingest. allow_fewer_rows: replace a partition even when the source
    answers with far fewer GPUs (or none) than the lake has, e.g. after removing nodes on purpose."""

    allow_fewer_rows: bool = False


def _guard(store, spec, key: str, table: pa.Table, keys: list[str], config: IngestConfig) -> None:
    if config.allow_fewer_rows:
        return
    why = shrink_reason(store.read_partition(spec, key, columns=keys), table, keys)
    if why:
        raise dg.Failure(
            description=f"{spec.name} partition {key}: {why}: not replacing it (retention passed, or "
            "the wrong Prometheus?). To replace it anyway, run with config allow_fewer_rows: true."
        )


@dg.asset(
    partitions_def=HOURLY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=24),
    group_name="gpu",
    kinds={"prometheus", "parquet"},
    check_specs=GPU_SAMPLES_CHECKS,
    description="One row per GPU per scrape step (dcgm-exporter or foxhunt exporter), canonical units.",
)
def gpu_samples(
    context: dg.AssetExecutionContext,
    config: IngestConfig,
    lake: LakeResource,
    prometheus: PrometheusResource,
):
    settings, catalog, store, client = Settings.from_env(), load_catalog(), lake.lake(), prometheus.client()
    tables: dict[str, pa.Table] = {}
    missing: dict[str, dict] = {}
    for hour in hours_of(context.partition_time_window):
        key = hour_key(hour)
        try:
            table = collect_gpu_samples(
                client,
                catalog,
                _window(hour, settings.scrape_step_s, f"gpu_samples partition {key}"),
                node_labels=settings.node_labels,
                experiment_label=settings.experiment_label,
                exporter_containers=settings.exporter_containers,
                run_id_label=settings.run_id_label,
            )
            _guard(store, GPU_SAMPLES, key, table, ["uuid", "gpu_instance"], config)
            store.write_partition(GPU_SAMPLES, key, table)
        except (PrometheusError, LakeError, MigError, IngestError) as e:
            raise failure(e) from None
        context.log.info(f"gpu_samples {key}: {table.num_rows} rows")
        for column, gap in missing_core_columns(table, catalog).items():
            context.log.warning(
                f"gpu_samples {key}: {gap['gpus']} of {gap['of']} GPUs have no {column}; "
                f"looked for {', '.join(gap['looked_for'])}"
            )
            missing.setdefault(column, {**gap, "partitions": []})["partitions"].append(key)
        tables[key] = table
    metadata = _gpu_metadata(tables, store.root)
    metadata["missing_core_columns"] = dg.MetadataValue.json(missing)
    yield dg.MaterializeResult(metadata=metadata)
    yield dg.AssetCheckResult(
        check_name="core_columns_reported",
        passed=not missing,
        metadata={
            "missing": dg.MetadataValue.md(
                "\n".join(
                    f"- `{c}`: {g['gpus']} of {g['of']} GPUs in {', '.join(g['partitions'])}; "
                    f"looked for {', '.join(f'`{n}`' for n in g['looked_for'])}"
                    for c, g in missing.items()
                )
                or "none"
            )
        },
    )
    yield from _gpu_checks(tables, store, allow_fewer_rows=config.allow_fewer_rows)


def _gpu_metadata(tables: dict[str, pa.Table], root: str) -> dict:
    con = duckdb.connect(":memory:")
    con.register("t", pa.concat_tables(tables.values()))
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
    con.close()
    return {
        "dagster/row_count": dg.MetadataValue.int(rows),
        "partitions": dg.MetadataValue.text(", ".join(tables)),
        "time_range": dg.MetadataValue.text(f"{t0} .. {t1}" if rows else "empty"),
        "gpus": dg.MetadataValue.int(gpus),
        "nodes": dg.MetadataValue.int(nodes),
        "experiments": dg.MetadataValue.md(per_exp.to_markdown(index=False) if rows else "none"),
        "preview": dg.MetadataValue.md(preview.to_markdown(index=False) if rows else "empty"),
        "lake": dg.MetadataValue.path(f"{root}/{GPU_SAMPLES.name}"),
    }


def _gpu_checks(tables: dict[str, pa.Table], store, allow_fewer_rows: bool = False):
    con = duckdb.connect(":memory:")
    con.register("t", pa.concat_tables(tables.values()))
    # NaN is a missing reading, not an out-of-range one (DuckDB orders NaN above every number).
    bad = con.execute(
        """SELECT count(*) FILTER (WHERE NOT isnan(util) AND (util < 0 OR util > 1)),
                  count(*) FILTER (WHERE NOT isnan(temp_celsius) AND (temp_celsius < -20 OR temp_celsius > 130)),
                  count(*) FILTER (WHERE isnan(util)) FROM t"""
    ).fetchone()
    dupes = con.execute(
        "SELECT count(*) FROM (SELECT uuid, gpu_instance, vgpu, ts FROM t GROUP BY ALL HAVING count(*) > 1)"
    ).fetchone()[0]
    con.close()
    yield dg.AssetCheckResult(
        check_name="values_in_range",
        passed=bad[0] + bad[1] == 0,
        metadata={"util_out_of_range": bad[0], "temperature_out_of_range": bad[1], "util_nan": bad[2]},
    )
    yield dg.AssetCheckResult(
        check_name="unique_uuid_ts", passed=dupes == 0, metadata={"duplicate_keys": dupes}
    )
    empty_after_gpus = []
    for key, table in tables.items():
        if table.num_rows:
            continue
        prev_key = hour_key(datetime.strptime(key, "%Y-%m-%dT%H") - timedelta(hours=1))
        prev = tables.get(prev_key) or store.read_partition(GPU_SAMPLES, prev_key)
        if prev is not None and prev.num_rows:
            empty_after_gpus.append(key)
    yield dg.AssetCheckResult(
        check_name="not_empty_after_gpus",
        passed=not empty_after_gpus,
        # an empty hour reads downstream as a cluster without GPUs: loud, unless the run said it may be
        severity=dg.AssetCheckSeverity.WARN if allow_fewer_rows else dg.AssetCheckSeverity.ERROR,
        metadata={
            "empty_hours_after_gpus": dg.MetadataValue.text(", ".join(empty_after_gpus) or "none"),
            "allow_fewer_rows": allow_fewer_rows,
        },
    )


@dg.asset(
    partitions_def=HOURLY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=24),
    deps=[gpu_samples],
    group_name="gpu",
    kinds={"prometheus", "parquet"},
    description="One row per node per step: CPU busy, memory, network, instance type, GPUs reporting.",
)
def node_samples(
    context: dg.AssetExecutionContext,
    config: IngestConfig,
    lake: LakeResource,
    prometheus: PrometheusResource,
):
    settings, catalog, store, client = Settings.from_env(), load_catalog(), lake.lake(), prometheus.client()
    tables: dict[str, pa.Table] = {}
    for hour in hours_of(context.partition_time_window):
        key = hour_key(hour)
        gpus = store.read_partition(GPU_SAMPLES, key)
        if gpus is None:
            raise dg.Failure(
                f"node_samples partition {key}: gpu_samples {key} is not in the lake at {store.root}"
            )
        con = duckdb.connect(":memory:")
        con.register("g", gpus)
        counts = con.execute(
            "SELECT ts, node, count(DISTINCT uuid) AS gpus_reporting FROM g GROUP BY ALL"
        ).to_arrow_table()
        con.close()
        try:
            table = collect_node_samples(
                client,
                catalog,
                _window(hour, settings.scrape_step_s, f"node_samples partition {key}"),
                node_labels=settings.node_labels,
                gpu_counts=counts,
            )
            _guard(store, NODE_SAMPLES, key, table, ["node"], config)
            store.write_partition(NODE_SAMPLES, key, table)
        except (PrometheusError, LakeError) as e:
            raise failure(e) from None
        tables[key] = table
    con = duckdb.connect(":memory:")
    con.register("t", pa.concat_tables(tables.values()))
    rows, t0, t1, down = con.execute(
        "SELECT count(*), min(ts), max(ts), count(*) FILTER (WHERE NOT gpu_node_up) FROM t"
    ).fetchone()
    per_node = con.execute(
        """SELECT node, any_value(instance_type) AS instance_type, count(*) AS steps,
                  round(avg(cpu_busy), 3) AS cpu_busy, round(max(mem_used_bytes) / 2^30, 1) AS mem_used_max_gib,
                  max(gpus_reporting) AS gpus
           FROM t GROUP BY node ORDER BY node"""
    ).fetch_df()
    con.close()
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": dg.MetadataValue.int(rows),
            "partitions": dg.MetadataValue.text(", ".join(tables)),
            "time_range": dg.MetadataValue.text(f"{t0} .. {t1}" if rows else "empty"),
            "rows_without_gpus": dg.MetadataValue.int(down),
            "nodes": dg.MetadataValue.md(per_node.to_markdown(index=False) if rows else "none"),
        }
    )


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=7),
    deps=[dg.AssetDep(gpu_samples, partition_mapping=dg.TimeWindowPartitionMapping())],
    group_name="gpu",
    kinds={"duckdb", "parquet"},
    description=(
        "Per GPU-hour (or MIG slice-hour) and holder pod: its seconds, mean and p95 util, active GPU-seconds "
        "on util and SM activity, energy, errors; pod '' is the part no pod held."
    ),
)
def gpu_hourly(context: dg.AssetExecutionContext, lake: LakeResource):
    yield from assetkit.results(
        assetkit.build(tables.gpu_hourly, lake.lake(), days_of(context.partition_time_window))
    )
