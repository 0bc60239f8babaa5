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

Counter deltas (ECC, energy) are the samples' increments (lib/tables/counter_increments.py: seeded with
the hour before each day, a decrease counting as a reset). The samples are read once, in batches of hour
partitions: numpy adds the increments to a batch while DuckDB aggregates the one before.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from foxhunt_obs.lib.duck import scratch
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.names import UNATTRIBUTED
from foxhunt_obs.lib.schemas import GPU_HOURLY
from foxhunt_obs.lib.tables.counter_increments import with_increments

COLUMNS = [
    "ts", "uuid", "node", "gpu", "gpu_instance", "model", "gpu_profile", "gpu_share", "util_basis", "namespace",
    "pod", "experiment", "run_id", "step_seconds", "step_share", "temp_celsius", "power_watts",
    "mem_used_bytes", "util", "sm_active", "tensor_active",
]  # fmt: skip

_PER_HOUR = """
-- One batch of samples with their increments. Partitions written before the MIG, time-slicing and SM
-- columns existed read them as NULL: a whole GPU, one row per step. Hours as integers (hours since the
-- epoch; ts is after 1970, so // is the floor): date_trunc('hour', ts) on a TIMESTAMPTZ goes through
-- ICU's calendar for every sample, some 15x slower.
WITH s AS (
  SELECT epoch_ms(ts) // 3600000 AS hour_no, uuid, node, gpu, gpu_instance, model,
    coalesce(gpu_profile, '') AS gpu_profile, coalesce(gpu_share, 1.0) AS gpu_share,
    coalesce(util_basis, '') AS util_basis, coalesce(namespace, '') AS namespace, coalesce(pod, '') AS pod,
    experiment, coalesce(run_id, '') AS run_id,
    step_seconds * coalesce(step_share, 1.0) AS secs,
    CASE WHEN coalesce(step_share, 1.0) > 0 THEN step_seconds ELSE 0 END AS wall,
    temp_celsius, power_watts, mem_used_bytes,
    CASE WHEN isnan(util) THEN NULL ELSE util END AS u,
    CASE WHEN isnan(sm_active) THEN NULL ELSE sm_active END AS sm,
    CASE WHEN isnan(tensor_active) THEN NULL ELSE tensor_active END AS tensor,
    inc_energy_joules, inc_ecc_sbe_total, inc_ecc_dbe_total
  FROM batch
)
SELECT hour_no, node, gpu, uuid, gpu_instance, namespace, pod,
  CASE WHEN pod = '' THEN $unattributed ELSE experiment END AS experiment,
  max(run_id) AS run_id, max(model) AS model,
  max(gpu_profile) AS gpu_profile, max(gpu_share) AS gpu_share,
  coalesce(max(util_basis) FILTER (WHERE u IS NOT NULL), '') AS util_basis,
  count(*) AS samples,
  sum(secs) AS seconds_with_data,
  coalesce(sum(secs) FILTER (WHERE u IS NOT NULL), 0) AS activity_seconds,
  avg(u) AS util_mean,
  quantile_cont(u, 0.95) AS util_p95,
  -- GPU-seconds: a slice's activity counts for its share of the GPU; NULL where no util was reported
  sum(u * secs) * max(gpu_share) AS active_gpu_seconds,
  coalesce(sum(secs) FILTER (WHERE sm IS NOT NULL), 0) AS sm_activity_seconds,
  sum(sm * secs) * max(gpu_share) AS sm_active_gpu_seconds,
  sum(tensor * secs) * max(gpu_share) AS tensor_active_gpu_seconds,
  CASE WHEN pod = '' THEN 0 ELSE sum(secs) END AS held_seconds,
  -- wall-clock seconds the pod was on the GPU (a time-sliced step counts whole): runs' windows compare to it
  CASE WHEN pod = '' THEN 0 ELSE sum(wall) END AS held_wall_seconds,
  sum(power_watts * secs) AS watt_seconds,
  bool_and(power_watts IS NOT NULL OR secs = 0) AS power_complete,
  max(temp_celsius) AS temp_max_celsius,
  avg(power_watts) AS power_mean_watts,
  max(mem_used_bytes) AS mem_used_max_bytes,
  sum(inc_energy_joules) / 3600000.0 AS energy_part_kwh,
  sum(inc_ecc_sbe_total) AS ecc_sbe_delta,
  sum(inc_ecc_dbe_total) AS ecc_dbe_delta
FROM s
GROUP BY hour_no, node, gpu, uuid, gpu_instance, namespace, pod, 8
"""

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
    days = sorted(set(days))
    if not days:
        return {}
    parts = []
    with scratch() as con, ThreadPoolExecutor(1) as pool:
        # `con` is the worker's until the last batch is aggregated; DuckDB releases the GIL meanwhile
        pending: deque = deque()
        for batch in with_increments(lake, days, COLUMNS):
            pending.append(pool.submit(_per_hour, con, batch))
            if len(pending) > 1:  # memory: a batch aggregated, one waiting, one being built
                parts.append(pending.popleft().result())
        parts += [f.result() for f in pending]
        if not parts:
            return {day_key: GPU_HOURLY.schema.empty_table() for day_key in map(GPU_HOURLY.key, days)}
        con.register("per_hour", pa.concat_tables(parts))
        table = con.execute(_ROWS).to_arrow_table()
    table = table.select(GPU_HOURLY.schema.names).cast(GPU_HOURLY.schema)
    hours = pc.cast(table.column("hour"), pa.int64()).to_numpy()
    out = {}
    for day in days:
        start = int(day.timestamp()) * 1000
        lo, hi = np.searchsorted(hours, [start, start + 86_400_000])
        out[GPU_HOURLY.key(day)] = table.slice(lo, hi - lo)
    return out


def _per_hour(con: duckdb.DuckDBPyConnection, batch: pa.Table) -> pa.Table:
    con.register("batch", batch)
    try:
        return con.execute(_PER_HOUR, {"unattributed": UNATTRIBUTED}).to_arrow_table()
    finally:
        con.unregister("batch")
