-- outcome_per_dollar as of the end of one UTC day: for every MLflow run alive that day, success_rate
-- when it started and at the day's end, and what its own pods' GPUs cost in its own window so far.
-- Parameters: $key ('YYYY-MM-DD'), $day_start, $day_end (TIMESTAMPTZ).
--
-- A run's pods: its `pod` tag (a comma-separated list: a Ray head and its workers) in its `namespace`
-- tag's namespace (a run without one: the pod name wherever it is, unless several namespaces have it:
-- then the run is not charged and says so). A pod's GPU-hour counts for the run when the hour overlaps
-- the run's window [start, end) (a RUNNING run: up to the day's end, or to the start of the next run on
-- one of its pods: a killed run MLflow still calls RUNNING does not take its successor's hours), for the
-- seconds of the hour inside the window over the larger of what the pod held (wall-clock) and what all
-- runs' windows cover of that row: a StatefulSet's trainer-0 reused by the next run, or a trainer-0 in
-- another namespace, is not the run's, and runs sharing an hour never take more than it. Rows whose pod
-- carries a run id label (FOXHUNT_RUN_ID_POD_LABEL) go whole to that run, whatever the window.
WITH alive AS (
  SELECT run_id, run_name, experiment, pod, namespace, status, start_time, end_time
  FROM training_runs
  WHERE NOT deleted AND (start_time IS NULL OR (start_time < $day_end AND (end_time IS NULL OR end_time >= $day_start)))
),
run_pods AS (
  SELECT DISTINCT run_id, namespace, trim(p) AS pod, start_time
  FROM alive, unnest(string_split(pod, ',')) AS t(p)
  WHERE trim(p) <> '' AND start_time IS NOT NULL
),
successor AS (
  -- the first later run naming one of the run's pods (in its namespace)
  SELECT a.run_id, min(b.start_time) AS next_start
  FROM run_pods a JOIN run_pods b ON b.pod = a.pod AND b.namespace = a.namespace AND b.start_time > a.start_time
  GROUP BY a.run_id
),
runs AS (
  SELECT r.*, least(coalesce(r.end_time, s.next_start, $day_end), $day_end) AS window_end,
         r.end_time IS NULL AND s.next_start < $day_end AS cut_at_next
  FROM alive r LEFT JOIN successor s USING (run_id)
),
gpu AS (
  SELECT row_number() OVER (ORDER BY hour, node, gpu, uuid, gpu_instance, namespace, pod) AS row_id,
         hour, namespace, pod, coalesce(run_id, '') AS label_run_id, allocated_usd, idle_usd,
         coalesce(sm_idle_usd, 0) AS sm_idle_usd, held_seconds,
         -- wall-clock seconds the pod held this GPU (partitions before the column: held / share)
         coalesce(held_wall_seconds, held_seconds / coalesce(gpu_share, 1.0)) AS held_wall_seconds
  FROM cost_allocation
  WHERE kind = 'gpu' AND day <= $key AND pod <> ''
    AND day >= (SELECT strftime(coalesce(min(start_time), $day_start), '%Y-%m-%d') FROM runs)
),
by_window AS (
  SELECT r.run_id, g.*,
         greatest(0.0, epoch(least(r.window_end, g.hour + INTERVAL 1 HOUR)) - epoch(greatest(r.start_time, g.hour)))
           AS covered,
         count(DISTINCT g.namespace) OVER (PARTITION BY r.run_id) AS namespaces
  FROM runs r
  JOIN run_pods p USING (run_id)
  JOIN gpu g ON g.pod = p.pod AND (p.namespace = '' OR g.namespace = p.namespace) AND g.label_run_id = ''
   AND g.hour < r.window_end AND g.hour + INTERVAL 1 HOUR > r.start_time
),
charged AS (
  -- by the run id label: whole rows
  SELECT r.run_id, g.*, 1.0 AS part, 1 AS namespaces
  FROM runs r JOIN gpu g ON g.label_run_id = r.run_id
  UNION ALL
  -- by pod and window: rows no run id label claims, shared by the runs whose windows cover them
  SELECT run_id, row_id, hour, namespace, pod, label_run_id, allocated_usd, idle_usd, sm_idle_usd,
         held_seconds, held_wall_seconds,
         covered / nullif(greatest(held_wall_seconds, sum(covered) OVER (PARTITION BY row_id)), 0) AS part,
         namespaces
  FROM by_window
),
spend AS (
  SELECT run_id, sum(allocated_usd * part) AS usd, sum(idle_usd * part) AS idle_usd,
         sum(sm_idle_usd * part) AS sm_idle_usd, sum(held_seconds * part) / 3600.0 AS gpu_hours,
         bool_or(label_run_id <> '') AS by_label, max(namespaces) > 1 AS ambiguous
  FROM charged GROUP BY run_id
),
sr AS (
  SELECT m.run_id, m.ts, m.step, m.value FROM training_metrics m SEMI JOIN runs USING (run_id)
  WHERE m.key = $success_rate_key AND m.ts < $day_end AND isfinite(m.value)
),
success AS (
  SELECT run_id, arg_min(value, (ts, step)) AS success_start, arg_max(value, (ts, step)) AS success_end,
         max(value) AS success_best
  FROM sr GROUP BY run_id
),
priced AS (
  -- a run whose pod name is in several namespaces and that names none is not guessed at
  SELECT s.* REPLACE (CASE WHEN ambiguous THEN NULL ELSE usd END AS usd,
                      CASE WHEN ambiguous THEN NULL ELSE idle_usd END AS idle_usd,
                      CASE WHEN ambiguous THEN NULL ELSE sm_idle_usd END AS sm_idle_usd,
                      CASE WHEN ambiguous THEN NULL ELSE gpu_hours END AS gpu_hours)
  FROM spend s
)
SELECT CAST($key AS DATE) AS day, r.run_id, r.run_name, r.experiment, r.pod, r.status,
       s.success_start, s.success_end, s.success_best,
       100 * (s.success_end - s.success_start) AS success_gained_points,
       -- NULL, never $0, where no GPU the lake knows is the run's
       p.usd, p.idle_usd,
       CASE WHEN s.success_end > s.success_start
            THEN p.usd / (100 * (s.success_end - s.success_start)) END AS usd_per_point,
       r.namespace, p.gpu_hours, p.sm_idle_usd,
       CASE WHEN r.start_time IS NULL THEN 'no start time: no window'
            WHEN p.ambiguous THEN 'ambiguous: its pod names are in several namespaces; tag the run''s namespace'
            WHEN p.by_label THEN 'its pods (run id label)'
            WHEN p.run_id IS NOT NULL AND r.cut_at_next THEN 'its pods in its window (RUNNING: until the next run on its pods)'
            WHEN p.run_id IS NOT NULL THEN 'its pods in its window'
            WHEN trim(replace(r.pod, ',', '')) = '' THEN 'no pod tag: ran outside the cluster?'
            ELSE 'no GPU the lake knows held its pods in its window' END AS charged_by
FROM runs r LEFT JOIN success s USING (run_id) LEFT JOIN priced p USING (run_id)
ORDER BY r.experiment, r.run_name, r.run_id
