"""The cost tables, one function each: CUR 2.0 line items, Cost Explorer, the price-table estimate and AWS Budgets.

costs_daily keeps the three sources side by side (column `source`) and never double counts within one:
Cost Explorer rows come from one tag breakdown whose pairs are checked against its own totals, CUR rows are
costs_hourly summed per resource, estimate rows are node-hours and file systems priced once each.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta, timezone

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_obs.lib.analysis.cost_estimate import (
    StorageCapacity,
    estimate_day,
    file_system_hours,
    node_hours,
)
from foxhunt_obs.lib.analysis.prices import PriceTable, load_price_table
from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import BUDGETS, COSTS_DAILY, COSTS_HOURLY, FSX_METRICS, NODE_SAMPLES
from foxhunt_obs.lib.sources.budgets import BudgetsSource, account_id, forecast_table
from foxhunt_obs.lib.sources.cost_explorer import CostExplorerSource
from foxhunt_obs.lib.sources.cur import CurSource
from foxhunt_obs.lib.sources.fsx import FsxSource
from foxhunt_obs.lib.tables import Built, Check, Markdown, md_table, row_count
from foxhunt_obs.lib.tables.cost_model import bill_rates

# CUR line items of one day summed per resource and tag set: the `cur` rows of costs_daily
CUR_DAILY_SQL = """
SELECT CAST($day AS DATE) AS day, 'cur' AS source, project, environment, experiment, service, resource_id,
  sum(cost_usd) AS cost_usd, sum(amortized_usd) AS amortized_usd, sum(usage_amount) AS usage_quantity,
  false AS estimated
FROM costs_hourly WHERE day = $key
GROUP BY ALL ORDER BY project, environment, experiment, service, resource_id
"""


def _md(con: duckdb.DuckDBPyConnection, sql: str) -> Markdown:
    return md_table(con.execute(sql).fetch_df(), floatfmt=None)


def costs_hourly(
    lake: Lake, client: Callable[[str], object], days: Sequence[datetime], cur_uri: str, tag_keys: tuple
) -> Built:
    label = f"costs_hourly {COSTS_HOURLY.key(days[0])}..{COSTS_HOURLY.key(days[-1])}"
    start, end = days[0], days[-1] + timedelta(days=1)
    skipped: list[str] = []
    unmatched: dict = {}
    log: list[tuple[str, str]] = []
    if cur_uri:
        cur = CurSource(client("s3"), cur_uri, tag_keys=tag_keys)
        table, skipped = cur.line_items(start, end, partition=label)
        unmatched = cur.unmatched_tag_keys
    else:
        log.append(("warning", "costs_hourly: FOXHUNT_CUR_S3_URI is not set: no CUR, empty partitions"))
        table = COSTS_HOURLY.schema.empty_table()
    if skipped:
        log.append(("warning", f"{label}: no CUR manifest yet for {', '.join(skipped)}: not ingested"))
    for key, periods in unmatched.items():
        log.append(
            (
                "warning",
                f"{label}: FOXHUNT_COST_TAGS key {key!r} matches no resource_tags key in {', '.join(periods)} "
                "(CUR 2.0 writes user_<snake_case>: is the tag activated, and spelled as in Billing?)",
            )
        )
    hour_type = COSTS_HOURLY.schema.field("hour").type
    tables = {}
    for day in days:
        in_day = pc.and_(
            pc.greater_equal(table["hour"], pa.scalar(day, hour_type)),
            pc.less(table["hour"], pa.scalar(day + timedelta(days=1), hour_type)),
        )
        tables[COSTS_HOURLY.key(day)] = table.filter(in_day)
        lake.write_partition(COSTS_HOURLY, COSTS_HOURLY.key(day), tables[COSTS_HOURLY.key(day)])
    with scratch(t=table) as con:
        rows, total = con.execute("SELECT count(*), round(coalesce(sum(cost_usd), 0), 2) FROM t").fetchone()
        by_service = _md(
            con,
            """SELECT service, count(DISTINCT resource_id) AS resources, round(sum(cost_usd), 2) AS cost_usd,
                      round(sum(amortized_usd), 2) AS amortized_usd FROM t GROUP BY service ORDER BY cost_usd DESC""",
        )
    summary = {
        "dagster/row_count": int(rows),
        "cost_usd": float(total),
        "by_service": by_service,
        "cur_export": cur_uri or "not configured (FOXHUNT_CUR_S3_URI)",
        "billing_periods_without_manifest": ", ".join(skipped) or "none",
        "unmatched_tag_keys": unmatched,
    }
    return Built(tables, summary, extra={"log": log})


def costs_daily(
    lake: Lake,
    client: Callable[[str], object],
    days: Sequence[datetime],
    tag_keys: tuple,
    fsx_ids: list[str] | None,
    price_region: str,
) -> Built:
    label = f"costs_daily {COSTS_DAILY.key(days[0])}..{COSTS_DAILY.key(days[-1])}"
    ce = CostExplorerSource(client("ce"), tag_keys=tag_keys)
    ce_table = ce.daily_costs(days[0].date(), days[-1].date() + timedelta(days=1), partition=label)
    file_systems = FsxSource(client("fsx"), client("cloudwatch")).file_systems(fsx_ids)
    prices = load_price_table(price_region)
    lake_con = lake.connect([COSTS_HOURLY, NODE_SAMPLES, FSX_METRICS])
    tables, unpriced, cur_totals = {}, set(), {}
    rate_rows: list[dict] = []
    unknown_region_lines = 0
    try:
        for day in days:
            key = COSTS_DAILY.key(day)
            cur = lake_con.execute(CUR_DAILY_SQL, {"day": day.date(), "key": key}).to_arrow_table()
            cur_totals[key] = lake_con.execute(
                "SELECT coalesce(sum(cost_usd), 0) FROM costs_hourly WHERE day = $key", {"key": key}
            ).fetchone()[0]
            fs_hours = file_system_hours(lake_con, day.date())
            capacities = [
                StorageCapacity(
                    f.id, f.deployment_type, f.per_unit_storage_throughput, f.storage_capacity_gib,
                    fs_hours.get(f.id, 0.0),
                )
                for f in file_systems
            ]  # fmt: skip
            rates = bill_rates(lake_con, day)
            unknown_region_lines += rates.unknown_region_lines
            estimate = estimate_day(day.date(), node_hours(lake_con, day.date()), capacities, prices, rates)
            unpriced.update(estimate.unpriced)
            for itype, (basis, usd, source) in estimate.ec2_rates.items():
                rate_rows.append({"day": key, "instance_type": itype, "price_basis": basis,
                                  "usd_per_hour": round(usd, 6), "from": source})  # fmt: skip
            ce_day = ce_table.filter(pc.equal(ce_table["day"], pa.scalar(day.date(), pa.date32())))
            tables[key] = pa.concat_tables(
                [
                    t.select(COSTS_DAILY.schema.names).cast(COSTS_DAILY.schema)
                    for t in (ce_day, cur, estimate.table)
                ]
            )
    finally:
        lake_con.close()
    for key, table in tables.items():
        lake.write_partition(COSTS_DAILY, key, table)
    log = (
        [("warning", f"{label}: no price for {', '.join(sorted(unpriced))}: left out of the estimate")]
        if unpriced
        else []
    )
    with scratch(t=pa.concat_tables(tables.values())) as con:
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
    summary = {
        "dagster/row_count": int(rows),
        "estimate_vs_bill": gap,
        "by_experiment_tag": by_experiment,
        "cost_explorer_calls": int(ce.calls),
        "cost_explorer_usd_spent": round(ce.cost_usd, 2),
        "unpriced": ", ".join(sorted(unpriced)) or "none",
        # which rate priced each instance type's estimate rows: effective (the newest landed bill's
        # amortized $ per instance-hour) or list (the price table, no bill yet)
        "estimate_price_basis": (
            md_table(pd.DataFrame(rate_rows), floatfmt=None) if rate_rows else "no EC2 rows"
        ),
        "cur_lines_of_unknown_region": unknown_region_lines,
    }
    checks = [
        double_counting_check(sums, ce.day_totals, cur_totals),
        price_table_check(prices, datetime.now(timezone.utc).date()),
    ]
    return Built(tables, summary, checks, extra={"log": log})


def price_table_check(prices: PriceTable, today: date) -> Check:
    """A WARN when the price table's newest row is older than its max_age_days: the estimate (and the
    live cost rules) would price today's hours at a list AWS may have changed."""
    age = prices.age_days(today)
    newest = max(p.as_of for p in prices.prices)
    return Check(
        "price_table_current",
        prices.max_age_days is None or age <= prices.max_age_days,
        {"newest_as_of": newest.isoformat(), "age_days": age, "max_age_days": prices.max_age_days,
         "region": prices.region, "table": prices.path},
        severity="WARN",
    )  # fmt: skip


