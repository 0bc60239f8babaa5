"""What the daily derived tables share: a table written one partition per UTC day over one lake connection
(`write_per_day`), and a query over the partitions just written (`query_written`) for the asset's figures."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import pyarrow as pa

from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import TableSpec


def write_per_day(
    lake: Lake, days: Sequence[datetime], reads: list[TableSpec], spec: TableSpec, build, prepare=None
) -> dict:
    """Each day: `build(connection over reads, day)` written as the day's partition of spec. One
    connection for all the days: each connection lists every partition of the tables it reads (on S3,
    listings and a dataset per table: a connection per day made cost_allocation 5x slower there). Its
    views are the partitions as they were when it opened, which holds because no table reads itself."""
    if spec in reads:
        raise ValueError(f"{spec.name} reads itself: a connection opened once would not see its own writes")
    out = {}
    con = lake.connect(reads)
    try:
        if prepare is not None:
            prepare(con)  # what every day needs, once
        for day in days:
            table = build(con, day)
            lake.write_partition(spec, spec.key(day), table)
            out[spec.key(day)] = table
    finally:
        con.close()
    return out


def query_written(tables: dict[str, pa.Table], *statements: str):
    """Run statements over the written partitions as the view t; each answer as a DataFrame."""
    with scratch(t=pa.concat_tables(tables.values())) as con:
        return [con.execute(s).fetch_df() for s in statements]
