"""fsx_metrics as a table function: CloudWatch AWS/FSx per Lustre file system and minute, one hour a
partition (one request chain per hour, whatever the run's width)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import pyarrow as pa

from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import FSX_METRICS
from foxhunt_obs.lib.sources.fsx import FsxSource
from foxhunt_obs.lib.tables import Built, md_table


def fsx_metrics(lake: Lake, source: FsxSource, hours: Sequence[datetime], fsx_ids: list[str] | None) -> Built:
    tables: dict[str, pa.Table] = {}
    file_systems = source.file_systems(fsx_ids)
    for hour in hours:
        key = FSX_METRICS.key(hour)
        table = source.metrics(file_systems, hour, hour + timedelta(hours=1), partition=f"fsx_metrics {key}")
        lake.write_partition(FSX_METRICS, key, table)
        tables[key] = table
    log = (
        []
        if file_systems
        else [("warning", "fsx_metrics: no Lustre file system found (FOXHUNT_FSX_IDS unset): empty hours")]
    )
    with scratch(t=pa.concat_tables(tables.values())) as con:
        rows = con.execute("SELECT count(*) FROM t").fetchone()[0]
        per_fs = con.execute(
            """SELECT file_system_id, any_value(file_system_name) AS name,
                      round(min(value) FILTER (WHERE metric = 'FreeDataStorageCapacity' AND statistic = 'Minimum')
                            / 1e9, 1) AS fullest_disk_free_gb,
                      round(min(value) FILTER (WHERE metric = 'FreeDataStorageCapacity' AND statistic = 'Sum')
                            / 1e9, 1) AS min_free_gb,
                      round(max(per_second) FILTER (WHERE metric = 'DataReadBytes') / 1e6, 1) AS peak_read_mb_s,
                      round(max(per_second) FILTER (WHERE metric = 'DataWriteBytes') / 1e6, 1) AS peak_write_mb_s
               FROM t GROUP BY file_system_id ORDER BY file_system_id"""
        ).fetch_df()
    summary = {
        "dagster/row_count": int(rows),
        "partitions": ", ".join(tables),
        "file_systems": md_table(per_fs, floatfmt=None),
        "aws_calls": int(source.calls),
    }
    return Built(tables, summary, extra={"log": log})
