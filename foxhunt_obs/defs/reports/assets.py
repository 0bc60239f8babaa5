"""Utilization per dollar: the cost model applied per GPU-hour, per experiment and day, per MLflow run,
and the weekly cost report (DESIGN §5)."""

import math
from datetime import timedelta

import dagster as dg
import duckdb
import pyarrow as pa

from foxhunt_obs.defs.costs.assets import costs_daily, costs_hourly
from foxhunt_obs.defs.failures import failure
from foxhunt_obs.defs.gpu.assets import gpu_hourly, node_samples
from foxhunt_obs.defs.partitions import DAILY, WEEKLY, days_of
from foxhunt_obs.defs.resources import LakeResource, SlackBotResource
from foxhunt_obs.defs.training.assets import training_metrics, training_runs
from foxhunt_obs.lib.analysis.allocation import (
    CLUSTER_IDLE,
    build_cost_allocation,
    build_outcome_per_dollar,
    build_utilization_per_dollar,
    register_prices,
)
from foxhunt_obs.lib.analysis.prices import PriceError, load_price_table
from foxhunt_obs.lib.lake import LakeError
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
)
from foxhunt_obs.lib.settings import env

DAY_TO_DAY = dg.TimeWindowPartitionMapping()
BILL_TOLERANCE = 0.001  # allocations sum to the day's bill within 0.1 %


def _per_day(context, lake: LakeResource, reads, build, spec) -> dict[str, pa.Table]:
    """Each day of the run: `build(connection over reads, day)` written as the day's partition of spec."""
    store, out = lake.lake(), {}
    for day in days_of(context.partition_time_window):
        key = day.strftime("%Y-%m-%d")
        con = store.connect(reads)
        try:
            table = build(con, day.date())
        finally:
            con.close()
        try:
            store.write_partition(spec, key, table)
        except LakeError as e:
            raise failure(e) from None
        out[key] = table
    return out


