"""gpu_samples -> gpu_hourly: one row per GPU-hour (or MIG slice-hour) of a UTC day and per holder.

Each pod that held the GPU in the hour gets a row of its own with its held seconds, active GPU-seconds
and energy; what no pod held is a row with pod '' (cluster idle). A hand-off at 14:20 gives the first
pod 20 minutes and the second 40. A time-sliced GPU (several pods' copies of its series at one step,
gpu_samples.step_share 1/k each) splits each step evenly over the k pods present.

A MIG slice is its own unit with its gpu_share of the GPU: its active GPU-seconds are weighed by the
share, and its GPU's energy is split over the slices present by their shares, so sums over rows count
every GPU once. Within a unit-hour, the energy goes to its holders by the power each drew over its
seconds (by their seconds where no power was reported). Activity no source reported (util NULL) is
unknown, not idle: activity_seconds says how many of a row's seconds had a util value; the same for SM
activity (sm_activity_seconds).

Counter deltas (ECC, energy) are the samples' increments (counter_increments.py: a decrease counts as a
reset; a day looks back no further than the hour before it). The rows are made from the hours' parts
(gpu_hour_parts.py), which the ingest keeps in each gpu_samples partition's footer: a day reads 25 small
footers, not its samples. Partitions without parts have them computed from their samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.schemas import GPU_HOURLY
from foxhunt_obs.lib.tables.counter_increments import COUNTERS, INCREMENTS
from foxhunt_obs.lib.tables.gpu_hour_parts import hours_to_read, read_parts


def _increment(now: str, before: str) -> str:
    """SQL: the increment from reading `before` to `now`, as in_hour_increments counts it."""
    return (
        f"CASE WHEN NOT coalesce(isfinite({now}) AND isfinite({before}), false) THEN 0.0 "
        f"WHEN {now} - {before} < 0 THEN {now} ELSE {now} - {before} END"
    )


_UNIT = ["node", "gpu", "uuid", "gpu_instance"]
_PER_HOUR = f"""
WITH unit_hour AS (
  SELECT hour_no, {", ".join(_UNIT)},
    {", ".join(f"any_value(first_{c}) FILTER (WHERE takes_first) AS first_{c}" for c in COUNTERS)},
    {", ".join(f"any_value(last_{c}) FILTER (WHERE holds_last) AS last_{c}" for c in COUNTERS)}
  FROM parts GROUP BY ALL
),
after AS (
  SELECT hour_no, {", ".join(_UNIT)}, lag(hour_no) OVER w AS hour_before,
    {", ".join(f"first_{c}, lag(last_{c}) OVER w AS before_{c}" for c in COUNTERS)}
  FROM unit_hour WINDOW w AS (PARTITION BY {", ".join(_UNIT)} ORDER BY hour_no)
),
-- the increment from the unit's last reading before the hour, from the hour before the day on
boundary AS (
  SELECT hour_no, {", ".join(_UNIT)},
    {", ".join(f"CASE WHEN hour_before >= hour_no // 24 * 24 - 1 THEN {_increment(f'first_{c}', f'before_{c}')} "
               f"ELSE 0.0 END AS b_{c}" for c in COUNTERS)}
  FROM after
)
SELECT p.* EXCLUDE ({", ".join([*INCREMENTS, "takes_first", "holds_last",
                                *(f"{w}_{c}" for w in ("first", "last") for c in COUNTERS)])}),
  -- the holder whose row has the unit-hour's first reading takes its increment
  (p.inc_energy_joules + CASE WHEN p.takes_first THEN b.b_energy_joules ELSE 0.0 END) / 3600000.0 AS energy_part_kwh,
  p.inc_ecc_sbe_total + CASE WHEN p.takes_first THEN b.b_ecc_sbe_total ELSE 0.0 END AS ecc_sbe_delta,
  p.inc_ecc_dbe_total + CASE WHEN p.takes_first THEN b.b_ecc_dbe_total ELSE 0.0 END AS ecc_dbe_delta
