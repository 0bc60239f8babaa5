"""FSx for Lustre CloudWatch metrics into the lake."""

from datetime import timedelta

import dagster as dg
import duckdb
import pyarrow as pa

from foxhunt_obs.defs.failures import failure
from foxhunt_obs.defs.partitions import HOURLY, hours_of
from foxhunt_obs.defs.resources import AwsResource, LakeResource
from foxhunt_obs.lib.analysis.gpu_hourly import hour_key
from foxhunt_obs.lib.lake import LakeError
from foxhunt_obs.lib.schemas import FSX_METRICS
from foxhunt_obs.lib.settings import csv_setting
from foxhunt_obs.lib.sources.fsx import FsxSource, FsxSourceError


@dg.asset(
    partitions_def=HOURLY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=24),
    group_name="storage",
    kinds={"aws", "parquet"},
    description=(
        "CloudWatch AWS/FSx per Lustre file system and minute: read/write bytes and operations, metadata "
        "operations (Sum, with per-second rates) and free capacity (Minimum = fullest disk, Sum = total)."
    ),
)
def fsx_metrics(context: dg.AssetExecutionContext, lake: LakeResource, aws: AwsResource):
    store = lake.lake()
    source = FsxSource(aws.client("fsx"), aws.client("cloudwatch"))
    tables: dict[str, pa.Table] = {}
    try:
        file_systems = source.file_systems(csv_setting("FOXHUNT_FSX_IDS") or None)
        # one request chain per hour: a partition's data is exactly one hour, whatever the run's width
        for hour in hours_of(context.partition_time_window):
            key = hour_key(hour)
            table = source.metrics(
                file_systems, hour, hour + timedelta(hours=1), partition=f"fsx_metrics {key}"
            )
            store.write_partition(FSX_METRICS, key, table)
            tables[key] = table
    except (FsxSourceError, LakeError) as e:
        raise failure(e) from None
    if not file_systems:
        context.log.warning("fsx_metrics: no Lustre file system found (FOXHUNT_FSX_IDS unset): empty hours")
    con = duckdb.connect(":memory:")
    con.register("t", pa.concat_tables(tables.values()))
    rows = con.execute("SELECT count(*) FROM t").fetchone()[0]
    summary = con.execute(
        """SELECT file_system_id, any_value(file_system_name) AS name,
                  round(min(value) FILTER (WHERE metric = 'FreeDataStorageCapacity' AND statistic = 'Minimum')
                        / 1e9, 1) AS fullest_disk_free_gb,
                  round(min(value) FILTER (WHERE metric = 'FreeDataStorageCapacity' AND statistic = 'Sum')
                        / 1e9, 1) AS min_free_gb,
                  round(max(per_second) FILTER (WHERE metric = 'DataReadBytes') / 1e6, 1) AS peak_read_mb_s,
                  round(max(per_second) FILTER (WHERE metric = 'DataWriteBytes') / 1e6, 1) AS peak_write_mb_s
           FROM t GROUP BY file_system_id ORDER BY file_system_id"""
    ).fetch_df()
    con.close()
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": dg.MetadataValue.int(rows),
            "partitions": dg.MetadataValue.text(", ".join(tables)),
            "file_systems": dg.MetadataValue.md(summary.to_markdown(index=False) if rows else "none"),
            "aws_calls": dg.MetadataValue.int(source.calls),
        }
    )
