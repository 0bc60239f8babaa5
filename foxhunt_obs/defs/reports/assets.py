"""Utilization per dollar: the cost model applied per GPU-hour, per experiment and day, per MLflow run,
and the weekly cost report (docs/cost-model.md)."""

from datetime import datetime, timezone

import dagster as dg

from foxhunt_obs import assetkit
from foxhunt_obs.defs.partitions import DAILY, WEEKLY, days_of
from foxhunt_obs.defs.resources import (
    AlertingResource,
    CostsResource,
    LakeResource,
    ReportResource,
    SlackBotResource,
)
from foxhunt_obs.lib import schemas
from foxhunt_obs.lib.analysis.prices import load_price_table
from foxhunt_obs.lib.names import CLUSTER_IDLE
from foxhunt_obs.lib.tables import cost_allocation as allocation
from foxhunt_obs.lib.tables import per_dollar

DAY_TO_DAY = dg.TimeWindowPartitionMapping()


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=7),
    deps=[
        dg.AssetDep("gpu_hourly", partition_mapping=DAY_TO_DAY),
        dg.AssetDep("node_samples", partition_mapping=DAY_TO_DAY),
        dg.AssetDep("costs_hourly", partition_mapping=DAY_TO_DAY),
        dg.AssetDep("costs_daily", partition_mapping=DAY_TO_DAY),
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
    **assetkit.writes(
        schemas.COST_ALLOCATION,
        does="The cost model (docs/cost-model.md) applied to gpu_hourly, node_samples and the day's bill "
        "(costs_hourly's CUR lines, else costs_daily's estimate).",
    ),
)
def cost_allocation(context: dg.AssetExecutionContext, lake: LakeResource, costs: CostsResource):
    prices = assetkit.build(load_price_table, costs.value("price_region"))
    days = days_of(context.partition_time_window)
    yield from assetkit.results(assetkit.build(allocation.cost_allocation, lake.lake(), days, prices))


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=7),
    deps=[dg.AssetDep(cost_allocation, partition_mapping=DAY_TO_DAY)],
    group_name="reports",
    kinds={"duckdb", "parquet"},
    **assetkit.writes(
        schemas.UTILIZATION_PER_DOLLAR,
        does=f"Summed from cost_allocation, plus a {CLUSTER_IDLE} row. Active GPU-hours on two bases: "
        "utilization and SM activity (sm_*), each over the dollars it was reported for.",
    ),
)
def utilization_per_dollar(context: dg.AssetExecutionContext, lake: LakeResource):
    days = days_of(context.partition_time_window)
    yield from assetkit.results(assetkit.build(per_dollar.utilization_per_dollar, lake.lake(), days))


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=7),
    deps=[
        dg.AssetDep(cost_allocation, partition_mapping=DAY_TO_DAY),
        dg.AssetDep("training_metrics", partition_mapping=DAY_TO_DAY),
        "training_runs",
    ],
    group_name="reports",
    kinds={"duckdb", "parquet"},
    **assetkit.writes(
        schemas.OUTCOME_PER_DOLLAR,
        does="Its pods are its `pod` tag's list, in its namespace, priced from cost_allocation. A run on no "
        "GPU the lake knows has no $ (never $0) and says why (charged_by).",
    ),
)
def outcome_per_dollar(context: dg.AssetExecutionContext, lake: LakeResource):
    days = days_of(context.partition_time_window)
    yield from assetkit.results(assetkit.build(per_dollar.outcome_per_dollar, lake.lake(), days))


@dg.asset(
    partitions_def=WEEKLY,
    deps=[
        dg.AssetDep(utilization_per_dollar, partition_mapping=DAY_TO_DAY),
        dg.AssetDep(cost_allocation, partition_mapping=DAY_TO_DAY),
        dg.AssetDep(outcome_per_dollar, partition_mapping=DAY_TO_DAY),
        dg.AssetDep("costs_daily", partition_mapping=DAY_TO_DAY),
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
def weekly_cost_report(
    context: dg.AssetExecutionContext,
    lake: LakeResource,
    report: ReportResource,
    slack: SlackBotResource,
    alerting: AlertingResource,
):
    from foxhunt_obs.lib.report.model import ReportLinks
    from foxhunt_obs.lib.tables.weekly import weekly_cost_report as build

    week_start = context.partition_time_window.start.date()
    # the report links to this run's trace (from the run's start) and its pods' logs, when the alerting
    # resource's FOXHUNT_TRACE_URL_TEMPLATE / FOXHUNT_LOGS_URL_TEMPLATE are set
    record = context.instance.get_run_record_by_id(context.run.run_id)
    started = record.start_time if record is not None and record.start_time else None
    links = ReportLinks(
        templates=alerting.links(),
        run_id=context.run.run_id,
        run_started=datetime.fromtimestamp(started, timezone.utc) if started else datetime.now(timezone.utc),
    )
    built = assetkit.build(
        build,
        lake.lake(),
        week_start,
        report.basis(),
        report.delivery(),
        slack_client=slack.get_client,
        links=links,
    )
    if built.extra["delivery_error"]:
        context.log.error(
            f"weekly_cost_report week={week_start}: delivery failed: {built.extra['delivery_error']}"
        )
    yield from assetkit.results(built)