def _md(df) -> dg.MetadataValue:
    return dg.MetadataValue.md(df.to_markdown(index=False, floatfmt=".2f") if len(df) else "none")


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=7),
    deps=[
        dg.AssetDep(gpu_hourly, partition_mapping=DAY_TO_DAY),
        dg.AssetDep(node_samples, partition_mapping=DAY_TO_DAY),
        dg.AssetDep(costs_hourly, partition_mapping=DAY_TO_DAY),
        dg.AssetDep(costs_daily, partition_mapping=DAY_TO_DAY),
    ],
    group_name="reports",
    kinds={"duckdb", "parquet"},
    check_specs=[
        dg.AssetCheckSpec(
            "sums_to_the_bill",
            asset="cost_allocation",
            description="allocated + unallocated $ equal the day's bill (CUR, else the estimate) within 0.1 %",
        )
    ],
    description=(
        "Per GPU-hour: node, GPU, holder pod and experiment, allocated $, unallocated (cluster idle) $, "
        "active GPU-seconds, idle $, cost source; plus the day's tagged and shared bill lines."
    ),
)
def cost_allocation(context: dg.AssetExecutionContext, lake: LakeResource):
    store = lake.lake()
    try:
        prices = load_price_table(env("FOXHUNT_PRICE_REGION"))
    except PriceError as e:
        raise failure(e) from None
    out, bills = {}, {}
    for day in days_of(context.partition_time_window):
        key = day.strftime("%Y-%m-%d")
        con = store.connect([GPU_HOURLY, NODE_SAMPLES, COSTS_HOURLY, COSTS_DAILY])
        try:
            register_prices(con, prices)
            table = build_cost_allocation(con, day.date())
            bills[key] = con.execute(
                """SELECT coalesce(sum(cost_usd) FILTER (WHERE source = 'cur'),
                                   sum(cost_usd) FILTER (WHERE source = 'estimate')),
                          CASE WHEN count(*) FILTER (WHERE source = 'cur') > 0 THEN 'cur' ELSE 'estimate' END
                   FROM costs_daily WHERE day = $key""",
                {"key": key},
            ).fetchone()
        finally:
            con.close()
        try:
            store.write_partition(COST_ALLOCATION, key, table)
        except LakeError as e:
            raise failure(e) from None
        out[key] = table
    con = duckdb.connect(":memory:")
    con.register("t", pa.concat_tables(out.values()))
    per_day = con.execute(
        """SELECT strftime(hour, '%Y-%m-%d') AS day, sum(allocated_usd) AS allocated_usd,
                  sum(unallocated_usd) AS unallocated_usd, sum(idle_usd) AS idle_usd,
                  string_agg(DISTINCT cost_source, '+' ORDER BY cost_source) AS cost_source
           FROM t GROUP BY ALL ORDER BY day"""
    ).fetch_df()
    by_experiment = con.execute(
        """SELECT coalesce(nullif(experiment, ''), '(cluster idle)') AS experiment,
                  round(sum(held_seconds) / 3600, 2) AS gpu_hours, round(sum(allocated_usd), 2) AS allocated_usd,
                  round(sum(idle_usd), 2) AS idle_usd, round(sum(unallocated_usd), 2) AS unallocated_usd
           FROM t GROUP BY ALL ORDER BY experiment"""
    ).fetch_df()
    con.close()
    mismatches = []
    for row in per_day.itertuples():
        bill, source = bills.get(row.day, (None, ""))
        total = row.allocated_usd + row.unallocated_usd
        if bill is None or abs(total - bill) > BILL_TOLERANCE * max(abs(bill), 1e-9):
            mismatches.append(f"{row.day}: allocated {total:.4f} vs bill ({source}) {bill}")
    yield dg.MaterializeResult(
        metadata={
            "dagster/row_count": dg.MetadataValue.int(sum(t.num_rows for t in out.values())),
            "by_day": _md(per_day),
            "by_experiment": _md(by_experiment),
        }
    )
    yield dg.AssetCheckResult(
        check_name="sums_to_the_bill",
        passed=not mismatches,
        metadata={"mismatches": dg.MetadataValue.text("\n".join(mismatches) or "none")},
    )


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=7),
    deps=[dg.AssetDep(cost_allocation, partition_mapping=DAY_TO_DAY)],
    group_name="reports",
    kinds={"duckdb", "parquet"},
    description=(
        "Experiment × day: GPU-hours, active GPU-hours, mean util, allocated $, idle $, active GPU-hours "
        f"per $, $ per active GPU-hour, energy, cost source; plus a {CLUSTER_IDLE} row. Active GPU-hours on "
        "two bases: utilization and SM activity (sm_*), each over the dollars it was reported for."
    ),
)
def utilization_per_dollar(context: dg.AssetExecutionContext, lake: LakeResource):
    out = _per_day(context, lake, [COST_ALLOCATION], build_utilization_per_dollar, UTILIZATION_PER_DOLLAR)
    df = pa.concat_tables(out.values()).to_pandas()
    total = df.allocated_usd.sum()
    active = df.active_gpu_hours.sum()
    held = df[df.experiment != CLUSTER_IDLE]
    # NaN where no GPU reported SM activity: unknown, not 0 (the cluster row's unheld $ make no basis)
    sm_known = total - df.sm_unknown_activity_usd.sum() if held.sm_active_gpu_hours.notna().any() else 0.0
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": dg.MetadataValue.int(len(df)),
            "allocated_usd": dg.MetadataValue.float(round(float(total), 2)),
            "idle_usd": dg.MetadataValue.float(round(float(df.idle_usd.sum()), 2)),
            "active_gpu_hours_per_usd": dg.MetadataValue.float(
                round(float(active / total), 5) if total else math.nan
            ),
            "sm_active_gpu_hours_per_usd": dg.MetadataValue.float(
                round(float(df.sm_active_gpu_hours.sum() / sm_known), 5) if sm_known > 1e-9 else math.nan
            ),
            "table": _md(
                df[
                    [
                        "day",
                        "experiment",
                        "gpu_hours",
                        "active_gpu_hours",
                        "allocated_usd",
                        "idle_usd",
                        "active_gpu_hours_per_usd",
                        "sm_active_gpu_hours_per_usd",
                        "usd_per_active_gpu_hour",
                        "cost_source",
                    ]
                ]
            ),
        }
    )


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=7),
    deps=[
        dg.AssetDep(cost_allocation, partition_mapping=DAY_TO_DAY),
        dg.AssetDep(training_metrics, partition_mapping=DAY_TO_DAY),
        training_runs,
    ],
    group_name="reports",
    kinds={"duckdb", "parquet"},
    description=(
        "Per MLflow run alive that day: success_rate at its start and at the day's end, what its own pods' "
        "GPUs (its `pod` tag's list, in its namespace) cost in its own window so far, and $ per point of "
        "success_rate gained. A run on no GPU the lake knows has no $ (never $0) and says why."
    ),
)
def outcome_per_dollar(context: dg.AssetExecutionContext, lake: LakeResource):
    reads = [TRAINING_RUNS, TRAINING_METRICS, COST_ALLOCATION]
    out = _per_day(context, lake, reads, build_outcome_per_dollar, OUTCOME_PER_DOLLAR)
    df = pa.concat_tables(out.values()).to_pandas()
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
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": dg.MetadataValue.int(len(df)),
            "runs": _md(view),
            "runs_without_known_gpu": dg.MetadataValue.int(int(df.usd.isna().sum())),
        }
    )


