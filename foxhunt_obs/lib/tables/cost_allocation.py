"""cost_allocation: each GPU-hour's dollars charged to the pod (and experiment) that held it, by the cost model
(docs/cost-model.md, the SQL in cost_model.py); one partition per UTC day, with the check that a day's
allocations sum to its bill."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import duckdb
import pyarrow as pa

from foxhunt_obs.lib.analysis.prices import PriceTable
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.names import CLUSTER_IDLE
from foxhunt_obs.lib.schemas import COST_ALLOCATION, COSTS_DAILY, COSTS_HOURLY, GPU_HOURLY, NODE_SAMPLES
from foxhunt_obs.lib.tables import Built, Check, md_table, row_count
from foxhunt_obs.lib.tables.cost_model import (
    bill_rates,
    build_cost_allocation,
    register_node_instances,
    register_prices,
)
from foxhunt_obs.lib.tables.per_day import query_written, write_per_day

BILL_TOLERANCE = 0.001  # allocations sum to the day's bill within 0.1 %


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

    tables = write_per_day(
        lake,
        days,
        [GPU_HOURLY, NODE_SAMPLES, COSTS_HOURLY, COSTS_DAILY],
        COST_ALLOCATION,
        build,
        # the instances in the week before each day (its bill_rates), read once for the run
        prepare=lambda con: register_node_instances(con, list(days)) if days else None,
    )
    per_day, by_experiment = query_written(
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
