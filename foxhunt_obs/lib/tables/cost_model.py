"""The cost model (DESIGN §5) as SQL over the lake: cost_allocation, utilization_per_dollar and
outcome_per_dollar for one UTC day. The statements live beside this module in sql/.

A GPU-hour costs its node's cost for that hour (the instance's CUR line items when the bill is in, else
the price table × the seconds the node reported) ÷ the GPUs reporting on the node, and is charged to the
pod that held the GPU (then the pod's experiment) for the share of the hour it held it; the rest is
cluster idle. idle $ = allocated $ × (1 − active fraction). Lines of the bill on no node-hour go to their
Experiment tag, else are shared by the GPU-hours each experiment held that day.
"""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta, timezone
from functools import cache
from pathlib import Path

import duckdb
import pyarrow as pa

from foxhunt_obs.lib.analysis.prices import PriceTable
from foxhunt_obs.lib.analysis.training_health import mlflow_key
from foxhunt_obs.lib.names import SQL_PARAMETERS
from foxhunt_obs.lib.schemas import COST_ALLOCATION, NODE_SAMPLES, OUTCOME_PER_DOLLAR, UTILIZATION_PER_DOLLAR

SQL_DIR = Path(__file__).resolve().parent / "sql"


@cache
def sql(name: str) -> str:
    return (SQL_DIR / f"{name}.sql").read_text()


def _bounds(day: date) -> dict:
    """The statements' parameters: the day's bounds, the shared names, the MLflow key of success."""
    start = datetime.combine(day, time(), tzinfo=timezone.utc)
    return {
        **SQL_PARAMETERS,
        "success_rate_key": mlflow_key("success_rate"),
        "day": day,
        "key": day.isoformat(),
        "first_hour": NODE_SAMPLES.key(start),
        "last_hour": NODE_SAMPLES.key(start + timedelta(hours=23)),
        "day_start": start,
        "day_end": start + timedelta(days=1),
    }


def _params(statement: str, values: dict) -> dict:
    """Only the parameters the statement names: DuckDB refuses extra ones."""
    named = set(re.findall(r"\$(\w+)", statement))
    return {k: v for k, v in values.items() if k in named}


def _run(con: duckdb.DuckDBPyConnection, name: str, day: date, spec) -> pa.Table:
    statement = sql(name)
    table = con.execute(statement, _params(statement, _bounds(day))).to_arrow_table()
    return table.select(spec.schema.names).cast(spec.schema)


def register_prices(con: duckdb.DuckDBPyConnection, prices: PriceTable) -> None:
    """The EC2 on-demand prices as a view ec2_prices(instance_type, usd_per_hour)."""
    rows = [
        {"instance_type": p.key, "usd_per_hour": float(p.usd)}
        for p in prices.prices
        if p.service == "AmazonEC2" and p.unit == "hour"
    ]
    schema = pa.schema([("instance_type", pa.string()), ("usd_per_hour", pa.float64())])
    con.register("ec2_prices", pa.Table.from_pylist(rows, schema=schema))


def build_cost_allocation(con: duckdb.DuckDBPyConnection, day: date) -> pa.Table:
    """Needs views gpu_hourly, node_samples, costs_hourly, costs_daily and ec2_prices."""
    return _run(con, "cost_allocation", day, COST_ALLOCATION)


def build_utilization_per_dollar(con: duckdb.DuckDBPyConnection, day: date) -> pa.Table:
    """Needs the view cost_allocation (with the day's partition written)."""
    return _run(con, "utilization_per_dollar", day, UTILIZATION_PER_DOLLAR)


def build_outcome_per_dollar(con: duckdb.DuckDBPyConnection, day: date) -> pa.Table:
    """Needs views training_runs, training_metrics and cost_allocation (every day up to this one)."""
    return _run(con, "outcome_per_dollar", day, OUTCOME_PER_DOLLAR)
