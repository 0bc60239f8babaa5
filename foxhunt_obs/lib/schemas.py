"""The lake's tables: name, partition column and pyarrow schema of each.

Names and columns are contracts (DESIGN §3): later assets, outside checks and Athena DDL rely on them.
Columns may grow; a column never changes meaning or unit. All timestamps are UTC.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

TS = pa.timestamp("ms", tz="UTC")
# Labels repeat on every row: dictionary-encoded in memory they cost an index per row, and Parquet
# writes them without hashing each string again. DuckDB reads them as plain VARCHAR.
LABEL = pa.dictionary(pa.int32(), pa.string())


@dataclass(frozen=True)
class TableSpec:
    name: str
    partition: str  # Hive partition column: "hour" (YYYY-MM-DDTHH) or "day" (YYYY-MM-DD)
    schema: pa.Schema
    doc: str

    def key(self, t) -> str:
        """The partition value of the hour or day starting at t (a datetime or date)."""
        formats = {"hour": "%Y-%m-%dT%H", "day": "%Y-%m-%d"}
        if self.partition not in formats:
            raise ValueError(f"table {self.name}: {self.partition!r} partitions have no time key")
        return t.strftime(formats[self.partition])


GPU_SAMPLES = TableSpec(
    name="gpu_samples",
    partition="hour",
    doc="One row per GPU per scrape step; units converted once, on ingest, by the metric catalog.",
    schema=pa.schema(
        [
            ("ts", TS),
            ("node", LABEL),
            ("gpu", pa.int32()),
            ("uuid", LABEL),
            ("model", LABEL),
            ("namespace", LABEL),
            ("pod", LABEL),
            ("container", LABEL),
            ("experiment", LABEL),
            ("util", pa.float64()),  # ratio 0-1
            ("mem_used_bytes", pa.float64()),
            ("mem_free_bytes", pa.float64()),
            ("mem_total_bytes", pa.float64()),
            ("temp_celsius", pa.float64()),
            ("power_watts", pa.float64()),
            ("sm_clock_hz", pa.float64()),
            ("mem_clock_hz", pa.float64()),
            ("energy_joules", pa.float64()),  # counter since driver load
            ("ecc_sbe_total", pa.float64()),  # counter
            ("ecc_dbe_total", pa.float64()),  # counter
            ("xid_last", pa.float64()),  # dcgm's XID_ERRORS gauge: the last XID code seen
            ("nvlink_bandwidth_total", pa.float64()),
            ("gr_engine_active", pa.float64()),  # ratio 0-1, when profiling metrics are on
            ("step_seconds", pa.float64()),  # the query step: each row stands for this many seconds
            # MIG: a slice is a row of its own (GPU_I_ID, GPU_I_PROFILE; null/'' for a whole GPU) and a
            # gpu_share of its GPU (3g.40gb on an H100: 3/7). Device-level values (temperature, power,
            # clocks, energy) on a slice's rows are its GPU's: weigh them by gpu_share when summing.
            ("gpu_instance", pa.int32()),
            ("gpu_profile", LABEL),
            ("gpu_share", pa.float64()),
            ("util_basis", LABEL),  # the source name util came from (a slice: GR_ENGINE_ACTIVE); '' none
            ("mem_reserved_bytes", pa.float64()),
            ("rows_remapped_uncorrectable_total", pa.float64()),  # counter
            ("rows_remapped_correctable_total", pa.float64()),  # counter
            ("row_remap_failure", pa.float64()),  # 1 = a row remap failed (the GPU needs a reset)
            ("sm_active", pa.float64()),  # ratio 0-1 (DCGM_FI_PROF_SM_ACTIVE, NVML GPM), where reported
            ("tensor_active", pa.float64()),  # ratio 0-1 (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, NVML GPM)
            # Time-slicing: a shared GPU's series come once per pod (`vgpu` the replica), one row each.
            # step_share: the part of the step a row stands for (1; 1/k for each of k pods sharing the GPU;
            # 0 for the shared GPU's own row while pods hold it). Sums over rows weigh by it.
            ("vgpu", LABEL),
            ("step_share", pa.float64()),
            ("run_id", LABEL),  # the MLflow run id from a pod label (FOXHUNT_RUN_ID_POD_LABEL), '' none
        ]
    ),
)

NODE_SAMPLES = TableSpec(
    name="node_samples",
    partition="hour",
    doc="One row per node per scrape step (node_exporter, kube-state-metrics, GPU presence).",
    schema=pa.schema(
        [
            ("ts", TS),
            ("node", pa.string()),
            ("instance_type", pa.string()),
            ("instance_id", pa.string()),  # EC2 instance (kube_node_info provider_id) at ts; '' unknown
            ("cpu_busy", pa.float64()),  # ratio 0-1, mean over CPUs
            ("mem_used_bytes", pa.float64()),  # MemTotal - MemAvailable
            ("mem_total_bytes", pa.float64()),
            ("net_tx_bytes_per_second", pa.float64()),
            ("net_rx_bytes_per_second", pa.float64()),
            ("gpus_reporting", pa.int32()),
            ("gpu_node_up", pa.bool_()),
            ("step_seconds", pa.float64()),
        ]
    ),
)

GPU_HOURLY = TableSpec(
    name="gpu_hourly",
    partition="day",
    doc="One row per GPU-hour and holder: each pod's held seconds, how busy, energy and errors; pod '' "
    "is the part no pod held.",
    schema=pa.schema(
        [
            ("hour", TS),
            ("node", pa.string()),
            ("gpu", pa.int32()),
            ("uuid", pa.string()),
            ("model", pa.string()),
            ("namespace", pa.string()),
            ("pod", pa.string()),  # the holder of this row's seconds ('' = the part no pod held)
            ("experiment", pa.string()),
            ("pods_seen", pa.int32()),  # pods that held the GPU (slice) in the hour
            ("samples", pa.int64()),
            ("seconds_with_data", pa.float64()),  # this row's seconds (a time-sliced step: step / k)
            ("util_mean", pa.float64()),
            ("util_p95", pa.float64()),
            ("active_gpu_seconds", pa.float64()),  # sum(util * step) * gpu_share; NULL: util unknown
            ("held_seconds", pa.float64()),  # seconds a pod held the GPU
            ("energy_kwh", pa.float64()),
            ("temp_max_celsius", pa.float64()),
            ("power_mean_watts", pa.float64()),
            ("mem_used_max_bytes", pa.float64()),
            ("ecc_sbe_delta", pa.float64()),
            ("ecc_dbe_delta", pa.float64()),
            # MIG: one row per slice-hour (gpu_instance null for a whole GPU); active_gpu_seconds and
            # energy_kwh are already weighed by gpu_share, the *_seconds columns are wall-clock seconds.
            ("gpu_instance", pa.int32()),
            ("gpu_profile", pa.string()),
            ("gpu_share", pa.float64()),
            ("util_basis", pa.string()),  # the util source (a slice: DCGM_FI_PROF_GR_ENGINE_ACTIVE)
            ("activity_seconds", pa.float64()),  # seconds with a util value; the rest is unknown activity
            ("run_id", pa.string()),  # the holder pod's MLflow run id label (FOXHUNT_RUN_ID_POD_LABEL), ''
            ("device_seconds", pa.float64()),  # seconds the GPU (slice) reported in the hour: all its rows'
            ("sm_activity_seconds", pa.float64()),  # of seconds_with_data, those with an SM activity value
            ("sm_active_gpu_seconds", pa.float64()),  # sum(sm_active * step) * gpu_share; NULL: not reported
            ("tensor_active_gpu_seconds", pa.float64()),  # sum(tensor_active * step) * gpu_share; NULL: none
            (
                "held_wall_seconds",
                pa.float64(),
            ),  # wall-clock seconds the pod was on it (time-sliced: whole steps)
        ]
    ),
)

RAY_SAMPLES = TableSpec(
    name="ray_samples",
    partition="hour",
    doc=(
        "One row per Ray node (a KubeRay pod scraped as a Ray target) per scrape step, from Ray's own series "
        "(data/ray_metrics.yaml): logical GPUs, tasks, the GCS's actor states (on the head's row), object "
        "store. alive false: the node's scrape failed (its raylet gone), its values null."
    ),
    schema=pa.schema(
        [
            ("ts", TS),
            ("ray_cluster", LABEL),  # the RayCluster (ray.io/cluster, the ray_io_cluster target label)
            ("namespace", LABEL),
            ("pod", LABEL),
            ("node_type", LABEL),  # head / worker (KubeRay's ray.io/node-type), '' unknown
            ("experiment", LABEL),  # the head pod's experiment label, else the pod's, else its namespace's
            ("alive", pa.bool_()),  # the Ray node answered its scrape at this step
            ("gpus_total", pa.float64()),  # Ray's logical GPUs on the node (ray_resources Name=GPU)
            ("gpus_used", pa.float64()),
            ("gpus_available", pa.float64()),
            ("tasks_pending", pa.float64()),  # PENDING_NODE_ASSIGNMENT, as the owners on this node report
            ("tasks_running", pa.float64()),
            ("tasks_failed", pa.float64()),  # tasks in state FAILED (a running count, not a rate)
            ("actors_alive", pa.float64()),  # the GCS's counts: the cluster's, on the head's row only
            ("actors_restarting", pa.float64()),
            ("actors_dead", pa.float64()),
            ("object_store_used_bytes", pa.float64()),  # in the plasma store's shared memory
            ("object_store_capacity_bytes", pa.float64()),
            ("step_seconds", pa.float64()),
        ]
    ),
)

TRAINING_RUNS = TableSpec(
    name="training_runs",
    partition="snapshot",  # one partition, "current": the table is a snapshot, replaced whole each time
    doc="One row per MLflow run (deleted ones too): ids, experiment, status, times, params and tags.",
    schema=pa.schema(
        [
            ("run_id", pa.string()),
            ("experiment_id", pa.string()),
            ("mlflow_experiment", pa.string()),  # MLflow's experiment name
            ("experiment", pa.string()),  # the join key to gpu_samples: tag `experiment`, else the above
            ("run_name", pa.string()),
            ("status", pa.string()),  # RUNNING / SCHEDULED / FINISHED / FAILED / KILLED
            ("deleted", pa.bool_()),
            ("start_time", TS),
            ("end_time", TS),
            ("duration_seconds", pa.float64()),
            ("user", pa.string()),
            ("params", pa.string()),  # JSON object
            ("tags", pa.string()),  # JSON object
            ("pod", pa.string()),  # tag `pod` (joins gpu_samples.pod) or ''
            ("namespace", pa.string()),
            ("metric_keys", pa.string()),  # JSON list
            ("last_metric_time", TS),
            ("history_status", pa.string()),  # the status the stored history was read at
            ("history_points", pa.int64()),
            ("synced_at", TS),
        ]
    ),
)

TRAINING_HISTORY = TableSpec(
    name="training_history",
    partition="run",
    doc="Every metric point of one MLflow run: the incremental cache training_metrics is cut from.",
    schema=pa.schema(
        [
            ("run_id", pa.string()),
            ("key", pa.string()),
            ("step", pa.int64()),
            ("ts", TS),
            ("value", pa.float64()),
        ]
    ),
)

TRAINING_METRICS = TableSpec(
    name="training_metrics",
    partition="day",
    doc="MLflow metric points by day of their timestamp; NaN and ±Inf kept.",
    schema=TRAINING_HISTORY.schema,
)

TRAINING_HEALTH = TableSpec(
    name="training_health",
    partition="day",
    doc="Per run and day: success trend, NaN/Inf losses, entropy collapse, bottleneck, accuracy band, stall.",
    schema=pa.schema(
        [
            ("day", pa.date32()),
            ("run_id", pa.string()),
            ("run_name", pa.string()),
            ("experiment", pa.string()),
            ("status", pa.string()),
            ("deleted", pa.bool_()),
            ("pod", pa.string()),
            ("points", pa.int64()),
            ("success_rate_last", pa.float64()),
            ("success_rate_best", pa.float64()),  # best up to the end of the day
            ("success_rate_trend_per_hour", pa.float64()),
            ("success_drop", pa.bool_()),
            ("loss_nonfinite", pa.int64()),  # NaN or ±Inf values of actor/loss
            ("entropy_last", pa.float64()),
            ("entropy_slope_per_hour", pa.float64()),
            ("entropy_collapse", pa.bool_()),
            ("rollout_share", pa.float64()),  # timing/generate / timing/total
            ("update_share", pa.float64()),  # timing/update / timing/total
            ("bottleneck", pa.string()),  # rollout / update / ''
            ("accuracy_out_of_band_points", pa.int64()),
            ("accuracy_out_of_band", pa.bool_()),
            ("last_metric_time", TS),
            ("minutes_since_last_metric", pa.float64()),
            ("stalled", pa.bool_()),
        ]
    ),
)

FSX_METRICS = TableSpec(
    name="fsx_metrics",
    partition="hour",
    doc="CloudWatch AWS/FSx datapoints per file system, metric and statistic (period start, UTC).",
    schema=pa.schema(
        [
            ("ts", TS),  # start of the CloudWatch period
            ("file_system_id", LABEL),
            ("file_system_name", LABEL),  # its Name tag, '' when untagged
            ("metric", LABEL),  # CloudWatch metric name: DataReadBytes, FreeDataStorageCapacity, ...
            ("statistic", LABEL),  # Sum / Minimum
            ("period_seconds", pa.int32()),
            ("value", pa.float64()),
            ("per_second", pa.float64()),  # Sum of a bytes/operations metric / period; null otherwise
        ]
    ),
)

# Money columns: CUR and Cost Explorer amounts are parsed as Decimal and become float64 only here.
COSTS_HOURLY = TableSpec(
    name="costs_hourly",
    partition="day",
    doc="CUR 2.0 line items per resource-hour (from the newest manifest), tags normalised to plain keys.",
    schema=pa.schema(
        [
            ("hour", TS),  # line_item_usage_start_date
            ("billing_period", pa.string()),  # YYYY-MM
            ("account_id", pa.string()),
            ("line_item_type", pa.string()),  # Usage, DiscountedUsage, SavingsPlanCoveredUsage, Tax, ...
            ("service", pa.string()),  # product code: AmazonEC2, AmazonFSx, AmazonS3, ...
            ("usage_type", pa.string()),
            ("operation", pa.string()),
            ("instance_type", pa.string()),
            ("resource_id", pa.string()),  # '' when the line has none
            ("usage_amount", pa.float64()),
            ("cost_usd", pa.float64()),  # unblended
            ("amortized_usd", pa.float64()),  # effective cost: RI / Savings Plan fees spread on usage
            ("project", pa.string()),  # FOXHUNT_COST_TAGS values, '' when untagged
            ("environment", pa.string()),
            ("experiment", pa.string()),
            ("tags", pa.string()),  # every resource tag, normalised keys, JSON object
            ("manifest", pa.string()),  # the manifest (execution) the line came from
        ]
    ),
)

COSTS_DAILY = TableSpec(
    name="costs_daily",
    partition="day",
    doc=(
        "Daily cost per source (ce, cur, estimate) by tag, service and resource. Within one day and source "
        "the rows never overlap: their cost_usd sums to that source's total for the day."
    ),
    schema=pa.schema(
        [
            ("day", pa.date32()),
            ("source", pa.string()),  # ce / cur / estimate
            ("project", pa.string()),  # '' = untagged
            ("environment", pa.string()),
            ("experiment", pa.string()),
            ("service", pa.string()),  # AWS product code (Cost Explorer's names mapped to it)
            ("resource_id", pa.string()),  # cur: the resource; estimate: node or file system; ce: ''
            ("cost_usd", pa.float64()),  # unblended
            ("amortized_usd", pa.float64()),
            ("usage_quantity", pa.float64()),
            ("estimated", pa.bool_()),  # Cost Explorer's Estimated flag; always true for source=estimate
        ]
    ),
)

BUDGETS = TableSpec(
    name="budgets",
    partition="day",
    doc="AWS Budgets as seen on the day: limit, actual and forecasted spend (plus Cost Explorer's forecast).",
    schema=pa.schema(
        [
            ("day", pa.date32()),
            ("source", pa.string()),  # budgets / ce_forecast
            ("account_id", pa.string()),
            ("budget_name", pa.string()),
            ("budget_type", pa.string()),  # COST, USAGE, ...
            ("time_unit", pa.string()),  # MONTHLY, ...
            ("period_start", TS),
            ("period_end", TS),
            ("limit_usd", pa.float64()),
            ("actual_usd", pa.float64()),
            ("forecast_usd", pa.float64()),
            ("synced_at", TS),
        ]
    ),
)

COST_ALLOCATION = TableSpec(
    name="cost_allocation",
    partition="day",
    doc=(
        "Per GPU-hour (kind gpu): its node's cost for the hour ÷ GPUs reporting, charged to the holder pod's "
        "experiment for the share of the hour held (allocated_usd), the rest cluster idle (unallocated_usd). "
        "Plus the day's bill lines on no node-hour: kind tagged (to their Experiment tag) or shared (by "
        "GPU-hours held), node_without_gpus, and mig_unsliced (a MIG GPU's part no slice covers). A MIG "
        "slice is a row with its share of its GPU's cost. Per day, allocated + unallocated = the bill."
    ),
    schema=pa.schema(
        [
            ("hour", TS),
            ("node", pa.string()),
            ("gpu", pa.int32()),  # null for rows that are no GPU's
            ("uuid", pa.string()),
            ("pod", pa.string()),
            ("namespace", pa.string()),
            ("experiment", pa.string()),  # '' = nobody: cluster idle
            ("kind", pa.string()),  # gpu / tagged / shared / node_without_gpus
            ("service", pa.string()),
            ("resource_id", pa.string()),  # the node's EC2 instance id(s), or the bill line's resource
            ("gpu_seconds", pa.float64()),  # GPU-seconds the GPU (a slice: × gpu_share) reported in the hour
            ("held_seconds", pa.float64()),  # GPU-seconds a pod held it
            ("active_gpu_seconds", pa.float64()),  # Σ util × Δt (× gpu_share); NULL: activity unknown
            ("energy_kwh", pa.float64()),
            ("allocated_usd", pa.float64()),
            ("unallocated_usd", pa.float64()),  # cluster idle
            ("idle_usd", pa.float64()),  # allocated $ × (1 − active fraction), where activity is known
            ("cost_source", pa.string()),  # cur / estimate / cur+estimate
            ("gpu_instance", pa.int32()),  # MIG slice (null: a whole GPU, or no GPU's row)
            ("gpu_profile", pa.string()),  # MIG profile; 'unsliced' for a MIG GPU's part no slice covers
            ("gpu_share", pa.float64()),  # of the GPU's cost this row carries (1 for a whole GPU)
            ("unknown_activity_usd", pa.float64()),  # allocated $ with no util reported: not idle, unknown
            ("run_id", pa.string()),  # the holder pod's MLflow run id label, '' none
            # the same on SM activity (the other activity basis), where reported
            ("sm_active_gpu_seconds", pa.float64()),  # NULL: not reported
            ("sm_idle_usd", pa.float64()),
            ("sm_unknown_activity_usd", pa.float64()),
            ("tensor_active_gpu_seconds", pa.float64()),
            (
                "held_wall_seconds",
                pa.float64(),
            ),  # wall-clock seconds the pod held it (a run's window is wall-clock)
        ]
    ),
)

UTILIZATION_PER_DOLLAR = TableSpec(
    name="utilization_per_dollar",
    partition="day",
    doc="Experiment × day: GPU-hours, active GPU-hours, cost, idle cost, active GPU-hours per $, $ per active GPU-hour.",
    schema=pa.schema(
        [
            ("day", pa.date32()),
            ("experiment", pa.string()),  # "(cluster idle)": GPU time no pod held, cost nobody was charged
            ("gpu_hours", pa.float64()),
            ("active_gpu_hours", pa.float64()),
            ("mean_util", pa.float64()),
            ("allocated_usd", pa.float64()),
            ("idle_usd", pa.float64()),
            ("active_gpu_hours_per_usd", pa.float64()),  # utilization per dollar: higher is better
            ("usd_per_active_gpu_hour", pa.float64()),
            ("energy_kwh", pa.float64()),
            ("cost_source", pa.string()),
            (
                "unknown_activity_usd",
                pa.float64(),
            ),  # $ of GPU time with no util reported: neither busy nor idle
            # The other activity basis, SM activity (DCGM_FI_PROF_SM_ACTIVE), over the $ where it is reported
            ("sm_active_gpu_hours", pa.float64()),
            ("sm_active_gpu_hours_per_usd", pa.float64()),
            ("sm_idle_usd", pa.float64()),
            ("sm_unknown_activity_usd", pa.float64()),
        ]
    ),
)

OUTCOME_PER_DOLLAR = TableSpec(
    name="outcome_per_dollar",
    partition="day",
    doc="Per MLflow run alive that day: success_rate at start and at the day's end, $ its own pods cost in its window, $ per point.",
    schema=pa.schema(
        [
            ("day", pa.date32()),
            ("run_id", pa.string()),
            ("run_name", pa.string()),
            ("experiment", pa.string()),
            ("pod", pa.string()),
            ("status", pa.string()),
            ("success_start", pa.float64()),
            ("success_end", pa.float64()),  # the last value up to the day's end
            ("success_best", pa.float64()),
            ("success_gained_points", pa.float64()),  # 100 × (end − start)
            (
                "usd",
                pa.float64(),
            ),  # its pods' allocated GPU cost in its window up to the day's end; NULL: none known
            ("idle_usd", pa.float64()),
            ("usd_per_point", pa.float64()),  # null when nothing was gained
            ("namespace", pa.string()),  # its `namespace` tag ('' = its pods matched in any namespace)
            ("gpu_hours", pa.float64()),  # GPU-hours of its pods in its window
            ("sm_idle_usd", pa.float64()),  # idle $ on the SM-activity basis, where reported
            ("charged_by", pa.string()),  # how its dollars were found, or why there are none
        ]
    ),
)

ALERTS = TableSpec(
    name="alerts",
    partition="day",
    doc=(
        "One row per alert transition (firing or resolved), partitioned by the day of the transition; "
        "(fingerprint, status, starts_at) is unique: a retried delivery adds no row."
    ),
    schema=pa.schema(
        [
            ("day", pa.date32()),  # of ts
            ("ts", TS),  # the transition: starts_at when firing, ends_at when resolved
            ("rule", pa.string()),  # the rule id (Alertmanager's alertname)
            ("fingerprint", pa.string()),
            ("severity", pa.string()),  # critical / warning / info
            ("status", pa.string()),  # firing / resolved
            ("labels", pa.string()),  # JSON object
            ("summary", pa.string()),
            ("value", pa.float64()),  # the value that fired the rule (NaN kept)
            ("starts_at", TS),
            ("ends_at", TS),  # null while firing
            ("sent_to", pa.string()),  # comma-separated sinks that accepted it: alertmanager,slack,webhook
        ]
    ),
)

SPEND_NOW = TableSpec(
    name="spend_now",
    partition="day",
    doc=(
        "Live spend as of a refresh, per experiment and source (cluster: the live cost rules' $/h in "
        "Prometheus; untracked: running EC2 instances outside the cluster): $/h now, today so far, the "
        "month so far (the lake's cost_allocation for its complete days, live for the rest) and the "
        "month's run rate (so far + $/h now x the hours left). A refresh replaces the day's partition."
    ),
    schema=pa.schema(
        [
            ("as_of", TS),
            ("experiment", pa.string()),
            ("source", pa.string()),  # cluster / untracked
            ("usd_per_hour", pa.float64()),
            ("today_usd", pa.float64()),
            ("month_usd", pa.float64()),
            ("run_rate_usd", pa.float64()),  # the month's projection at the current $/h
        ]
    ),
)

TABLES: dict[str, TableSpec] = {
    t.name: t
    for t in (
        GPU_SAMPLES,
        NODE_SAMPLES,
        RAY_SAMPLES,
        GPU_HOURLY,
        TRAINING_RUNS,
        TRAINING_HISTORY,
        TRAINING_METRICS,
        TRAINING_HEALTH,
        FSX_METRICS,
        COSTS_HOURLY,
        COSTS_DAILY,
        BUDGETS,
        COST_ALLOCATION,
        UTILIZATION_PER_DOLLAR,
        OUTCOME_PER_DOLLAR,
        ALERTS,
        SPEND_NOW,
    )
}
