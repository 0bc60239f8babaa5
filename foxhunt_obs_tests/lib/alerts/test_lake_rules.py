"""The alert tick's lake rules (lib/alerts/collect.py _lake_rules) share one connection per tick, over the
tables the enabled rules read and no other: a table that cannot be read stops the lake rules only when one
of them reads it."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

from foxhunt_obs.lib.alerts.collect import Sources, collect
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import COSTS_DAILY

NOW = datetime(2026, 11, 23, 12, tzinfo=timezone.utc)


def _lake(tmp_path) -> Lake:
    """costs_daily of 15 days, the last one three times the others' (a spike), and a spend_now partition
    that is no Parquet file."""
    lake = Lake(str(tmp_path / "lake"))
    for d in range(8, 23):
        day = f"2026-11-{d:02d}"
        rows = [{"day": day, "source": "cur", "project": "rl", "cost_usd": 3000.0 if d == 22 else 1000.0}]
        table = pa.Table.from_pylist(rows)
        full = pa.table(
            {f.name: table[f.name].cast(f.type) if f.name in table.column_names else pa.nulls(1, f.type)
             for f in COSTS_DAILY.schema},
            schema=COSTS_DAILY.schema,
        )  # fmt: skip
        lake.write_partition(COSTS_DAILY, day, full)
    broken = tmp_path / "lake" / "spend_now" / "day=2026-11-23" / "part-0.parquet"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not parquet")
    return lake


def test_an_unreadable_spend_now_stops_the_lake_rules_only_when_budget_burn_reads_it(tmp_path):
    lake = _lake(tmp_path)
    rules = {r.id: r for r in load_rules() if r.source == "lake"}
    alone = collect([rules["cost_spike"]], Sources(lake=lake), NOW)
    assert alone.errors == {} and alone.evaluated == {"cost_spike"}
    assert [f.labels.get("project") for f in alone.findings] == ["rl"]  # the 2026-11-22 spike

    both = collect([rules["cost_spike"], rules["budget_burn"]], Sources(lake=lake), NOW)
    assert both.evaluated == set()  # their alerts keep their state
    assert "spend_now/day=2026-11-23" in both.errors["lake"]  # the file that failed, named
