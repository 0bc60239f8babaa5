"""Plain-text summaries of the lake's tables, for the terminal (the demo prints them)."""

from __future__ import annotations

from datetime import datetime, timedelta

from foxhunt_obs.lib.names import CLUSTER_IDLE


def lake():
    """The lake as the resources configure it (imported when a summary runs: Dagster costs ~2 s)."""
    from foxhunt_obs.cli.config import lake as configured

    return configured()


def summary(start: datetime, end: datetime) -> str:
    """A plain-text summary of gpu_hourly for [start, end)."""
    from foxhunt_obs.lib.schemas import GPU_HOURLY

    store = lake()
    con = store.connect([GPU_HOURLY])
    params = [start, end]
    where = "WHERE hour >= ? AND hour < ?"
    total = con.execute(
        # GPU-hours weighed by gpu_share: a MIG slice counts for its part of its GPU
        f"""SELECT count(DISTINCT uuid), sum(seconds_with_data * coalesce(gpu_share, 1)) / 3600, sum(active_gpu_seconds) / 3600,
                   sum(energy_kwh), sum(ecc_sbe_delta), sum(ecc_dbe_delta) FROM gpu_hourly {where}""",
        params,
    ).fetchone()
    if not total[0]:
        return f"no gpu_hourly rows for {start:%Y-%m-%dT%H} .. {end:%Y-%m-%dT%H} in {store.root}"

    def table(by: str) -> str:
        rows = con.execute(
            f"""SELECT {by}, count(DISTINCT uuid) AS gpus,
                       round(sum(seconds_with_data * coalesce(gpu_share, 1)) / 3600, 1) AS gpu_hours,
                       round(sum(active_gpu_seconds) / 3600, 1) AS active_gpu_hours,
                       round(100 * sum(active_gpu_seconds) / sum(coalesce(activity_seconds, seconds_with_data) * coalesce(gpu_share, 1)), 1) AS mean_util_pct
                FROM gpu_hourly {where} GROUP BY {by} ORDER BY {by}""",
            params,
        ).fetch_df()
        return rows.to_string(index=False)

    out = [
        f"GPU summary {start:%Y-%m-%d %H:00} .. {end:%Y-%m-%d %H:00} UTC (lake {store.root})",
        f"  GPUs {total[0]}, GPU-hours observed {total[1]:.1f}, active GPU-hours {total[2]:.1f} "
        f"(mean util {100 * total[2] / total[1]:.1f} %), energy {total[3]:.1f} kWh, "
        f"ECC SBE {total[4]:.0f}, DBE {total[5]:.0f}",
        "",
        "By experiment:",
        table("experiment"),
        "",
        "By node:",
        table("node"),
    ]
    con.close()
    return "\n".join(out)


def training_summary(day: str) -> str:
    """Per experiment: GPU utilization beside the day's training health."""

    store = lake()
    rows = store.query(
        """
        WITH gpu AS (
          SELECT experiment, round(sum(seconds_with_data * coalesce(gpu_share, 1)) / 3600, 1) AS gpu_hours,
                 round(100 * sum(active_gpu_seconds) / sum(coalesce(activity_seconds, seconds_with_data) * coalesce(gpu_share, 1)), 1) AS gpu_util_pct
          FROM gpu_hourly WHERE strftime(hour, '%Y-%m-%d') = $day GROUP BY experiment
        ),
        h AS (
          SELECT experiment, count(*) AS runs,
                 count(*) FILTER (WHERE status = 'RUNNING') AS running,
                 round(max(success_rate_best), 2) AS best_success,
                 string_agg(DISTINCT bottleneck, '/') FILTER (WHERE bottleneck <> '') AS bottleneck,
                 string_agg(
                   run_name || ': ' || concat_ws(', ',
                     CASE WHEN loss_nonfinite > 0 THEN 'NaN/Inf loss' END,
                     CASE WHEN entropy_collapse THEN 'entropy collapse' END,
                     CASE WHEN success_drop THEN 'success drop' END,
                     CASE WHEN stalled THEN 'stalled' END,
                     CASE WHEN status = 'FAILED' THEN 'FAILED' END),
                   '; ') FILTER (WHERE loss_nonfinite > 0 OR entropy_collapse OR success_drop OR stalled
                                 OR status = 'FAILED') AS incidents
          FROM training_health WHERE day = CAST($day AS DATE) AND NOT deleted GROUP BY experiment
        )
        SELECT coalesce(h.experiment, gpu.experiment) AS experiment, gpu.gpu_hours, gpu.gpu_util_pct,
               h.runs, h.running, h.best_success, h.bottleneck, coalesce(h.incidents, '') AS incidents
        FROM h FULL OUTER JOIN gpu USING (experiment) ORDER BY experiment
        """,
        {"day": day},
    ).to_pandas()
    for col in ("runs", "running"):
        rows[col] = rows[col].astype("Int64")  # no training runs (unattributed GPUs): <NA>, not NaN
    return f"Training health and GPU use, {day} (lake {store.root})\n" + rows.to_string(index=False)