@dg.asset(
    partitions_def=WEEKLY,
    deps=[
        dg.AssetDep(utilization_per_dollar, partition_mapping=DAY_TO_DAY),
        dg.AssetDep(cost_allocation, partition_mapping=DAY_TO_DAY),
        dg.AssetDep(outcome_per_dollar, partition_mapping=DAY_TO_DAY),
        dg.AssetDep(costs_daily, partition_mapping=DAY_TO_DAY),
    ],
    group_name="reports",
    kinds={"html", "markdown"},
    check_specs=[
        dg.AssetCheckSpec(
            "delivered",
            asset="weekly_cost_report",
            description="every configured sink (SMTP e-mail, Slack) accepted the report",
        )
    ],
    description=(
        "The week's cost report (weeks start Monday 00:00 UTC): spend by experiment, utilization per "
        "dollar, idle $, the biggest wastes, $ per point of success_rate, the cost policy. Markdown and a "
        "self-contained HTML file with PNG charts, in the lake under reports/week=…/."
    ),
)
def weekly_cost_report(context: dg.AssetExecutionContext, lake: LakeResource, slack: SlackBotResource):
    # imported here: matplotlib costs ~1 s, which every code-location load would pay otherwise
    from foxhunt_obs.lib.analysis.weekly import weekly_report_data
    from foxhunt_obs.lib.delivery.send import DeliveryError, deliver
    from foxhunt_obs.lib.delivery.weekly_report import render_weekly_report

    store = lake.lake()
    week_start = context.partition_time_window.start.date()
    con = store.connect([UTILIZATION_PER_DOLLAR, COST_ALLOCATION, OUTCOME_PER_DOLLAR, COSTS_DAILY])
    try:
        data = weekly_report_data(con, week_start)
    finally:
        con.close()
    if data.daily.empty:
        raise dg.Failure(
            description=f"weekly_cost_report week={week_start}: no utilization_per_dollar rows for "
            f"{week_start}..{week_start + timedelta(days=6)} in {store.root}: materialize the week's "
            "cost_allocation and utilization_per_dollar first"
        )
    report = render_weekly_report(data)
    files = {"report.md": report.markdown.encode(), "report.html": report.html.encode()}
    files.update(report.charts)  # the PNGs beside the report (the HTML embeds its own copies)
    try:
        paths = store.write_files(f"reports/week={week_start.isoformat()}", files)
    except LakeError as e:
        raise failure(e) from None
    html_path = next(p for p in paths if p.endswith("report.html"))
    metadata = {
        "report": dg.MetadataValue.md(report.markdown),
        "html": dg.MetadataValue.path(html_path),
        "files": dg.MetadataValue.text("\n".join(paths)),
    }
    metadata.update(
        {k: dg.MetadataValue.float(round(float(v), 4)) for k, v in report.figures.items() if v == v}
    )
    # the report is in the lake whatever happens here: a failed sink fails the check, not the asset
    try:
        sent, failures = deliver(report, week_start, slack_client=slack.get_client), {}
    except DeliveryError as e:
        sent, failures = e.delivered, e.failures
        context.log.error(f"weekly_cost_report week={week_start}: delivery failed: {e}")
    metadata["delivered_to"] = dg.MetadataValue.text(", ".join(sent) or "no sink configured")
    yield dg.MaterializeResult(metadata=metadata)
    yield dg.AssetCheckResult(
        check_name="delivered",
        passed=not failures,
        metadata={"sent": ", ".join(sent) or "none", "failures": "\n".join(failures.values()) or "none"},
    )
