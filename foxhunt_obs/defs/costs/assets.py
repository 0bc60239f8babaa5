"""Costs into the lake: CUR 2.0 line items, Cost Explorer, the price-table estimate and AWS Budgets.

costs_daily keeps the three sources side by side (column `source`) and never double counts within one:
Cost Explorer rows come from one tag breakdown whose pairs are checked against its own totals, CUR rows are
costs_hourly summed per resource, estimate rows are node-hours and file systems priced once each.
"""

from datetime import datetime, timezone

import dagster as dg

from foxhunt_obs import assetkit
from foxhunt_obs.defs.partitions import DAILY, days_of
from foxhunt_obs.defs.resources import (
    PROMETHEUS_POOL,
    AwsResource,
    CostsResource,
    FsxResource,
    LakeResource,
    PrometheusResource,
)
from foxhunt_obs.lib import schemas
from foxhunt_obs.lib.tables import costs as tables
from foxhunt_obs.lib.tables import spend


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.single_run(),  # a month's CUR files are read once per run
    group_name="costs",
    kinds={"aws", "s3", "parquet"},
    **assetkit.writes(
        schemas.COSTS_HOURLY,
        does="Read from the CUR 2.0 (Data Exports) files of each billing period's newest manifest; empty "
        "until an export's manifest exists.",
    ),
)
def costs_hourly(
    context: dg.AssetExecutionContext, lake: LakeResource, aws: AwsResource, costs: CostsResource
):
    days = days_of(context.partition_time_window)
    built = assetkit.build(tables.costs_hourly, lake.lake(), aws.client, days, costs.cur_s3_uri, costs.tags())
    assetkit.log(context, built)
    yield from assetkit.results(built)


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.single_run(),  # one Cost Explorer call chain for the whole window
    deps=[
        costs_hourly,
        dg.AssetDep("node_samples", partition_mapping=dg.TimeWindowPartitionMapping()),
        dg.AssetDep("fsx_metrics", partition_mapping=dg.TimeWindowPartitionMapping()),
    ],
    group_name="costs",
    kinds={"aws", "duckdb", "parquet"},
    check_specs=[
        dg.AssetCheckSpec(
            "no_double_counting",
            asset="costs_daily",
            description="per day and source, the rows sum to the source's own total (CE discovery, CUR lines)",
        ),
        dg.AssetCheckSpec(
            "price_table_current",
            asset="costs_daily",
            description="a warning when the price table's newest row is older than its max_age_days (90)",
        ),
    ],
    **assetkit.writes(
        schemas.COSTS_DAILY,
        does="ce from Cost Explorer, cur from costs_hourly, estimate from the price table × node-hours "
        "(node_samples) and FSx storage-hours (fsx_metrics).",
    ),
)
def costs_daily(
    context: dg.AssetExecutionContext,
    lake: LakeResource,
    aws: AwsResource,
    costs: CostsResource,
    fsx: FsxResource,
):
    days = days_of(context.partition_time_window)
    built = assetkit.build(
        tables.costs_daily,
        lake.lake(),
        aws.client,
        days,
        costs.tags(),
        fsx.ids(),
        costs.value("price_region"),
    )
    assetkit.log(context, built)
    yield from assetkit.results(built)


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.single_run(),
    group_name="costs",
    kinds={"aws", "parquet"},
    **assetkit.writes(
        schemas.BUDGETS,
        does="Syncs every budget of the account from AWS Budgets as it stands when the run starts and, with "
        "FOXHUNT_CE_FORECAST=1, adds Cost Explorer's forecast of the month; each day of the run gets that "
        "sync, so a day holds the values of its last run, not a history.",
    ),
)
def budgets(context: dg.AssetExecutionContext, lake: LakeResource, aws: AwsResource, costs: CostsResource):
    days = days_of(context.partition_time_window)
    forecast = costs.flag("ce_forecast")
    yield from assetkit.results(
        assetkit.build(tables.budgets, lake.lake(), aws.client, days, costs.tags(), forecast)
    )


@dg.asset(
    deps=["cost_allocation"],
    pool=PROMETHEUS_POOL,
    group_name="costs",
    kinds={"prometheus", "aws", "parquet"},
    check_specs=[
        dg.AssetCheckSpec(
            "month_complete",
            asset="spend_now",
            description="a warning when a day of the month is in neither the lake nor the live cost rules",
        ),
        dg.AssetCheckSpec(
            "live_matches_lake",
            asset="spend_now",
            description="a warning when a complete day's live $ differs from cost_allocation's by more than 2 %",
        ),
        dg.AssetCheckSpec(
            "untracked_listed",
            asset="spend_now",
            description="a warning when the EC2 instances outside the cluster could not be listed (EC2 access, kube_node_info)",
        ),
    ],
    **assetkit.writes(
        schemas.SPEND_NOW,
        does="Checks the live-vs-lake reconciliation of the last days. Pushed to the Pushgateway when "
        "FOXHUNT_PUSHGATEWAY_URL is set. Refreshed by spend_now_schedule.",
    ),
)
def spend_now(
    context: dg.AssetExecutionContext,
    lake: LakeResource,
    prometheus: PrometheusResource,
    aws: AwsResource,
    costs: CostsResource,
):
    from foxhunt_obs.lib.delivery.pushgateway import push_spend

    client = prometheus.client()
    built = assetkit.build(
        spend.spend_now,
        lake.lake(),
        client,
        costs.untracked(aws, client),
        datetime.now(timezone.utc),
        costs.value("pushgateway_url"),
        push_spend,
    )
    assetkit.log(context, built)
    yield from assetkit.results(built)
