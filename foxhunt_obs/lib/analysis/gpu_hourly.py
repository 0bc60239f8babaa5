"""gpu_samples -> gpu_hourly: one row per GPU-hour (or MIG slice-hour) of a UTC day.

A MIG slice is its own row with its gpu_share of the GPU: its active GPU-seconds are weighed by the
share, and its GPU's energy is split over the slices present by their shares, so sums over rows count
every GPU once. Activity no source reported (util NULL) is unknown, not idle: activity_seconds says
how many of the seconds with data had a util value.

Counter deltas (ECC, energy) are taken between consecutive samples of a GPU, seeded with the hour
before the day so an increase across midnight is not lost; a decrease is a counter reset and counts
as an increase from zero (as Prometheus's increase() does).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
import pyarrow as pa

from foxhunt_obs.lib.schemas import GPU_HOURLY

_SQL = """
WITH s AS (
  -- The counters' increments need each GPU's previous sample, hence a window over the seed hour and the
  -- day: the query's main cost, as it sorts every column it carries, so it carries only what per_hour reads.
  -- partitions written before the MIG columns existed read them as NULL: a whole GPU
  SELECT uuid, node, gpu, gpu_instance, ts, model, coalesce(gpu_profile, '') AS gpu_profile,
    coalesce(gpu_share, 1.0) AS gpu_share, coalesce(util_basis, '') AS util_basis, pod, step_seconds,
    temp_celsius, power_watts, mem_used_bytes,
    CASE WHEN isnan(util) THEN NULL ELSE util END AS u,
    ecc_sbe_total, ecc_dbe_total, energy_joules,
    ecc_sbe_total - lag(ecc_sbe_total) OVER w AS d_sbe,
    ecc_dbe_total - lag(ecc_dbe_total) OVER w AS d_dbe,
    energy_joules - lag(energy_joules) OVER w AS d_energy
  FROM gpu_samples
  WHERE hour >= $seed_hour AND hour < $end_hour
  WINDOW w AS (PARTITION BY uuid, node, gpu, gpu_instance ORDER BY ts)
),
per_hour AS (
  -- Hours as integers (hours since the epoch; ts is after 1970, so // is the floor): date_trunc('hour', ts)
  -- on a TIMESTAMPTZ goes through ICU's calendar for every sample, some 15 times slower.
  SELECT epoch_ms(ts) // 3600000 AS hour_no, node, gpu, uuid, gpu_instance, max(model) AS model,
    max(gpu_profile) AS gpu_profile, max(gpu_share) AS gpu_share,
    coalesce(max(util_basis) FILTER (WHERE u IS NOT NULL), '') AS util_basis,
    count(DISTINCT pod) FILTER (WHERE pod <> '')::INTEGER AS pods_seen,
    count(*) AS samples,
    sum(step_seconds) AS seconds_with_data,
    coalesce(sum(step_seconds) FILTER (WHERE u IS NOT NULL), 0) AS activity_seconds,
    avg(u) AS util_mean,
    quantile_cont(u, 0.95) AS util_p95,
    -- GPU-seconds: a slice's activity counts for its share of the GPU; NULL where no util was reported
    sum(u * step_seconds) * max(gpu_share) AS active_gpu_seconds,
    coalesce(sum(step_seconds) FILTER (WHERE pod <> ''), 0) AS held_seconds,
    -- a decrease is a counter reset: the new value is the increase since the reset
    coalesce(sum(CASE WHEN d_energy < 0 THEN energy_joules ELSE d_energy END), 0) / 3600000.0 AS gpu_energy_kwh,
    max(temp_celsius) AS temp_max_celsius,
    avg(power_watts) AS power_mean_watts,
    max(mem_used_bytes) AS mem_used_max_bytes,
    coalesce(sum(CASE WHEN d_sbe < 0 THEN ecc_sbe_total ELSE d_sbe END), 0) AS ecc_sbe_delta,
    coalesce(sum(CASE WHEN d_dbe < 0 THEN ecc_dbe_total ELSE d_dbe END), 0) AS ecc_dbe_delta
  FROM s
  WHERE ts >= $day_start AND ts < $day_end
  GROUP BY hour_no, node, gpu, uuid, gpu_instance
),
-- every slice of a MIG GPU reports the GPU's energy counter: each gets its share of the slices present
weighed AS (
  SELECT *, gpu_energy_kwh * gpu_share / sum(gpu_share) OVER (PARTITION BY hour_no, node, gpu, uuid) AS energy_kwh
  FROM per_hour
),
holders AS (
  -- The pod seen most in the GPU-hour (ties: the first by name). It needs no previous sample, so it reads
  -- the day's rows from the lake, not from the window.
  SELECT uuid, node, gpu, gpu_instance, epoch_ms(ts) // 3600000 AS hour_no, pod, namespace, experiment,
    row_number() OVER (PARTITION BY uuid, node, gpu, gpu_instance, hour_no ORDER BY count(*) DESC, pod) AS rank
  FROM gpu_samples
  WHERE hour >= $seed_hour AND hour < $end_hour AND ts >= $day_start AND ts < $day_end AND pod <> ''
  GROUP BY uuid, node, gpu, gpu_instance, hour_no, pod, namespace, experiment
  QUALIFY rank = 1
)
-- The holder joins the aggregated GPU-hours, not the samples (each sample would be joined to every pod
-- of its hour, then all but the holder's row dropped).
SELECT to_timestamp(d.hour_no * 3600) AS hour, d.node, d.gpu, d.uuid, d.gpu_instance, d.gpu_profile,
  d.gpu_share, d.util_basis, d.activity_seconds, d.model,
  coalesce(h.namespace, '') AS namespace,
  coalesce(h.pod, '') AS pod,
  coalesce(h.experiment, 'unattributed') AS experiment,
  d.pods_seen, d.samples, d.seconds_with_data, d.util_mean, d.util_p95, d.active_gpu_seconds,
  d.held_seconds, d.energy_kwh, d.temp_max_celsius, d.power_mean_watts, d.mem_used_max_bytes,
  d.ecc_sbe_delta, d.ecc_dbe_delta
FROM weighed d
LEFT JOIN holders h ON h.uuid = d.uuid AND h.node = d.node AND h.gpu IS NOT DISTINCT FROM d.gpu
  AND h.gpu_instance IS NOT DISTINCT FROM d.gpu_instance AND h.hour_no = d.hour_no
ORDER BY d.hour_no, d.node, d.gpu, d.uuid, d.gpu_instance NULLS FIRST
"""


def hour_key(t: datetime) -> str:
    """The lake's hour partition value: 2026-11-29T13."""
    return t.strftime("%Y-%m-%dT%H")


def build_gpu_hourly(con: duckdb.DuckDBPyConnection, day_start: datetime) -> pa.Table:
    """gpu_hourly rows for the UTC day starting at day_start, from a lake connection's gpu_samples view."""
    day_end = day_start + timedelta(days=1)
    params = {
        "seed_hour": hour_key(day_start - timedelta(hours=1)),
        "end_hour": hour_key(day_end),
        "day_start": day_start,
        "day_end": day_end,
    }
    table = con.execute(_SQL, params).to_arrow_table()
    return table.select(GPU_HOURLY.schema.names).cast(GPU_HOURLY.schema)
