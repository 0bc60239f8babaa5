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
  SELECT *,
    date_trunc('hour', ts) AS hour_ts,
    CASE WHEN isnan(util) THEN NULL ELSE util END AS u,
    ecc_sbe_total - lag(ecc_sbe_total) OVER w AS d_sbe,
    ecc_dbe_total - lag(ecc_dbe_total) OVER w AS d_dbe,
    energy_joules - lag(energy_joules) OVER w AS d_energy
  FROM gpu_samples
  WHERE hour >= $seed_hour AND hour < $end_hour
  WINDOW w AS (PARTITION BY uuid, node, gpu ORDER BY ts)
),
day AS (
  SELECT *,
    CASE WHEN d_sbe < 0 THEN ecc_sbe_total ELSE d_sbe END AS inc_sbe,
    CASE WHEN d_dbe < 0 THEN ecc_dbe_total ELSE d_dbe END AS inc_dbe,
    CASE WHEN d_energy < 0 THEN energy_joules ELSE d_energy END AS inc_energy
  FROM s WHERE ts >= $day_start AND ts < $day_end
),
holders AS (
  SELECT uuid, node, gpu, hour_ts, pod, namespace, experiment,
    row_number() OVER (PARTITION BY uuid, node, gpu, hour_ts ORDER BY count(*) DESC, pod) AS rank
  FROM day WHERE pod <> ''
  GROUP BY uuid, node, gpu, hour_ts, pod, namespace, experiment
)
SELECT d.hour_ts AS hour, d.node, d.gpu, d.uuid, max(d.model) AS model,
  coalesce(max(h.namespace), '') AS namespace,
  coalesce(max(h.pod), '') AS pod,
  coalesce(max(h.experiment), 'unattributed') AS experiment,
  count(DISTINCT d.pod) FILTER (WHERE d.pod <> '')::INTEGER AS pods_seen,
  count(*) AS samples,
  sum(d.step_seconds) AS seconds_with_data,
  avg(d.u) AS util_mean,
  quantile_cont(d.u, 0.95) AS util_p95,
  coalesce(sum(d.u * d.step_seconds), 0) AS active_gpu_seconds,
  coalesce(sum(d.step_seconds) FILTER (WHERE d.pod <> ''), 0) AS held_seconds,
  coalesce(sum(d.inc_energy), 0) / 3600000.0 AS energy_kwh,
  max(d.temp_celsius) AS temp_max_celsius,
  avg(d.power_watts) AS power_mean_watts,
  max(d.mem_used_bytes) AS mem_used_max_bytes,
  coalesce(sum(d.inc_sbe), 0) AS ecc_sbe_delta,
  coalesce(sum(d.inc_dbe), 0) AS ecc_dbe_delta
FROM day d
LEFT JOIN holders h USING (uuid, node, gpu, hour_ts)
WHERE h.rank = 1 OR h.rank IS NULL
GROUP BY d.hour_ts, d.node, d.gpu, d.uuid
ORDER BY hour, d.node, d.gpu, d.uuid
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
