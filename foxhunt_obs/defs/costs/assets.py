"""Costs into the lake: CUR 2.0 line items, Cost Explorer, the price-table estimate and AWS Budgets.

costs_daily keeps the three sources side by side (column `source`) and never double counts within one:
Cost Explorer rows come from one tag breakdown whose pairs are checked against its own totals, CUR rows are
costs_hourly summed per resource, estimate rows are node-hours and file systems priced once each.
"""

from datetime import date, datetime, timedelta, timezone

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_obs.defs.failures import failure
from foxhunt_obs.defs.gpu.assets import node_samples
from foxhunt_obs.defs.partitions import DAILY, days_of
from foxhunt_obs.defs.resources import AwsResource, LakeResource
from foxhunt_obs.defs.storage.assets import fsx_metrics
from foxhunt_obs.lib.analysis.cost_estimate import (
    StorageCapacity,
    estimate_day,
    file_system_hours,
    node_hours,
)
from foxhunt_obs.lib.analysis.prices import PriceError, load_price_table
from foxhunt_obs.lib.lake import LakeError
from foxhunt_obs.lib.schemas import BUDGETS, COSTS_DAILY, COSTS_HOURLY, FSX_METRICS, NODE_SAMPLES
from foxhunt_obs.lib.settings import cost_tags, csv_setting, env
from foxhunt_obs.lib.sources.budgets import BudgetsError, BudgetsSource, account_id, forecast_table
from foxhunt_obs.lib.sources.cost_explorer import CostExplorerError, CostExplorerSource
from foxhunt_obs.lib.sources.cur import CurError, CurSource
from foxhunt_obs.lib.sources.fsx import FsxSource, FsxSourceError

SOURCE_ERRORS = (CurError, CostExplorerError, BudgetsError, FsxSourceError, PriceError, LakeError)

# CUR line items of one day summed per resource and tag set: the `cur` rows of costs_daily
CUR_DAILY_SQL = """
SELECT CAST($day AS DATE) AS day, 'cur' AS source, project, environment, experiment, service, resource_id,
  sum(cost_usd) AS cost_usd, sum(amortized_usd) AS amortized_usd, sum(usage_amount) AS usage_quantity,
  false AS estimated
FROM costs_hourly WHERE day = $key
GROUP BY ALL ORDER BY project, environment, experiment, service, resource_id
"""


def _key(day: datetime) -> str:
    return day.strftime("%Y-%m-%d")