-- (a condition on p alone in ON makes DuckDB's join a nested loop: 0.4 s for a week of 64 GPUs)
FROM parts p JOIN boundary b
  ON p.hour_no = b.hour_no AND {" AND ".join(f"p.{c} IS NOT DISTINCT FROM b.{c}" for c in _UNIT)}
WHERE list_contains($days, p.hour_no // 24)  -- the hours before the days only gave their last readings
"""  # fmt: skip


def per_hour(parts: pa.Table, days: Sequence[datetime]) -> pa.Table:
    """gpu_hourly's per-hour rows of `days` from the parts of their hours and the hour before each: the
    parts' sums with each unit-hour's increment from the hour before."""
    day_numbers = sorted({int(d.timestamp()) // 86400 for d in days})
    with scratch(parts=parts) as con:
        con.execute("SET threads = 1")  # rows in the same order on every run: see _ROWS
        return con.execute(_PER_HOUR, {"days": day_numbers}).to_arrow_table()


_ROWS = """
WITH
-- the unit-hour's totals, on each of its holders' rows
unit AS (
  SELECT *,
    sum(energy_part_kwh) OVER u AS unit_energy_kwh,
    sum(watt_seconds) OVER u AS unit_watt_seconds,
    bool_and(power_complete) OVER u AS unit_power_complete,
    sum(seconds_with_data) OVER u AS device_seconds,
    count(*) FILTER (WHERE pod <> '') OVER u AS pods_seen
  FROM per_hour
  WINDOW u AS (PARTITION BY hour_no, node, gpu, uuid, gpu_instance)
),
-- every slice of a MIG GPU reports the GPU's energy counter: each gets its share of the slices present
-- (a slice's rows together stand for it once: seconds / device_seconds sums to 1 over them)
weighed AS (
  SELECT *,
    unit_energy_kwh * gpu_share
      / sum(gpu_share * seconds_with_data / nullif(device_seconds, 0)) OVER (PARTITION BY hour_no, node, gpu, uuid)
      -- by power only where every holder's power is known, else by seconds (the shares must sum to 1)
      * CASE WHEN unit_power_complete AND unit_watt_seconds > 0 THEN watt_seconds / unit_watt_seconds
             ELSE seconds_with_data / nullif(device_seconds, 0) END
      AS energy_kwh
  FROM unit
)
SELECT to_timestamp(hour_no * 3600) AS hour, node, gpu, uuid, gpu_instance, gpu_profile,
  gpu_share, util_basis, activity_seconds, model, namespace, pod, experiment, run_id,
  pods_seen::INTEGER AS pods_seen, samples, seconds_with_data, device_seconds, util_mean, util_p95,
  active_gpu_seconds, held_seconds, coalesce(energy_kwh, 0) AS energy_kwh, temp_max_celsius,
  power_mean_watts, mem_used_max_bytes, ecc_sbe_delta, ecc_dbe_delta,
  sm_activity_seconds, sm_active_gpu_seconds, tensor_active_gpu_seconds, held_wall_seconds
FROM weighed
-- a shared GPU's own row while pods hold it stands for no time (its increments are in the unit's energy)
WHERE seconds_with_data > 0
ORDER BY hour_no, node, gpu, uuid, gpu_instance NULLS FIRST, pod = '', namespace, pod
"""


def build_gpu_hourly(lake: Lake, days: list[datetime]) -> dict[str, pa.Table]:
    """gpu_hourly rows of each UTC day in `days` (midnights), by partition key."""
    return build_gpu_hourly_counted(lake, days)[0]


def build_gpu_hourly_counted(lake: Lake, days: list[datetime]) -> tuple[dict[str, pa.Table], list[datetime]]:
    """build_gpu_hourly, and the hours whose parts were computed from their samples (no parts in them)."""
    days = sorted(set(days))
    if not days:
        return {}, []
    parts, computed = read_parts(lake, hours_to_read(days))
    if not parts:
        return {day_key: GPU_HOURLY.schema.empty_table() for day_key in map(GPU_HOURLY.key, days)}, computed
    with scratch(per_hour=per_hour(pa.concat_tables(parts), days)) as con:
        # one thread, its input in the same order: a unit-hour's window sums add its rows in the same
        # order on every run, so a re-run gives the same energy_kwh to the last bit
        con.execute("SET threads = 1")
        table = con.execute(_ROWS).to_arrow_table()
    table = table.select(GPU_HOURLY.schema.names).cast(GPU_HOURLY.schema)
    hours = pc.cast(table.column("hour"), pa.int64()).to_numpy()
    out = {}
    for day in days:
        start = int(day.timestamp()) * 1000
        lo, hi = np.searchsorted(hours, [start, start + 86_400_000])
        out[GPU_HOURLY.key(day)] = table.slice(lo, hi - lo)
    return out, computed
