-- outcome_per_dollar as of the end of one UTC day: for every MLflow run with a pod that was alive that
-- day, success_rate when it started and at the day's end, and what its pod's GPUs cost so far.
-- Parameters: $key ('YYYY-MM-DD'), $day_start, $day_end (TIMESTAMPTZ).
WITH runs AS (
  SELECT run_id, run_name, experiment, pod, status, start_time, end_time
  FROM training_runs
  WHERE NOT deleted AND pod <> '' AND start_time < $day_end
    AND (end_time IS NULL OR end_time >= $day_start)
),
sr AS (
  SELECT m.run_id, m.ts, m.step, m.value FROM training_metrics m SEMI JOIN runs USING (run_id)
  WHERE m.key = 'success_rate' AND m.ts < $day_end AND isfinite(m.value)
),
success AS (
  SELECT run_id, arg_min(value, (ts, step)) AS success_start, arg_max(value, (ts, step)) AS success_end,
         max(value) AS success_best
  FROM sr GROUP BY run_id
),
spend AS (
  SELECT pod, sum(allocated_usd) AS usd, sum(idle_usd) AS idle_usd
  FROM cost_allocation WHERE kind = 'gpu' AND day <= $key GROUP BY pod
)
SELECT CAST($key AS DATE) AS day, r.run_id, r.run_name, r.experiment, r.pod, r.status,
       s.success_start, s.success_end, s.success_best,
       100 * (s.success_end - s.success_start) AS success_gained_points,
       coalesce(p.usd, 0) AS usd, coalesce(p.idle_usd, 0) AS idle_usd,
       CASE WHEN s.success_end > s.success_start
            THEN coalesce(p.usd, 0) / (100 * (s.success_end - s.success_start)) END AS usd_per_point
FROM runs r LEFT JOIN success s USING (run_id) LEFT JOIN spend p USING (pod)
ORDER BY r.experiment, r.run_name
