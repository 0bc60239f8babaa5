"""The live cost estimate: rate × what ran, before Cost Explorer and CUR land (~24 h late).

GPU nodes: node-hours from node_samples (each row stands for step_seconds of a node that reported) × the
rate of the node's instance type: the effective rate the newest landed bill shows for it (Savings Plans,
Reserved Instances, spot: analysis/effective_rates.py), else the price table's on-demand list price.
costs_daily has no column for it (Cost Explorer's rows share the schema), so Estimate.basis says which
priced each row (effective / list; FSx rows: list) and costs_daily's metadata shows it. A node that does
not report (lost, replaced) is not billed by AWS either once its instance is gone, so counting reporting
time matches the bill. FSx for Lustre: the hours a file system published CloudWatch datapoints
(fsx_metrics) × its provisioned storage × the GB-month price of its deployment type and throughput tier,
prorated by the hours of the month (AWS's rule). Experiment attribution of shared nodes is not done here;
the rows carry no tags (the GPU-hour allocation does it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal

import pyarrow as pa

from foxhunt_obs.lib.analysis.effective_rates import EffectiveRates, hourly_rate
from foxhunt_obs.lib.analysis.prices import PriceTable, hours_in_month
from foxhunt_obs.lib.schemas import COSTS_DAILY, NODE_SAMPLES

# node-hours per node and instance type over one UTC day of node_samples (hour partitions of the day)
NODE_HOURS_SQL = """
SELECT node, coalesce(instance_type, '') AS instance_type, sum(step_seconds) / 3600.0 AS hours
FROM node_samples
WHERE hour >= $first_hour AND hour <= $last_hour
GROUP BY ALL ORDER BY node, instance_type
"""

# hours of the UTC day each file system reported its free capacity (one datapoint a period)
FSX_HOURS_SQL = """
SELECT file_system_id, count(DISTINCT ts) * any_value(period_seconds) / 3600.0 AS hours
FROM fsx_metrics
WHERE hour >= $first_hour AND hour <= $last_hour AND metric = 'FreeDataStorageCapacity'
GROUP BY ALL ORDER BY file_system_id
"""


@dataclass(frozen=True)
class StorageCapacity:
    """A file system as priced: FSx's id, deployment type, throughput tier, provisioned GiB and the hours
    of the day it existed."""

    id: str
    deployment_type: str
    per_unit_storage_throughput: int | None
    storage_capacity_gib: int
    hours: float = 24.0

    @property
    def price_key(self) -> str:
        tier = self.per_unit_storage_throughput or (200 if self.deployment_type == "SCRATCH_2" else "")
        return f"{self.deployment_type}/{tier}"


@dataclass
class Estimate:
    table: pa.Table
    unpriced: list[str]  # "node (instance type)" / "fs-id (key)" with no price: not in the estimate
    node_hours: float
    # instance type -> (basis, $/h, where the rate came from) for the EC2 rows priced
    ec2_rates: dict[str, tuple[str, float, str]] = field(default_factory=dict)
    basis: dict[str, str] = field(default_factory=dict)  # row's resource_id -> effective / list


def estimate_day(
    day: date,
    node_hours: Iterable[tuple[str, str, float]],
    file_systems: Iterable[StorageCapacity],
    prices: PriceTable,
    rates: EffectiveRates | None = None,
) -> Estimate:
    """``rates``: the effective rates of the bills landed so far (None: list prices only)."""
    rows: list[dict] = []
    unpriced: list[str] = []
    used: dict[str, tuple[str, float, str]] = {}
    basis: dict[str, str] = {}
    total_hours = 0.0
    for node, instance_type, hours in node_hours:
        total_hours += hours
        rate = hourly_rate(instance_type, prices, rates)
        if rate is None:
            unpriced.append(f"{node} ({instance_type or 'no instance type label'})")
            continue
        used[instance_type] = (rate.basis, float(rate.usd_per_hour), rate.source)
        rows.append(_row(day, "AmazonEC2", node, rate.usd_per_hour * Decimal(str(hours)), hours))
        basis[node] = rate.basis
    for fs in file_systems:
        if fs.hours <= 0:
            continue
        price = prices.find("AmazonFSx", fs.price_key)
        if price is None:
            unpriced.append(f"{fs.id} ({fs.price_key})")
            continue
        hours = Decimal(str(fs.hours))
        hourly = prices.per_hour(price, fs.storage_capacity_gib, day)
        gb_month = Decimal(fs.storage_capacity_gib) * hours / hours_in_month(day)
        rows.append(_row(day, "AmazonFSx", fs.id, hourly * hours, float(gb_month)))
        basis[fs.id] = "list"
    rows.sort(key=lambda r: (r["service"], r["resource_id"]))
    table = pa.Table.from_pylist(rows, schema=COSTS_DAILY.schema)
    return Estimate(table, unpriced, total_hours, dict(sorted(used.items())), basis)


def _row(day: date, service: str, resource_id: str, cost: Decimal, quantity: float) -> dict:
    usd = float(cost)
    return {
        "day": day,
        "source": "estimate",
        "project": "",
        "environment": "",
        "experiment": "",
        "service": service,
        "resource_id": resource_id,
        "cost_usd": usd,
        "amortized_usd": usd,
        "usage_quantity": quantity,
        "estimated": True,
    }


def _day_hours(day: date) -> dict[str, str]:
    first = datetime.combine(day, time(), tzinfo=timezone.utc)
    return {"first_hour": NODE_SAMPLES.key(first), "last_hour": NODE_SAMPLES.key(first + timedelta(hours=23))}


def node_hours(con, day: date) -> list[tuple[str, str, float]]:
    """(node, instance type, hours reported) over the UTC day, from a lake connection's node_samples."""
    return [tuple(r) for r in con.execute(NODE_HOURS_SQL, _day_hours(day)).fetchall()]


def file_system_hours(con, day: date) -> dict[str, float]:
    """file system id -> hours of the UTC day it published datapoints, from a connection's fsx_metrics."""
    return dict(con.execute(FSX_HOURS_SQL, _day_hours(day)).fetchall())