def double_counting_check(sums, ce_totals: dict[date, float], cur_totals: dict[str, float]) -> Check:
    """Rows vs the sources' own totals; half a cent of float rounding allowed."""
    want = {(d.isoformat(), "ce"): float(v) for d, v in ce_totals.items()}
    want.update({(k, "cur"): float(v) for k, v in cur_totals.items()})
    got = {(d, s): v for d, s, v in sums}
    bad = [
        f"{d} {s}: rows {got.get((d, s), 0.0):.4f} vs source {v:.4f}"
        for (d, s), v in sorted(want.items())
        if abs(got.get((d, s), 0.0) - v) > 0.005
    ]
    return Check(
        "no_double_counting", not bad, {"mismatches": "\n".join(bad) or "none", "checked": len(want)}
    )


def budgets(
    lake: Lake, client: Callable[[str], object], days: Sequence[datetime], tag_keys: tuple, ce_forecast: bool
) -> Built:
    synced_at = datetime.now(timezone.utc).replace(microsecond=0)
    tables = {}
    source = BudgetsSource(client("budgets"), account_id(client("sts")))
    forecast = None
    if ce_forecast:
        ce = CostExplorerSource(client("ce"), tag_keys=tag_keys)
        forecast = ce.forecast(synced_at.date(), partition=f"budgets {synced_at.date()}")
    for day in days:
        key = BUDGETS.key(day)
        table = source.budgets(day.date(), partition=f"budgets {key}", synced_at=synced_at)
        if forecast is not None:
            table = pa.concat_tables(
                [table, forecast_table(forecast, day.date(), source.account_id, synced_at)]
            )
        lake.write_partition(BUDGETS, key, table)
        tables[key] = table
    last = list(tables.values())[-1].to_pandas()
    for col in ("limit_usd", "actual_usd", "forecast_usd"):
        last[col] = last[col].round(2)
    view = last[["source", "budget_name", "time_unit", "limit_usd", "actual_usd", "forecast_usd"]]
    summary = {
        "dagster/row_count": row_count(tables),
        "budgets": md_table(view, floatfmt=None),
        "synced_at": synced_at.isoformat(),
    }
    return Built(tables, summary)
