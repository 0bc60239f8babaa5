"""The daily derived tables, one function each: gpu_hourly (from gpu_samples), cost_allocation (with its
sums_to_the_bill check), utilization_per_dollar and outcome_per_dollar (DESIGN §5). Each writes one
partition per day of `days` and returns the figures its asset shows; the SQL is in lib/analysis."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import duckdb
import pyarrow as pa

from foxhunt_obs.lib.analysis.prices import PriceTable
from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.names import CLUSTER_IDLE
from foxhunt_obs.lib.schemas import (
    COST_ALLOCATION,
    COSTS_DAILY,
    COSTS_HOURLY,
    GPU_HOURLY,
    NODE_SAMPLES,
    OUTCOME_PER_DOLLAR,
    TRAINING_METRICS,
    TRAINING_RUNS,
    UTILIZATION_PER_DOLLAR,
    TableSpec,
)
from foxhunt_obs.lib.tables import Built, Check, frame, md_table, row_count
from foxhunt_obs.lib.tables.cost_model import (
    bill_rates,
    build_cost_allocation,
    build_outcome_per_dollar,
    build_utilization_per_dollar,
    register_node_instances,
    register_prices,
)
from foxhunt_obs.lib.tables.hourly_rollup import build_gpu_hourly_counted

BILL_TOLERANCE = 0.001  # allocations sum to the day's bill within 0.1 %


def _per_day(
    lake: Lake, days: Sequence[datetime], reads: list[TableSpec], spec: TableSpec, build, prepare=None
) -> dict:
    """Each day: `build(connection over reads, day)` written as the day's partition of spec. One
    connection for all the days: each connection lists every partition of the tables it reads (on S3,
    listings and a dataset per table: a connection per day made cost_allocation 5x slower there). Its
    views are the partitions as they were when it opened, which holds because no table reads itself."""
    if spec in reads:
        raise ValueError(f"{spec.name} reads itself: a connection opened once would not see its own writes")
    out = {}
    con = lake.connect(reads)
    try:
        if prepare is not None:
            prepare(con)  # what every day needs, once
        for day in days:
            table = build(con, day)
            lake.write_partition(spec, spec.key(day), table)
            out[spec.key(day)] = table
    finally:
        con.close()
    return out


def _query(tables: dict[str, pa.Table], *statements: str):
    """Run statements over the written partitions as the view t; each answer as a DataFrame."""
    with scratch(t=pa.concat_tables(tables.values())) as con:
        return [con.execute(s).fetch_df() for s in statements]


def gpu_hourly(lake: Lake, days: Sequence[datetime]) -> Built:
    # every day first: one read for them all
    tables, from_samples = build_gpu_hourly_counted(lake, list(days))
    for key, table in tables.items():
        lake.write_partition(GPU_HOURLY, key, table)
    # GPU-hours weighed by gpu_share (a MIG slice counts for its part of the GPU)
    totals, per_exp = _query(
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


def cost_allocation(lake: Lake, days: Sequence[datetime], prices: PriceTable) -> Built:
    bills = {}

    def build(con: duckdb.DuckDBPyConnection, day: datetime) -> pa.Table:
        register_prices(con, prices, bill_rates(con, day, node_instances=True))  # the estimate's rates
        table = build_cost_allocation(con, day.date())
        key = COST_ALLOCATION.key(day)
        bills[key] = con.execute(
            """SELECT coalesce(sum(cost_usd) FILTER (WHERE source = 'cur'),
                               sum(cost_usd) FILTER (WHERE source = 'estimate')),
                      CASE WHEN count(*) FILTER (WHERE source = 'cur') > 0 THEN 'cur' ELSE 'estimate' END
               FROM costs_daily WHERE day = $key""",
            {"key": key},
        ).fetchone()
        return table

    tables = _per_day(
        lake,
        days,
        [GPU_HOURLY, NODE_SAMPLES, COSTS_HOURLY, COSTS_DAILY],
        COST_ALLOCATION,
        build,
        # the instances in the week before each day (its bill_rates), read once for the run
        prepare=lambda con: register_node_instances(con, list(days)) if days else None,
    )
    per_day, by_experiment = _query(
        tables,
        """SELECT strftime(hour, '%Y-%m-%d') AS day, sum(allocated_usd) AS allocated_usd,
                  sum(unallocated_usd) AS unallocated_usd, sum(idle_usd) AS idle_usd,
                  string_agg(DISTINCT cost_source, '+' ORDER BY cost_source) AS cost_source
           FROM t GROUP BY ALL ORDER BY day""",
        f"""SELECT coalesce(nullif(experiment, ''), '{CLUSTER_IDLE}') AS experiment,
                  round(sum(held_seconds) / 3600, 2) AS gpu_hours, round(sum(allocated_usd), 2) AS allocated_usd,
                  round(sum(idle_usd), 2) AS idle_usd, round(sum(unallocated_usd), 2) AS unallocated_usd
           FROM t GROUP BY ALL ORDER BY experiment""",
    )
    mismatches = []
    for row in per_day.itertuples():
        bill, source = bills.get(row.day, (None, ""))
        total = row.allocated_usd + row.unallocated_usd
        if bill is None or abs(total - bill) > BILL_TOLERANCE * max(abs(bill), 1e-9):
            mismatches.append(f"{row.day}: allocated {total:.4f} vs bill ({source}) {bill}")
    return Built(
        tables,
        {
            "dagster/row_count": row_count(tables),
            "by_day": md_table(per_day),
            "by_experiment": md_table(by_experiment),
        },
        [Check("sums_to_the_bill", not mismatches, {"mismatches": "\n".join(mismatches) or "none"})],
        extra={"bills": bills},  # the day's bill the check compared with
    )


def utilization_per_dollar(lake: Lake, days: Sequence[datetime]) -> Built:
    tables = _per_day(
        lake,
        days,
        [COST_ALLOCATION],
        UTILIZATION_PER_DOLLAR,
        lambda con, d: build_utilization_per_dollar(con, d.date()),
    )
    df = frame(tables)
    total, active = df.allocated_usd.sum(), df.active_gpu_hours.sum()
    held = df[df.experiment != CLUSTER_IDLE]
    # NaN where no GPU reported SM activity: unknown, not 0 (the cluster row's unheld $ make no basis)
    sm_known = total - df.sm_unknown_activity_usd.sum() if held.sm_active_gpu_hours.notna().any() else 0.0
    columns = [
        "day", "experiment", "gpu_hours", "active_gpu_hours", "allocated_usd", "idle_usd",
        "active_gpu_hours_per_usd", "sm_active_gpu_hours_per_usd", "usd_per_active_gpu_hour", "cost_source",
    ]  # fmt: skip
    summary = {
        "dagster/row_count": len(df),
        "allocated_usd": round(float(total), 2),
        "idle_usd": round(float(df.idle_usd.sum()), 2),
        "active_gpu_hours_per_usd": round(float(active / total), 5) if total else float("nan"),
        "sm_active_gpu_hours_per_usd": (
            round(float(df.sm_active_gpu_hours.sum() / sm_known), 5) if sm_known > 1e-9 else float("nan")
        ),
        "table": md_table(df[columns]),
    }
    return Built(tables, summary)


def outcome_per_dollar(lake: Lake, days: Sequence[datetime]) -> Built:
    reads = [TRAINING_RUNS, TRAINING_METRICS, COST_ALLOCATION]
    tables = _per_day(
        lake, days, reads, OUTCOME_PER_DOLLAR, lambda con, d: build_outcome_per_dollar(con, d.date())
    )
    df = frame(tables)
    view = df[
        [
            "day",
            "run_name",
            "experiment",
            "success_start",
            "success_end",
            "usd",
            "usd_per_point",
            "charged_by",
        ]
    ]
    summary = {
        "dagster/row_count": len(df),
        "runs": md_table(view),
        "runs_without_known_gpu": int(df.usd.isna().sum()),
    }
    return Built(tables, summary)
