"""gpu_hourly: one row per GPU-hour (or MIG slice-hour) and holder, from gpu_samples (the roll-up is
hourly_rollup.py); one partition per UTC day, and the figures its asset shows."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import GPU_HOURLY
from foxhunt_obs.lib.tables import Built, md_table
from foxhunt_obs.lib.tables.hourly_rollup import build_gpu_hourly_counted
from foxhunt_obs.lib.tables.per_day import query_written


def gpu_hourly(lake: Lake, days: Sequence[datetime]) -> Built:
    # every day first: one read for them all
    tables, from_samples = build_gpu_hourly_counted(lake, list(days))
    for key, table in tables.items():
        lake.write_partition(GPU_HOURLY, key, table)
    # GPU-hours weighed by gpu_share (a MIG slice counts for its part of the GPU)
    totals, per_exp = query_written(
        tables,
        """SELECT count(*) AS n, count(DISTINCT uuid) AS gpus, coalesce(sum(seconds_with_data * gpu_share), 0) / 3600 AS gh,
                  coalesce(sum(active_gpu_seconds), 0) / 3600 AS active, coalesce(sum(energy_kwh), 0) AS kwh,
                  coalesce(sum((seconds_with_data - activity_seconds) * gpu_share), 0) / 3600 AS unknown,
                  count(DISTINCT (uuid, gpu_instance)) FILTER (WHERE gpu_instance IS NOT NULL) AS slices FROM t""",
        """SELECT experiment, round(sum(seconds_with_data * gpu_share) / 3600, 2) AS gpu_hours,
                  round(sum(active_gpu_seconds) / 3600, 2) AS active_gpu_hours,
                  round(sum(active_gpu_seconds) / nullif(sum(activity_seconds * gpu_share), 0), 3) AS mean_util,
                  round(sum((seconds_with_data - activity_seconds) * gpu_share) / 3600, 2) AS unknown_activity_gpu_hours
           FROM t GROUP BY experiment ORDER BY experiment""",
    )
    t = totals.iloc[0]
    rows = int(t.n)
    return Built(
        tables,
        {
            "dagster/row_count": rows,
            "gpus": int(t.gpus),
            "gpu_hours": round(float(t.gh), 3),
            "active_gpu_hours": round(float(t.active), 3),
            "energy_kwh": round(float(t.kwh), 3),
            # GPU-hours with no util reported: unknown activity, never idle (check core_columns_reported)
            "unknown_activity_gpu_hours": round(float(t.unknown), 3),
            "mig_slices": int(t.slices),
            # gpu_samples hours without the ingest's parts in their footer (written before they existed, or
            # by another writer): summed from their samples, 3-10x slower (bench/report.py)
            "hours_summed_from_samples": len(from_samples),
            "by_experiment": md_table(per_exp, empty="empty", floatfmt=None),
        },
    )
