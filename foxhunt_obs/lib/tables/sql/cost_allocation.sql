-- One UTC day of cost_allocation (docs/cost-model.md). Parameters: $day (DATE), $key ('YYYY-MM-DD'),
-- $first_hour / $last_hour (node_samples partitions of the day). Views: gpu_hourly, node_samples,
-- costs_hourly, costs_daily, ec2_prices(instance_type, usd_per_hour).
WITH
-- seconds each node reported per hour, per EC2 instance (an instance can be replaced mid-hour); the hour
-- as integer arithmetic: date_trunc on a TIMESTAMPTZ goes through ICU's calendar for every sample
node_hours AS (
  SELECT node, to_timestamp(epoch_ms(ts) // 3600000 * 3600) AS hour, coalesce(instance_id, '') AS instance_id,
         any_value(instance_type) AS instance_type, sum(step_seconds) AS seconds
  FROM node_samples WHERE hour >= $first_hour AND hour <= $last_hour
  GROUP BY ALL
),
cur_lines AS (
  SELECT hour, resource_id, service, experiment, cost_usd FROM costs_hourly WHERE day = $key
),
has_cur AS (SELECT count(*) > 0 AS yes FROM cur_lines),
cur_by_instance AS (
  SELECT resource_id, hour, sum(cost_usd) AS cost_usd FROM cur_lines WHERE resource_id <> '' GROUP BY ALL
),
-- A node-hour costs its instances' CUR lines for that hour; before the bill lands, the price table's.
-- Once the bill is in every dollar comes from it: a node-hour whose instance has no line (no
-- providerID, say) costs 0 here and its instance's lines are shared below, never counted twice.
node_cost AS (
  SELECT n.node, n.hour,
         sum(CASE WHEN c.cost_usd IS NOT NULL THEN c.cost_usd
                  WHEN (SELECT yes FROM has_cur) THEN 0
                  ELSE p.usd_per_hour * n.seconds / 3600.0 END) AS cost_usd,
         CASE WHEN (SELECT yes FROM has_cur) THEN 'cur' ELSE 'estimate' END AS cost_source,
         string_agg(DISTINCT n.instance_id, ',' ORDER BY n.instance_id) AS instance_ids
  FROM node_hours n
  LEFT JOIN cur_by_instance c ON c.resource_id = n.instance_id AND c.hour = n.hour
  LEFT JOIN ec2_prices p ON p.instance_type = n.instance_type
  GROUP BY ALL
),
-- A MIG GPU reports one row per slice: the node's cost is split over its GPUs (not its rows; by index and
-- UUID, so GPUs whose exporter sent no UUID still count one each), and a
-- GPU's over its slices by their gpu_share; what no slice covers is cluster idle (kind mig_unsliced).
-- A unit (GPU or slice) has a row per holder in the hour (pod '' for the part no pod held): each row
-- carries its seconds' part of the unit's cost (seconds_with_data / device_seconds).
gpus AS (
  -- gpu_hourly partitions written before the MIG, activity and per-holder columns existed: whole GPUs,
  -- util known, one row per GPU-hour (its holder's seconds and the unheld rest on the same row)
  SELECT g.* REPLACE (coalesce(g.gpu_share, 1.0) AS gpu_share, coalesce(g.gpu_profile, '') AS gpu_profile,
                      coalesce(g.activity_seconds, g.seconds_with_data) AS activity_seconds,
                      coalesce(g.device_seconds, g.seconds_with_data) AS device_seconds,
                      coalesce(g.run_id, '') AS run_id, coalesce(g.sm_activity_seconds, 0) AS sm_activity_seconds,
                      coalesce(g.held_wall_seconds, g.held_seconds) AS held_wall_seconds),
         n.gpus_on_node
  FROM gpu_hourly g
  JOIN (SELECT node, hour, count(DISTINCT coalesce(gpu, -1)::VARCHAR || '|' || uuid) AS gpus_on_node FROM gpu_hourly
        WHERE day = $key AND strftime(hour, '%Y-%m-%d') = $key GROUP BY ALL) n USING (node, hour)
  -- the partition key first: only the day's partition is read, not every day the lake holds
  WHERE g.day = $key AND strftime(g.hour, '%Y-%m-%d') = $key
),
unsliced AS (
  -- a slice's rows together stand for it once: seconds / device_seconds sums to 1 over them
  SELECT hour, node, gpu, uuid, any_value(gpus_on_node) AS gpus_on_node,
         1 - sum(gpu_share * seconds_with_data / device_seconds) AS share, max(device_seconds) AS seconds_with_data
  FROM gpus WHERE gpu_instance IS NOT NULL GROUP BY ALL
  HAVING sum(gpu_share * seconds_with_data / device_seconds) < 1 - 1e-9
),
gpu_rows AS (
  SELECT g.hour, g.node, g.gpu, g.uuid, g.gpu_instance, g.gpu_profile, g.gpu_share, g.pod, g.namespace,
         CASE WHEN g.pod = '' THEN '' ELSE g.experiment END AS experiment, g.run_id,
         'gpu' AS kind, 'AmazonEC2' AS service, coalesce(c.instance_ids, '') AS resource_id,
         -- GPU-seconds: a slice's seconds count for its share of the GPU
         g.seconds_with_data * g.gpu_share AS gpu_seconds, g.held_seconds * g.gpu_share AS held_seconds,
         g.active_gpu_seconds, g.energy_kwh, g.sm_active_gpu_seconds, g.tensor_active_gpu_seconds,
         g.held_wall_seconds,
         -- this row's part of its unit's cost for the hour
         coalesce(c.cost_usd, 0) / g.gpus_on_node * g.gpu_share * g.seconds_with_data / g.device_seconds AS gpu_cost,
         coalesce(least(g.held_seconds / nullif(g.seconds_with_data, 0), 1), 0) AS held_frac,
         -- of the held seconds, the part whose activity is known (util reported) ...
         coalesce(least(g.activity_seconds / nullif(g.seconds_with_data, 0), 1), 0) AS known_frac,
         -- ... and how busy it was then; NULL where nothing is known
         least(g.active_gpu_seconds
               / nullif(g.gpu_share * g.held_seconds * g.activity_seconds / g.seconds_with_data, 0), 1)
           AS active_frac,
         -- the same on SM activity, where reported
         coalesce(least(g.sm_activity_seconds / nullif(g.seconds_with_data, 0), 1), 0) AS sm_known_frac,
         least(g.sm_active_gpu_seconds
               / nullif(g.gpu_share * g.held_seconds * g.sm_activity_seconds / g.seconds_with_data, 0), 1)
           AS sm_active_frac,
         coalesce(c.cost_source, 'estimate') AS cost_source
  FROM gpus g LEFT JOIN node_cost c USING (node, hour)
  UNION ALL
  SELECT u.hour, u.node, u.gpu, u.uuid, NULL, 'unsliced', u.share, '', '', '', '', 'mig_unsliced', 'AmazonEC2',
         coalesce(c.instance_ids, ''), u.seconds_with_data * u.share, 0.0, 0.0, 0.0, NULL, NULL, 0.0,
         coalesce(c.cost_usd, 0) / u.gpus_on_node * u.share, 0.0, 1.0, 0.0, 1.0, 0.0,
         coalesce(c.cost_source, 'estimate')
  FROM unsliced u LEFT JOIN node_cost c USING (node, hour)
),
-- node-hours that cost money but had no GPU rows (dcgm-exporter down): nobody to charge, cluster idle
orphan_node_rows AS (
  SELECT c.hour, c.node, NULL::INTEGER AS gpu, '' AS uuid, NULL::INTEGER AS gpu_instance, '' AS gpu_profile,
         NULL::DOUBLE AS gpu_share, '' AS pod, '' AS namespace, '' AS experiment, '' AS run_id,
         'node_without_gpus' AS kind, 'AmazonEC2' AS service, c.instance_ids AS resource_id,
         0.0 AS gpu_seconds, 0.0 AS held_seconds, 0.0 AS active_gpu_seconds, 0.0 AS energy_kwh,
         NULL::DOUBLE AS sm_active_gpu_seconds, NULL::DOUBLE AS tensor_active_gpu_seconds,
         0.0 AS held_wall_seconds, c.cost_usd AS gpu_cost, 0.0 AS held_frac, 1.0 AS known_frac, 0.0 AS active_frac,
         1.0 AS sm_known_frac, 0.0 AS sm_active_frac, c.cost_source
  FROM node_cost c ANTI JOIN gpus g USING (node, hour)
),
-- everything else on the bill: lines of no node-hour above (per instance and hour). With CUR: its other lines; before the
-- bill lands: the estimate's non-EC2 rows (FSx storage).
other_lines AS (
  SELECT experiment, service, resource_id, sum(cost_usd) AS cost_usd, 'cur' AS cost_source
  FROM cur_lines l
  WHERE NOT EXISTS (SELECT 1 FROM node_hours n
                   WHERE n.instance_id = l.resource_id AND n.hour = l.hour AND n.instance_id <> '')
  GROUP BY ALL
  UNION ALL
  SELECT experiment, service, resource_id, sum(cost_usd), 'estimate'
  FROM costs_daily
  WHERE day = $key AND source = 'estimate' AND service <> 'AmazonEC2' AND NOT (SELECT yes FROM has_cur)
  GROUP BY ALL
),
held AS (
  SELECT experiment, sum(held_seconds) AS held_seconds FROM gpu_rows WHERE experiment <> '' GROUP BY ALL
),
-- a tagged line goes to its experiment; untagged ones are shared by GPU-hours held that day
other_rows AS (
  SELECT $day::TIMESTAMPTZ AS hour, '' AS node, NULL::INTEGER AS gpu, '' AS uuid, NULL::INTEGER AS gpu_instance,
         '' AS gpu_profile, NULL::DOUBLE AS gpu_share, '' AS pod, '' AS namespace,
         CASE WHEN o.experiment <> '' THEN o.experiment ELSE coalesce(h.experiment, '') END AS experiment,
         '' AS run_id,
         CASE WHEN o.experiment <> '' THEN 'tagged' ELSE 'shared' END AS kind,
         o.service, o.resource_id,
         0.0 AS gpu_seconds, 0.0 AS held_seconds, 0.0 AS active_gpu_seconds, 0.0 AS energy_kwh,
         NULL::DOUBLE AS sm_active_gpu_seconds, NULL::DOUBLE AS tensor_active_gpu_seconds,
         0.0 AS held_wall_seconds,
         o.cost_usd * CASE WHEN o.experiment <> '' OR h.experiment IS NULL THEN 1
                           ELSE h.held_seconds / (SELECT sum(held_seconds) FROM held) END AS gpu_cost,
         -- nobody held a GPU that day: the shared lines are cluster idle
         CASE WHEN o.experiment <> '' OR h.experiment IS NOT NULL THEN 1.0 ELSE 0.0 END AS held_frac,
         1.0 AS known_frac, 1.0 AS active_frac, 1.0 AS sm_known_frac, 1.0 AS sm_active_frac, o.cost_source
  FROM other_lines o LEFT JOIN held h ON o.experiment = '' 
),
rows AS (
  SELECT * FROM gpu_rows UNION ALL SELECT * FROM orphan_node_rows UNION ALL SELECT * FROM other_rows
)
SELECT hour, node, gpu, uuid, pod, namespace, experiment, kind, service, resource_id,
       gpu_seconds, held_seconds, active_gpu_seconds, energy_kwh,
       gpu_cost * held_frac AS allocated_usd,
       gpu_cost * (1 - held_frac) AS unallocated_usd,
       -- idle $ only where activity is known; the rest is unknown_activity_usd, never counted as idle
       CASE WHEN kind = 'gpu' THEN coalesce(gpu_cost * held_frac * known_frac * (1 - active_frac), 0)
            ELSE 0 END AS idle_usd,
       cost_source, gpu_instance, gpu_profile, gpu_share,
       CASE WHEN kind = 'gpu' THEN gpu_cost * held_frac * (1 - CASE WHEN active_frac IS NULL THEN 0 ELSE known_frac END)
            ELSE 0 END AS unknown_activity_usd,
       run_id, sm_active_gpu_seconds,
       CASE WHEN kind = 'gpu' THEN coalesce(gpu_cost * held_frac * sm_known_frac * (1 - sm_active_frac), 0)
            ELSE 0 END AS sm_idle_usd,
       CASE WHEN kind = 'gpu' THEN gpu_cost * held_frac * (1 - CASE WHEN sm_active_frac IS NULL THEN 0 ELSE sm_known_frac END)
            ELSE 0 END AS sm_unknown_activity_usd,
       tensor_active_gpu_seconds, held_wall_seconds
FROM rows
ORDER BY hour, kind, node, gpu, gpu_instance NULLS FIRST, pod = '', namespace, pod, experiment, service, resource_id