def costs_summary(day: str) -> str:
    """Cost per experiment tag and source, the estimate-vs-bill gap, and FSx free space, for one day."""

    store = lake()
    con = store.connect()
    by_experiment = con.execute(
        """SELECT coalesce(nullif(project, ''), '(untagged)') AS project,
                  coalesce(nullif(experiment, ''), CASE WHEN project = '' THEN '' ELSE '(shared)' END) AS experiment,
                  round(sum(cost_usd) FILTER (WHERE source = 'cur'), 2) AS cur_usd,
                  round(sum(cost_usd) FILTER (WHERE source = 'ce'), 2) AS cost_explorer_usd
           FROM costs_daily WHERE day = $day AND source IN ('cur', 'ce') GROUP BY ALL ORDER BY ALL""",
        {"day": day},
    ).fetch_df()
    gap = con.execute(
        """SELECT service, round(sum(cost_usd) FILTER (WHERE source = 'estimate'), 2) AS estimate_usd,
                  round(sum(cost_usd) FILTER (WHERE source = 'cur'), 2) AS cur_usd,
                  round(sum(cost_usd) FILTER (WHERE source = 'ce'), 2) AS cost_explorer_usd,
                  round(100 * (sum(cost_usd) FILTER (WHERE source = 'estimate')
                        / nullif(sum(cost_usd) FILTER (WHERE source = 'cur'), 0) - 1), 3) AS estimate_gap_pct
           FROM costs_daily WHERE day = $day GROUP BY ALL ORDER BY service""",
        {"day": day},
    ).fetch_df()
    fsx = con.execute(
        """SELECT file_system_name AS name, file_system_id,
                  round(min(value) FILTER (WHERE statistic = 'Sum') / 1e9, 1) AS min_free_gb,
                  round(min(value) FILTER (WHERE statistic = 'Minimum') / 1e9, 1) AS fullest_disk_free_gb
           FROM fsx_metrics WHERE metric = 'FreeDataStorageCapacity' AND hour LIKE $day || 'T%'
           GROUP BY ALL ORDER BY name""",
        {"day": day},
    ).fetch_df()
    con.close()
    return "\n".join(
        [
            f"Costs {day} by Project and Experiment tag (USD; lake {store.root}). Shared GPU nodes and the",
            "file system carry no Experiment tag: their split by GPU-hours held is utilization_per_dollar's.",
            by_experiment.to_string(index=False),
            "",
            "Estimate (price table x node-hours and FSx storage-hours) vs the bill, by service (EKS and S3",
            "are not estimated: no usage series for them):",
            gap.to_string(index=False),
            "",
            "FSx free space:",
            fsx.to_string(index=False) if len(fsx) else "  no fsx_metrics rows",
        ]
    )


def weekly_summary(week: str) -> str:
    """Where the week's report is and its headline figures, from utilization_per_dollar."""
    from foxhunt_obs.lib.schemas import UTILIZATION_PER_DOLLAR

    store = lake()
    first, last = week, (datetime.fromisoformat(week) + timedelta(days=6)).strftime("%Y-%m-%d")
    rows = store.query(
        """SELECT experiment, round(sum(gpu_hours), 1) AS gpu_hours, round(sum(active_gpu_hours), 1) AS active_gpu_hours,
                  round(sum(allocated_usd), 2) AS usd, round(sum(idle_usd), 2) AS idle_usd,
                  round(sum(active_gpu_hours) / nullif(sum(allocated_usd), 0), 4) AS active_gpu_hours_per_usd,
                  round(sum(allocated_usd) / nullif(sum(active_gpu_hours), 0), 2) AS usd_per_active_gpu_hour
           FROM utilization_per_dollar WHERE day >= $first AND day <= $last
           GROUP BY experiment ORDER BY experiment = $cluster_idle, usd DESC""",
        {"first": first, "last": last, "cluster_idle": CLUSTER_IDLE},
        tables=[UTILIZATION_PER_DOLLAR],
    ).to_pandas()
    total, idle, active = rows.usd.sum(), rows.idle_usd.sum(), rows.active_gpu_hours.sum()
    path = f"{store.root}/reports/week={week}/report.html"
    return "\n".join(
        [
            f"Weekly cost report, week of {week}: {path}",
            f"  total ${total:,.2f}, idle ${idle:,.2f} ({100 * idle / total:.1f} %), "
            f"{active / total:.4f} active GPU-hours per $, ${total / active:,.2f} per active GPU-hour",
            rows.to_string(index=False),
        ]
    )