def _md(con: duckdb.DuckDBPyConnection, sql: str) -> dg.MetadataValue:
    df = con.execute(sql).fetch_df()
    return dg.MetadataValue.md(df.to_markdown(index=False) if len(df) else "none")


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.single_run(),  # a month's CUR files are read once per run
    group_name="costs",
    kinds={"aws", "s3", "parquet"},
    description=(
        "CUR 2.0 (Data Exports) line items per resource-hour from the newest manifest of each billing "
        "period, tags normalised. Empty until an export's manifest exists."
    ),
)
def costs_hourly(context: dg.AssetExecutionContext, lake: LakeResource, aws: AwsResource):
    store, window = lake.lake(), context.partition_time_window
    days = days_of(window)
    label = f"costs_hourly {_key(days[0])}..{_key(days[-1])}"
    uri = env("FOXHUNT_CUR_S3_URI")
    skipped: list[str] = []
    unmatched: dict = {}
    if uri:
        try:
            cur = CurSource(aws.client("s3"), uri, tag_keys=cost_tags())
            table, skipped = cur.line_items(window.start, window.end, partition=label)
            unmatched = cur.unmatched_tag_keys
        except CurError as e:
            raise failure(e) from None
    else:
        context.log.warning("costs_hourly: FOXHUNT_CUR_S3_URI is not set: no CUR, empty partitions")
        table = COSTS_HOURLY.schema.empty_table()
    if skipped:
        context.log.warning(f"{label}: no CUR manifest yet for {', '.join(skipped)}: not ingested")
    for key, periods in unmatched.items():
        context.log.warning(
            f"{label}: FOXHUNT_COST_TAGS key {key!r} matches no resource_tags key in {', '.join(periods)} "
            "(CUR 2.0 writes user_<snake_case>: is the tag activated, and spelled as in Billing?)"
        )
    try:
        for day in days:
            in_day = pc.and_(
                pc.greater_equal(table["hour"], pa.scalar(day, COSTS_HOURLY.schema.field("hour").type)),
                pc.less(
                    table["hour"], pa.scalar(day + timedelta(days=1), COSTS_HOURLY.schema.field("hour").type)
                ),
            )
            store.write_partition(COSTS_HOURLY, _key(day), table.filter(in_day))
    except LakeError as e:
        raise failure(e) from None
    con = duckdb.connect(":memory:")
    con.register("t", table)
    rows, total = con.execute("SELECT count(*), round(coalesce(sum(cost_usd), 0), 2) FROM t").fetchone()
    by_service = _md(
        con,
        """SELECT service, count(DISTINCT resource_id) AS resources, round(sum(cost_usd), 2) AS cost_usd,
                  round(sum(amortized_usd), 2) AS amortized_usd FROM t GROUP BY service ORDER BY cost_usd DESC""",
    )
    con.close()
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": dg.MetadataValue.int(rows),
            "cost_usd": dg.MetadataValue.float(total),
            "by_service": by_service,
            "cur_export": dg.MetadataValue.text(uri or "not configured (FOXHUNT_CUR_S3_URI)"),
            "billing_periods_without_manifest": dg.MetadataValue.text(", ".join(skipped) or "none"),
            "unmatched_tag_keys": dg.MetadataValue.json(unmatched),
        }
    )


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.single_run(),  # one Cost Explorer call chain for the whole window
    deps=[
        costs_hourly,
        dg.AssetDep(node_samples, partition_mapping=dg.TimeWindowPartitionMapping()),
        dg.AssetDep(fsx_metrics, partition_mapping=dg.TimeWindowPartitionMapping()),
    ],
    group_name="costs",
    kinds={"aws", "duckdb", "parquet"},
    check_specs=[
        dg.AssetCheckSpec(
            "no_double_counting",
            asset="costs_daily",
            description="per day and source, the rows sum to the source's own total (CE discovery, CUR lines)",
        )
    ],
    description=(
        "Daily cost by source (ce = Cost Explorer, cur = CUR 2.0, estimate = price table × node-hours from "
        "node_samples and FSx storage-hours from fsx_metrics), project/environment/experiment tag, service "
        "and resource."
    ),
)
def costs_daily(context: dg.AssetExecutionContext, lake: LakeResource, aws: AwsResource):
    store, window = lake.lake(), context.partition_time_window
    days = days_of(window)
    label = f"costs_daily {_key(days[0])}..{_key(days[-1])}"
    ce = CostExplorerSource(aws.client("ce"), tag_keys=cost_tags())
    try:
        ce_table = ce.daily_costs(days[0].date(), days[-1].date() + timedelta(days=1), partition=label)
        file_systems = FsxSource(aws.client("fsx"), aws.client("cloudwatch")).file_systems(
            csv_setting("FOXHUNT_FSX_IDS") or None
        )
        prices = load_price_table(env("FOXHUNT_PRICE_REGION"))
    except SOURCE_ERRORS as e:
        raise failure(e) from None
    lake_con = store.connect([COSTS_HOURLY, NODE_SAMPLES, FSX_METRICS])
    tables, unpriced, cur_totals = {}, set(), {}
    try:
        for day in days:
            key = _key(day)
            cur = lake_con.execute(CUR_DAILY_SQL, {"day": day.date(), "key": key}).to_arrow_table()
            cur_totals[key] = lake_con.execute(
                "SELECT coalesce(sum(cost_usd), 0) FROM costs_hourly WHERE day = $key", {"key": key}
            ).fetchone()[0]
            fs_hours = file_system_hours(lake_con, day.date())
            capacities = [
                StorageCapacity(
                    f.id,
                    f.deployment_type,
                    f.per_unit_storage_throughput,
                    f.storage_capacity_gib,
                    fs_hours.get(f.id, 0.0),
                )
                for f in file_systems
            ]
            estimate = estimate_day(day.date(), node_hours(lake_con, day.date()), capacities, prices)
            unpriced.update(estimate.unpriced)
            ce_day = ce_table.filter(pc.equal(ce_table["day"], pa.scalar(day.date(), pa.date32())))
            tables[key] = pa.concat_tables(
                [
                    t.select(COSTS_DAILY.schema.names).cast(COSTS_DAILY.schema)
                    for t in (ce_day, cur, estimate.table)
                ]
            )
    finally:
        lake_con.close()
    try:
        for key, table in tables.items():
            store.write_partition(COSTS_DAILY, key, table)
    except LakeError as e:
        raise failure(e) from None
    if unpriced:
        context.log.warning(f"{label}: no price for {', '.join(sorted(unpriced))}: left out of the estimate")
    con = duckdb.connect(":memory:")
    con.register("t", pa.concat_tables(tables.values()))
    rows = con.execute("SELECT count(*) FROM t").fetchone()[0]
    gap = _md(
        con,
        """SELECT day, round(sum(cost_usd) FILTER (WHERE source = 'estimate'), 2) AS estimate_usd,
                  round(sum(cost_usd) FILTER (WHERE source = 'cur'), 2) AS cur_usd,
                  round(sum(cost_usd) FILTER (WHERE source = 'ce'), 2) AS ce_usd,
                  round(100 * (sum(cost_usd) FILTER (WHERE source = 'estimate')
                        / nullif(sum(cost_usd) FILTER (WHERE source = 'cur'), 0) - 1), 2) AS estimate_vs_cur_pct
           FROM t GROUP BY day ORDER BY day""",
    )
    by_experiment = _md(
        con,
        """SELECT day, source, coalesce(nullif(experiment, ''), '(no Experiment tag)') AS experiment,
                  round(sum(cost_usd), 2) AS cost_usd FROM t WHERE source <> 'estimate'
           GROUP BY ALL ORDER BY day, source, experiment""",
    )
    sums = con.execute("SELECT day::VARCHAR, source, sum(cost_usd) FROM t GROUP BY ALL").fetchall()
    con.close()
    yield dg.MaterializeResult(
        metadata={
            "dagster/row_count": dg.MetadataValue.int(rows),
            "estimate_vs_bill": gap,
            "by_experiment_tag": by_experiment,
            "cost_explorer_calls": dg.MetadataValue.int(ce.calls),
            "cost_explorer_usd_spent": dg.MetadataValue.float(round(ce.calls * 0.01, 2)),
            "unpriced": dg.MetadataValue.text(", ".join(sorted(unpriced)) or "none"),
        }
    )
    yield _double_counting_check(sums, ce.day_totals, cur_totals)


