"""gpu_samples -> gpu_hourly: one row per GPU-hour of a UTC day.

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
  SELECT uuid, node, gpu, ts, model, pod, step_seconds, temp_celsius, power_watts, mem_used_bytes,
    CASE WHEN isnan(util) THEN NULL ELSE util END AS u,
    ecc_sbe_total, ecc_dbe_total, energy_joules,
    ecc_sbe_total - lag(ecc_sbe_total) OVER w AS d_sbe,
    ecc_dbe_total - lag(ecc_dbe_total) OVER w AS d_dbe,
    energy_joules - lag(energy_joules) OVER w AS d_energy
  FROM gpu_samples
  WHERE hour >= $seed_hour AND hour < $end_hour
  WINDOW w AS (PARTITION BY uuid, node, gpu ORDER BY ts)
),
per_hour AS (
  -- Hours as integers (hours since the epoch; ts is after 1970, so // is the floor): date_trunc('hour', ts)
  -- on a TIMESTAMPTZ goes through ICU's calendar for every sample, some 15 times slower.
  SELECT epoch_ms(ts) // 3600000 AS hour_no, node, gpu, uuid, max(model) AS model,
    count(DISTINCT pod) FILTER (WHERE pod <> '')::INTEGER AS pods_seen,
    count(*) AS samples,
    sum(step_seconds) AS seconds_with_data,
    avg(u) AS util_mean,
    quantile_cont(u, 0.95) AS util_p95,
    coalesce(sum(u * step_seconds), 0) AS active_gpu_seconds,
    coalesce(sum(step_seconds) FILTER (WHERE pod <> ''), 0) AS held_seconds,
    -- a decrease is a counter reset: the new value is the increase since the reset
    coalesce(sum(CASE WHEN d_energy < 0 THEN energy_joules ELSE d_energy END), 0) / 3600000.0 AS energy_kwh,
    max(temp_celsius) AS temp_max_celsius,
    avg(power_watts) AS power_mean_watts,
    max(mem_used_bytes) AS mem_used_max_bytes,
    coalesce(sum(CASE WHEN d_sbe < 0 THEN ecc_sbe_total ELSE d_sbe END), 0) AS ecc_sbe_delta,
    coalesce(sum(CASE WHEN d_dbe < 0 THEN ecc_dbe_total ELSE d_dbe END), 0) AS ecc_dbe_delta
  FROM s
  WHERE ts >= $day_start AND ts < $day_end
  GROUP BY hour_no, node, gpu, uuid
),
holders AS (
  -- The pod seen most in the GPU-hour (ties: the first by name). It needs no previous sample, so it reads
  -- the day's rows from the lake, not from the window.
  SELECT uuid, node, gpu, epoch_ms(ts) // 3600000 AS hour_no, pod, namespace, experiment,
    row_number() OVER (PARTITION BY uuid, node, gpu, hour_no ORDER BY count(*) DESC, pod) AS rank
  FROM gpu_samples
  WHERE hour >= $seed_hour AND hour < $end_hour AND ts >= $day_start AND ts < $day_end AND pod <> ''
  GROUP BY uuid, node, gpu, hour_no, pod, namespace, experiment
  QUALIFY rank = 1
)
-- The holder joins the aggregated GPU-hours, not the samples (each sample would be joined to every pod
-- of its hour, then all but the holder's row dropped).
SELECT to_timestamp(d.hour_no * 3600) AS hour, d.node, d.gpu, d.uuid, d.model,
  coalesce(h.namespace, '') AS namespace,
  coalesce(h.pod, '') AS pod,
  coalesce(h.experiment, 'unattributed') AS experiment,
  d.pods_seen, d.samples, d.seconds_with_data, d.util_mean, d.util_p95, d.active_gpu_seconds,
  d.held_seconds, d.energy_kwh, d.temp_max_celsius, d.power_mean_watts, d.mem_used_max_bytes,
  d.ecc_sbe_delta, d.ecc_dbe_delta
FROM per_hour d
LEFT JOIN holders h USING (uuid, node, gpu, hour_no)
ORDER BY d.hour_no, d.node, d.gpu, d.uuid
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
