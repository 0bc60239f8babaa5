"""The cost model (docs/cost-model.md) as SQL over the lake: cost_allocation, utilization_per_dollar and
outcome_per_dollar for one UTC day. The statements live beside this module in sql/.

A GPU-hour costs its node's cost for that hour (the instance's CUR line items when the bill is in, else
the seconds the node reported × the effective rate the newest landed bill shows for its type, else × the
price table's on-demand price) ÷ the GPUs reporting on the node, and is charged to the
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
import pyarrow.compute as pc

from foxhunt_obs.lib.analysis.effective_rates import EffectiveRates, effective_rates, hourly_rate
from foxhunt_obs.lib.analysis.prices import PriceTable
from foxhunt_obs.lib.analysis.training_health import mlflow_key
from foxhunt_obs.lib.names import SQL_PARAMETERS
from foxhunt_obs.lib.schemas import (
    COST_ALLOCATION,
    COSTS_DAILY,
    NODE_SAMPLES,
    OUTCOME_PER_DOLLAR,
    UTILIZATION_PER_DOLLAR,
)

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


# The bill days whose EC2 instance-hour lines give a day's effective rates (the newest day per type wins).
# Only the cluster's own nodes count (node_samples' instance ids): an on-demand stray of the same type
# outside the cluster would pull a Savings Plan covered fleet's rate towards the list price.
RATE_WINDOW_DAYS = 7
EC2_LINES_SQL = """
SELECT hour, service, line_item_type, usage_type, instance_type, usage_amount, amortized_usd, resource_id
FROM costs_hourly WHERE day >= $first AND day <= $key AND service = 'AmazonEC2' AND instance_type <> ''
"""
# the cluster's instances in the window: from node_samples, or from node_instance_hours (below) when a run
# prices several days
_INSTANCES = {
    # the partition key first: only the window's hours are listed and read (on S3, a filter on ts alone
    # read every partition of the table, for every day)
    False: """SELECT DISTINCT instance_id FROM node_samples WHERE hour >= $since_hour AND hour < $until_hour
              AND instance_id <> '' AND ts >= $since AND ts < $until""",
    True: "SELECT DISTINCT instance_id FROM node_instance_hours WHERE hour >= $since_hour AND hour < $until_hour",
}


def _rate_window(day: datetime) -> tuple[datetime, datetime]:
    until = datetime.combine(day.date(), time(), tzinfo=timezone.utc) + timedelta(days=1)
    return until - timedelta(days=RATE_WINDOW_DAYS), until


def register_node_instances(con: duckdb.DuckDBPyConnection, days: list[datetime]) -> None:
    """node_instance_hours(hour, instance_id): the instances node_samples saw in each hour of the days'
    rate windows, once for a run of several days (each day's bill_rates reads a week of node_samples)."""
    since, until = _rate_window(min(days))[0], _rate_window(max(days))[1]
    con.execute(
        """CREATE OR REPLACE TEMP TABLE node_instance_hours AS
           SELECT DISTINCT hour, instance_id FROM node_samples
           WHERE hour >= $a AND hour < $b AND instance_id <> '' AND ts >= $since AND ts < $until""",
        {"a": NODE_SAMPLES.key(since), "b": NODE_SAMPLES.key(until), "since": since, "until": until},
    )


def bill_rates(con: duckdb.DuckDBPyConnection, day: datetime, node_instances: bool = False) -> EffectiveRates:
    """The effective rates (analysis/effective_rates.py) of the bills landed in the RATE_WINDOW_DAYS up to
    ``day``, over the cluster's nodes: what the estimate and the cost allocation price an instance-hour at
    before its own bill is in. Needs the views costs_hourly and node_samples (node_instances: the table
    register_node_instances made instead)."""
    since, until = _rate_window(day)
    params = {
        "first": COSTS_DAILY.key(since),
        "key": COSTS_DAILY.key(day),
        "since": since,
        "until": until,
        "since_hour": NODE_SAMPLES.key(since),
        "until_hour": NODE_SAMPLES.key(until),
    }
    instances = _INSTANCES[node_instances]
    ours = con.execute(instances, _params(instances, params)).to_arrow_table().column(0)
    lines = con.execute(EC2_LINES_SQL, _params(EC2_LINES_SQL, params)).to_arrow_table()
    # filtered here, not by a join in SQL: DuckDB pushes a small join's bloom filter into the scans, which
    # a pyarrow dataset (the lake on S3) refuses
    lines = lines.filter(pc.is_in(lines.column("resource_id"), value_set=ours.combine_chunks()))
    return effective_rates(lines, until=day + timedelta(days=1))


def register_prices(
    con: duckdb.DuckDBPyConnection, prices: PriceTable, rates: EffectiveRates | None = None
) -> None:
    """The EC2 hourly rates as a view ec2_prices(instance_type, usd_per_hour): each type's effective rate
    once a bill shows one (``rates``), else the price table's on-demand price (analysis hourly_rate)."""
    types = {p.key for p in prices.prices if p.service == "AmazonEC2" and p.unit == "hour"}
    if rates is not None:
        types |= set(rates.for_region(prices.region))
    rows = [
        {"instance_type": t, "usd_per_hour": float(rate.usd_per_hour)}
        for t in sorted(types)
        if (rate := hourly_rate(t, prices, rates)) is not None
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