def _double_counting_check(sums, ce_totals: dict[date, float], cur_totals: dict[str, float]):
    """Rows vs the sources' own totals; half a cent of float rounding allowed."""
    want = {(d.isoformat(), "ce"): float(v) for d, v in ce_totals.items()}
    want.update({(k, "cur"): float(v) for k, v in cur_totals.items()})
    got = {(d, s): v for d, s, v in sums}
    bad = [
        f"{d} {s}: rows {got.get((d, s), 0.0):.4f} vs source {v:.4f}"
        for (d, s), v in sorted(want.items())
        if abs(got.get((d, s), 0.0) - v) > 0.005
    ]
    return dg.AssetCheckResult(
        check_name="no_double_counting",
        passed=not bad,
        metadata={"mismatches": dg.MetadataValue.text("\n".join(bad) or "none"), "checked": len(want)},
    )


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.single_run(),
    group_name="costs",
    kinds={"aws", "parquet"},
    description=(
        "AWS Budgets as reported when synced: limit, actual and forecasted spend per budget (and Cost "
        "Explorer's month forecast when FOXHUNT_CE_FORECAST=1). Past partitions hold the sync's values."
    ),
)
def budgets(context: dg.AssetExecutionContext, lake: LakeResource, aws: AwsResource):
    store = lake.lake()
    days = days_of(context.partition_time_window)
    synced_at = datetime.now(timezone.utc).replace(microsecond=0)
    tables = {}
    try:
        source = BudgetsSource(aws.client("budgets"), account_id(aws.client("sts")))
        forecast = None
        if env("FOXHUNT_CE_FORECAST") in ("1", "true", "yes"):
            ce = CostExplorerSource(aws.client("ce"), tag_keys=cost_tags())
            forecast = ce.forecast(synced_at.date(), partition=f"budgets {synced_at.date()}")
        for day in days:
            table = source.budgets(day.date(), partition=f"budgets {_key(day)}", synced_at=synced_at)
            if forecast is not None:
                table = pa.concat_tables(
                    [table, forecast_table(forecast, day.date(), source.account_id, synced_at)]
                )
            store.write_partition(BUDGETS, _key(day), table)
            tables[_key(day)] = table
    except SOURCE_ERRORS as e:
        raise failure(e) from None
    last = list(tables.values())[-1].to_pandas()
    for col in ("limit_usd", "actual_usd", "forecast_usd"):
        last[col] = last[col].round(2)
    view = last[["source", "budget_name", "time_unit", "limit_usd", "actual_usd", "forecast_usd"]]
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": dg.MetadataValue.int(sum(t.num_rows for t in tables.values())),
            "budgets": dg.MetadataValue.md(view.to_markdown(index=False) if len(view) else "none"),
            "synced_at": dg.MetadataValue.text(synced_at.isoformat()),
        }
    )
