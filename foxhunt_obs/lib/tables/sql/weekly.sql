-- Named statements for the weekly report; each reads $first and $last ('YYYY-MM-DD', inclusive),
-- and $cluster_idle where it names it (lib/names.py: SQL_PARAMETERS).
-- name: daily
SELECT CAST(day AS DATE) AS day, experiment, allocated_usd, idle_usd, gpu_hours, active_gpu_hours
FROM utilization_per_dollar WHERE day >= $first AND day <= $last
ORDER BY day, experiment = $cluster_idle, experiment;
-- name: experiments
-- over the known part only, as utilization_per_dollar: unknown activity is neither busy nor idle
SELECT experiment, sum(gpu_hours) AS gpu_hours, sum(active_gpu_hours) AS active_gpu_hours,
       sum(active_gpu_hours) / nullif(sum(gpu_hours * (1 - coalesce(unknown_activity_usd, 0)
         / nullif(allocated_usd, 0))), 0) AS mean_util,
       sum(allocated_usd) AS allocated_usd, sum(idle_usd) AS idle_usd,
       sum(active_gpu_hours) / nullif(sum(allocated_usd - coalesce(unknown_activity_usd, 0)), 0)
         AS active_gpu_hours_per_usd,
       sum(allocated_usd - coalesce(unknown_activity_usd, 0)) / nullif(sum(active_gpu_hours), 0)
         AS usd_per_active_gpu_hour,
       sum(energy_kwh) AS energy_kwh,
       string_agg(DISTINCT nullif(cost_source, ''), '+' ORDER BY nullif(cost_source, '')) AS cost_source,
       coalesce(sum(unknown_activity_usd), 0) AS unknown_activity_usd,
       -- the SM-activity basis, over the dollars whose SM activity is known (NULL: never reported)
       sum(sm_active_gpu_hours) AS sm_active_gpu_hours,
       sum(sm_active_gpu_hours) / nullif(sum(allocated_usd - coalesce(sm_unknown_activity_usd, allocated_usd)), 0)
         AS sm_active_gpu_hours_per_usd,
       coalesce(sum(sm_idle_usd), 0) AS sm_idle_usd,
       sum(coalesce(sm_unknown_activity_usd, allocated_usd)) AS sm_unknown_activity_usd
FROM utilization_per_dollar WHERE day >= $first AND day <= $last
GROUP BY experiment ORDER BY experiment = $cluster_idle, allocated_usd DESC, experiment;
-- name: wastes
-- a pod is (namespace, pod): the same name in two namespaces is two pods
SELECT pod, namespace, experiment, node, count(DISTINCT uuid) AS gpus, sum(held_seconds) / 3600.0 AS held_gpu_hours,
       sum(active_gpu_seconds) / nullif(sum(held_seconds), 0) AS mean_util, sum(idle_usd) AS idle_usd
FROM cost_allocation WHERE day >= $first AND day <= $last AND kind = 'gpu' AND experiment <> ''
GROUP BY ALL ORDER BY idle_usd DESC, pod, node LIMIT 5;
-- name: outcomes
-- success on the 0-100 points scale of success_gained
SELECT run_name, experiment, 100 * success_start AS success_start, 100 * success_end AS success_end,
       success_gained_points AS success_gained, usd,
       usd_per_point
FROM (
  SELECT *, row_number() OVER (PARTITION BY run_id ORDER BY day DESC) AS latest
  FROM outcome_per_dollar WHERE day >= $first AND day <= $last
) WHERE latest = 1
ORDER BY usd_per_point NULLS LAST, experiment, run_name;
-- name: bill
SELECT coalesce(sum(cost_usd) FILTER (WHERE source = 'cur'), 0) AS cur_usd,
       count(*) FILTER (WHERE source = 'cur') AS cur_rows,
       coalesce(sum(cost_usd) FILTER (WHERE source = 'ce'), 0) AS ce_usd,
       count(*) FILTER (WHERE source = 'ce') AS ce_rows,
       coalesce(sum(cost_usd) FILTER (WHERE source = 'estimate'), 0) AS estimate_usd,
       -- the estimate covers EC2 and FSx: the gap compares it with those lines of the bill
       coalesce(sum(cost_usd) FILTER (WHERE source = 'cur' AND service IN ('AmazonEC2', 'AmazonFSx')), 0)
         AS cur_estimated_services_usd
FROM costs_daily WHERE day >= $first AND day <= $last;
