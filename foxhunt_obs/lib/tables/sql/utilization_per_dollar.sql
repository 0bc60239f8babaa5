-- One UTC day of utilization_per_dollar from cost_allocation. Parameter: $key ('YYYY-MM-DD').
-- Experiments get what they held (GPU-hours, the GPUs' cost, their idle part, tagged and shared lines);
-- the cluster row gets every GPU-hour no pod held and the cost nobody could be charged.
-- Two activity bases: util (DCGM_FI_DEV_GPU_UTIL: some kernel ran) and SM activity (a warp resident
-- on an SM), each over the dollars whose activity on that basis is known.
WITH a AS (SELECT * FROM cost_allocation WHERE day = $key),
per_experiment AS (
  SELECT experiment,
         sum(held_seconds) / 3600.0 AS gpu_hours,
         coalesce(sum(active_gpu_seconds) FILTER (WHERE kind = 'gpu'), 0) / 3600.0 AS active_gpu_hours,
         sum(allocated_usd) AS allocated_usd,
         sum(idle_usd) AS idle_usd,
         sum(energy_kwh) AS energy_kwh,
         string_agg(DISTINCT cost_source, '+' ORDER BY cost_source) AS cost_source,
         sum(unknown_activity_usd) AS unknown_activity_usd,
         sum(sm_active_gpu_seconds) FILTER (WHERE kind = 'gpu') / 3600.0 AS sm_active_gpu_hours,
         coalesce(sum(sm_idle_usd), 0) AS sm_idle_usd,
         -- partitions written before the SM columns existed: SM activity unknown on every GPU dollar
         sum(coalesce(sm_unknown_activity_usd, CASE WHEN kind = 'gpu' THEN allocated_usd ELSE 0 END))
           AS sm_unknown_activity_usd
  FROM a WHERE experiment <> '' GROUP BY experiment
),
cluster AS (
  SELECT $cluster_idle AS experiment,
         sum(gpu_seconds - held_seconds) / 3600.0 AS gpu_hours,
         coalesce(sum(active_gpu_seconds) FILTER (WHERE kind = 'gpu' AND experiment = ''), 0) / 3600.0,
         sum(unallocated_usd), sum(unallocated_usd),
         coalesce(sum(energy_kwh) FILTER (WHERE experiment = ''), 0),
         string_agg(DISTINCT cost_source, '+' ORDER BY cost_source) FILTER (WHERE unallocated_usd > 0),
         0.0, sum(sm_active_gpu_seconds) FILTER (WHERE kind = 'gpu' AND experiment = '') / 3600.0,
         sum(unallocated_usd), 0.0
  FROM a HAVING count(*) > 0
),
rows AS (SELECT * FROM per_experiment UNION ALL SELECT * FROM cluster)
-- GPU time with no util reported (unknown_activity_usd) is neither busy nor idle: the per-dollar and
-- mean-util figures are over the known part only (its share of the dollars), NULL when nothing is known
SELECT CAST($key AS DATE) AS day, experiment, gpu_hours, active_gpu_hours,
       active_gpu_hours / nullif(gpu_hours * (1 - coalesce(unknown_activity_usd, 0) / nullif(allocated_usd, 0)), 0)
         AS mean_util,
       allocated_usd, idle_usd,
       active_gpu_hours / nullif(allocated_usd - coalesce(unknown_activity_usd, 0), 0) AS active_gpu_hours_per_usd,
       (allocated_usd - coalesce(unknown_activity_usd, 0)) / nullif(active_gpu_hours, 0) AS usd_per_active_gpu_hour,
       energy_kwh, coalesce(cost_source, '') AS cost_source, unknown_activity_usd,
       sm_active_gpu_hours,
       sm_active_gpu_hours / nullif(allocated_usd - sm_unknown_activity_usd, 0) AS sm_active_gpu_hours_per_usd,
       sm_idle_usd, sm_unknown_activity_usd
FROM rows ORDER BY experiment = $cluster_idle, experiment
