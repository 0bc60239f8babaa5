-- outcome_per_dollar as of the end of one UTC day: for every MLflow run alive that day, success_rate
-- when it started and at the day's end, and what its own pods' GPUs cost in its own window so far.
-- Parameters: $key ('YYYY-MM-DD'), $day_start, $day_end (TIMESTAMPTZ).
--
-- A run's pods: its `pod` tag (a comma-separated list: a Ray head and its workers) in its `namespace`
-- tag's namespace (any namespace when the run has none). A pod's GPU-hour counts for the run when the
-- hour overlaps the run's window [start, end) (a running run: up to the day's end), for the seconds of
-- the hour inside the window, at most what the pod held: a StatefulSet's trainer-0 reused by the next
-- run, or a trainer-0 in another namespace, is not the run's. Rows whose pod carries a run id label
-- (FOXHUNT_RUN_ID_POD_LABEL) go whole to that run, whatever the window.
WITH runs AS (
  SELECT run_id, run_name, experiment, pod, namespace, status, start_time,
         least(coalesce(end_time, $day_end), $day_end) AS window_end
  FROM training_runs
  WHERE NOT deleted AND start_time < $day_end AND (end_time IS NULL OR end_time >= $day_start)
),
run_pods AS (
  SELECT DISTINCT run_id, namespace, trim(p) AS pod
  FROM runs, unnest(string_split(pod, ',')) AS t(p)
  WHERE trim(p) <> ''
),
gpu AS (
  SELECT hour, namespace, pod, coalesce(run_id, '') AS label_run_id, allocated_usd, idle_usd,
         coalesce(sm_idle_usd, 0) AS sm_idle_usd, held_seconds,
         -- wall-clock seconds the pod held this GPU (a slice's held_seconds are weighed by its share)
         held_seconds / coalesce(gpu_share, 1.0) AS held_wall_seconds
  FROM cost_allocation
  WHERE kind = 'gpu' AND day <= $key AND pod <> ''
    AND day >= (SELECT strftime(coalesce(min(start_time), $day_start), '%Y-%m-%d') FROM runs)
),
charged AS (
  -- by the run id label: whole rows
  SELECT r.run_id, g.*, 1.0 AS part
  FROM runs r JOIN gpu g ON g.label_run_id = r.run_id
  UNION ALL
  -- by pod and window: rows no run id label claims
  SELECT r.run_id, g.*,
         least(1.0, greatest(0.0, epoch(least(r.window_end, g.hour + INTERVAL 1 HOUR))
                                  - epoch(greatest(r.start_time, g.hour)))
                    / nullif(g.held_wall_seconds, 0)) AS part
  FROM runs r
  JOIN run_pods p USING (run_id)
  JOIN gpu g ON g.pod = p.pod AND (p.namespace = '' OR g.namespace = p.namespace) AND g.label_run_id = ''
   AND g.hour < r.window_end AND g.hour + INTERVAL 1 HOUR > r.start_time
),
spend AS (
  SELECT run_id, sum(allocated_usd * part) AS usd, sum(idle_usd * part) AS idle_usd,
         sum(sm_idle_usd * part) AS sm_idle_usd, sum(held_seconds * part) / 3600.0 AS gpu_hours,
         bool_or(label_run_id <> '') AS by_label
  FROM charged GROUP BY run_id
),
sr AS (
  SELECT m.run_id, m.ts, m.step, m.value FROM training_metrics m SEMI JOIN runs USING (run_id)
  WHERE m.key = 'success_rate' AND m.ts < $day_end AND isfinite(m.value)
),
success AS (
  SELECT run_id, arg_min(value, (ts, step)) AS success_start, arg_max(value, (ts, step)) AS success_end,
         max(value) AS success_best
  FROM sr GROUP BY run_id
)
SELECT CAST($key AS DATE) AS day, r.run_id, r.run_name, r.experiment, r.pod, r.status,
       s.success_start, s.success_end, s.success_best,
       100 * (s.success_end - s.success_start) AS success_gained_points,
       -- NULL, never $0, where no GPU the lake knows is the run's
       p.usd, p.idle_usd,
       CASE WHEN s.success_end > s.success_start
            THEN p.usd / (100 * (s.success_end - s.success_start)) END AS usd_per_point,
       r.namespace, p.gpu_hours, p.sm_idle_usd,
       CASE WHEN p.by_label THEN 'its pods (run id label)'
            WHEN p.run_id IS NOT NULL THEN 'its pods in its window'
            WHEN r.pod = '' THEN 'no pod tag: ran outside the cluster?'
            ELSE 'no GPU the lake knows held its pods in its window' END AS charged_by
FROM runs r LEFT JOIN success s USING (run_id) LEFT JOIN spend p USING (run_id)
ORDER BY r.experiment, r.run_name
