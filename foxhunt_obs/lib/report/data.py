"""The weekly cost report's input, read from the lake (utilization_per_dollar, cost_allocation,
outcome_per_dollar, costs_daily) for one week starting Monday 00:00 UTC by the named statements of
tables/sql/weekly.sql; the frames come out as render_weekly_report expects them (WeeklyReportData)."""

from __future__ import annotations

import math
import re
from datetime import date, timedelta
from functools import cache

import duckdb
import pandas as pd

from foxhunt_obs.lib.names import CLUSTER_IDLE, SQL_PARAMETERS
from foxhunt_obs.lib.report.model import WeeklyReportData
from foxhunt_obs.lib.tables.cost_model import SQL_DIR


@cache
def statements() -> dict[str, str]:
    """weekly.sql's statements by name (its `-- name: …` lines)."""
    text = (SQL_DIR / "weekly.sql").read_text()
    parts = re.split(r"^-- name: (\w+)\n", text, flags=re.M)
    return {name: body.strip().rstrip(";") for name, body in zip(parts[1::2], parts[2::2])}


def _frame(con: duckdb.DuckDBPyConnection, name: str, first: date, last: date) -> pd.DataFrame:
    sql = statements()[name]
    values = {"first": first.isoformat(), "last": last.isoformat(), **SQL_PARAMETERS}
    # DuckDB refuses a parameter the statement does not name: pass the statement's own
    named = set(re.findall(r"\$(\w+)", sql))
    return con.execute(sql, {k: v for k, v in values.items() if k in named}).fetch_df()


def weekly_report_data(
    con: duckdb.DuckDBPyConnection, week_start: date, activity_basis: str, alerts: pd.DataFrame | None = None
) -> WeeklyReportData:
    """The week's figures; activity_basis (util or sm) is the headline's basis of active GPU-hours."""
    if week_start.weekday() != 0:
        raise ValueError(f"weekly report: {week_start} is not a Monday (weeks start Monday 00:00 UTC)")
    last = week_start + timedelta(days=6)
    experiments = _frame(con, "experiments", week_start, last)
    previous = _frame(con, "experiments", week_start - timedelta(days=7), week_start - timedelta(days=1))
    bill = _frame(con, "bill", week_start, last).iloc[0]
    # the bill: CUR when it has landed, else Cost Explorer; NaN before either
    bill_usd = bill.cur_usd if bill.cur_rows else (bill.ce_usd if bill.ce_rows else math.nan)
    covered = bill.cur_estimated_services_usd if bill.cur_rows else math.nan
    is_cluster = experiments.experiment == CLUSTER_IDLE
    totals = {
        "bill_usd": float(bill_usd),
        "estimate_usd": float(bill.estimate_usd),
        "allocated_usd": float(experiments.loc[~is_cluster, "allocated_usd"].sum()),
        "idle_usd": float(experiments.idle_usd.sum()),
        "unallocated_usd": float(experiments.loc[is_cluster, "allocated_usd"].sum()),
        "unknown_activity_usd": float(experiments.unknown_activity_usd.sum()),
        "gap_pct": float(100 * (bill.estimate_usd / covered - 1))
        if covered and covered == covered
        else math.nan,
    }
    return WeeklyReportData(
        week_start=week_start,
        daily=_frame(con, "daily", week_start, last),
        experiments=experiments,
        previous=previous if len(previous) else None,
        wastes=_frame(con, "wastes", week_start, last),
        outcomes=_frame(con, "outcomes", week_start, last),
        totals=totals,
        alerts=alerts,
        activity_basis=activity_basis,
    )
