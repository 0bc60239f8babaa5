"""The lake's tables: name, partition column, pyarrow schema, and what each table and column means.

Each table is described once, here: `TableSpec.doc` (the table) and `TableSpec.columns` (each column, with
its unit). The asset's description and its `dagster/column_schema` (foxhunt_obs/assetkit.py), the Athena
DDL's comments (athena.py) and the tables reference page (docs/reference/tables.md) are made from them.

Names and columns are contracts (docs/design.md#the-lake): later assets, outside checks and Athena DDL rely
on them. Columns may grow; a column never changes meaning or unit. All timestamps are UTC.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import pyarrow as pa

TS = pa.timestamp("ms", tz="UTC")
# Labels repeat on every row: dictionary-encoded in memory they cost an index per row, and Parquet
# writes them without hashing each string again. DuckDB reads them as plain VARCHAR.
LABEL = pa.dictionary(pa.int32(), pa.string())
STR, F64, I32, I64, BOOL, DATE = pa.string(), pa.float64(), pa.int32(), pa.int64(), pa.bool_(), pa.date32()


# The one partition of a snapshot table (training_runs), replaced whole on each write.
SNAPSHOT = "current"


@dataclass(frozen=True)
class Partitioning:
    """What the folder values of a kind of partition column are."""

    meaning: str  # what one partition holds
    value: str = ""  # the values' pattern, or the one value; "" where any value goes (a run id)
    strftime: str = ""  # a time partition: the value of the hour or day starting at t (TableSpec.key)

    def describe(self, quote: Callable[[str], str] = str) -> str:
        """In words, the value or pattern passed through `quote` (Markdown code on the docs pages)."""
        return f"{self.meaning} ({quote(self.value)})" if self.value else self.meaning


# Every kind of partition column, by its name: the one description of the lake's folder values (TableSpec.key,
# the Athena DDL's partition comments, docs/reference/tables.md).
PARTITIONS: Mapping[str, Partitioning] = MappingProxyType(
    {
        "hour": Partitioning("the UTC hour", "YYYY-MM-DDTHH", "%Y-%m-%dT%H"),
        "day": Partitioning("the UTC day", "YYYY-MM-DD", "%Y-%m-%d"),
        "snapshot": Partitioning("the one snapshot, replaced whole", SNAPSHOT),
        "run": Partitioning("one per MLflow run, named by its run id"),
    }
)


@dataclass(frozen=True)
class TableSpec:
    name: str
    partition: str  # Hive partition column, a key of PARTITIONS: "hour", "day", "snapshot" or "run"
    schema: pa.Schema
    doc: str  # what one row is and what the table holds: the asset's description
    # column -> what it means, with its unit: one per column of the schema (lake tables; TABLES' test)
    columns: Mapping[str, str] = field(default_factory=dict, hash=False)

    @classmethod
    def define(
        cls, name: str, partition: str, doc: str, columns: Sequence[tuple[str, pa.DataType, str]]
    ) -> TableSpec:
        """A spec from its columns as (name, type, note), each note written beside its column."""
        return cls(
            name=name,
            partition=partition,
            schema=pa.schema([(n, t) for n, t, _ in columns]),
            doc=doc,
            columns=MappingProxyType({n: note for n, _, note in columns}),
        )

    def key(self, t) -> str:
        """The partition value of the hour or day starting at t (a datetime or date)."""
        kind = PARTITIONS.get(self.partition)
        if kind is None or not kind.strftime:
            raise ValueError(f"table {self.name}: {self.partition!r} partitions have no time key")
        return t.strftime(kind.strftime)


# Units are converted once, on ingest, by the metric catalog (data/metric_catalog.yaml): ratios 0-1, bytes,
# hertz, joules, watts, degrees Celsius. MIG: a slice is a row of its own, with a gpu_share of its GPU
# (3g.40gb on an H100: 3/7); device-level values (temperature, power, clocks, energy) on a slice's rows are
# its GPU's: weigh them by gpu_share when summing. Time-slicing: a shared GPU's series come once per pod
# (`vgpu` the replica), one row each, and step_share is the part of the step a row stands for.
GPU_SAMPLES = TableSpec.define(
    name="gpu_samples",
    partition="hour",
    doc="One row per GPU per scrape step; units converted once, on ingest, by the metric catalog.",
    columns=[
        ("ts", TS, "the scrape step's time (UTC)"),
        ("node", LABEL, "the Kubernetes node the GPU is on"),
        ("gpu", I32, "the GPU's index on its node (the exporter's gpu label)"),
        ("uuid", LABEL, "the GPU's UUID (GPU-...): the GPU across restarts and renumbering"),
        ("model", LABEL, "the GPU's model name as the exporter reports it"),
        ("namespace", LABEL, "the holder pod's namespace; '' when no pod holds the GPU"),
        ("pod", LABEL, "the pod holding the GPU at this step; '' when none"),
        ("container", LABEL, "the holder pod's container given the GPU; '' when none"),
        ("experiment", LABEL, "the holder pod's label FOXHUNT_EXPERIMENT_LABEL, else its namespace's"),
        ("util", F64, "GPU utilization, ratio 0-1 (its source series in util_basis); null: not reported"),
        ("mem_used_bytes", F64, "framebuffer memory used, bytes"),
        ("mem_free_bytes", F64, "framebuffer memory free, bytes"),
        ("mem_total_bytes", F64, "framebuffer memory in all, bytes: used + free + reserved, or as exported"),
        ("temp_celsius", F64, "GPU temperature, degrees Celsius"),
        ("power_watts", F64, "power draw, watts"),
        ("sm_clock_hz", F64, "SM clock, hertz"),
        ("mem_clock_hz", F64, "memory clock, hertz"),
        ("energy_joules", F64, "energy used, joules: a counter since driver load"),
        ("ecc_sbe_total", F64, "single-bit (corrected) volatile ECC errors: a counter"),
        ("ecc_dbe_total", F64, "double-bit (uncorrected) volatile ECC errors: a counter"),
        ("xid_last", F64, "dcgm's XID_ERRORS gauge: the last XID code seen"),
        ("nvlink_bandwidth_total", F64, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL as exported (not converted)"),
        ("gr_engine_active", F64, "graphics engine active, ratio 0-1, when profiling metrics are on"),
        ("step_seconds", F64, "the query step, seconds: each row stands for this many seconds"),
        ("gpu_instance", I32, "MIG GPU instance id (GPU_I_ID); null for a whole GPU"),
        ("gpu_profile", LABEL, "MIG profile (GPU_I_PROFILE, e.g. 3g.40gb); '' for a whole GPU"),
        ("gpu_share", F64, "the part of its GPU this row is, 0-1 (an H100's 3g.40gb slice: 3/7; whole: 1)"),
        ("util_basis", LABEL, "the source series util came from (a MIG slice: GR_ENGINE_ACTIVE); '' none"),
        ("mem_reserved_bytes", F64, "framebuffer memory the driver reserves, bytes (FB_RESERVED)"),
        ("rows_remapped_uncorrectable_total", F64, "rows remapped for uncorrectable errors: a counter"),
        ("rows_remapped_correctable_total", F64, "rows remapped for correctable errors: a counter"),
        ("row_remap_failure", F64, "1 = a row remap failed (the GPU needs a reset), else 0"),
        ("sm_active", F64, "SM activity, ratio 0-1 (DCGM_FI_PROF_SM_ACTIVE, NVML GPM), where reported"),
        ("tensor_active", F64, "tensor pipe activity, ratio 0-1 (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, NVML GPM)"),
        ("vgpu", LABEL, "the time-slicing replica of a shared GPU's series; '' when not time-sliced"),
        (
            "step_share",
            F64,
            "the part of the step this row stands for, 0-1: 1; 1/k for each of k pods sharing the GPU; 0 for "
            "the shared GPU's own row while pods hold it. Sums over rows weigh by it",
        ),
        ("run_id", LABEL, "the MLflow run id from a pod label (FOXHUNT_RUN_ID_POD_LABEL); '' none"),
    ],
)

NODE_SAMPLES = TableSpec.define(
    name="node_samples",
    partition="hour",
    doc="One row per node per scrape step (node_exporter, kube-state-metrics, GPU presence).",
    columns=[
        ("ts", TS, "the scrape step's time (UTC)"),
        ("node", STR, "the Kubernetes node"),
        ("instance_type", STR, "the node's EC2 instance type (node.kubernetes.io/instance-type); '' unknown"),
        ("instance_id", STR, "the EC2 instance (kube_node_info provider_id) at ts; '' unknown"),
        ("cpu_busy", F64, "CPU busy, ratio 0-1, mean over the node's CPUs"),
        ("mem_used_bytes", F64, "memory used, bytes: MemTotal - MemAvailable"),
        ("mem_total_bytes", F64, "memory in all (MemTotal), bytes"),
        ("net_tx_bytes_per_second", F64, "network sent, bytes per second, over the eth/ens/enp devices"),
        ("net_rx_bytes_per_second", F64, "network received, bytes per second, over the eth/ens/enp devices"),
        ("gpus_reporting", I32, "GPUs (distinct UUIDs) in gpu_samples on the node at ts"),
        ("gpu_node_up", BOOL, "at least one GPU reported on the node at ts"),
        ("step_seconds", F64, "the query step, seconds: each row stands for this many seconds"),
    ],
)

GPU_HOURLY = TableSpec.define(
    name="gpu_hourly",
    partition="day",
    doc="One row per GPU-hour and holder: each pod's held seconds, how busy, energy and errors; pod '' "
    "is the part no pod held.",
    columns=[
        ("hour", TS, "the hour's start (UTC)"),
        ("node", STR, "the node the GPU is on"),
        ("gpu", I32, "the GPU's index on its node"),
        ("uuid", STR, "the GPU's UUID"),
        ("model", STR, "the GPU's model name"),
        ("namespace", STR, "the holder pod's namespace; '' for the part no pod held"),
        ("pod", STR, "the holder of this row's seconds; '' = the part no pod held"),
        ("experiment", STR, "the holder pod's experiment; the part no pod held is unattributed"),
        ("pods_seen", I32, "pods that held the GPU (MIG slice) in the hour"),
        ("samples", I64, "gpu_samples rows behind this row"),
        ("seconds_with_data", F64, "this row's seconds, wall-clock (a time-sliced step counts step / k)"),
        ("util_mean", F64, "mean util over the row's samples, ratio 0-1; null: util unknown"),
        ("util_p95", F64, "95th percentile of util over the row's samples, ratio 0-1"),
        ("active_gpu_seconds", F64, "GPU-seconds busy: sum(util × step) × gpu_share; NULL: util unknown"),
        ("held_seconds", F64, "seconds a pod held the GPU, wall-clock (0 for pod '')"),
        ("energy_kwh", F64, "energy, kWh: the counter's increment × gpu_share, split over holders by power"),
        ("temp_max_celsius", F64, "highest temperature in the hour, degrees Celsius"),
        ("power_mean_watts", F64, "mean power draw, watts"),
        ("mem_used_max_bytes", F64, "most framebuffer memory used in the hour, bytes"),
        ("ecc_sbe_delta", F64, "single-bit (corrected) ECC errors in the hour: the counter's increment"),
        ("ecc_dbe_delta", F64, "double-bit (uncorrected) ECC errors in the hour: the counter's increment"),
        ("gpu_instance", I32, "MIG slice (one row per slice-hour); null for a whole GPU"),
        ("gpu_profile", STR, "MIG profile; '' for a whole GPU"),
        ("gpu_share", F64, "the part of its GPU the row is, ratio 0-1 (1 for a whole GPU)"),
        ("util_basis", STR, "the util source (a MIG slice: DCGM_FI_PROF_GR_ENGINE_ACTIVE); '' none"),
        ("activity_seconds", F64, "of seconds_with_data, those with a util value (the rest: unknown)"),
        ("run_id", STR, "the holder pod's MLflow run id label (FOXHUNT_RUN_ID_POD_LABEL); '' none"),
        ("device_seconds", F64, "seconds the GPU (slice) reported in the hour: its rows' seconds summed"),
        ("sm_activity_seconds", F64, "of seconds_with_data, those with an SM activity value"),
        ("sm_active_gpu_seconds", F64, "sum(sm_active × step) × gpu_share; NULL: not reported"),
        ("tensor_active_gpu_seconds", F64, "sum(tensor_active × step) × gpu_share; NULL: not reported"),
        ("held_wall_seconds", F64, "wall-clock seconds the pod was on it (time-sliced: whole steps)"),
    ],
)

RAY_SAMPLES = TableSpec.define(
    name="ray_samples",
    partition="hour",
    doc=(
        "One row per Ray node (a KubeRay pod scraped as a Ray target) per scrape step, from Ray's own series "
        "(data/ray_metrics.yaml): logical GPUs, tasks, the GCS's actor states (on the head's row), object "
        "store. alive false: the node's scrape failed (its raylet gone), its values null."
    ),
    columns=[
        ("ts", TS, "the scrape step's time (UTC)"),
        ("ray_cluster", LABEL, "the RayCluster (ray.io/cluster, the ray_io_cluster target label)"),
        ("namespace", LABEL, "the Ray pod's namespace"),
        ("pod", LABEL, "the Ray pod (one Ray node)"),
        ("node_type", LABEL, "head / worker (KubeRay's ray.io/node-type); '' unknown"),
        ("experiment", LABEL, "the head pod's experiment label, else the pod's, else its namespace's"),
        ("alive", BOOL, "the Ray node answered its scrape at this step"),
        ("gpus_total", F64, "Ray's logical GPUs on the node (ray_resources Name=GPU)"),
        ("gpus_used", F64, "logical GPUs in use on the node"),
        ("gpus_available", F64, "logical GPUs free on the node"),
        ("tasks_pending", F64, "tasks in PENDING_NODE_ASSIGNMENT, as the owners on this node report"),
        ("tasks_running", F64, "tasks running, as the owners on this node report"),
        ("tasks_failed", F64, "tasks in state FAILED (a running count, not a rate)"),
        ("actors_alive", F64, "actors alive: the GCS's count for the cluster, on the head's row only"),
        ("actors_restarting", F64, "actors restarting: the GCS's count, on the head's row only"),
        ("actors_dead", F64, "actors dead: the GCS's count, on the head's row only"),
        ("object_store_used_bytes", F64, "object store used, bytes (in the plasma store's shared memory)"),
        ("object_store_capacity_bytes", F64, "object store capacity, bytes"),
        ("step_seconds", F64, "the query step, seconds: each row stands for this many seconds"),
    ],
)

TRAINING_RUNS = TableSpec.define(
    name="training_runs",
    partition="snapshot",  # one partition, SNAPSHOT: the table is a snapshot, replaced whole each time
    doc="One row per MLflow run (deleted ones too): ids, experiment, status, times, params and tags.",
    columns=[
        ("run_id", STR, "MLflow's run id"),
        ("experiment_id", STR, "MLflow's experiment id"),
        ("mlflow_experiment", STR, "MLflow's experiment name"),
        ("experiment", STR, "the join key to gpu_samples: tag `experiment`, else mlflow_experiment"),
        ("run_name", STR, "the run's name"),
        ("status", STR, "RUNNING / SCHEDULED / FINISHED / FAILED / KILLED"),
        ("deleted", BOOL, "the run is deleted in MLflow (its lifecycle stage)"),
        ("start_time", TS, "the run's start (UTC)"),
        ("end_time", TS, "the run's end (UTC); null while it runs"),
        ("duration_seconds", F64, "end_time - start_time, seconds; null while it runs"),
        ("user", STR, "the user who started the run"),
        ("params", STR, "the run's params, a JSON object"),
        ("tags", STR, "the run's tags, a JSON object"),
        ("pod", STR, "tag `pod` (joins gpu_samples.pod; a comma-separated list) or ''"),
        ("namespace", STR, "tag `namespace` or '' (its pods matched in any namespace)"),
        ("metric_keys", STR, "the run's metric keys, a JSON list"),
        ("last_metric_time", TS, "the newest metric point's time (UTC)"),
        ("history_status", STR, "the run's status when its stored history was read"),
        ("history_points", I64, "metric points in its stored history (training_history)"),
        ("synced_at", TS, "when this snapshot was taken (UTC)"),
    ],
)

_METRIC_POINTS = [
    ("run_id", STR, "MLflow's run id"),
    ("key", STR, "the metric's key (success_rate, actor/loss, timing/total, ...)"),
    ("step", I64, "the point's step, as logged"),
    ("ts", TS, "the point's timestamp (UTC)"),
    ("value", F64, "the point's value; NaN and ±Inf kept"),
]

TRAINING_HISTORY = TableSpec.define(
    name="training_history",
    partition="run",
    doc="Every metric point of one MLflow run: the incremental cache training_metrics is cut from.",
    columns=_METRIC_POINTS,
)

TRAINING_METRICS = TableSpec.define(
    name="training_metrics",
    partition="day",
    doc="MLflow metric points by day of their timestamp; NaN and ±Inf kept.",
    columns=_METRIC_POINTS,
)

TRAINING_HEALTH = TableSpec.define(
    name="training_health",
    partition="day",
    doc="Per run and day: success trend, NaN/Inf losses, entropy collapse, bottleneck, accuracy band, stall.",
    columns=[
        ("day", DATE, "the day (UTC)"),
        ("run_id", STR, "MLflow's run id"),
        ("run_name", STR, "the run's name"),
        ("experiment", STR, "the run's experiment (training_runs.experiment)"),
        ("status", STR, "the run's status"),
        ("deleted", BOOL, "the run is deleted in MLflow"),
        ("pod", STR, "the run's tag `pod`"),
        ("points", I64, "metric points up to the end of the day"),
        ("success_rate_last", F64, "the last success_rate up to the end of the day"),
        ("success_rate_best", F64, "the best success_rate up to the end of the day"),
        ("success_rate_trend_per_hour", F64, "success_rate's slope, per hour"),
        ("success_drop", BOOL, "success_rate dropped suddenly (thresholds: data/training_health.yaml)"),
        ("loss_nonfinite", I64, "NaN or ±Inf values of actor/loss"),
        ("entropy_last", F64, "the last policy entropy"),
        ("entropy_slope_per_hour", F64, "the entropy's slope, per hour"),
        ("entropy_collapse", BOOL, "the entropy collapsed (thresholds: data/training_health.yaml)"),
        ("rollout_share", F64, "timing/generate / timing/total, ratio 0-1"),
        ("update_share", F64, "timing/update / timing/total, ratio 0-1"),
        ("bottleneck", STR, "rollout / update / ''"),
        ("accuracy_out_of_band_points", I64, "accuracy points outside the band (0.1-0.9)"),
        ("accuracy_out_of_band", BOOL, "accuracy left its band"),
        ("last_metric_time", TS, "the run's newest metric point (UTC)"),
        ("minutes_since_last_metric", F64, "minutes from the newest point to the day's as-of time"),
        ("stalled", BOOL, "a RUNNING run that logged nothing for too long"),
    ],
)

FSX_METRICS = TableSpec.define(
    name="fsx_metrics",
    partition="hour",
    doc="CloudWatch AWS/FSx datapoints per file system, metric and statistic (period start, UTC).",
    columns=[
        ("ts", TS, "start of the CloudWatch period (UTC)"),
        ("file_system_id", LABEL, "the FSx file system (fs-...)"),
        ("file_system_name", LABEL, "its Name tag; '' when untagged"),
        ("metric", LABEL, "CloudWatch metric name: DataReadBytes, FreeDataStorageCapacity, ..."),
        ("statistic", LABEL, "Sum / Minimum"),
        ("period_seconds", I32, "the CloudWatch period, seconds"),
        ("value", F64, "the datapoint, in the metric's CloudWatch unit (bytes, operations)"),
        ("per_second", F64, "Sum of a bytes/operations metric / period; null otherwise"),
    ],
)

# Money columns: CUR and Cost Explorer amounts are parsed as Decimal and become float64 only here.
COSTS_HOURLY = TableSpec.define(
    name="costs_hourly",
    partition="day",
    doc="CUR 2.0 line items per resource-hour (from the newest manifest), tags normalised to plain keys.",
    columns=[
        ("hour", TS, "line_item_usage_start_date (UTC)"),
        ("billing_period", STR, "YYYY-MM"),
        ("account_id", STR, "the usage account"),
        ("line_item_type", STR, "Usage, DiscountedUsage, SavingsPlanCoveredUsage, Tax, ..."),
        ("service", STR, "product code: AmazonEC2, AmazonFSx, AmazonS3, ..."),
        ("usage_type", STR, "the line's usage type (BoxUsage:p5.48xlarge, ...)"),
        ("operation", STR, "the line's operation (RunInstances, ...)"),
        ("instance_type", STR, "the EC2 instance type; '' when none"),
        ("resource_id", STR, "the resource (i-..., fs-...); '' when the line has none"),
        ("usage_amount", F64, "the usage quantity, in the usage type's unit"),
        ("cost_usd", F64, "unblended cost, USD"),
        ("amortized_usd", F64, "effective cost, USD: RI / Savings Plan fees spread on usage"),
        ("project", STR, "the first FOXHUNT_COST_TAGS tag's value (Project); '' when untagged"),
        ("environment", STR, "the second FOXHUNT_COST_TAGS tag's value (Environment); '' when untagged"),
        ("experiment", STR, "the third FOXHUNT_COST_TAGS tag's value (Experiment); '' when untagged"),
        ("tags", STR, "every resource tag, normalised keys, a JSON object"),
        ("manifest", STR, "the manifest (execution) the line came from"),
    ],
)

COSTS_DAILY = TableSpec.define(
    name="costs_daily",
    partition="day",
    doc=(
        "Daily cost per source (ce, cur, estimate) by tag, service and resource. Within one day and source "
        "the rows never overlap: their cost_usd sums to that source's total for the day."
    ),
    columns=[
        ("day", DATE, "the day (UTC)"),
        ("source", STR, "ce (Cost Explorer) / cur (CUR 2.0) / estimate (prices × node- and storage-hours)"),
        ("project", STR, "the Project cost tag; '' = untagged"),
        ("environment", STR, "the Environment cost tag; '' = untagged"),
        ("experiment", STR, "the Experiment cost tag; '' = untagged"),
        ("service", STR, "AWS product code (Cost Explorer's names mapped to it)"),
        ("resource_id", STR, "cur: the resource; estimate: node or file system; ce: ''"),
        ("cost_usd", F64, "unblended cost, USD"),
        ("amortized_usd", F64, "amortized cost, USD"),
        ("usage_quantity", F64, "usage, in the usage type's unit"),
        ("estimated", BOOL, "Cost Explorer's Estimated flag; always true for source=estimate"),
    ],
)

BUDGETS = TableSpec.define(
    name="budgets",
    partition="day",
    doc="AWS Budgets as seen on the day: limit, actual and forecasted spend (plus Cost Explorer's forecast).",
    columns=[
        ("day", DATE, "the day of the sync (UTC)"),
        ("source", STR, "budgets / ce_forecast"),
        ("account_id", STR, "the budget's account"),
        ("budget_name", STR, "the budget's name"),
        ("budget_type", STR, "COST, USAGE, ..."),
        ("time_unit", STR, "MONTHLY, ..."),
        ("period_start", TS, "the budget period's start (UTC)"),
        ("period_end", TS, "the budget period's end (UTC)"),
        ("limit_usd", F64, "the budget's limit, USD"),
        ("actual_usd", F64, "actual spend in the period, USD"),
        ("forecast_usd", F64, "forecasted spend for the period, USD"),
        ("synced_at", TS, "when it was read (UTC)"),
    ],
)

COST_ALLOCATION = TableSpec.define(
    name="cost_allocation",
    partition="day",
    doc=(
        "Per GPU-hour (kind gpu): its node's cost for the hour ÷ GPUs reporting, charged to the holder pod's "
        "experiment for the share of the hour held (allocated_usd), the rest cluster idle (unallocated_usd). "
        "Plus the day's bill lines on no node-hour: kind tagged (to their Experiment tag) or shared (by "
        "GPU-hours held), node_without_gpus, and mig_unsliced (a MIG GPU's part no slice covers). A MIG "
        "slice is a row with its share of its GPU's cost. Per day, allocated + unallocated = the bill."
    ),
    columns=[
        ("hour", TS, "the hour's start (UTC)"),
        ("node", STR, "the node; '' for bill lines on no node"),
        ("gpu", I32, "the GPU's index on its node; null for rows that are no GPU's"),
        ("uuid", STR, "the GPU's UUID; '' for rows that are no GPU's"),
        ("pod", STR, "the holder pod; '' none"),
        ("namespace", STR, "the holder pod's namespace; '' none"),
        ("experiment", STR, "who is charged; '' = nobody: cluster idle"),
        ("kind", STR, "gpu / tagged / shared / node_without_gpus / mig_unsliced"),
        ("service", STR, "AWS product code of the cost (AmazonEC2, ...)"),
        ("resource_id", STR, "the node's EC2 instance id(s), or the bill line's resource"),
        ("gpu_seconds", F64, "GPU-seconds the GPU (a slice: x gpu_share) reported in the hour"),
        ("held_seconds", F64, "GPU-seconds a pod held it"),
        ("active_gpu_seconds", F64, "Σ util × Δt (× gpu_share), GPU-seconds; NULL: activity unknown"),
        ("energy_kwh", F64, "energy, kWh"),
        ("allocated_usd", F64, "USD charged to the experiment"),
        ("unallocated_usd", F64, "USD charged to nobody: cluster idle"),
        ("idle_usd", F64, "allocated $ × (1 − active fraction), where activity is known, USD"),
        ("cost_source", STR, "cur / estimate / cur+estimate"),
        ("gpu_instance", I32, "MIG slice (null: a whole GPU, or no GPU's row)"),
        ("gpu_profile", STR, "MIG profile; 'unsliced' for a MIG GPU's part no slice covers"),
        ("gpu_share", F64, "the part of the GPU's cost this row carries, ratio 0-1 (1 for a whole GPU)"),
        ("unknown_activity_usd", F64, "allocated $ with no util reported: not idle, unknown, USD"),
        ("run_id", STR, "the holder pod's MLflow run id label; '' none"),
        ("sm_active_gpu_seconds", F64, "Σ sm_active × Δt (× gpu_share), GPU-seconds; NULL: not reported"),
        ("sm_idle_usd", F64, "idle $ on SM activity (the other activity basis), where reported, USD"),
        ("sm_unknown_activity_usd", F64, "allocated $ with no SM activity reported, USD"),
        ("tensor_active_gpu_seconds", F64, "Σ tensor_active × Δt (× gpu_share); NULL: not reported"),
        ("held_wall_seconds", F64, "wall-clock seconds the pod held it (a run's window is wall-clock)"),
    ],
)

UTILIZATION_PER_DOLLAR = TableSpec.define(
    name="utilization_per_dollar",
    partition="day",
    doc="Experiment × day: GPU-hours, active GPU-hours, cost, idle cost, active GPU-hours per $, $ per active GPU-hour.",
    columns=[
        ("day", DATE, "the day (UTC)"),
        ("experiment", STR, '"(cluster idle)": GPU time no pod held, cost nobody was charged'),
        ("gpu_hours", F64, "GPU-hours held"),
        ("active_gpu_hours", F64, "GPU-hours busy on util (Σ util × Δt)"),
        ("mean_util", F64, "active_gpu_hours / gpu_hours, ratio 0-1"),
        ("allocated_usd", F64, "USD charged, from cost_allocation"),
        ("idle_usd", F64, "allocated $ of idle GPU time, USD"),
        ("active_gpu_hours_per_usd", F64, "active GPU-hours per USD: higher is better"),
        ("usd_per_active_gpu_hour", F64, "USD per active GPU-hour: lower is better"),
        ("energy_kwh", F64, "energy, kWh"),
        ("cost_source", STR, "cur / estimate / cur+estimate"),
        ("unknown_activity_usd", F64, "$ of GPU time with no util reported: neither busy nor idle, USD"),
        ("sm_active_gpu_hours", F64, "GPU-hours busy on SM activity (DCGM_FI_PROF_SM_ACTIVE)"),
        ("sm_active_gpu_hours_per_usd", F64, "SM-active GPU-hours per USD, where SM activity is reported"),
        ("sm_idle_usd", F64, "idle $ on SM activity, USD"),
        ("sm_unknown_activity_usd", F64, "$ with no SM activity reported, USD"),
    ],
)

OUTCOME_PER_DOLLAR = TableSpec.define(
    name="outcome_per_dollar",
    partition="day",
    doc="Per MLflow run alive that day: success_rate at start and at the day's end, $ its own pods cost in its window, $ per point.",
    columns=[
        ("day", DATE, "the day (UTC)"),
        ("run_id", STR, "MLflow's run id"),
        ("run_name", STR, "the run's name"),
        ("experiment", STR, "the run's experiment"),
        ("pod", STR, "the run's tag `pod`: its pods, comma-separated"),
        ("status", STR, "the run's status"),
        ("success_start", F64, "success_rate at the run's start"),
        ("success_end", F64, "the last success_rate up to the day's end"),
        ("success_best", F64, "the best success_rate up to the day's end"),
        ("success_gained_points", F64, "100 × (end − start), points"),
        ("usd", F64, "its pods' allocated GPU cost in its window up to the day's end, USD; NULL: none known"),
        ("idle_usd", F64, "of usd, the idle GPU time's, USD"),
        ("usd_per_point", F64, "USD per point of success_rate gained; null when nothing was gained"),
        ("namespace", STR, "its `namespace` tag ('' = its pods matched in any namespace)"),
        ("gpu_hours", F64, "GPU-hours of its pods in its window"),
        ("sm_idle_usd", F64, "idle $ on the SM-activity basis, where reported, USD"),
        ("charged_by", STR, "how its dollars were found, or why there are none"),
    ],
)

ALERTS = TableSpec.define(
    name="alerts",
    partition="day",
    doc=(
        "One row per alert transition (firing or resolved), partitioned by the day of the transition; "
        "(fingerprint, status, starts_at) is unique: a retried delivery adds no row."
    ),
    columns=[
        ("day", DATE, "the day of ts (UTC)"),
        ("ts", TS, "the transition: starts_at when firing, ends_at when resolved (UTC)"),
        ("rule", STR, "the rule id (Alertmanager's alertname)"),
        ("fingerprint", STR, "the alert's fingerprint: its rule and labels"),
        ("severity", STR, "critical / warning / info"),
        ("status", STR, "firing / resolved"),
        ("labels", STR, "the alert's labels, a JSON object"),
        ("summary", STR, "the alert's one-line summary"),
        ("value", F64, "the value that fired the rule (NaN kept)"),
        ("starts_at", TS, "when the alert started firing (UTC)"),
        ("ends_at", TS, "when it resolved (UTC); null while firing"),
        ("sent_to", STR, "comma-separated sinks that accepted it: alertmanager,slack,webhook"),
    ],
)

SPEND_NOW = TableSpec.define(
    name="spend_now",
    partition="day",
    doc=(
        "Live spend as of a refresh, per experiment and source (cluster: the live cost rules' $/h in "
        "Prometheus; untracked: running EC2 instances outside the cluster): $/h now, today so far, the "
        "month so far (the lake's cost_allocation for its complete days, live for the rest) and the "
        "month's run rate (so far + $/h now x the hours left). A refresh replaces the day's partition."
    ),
    columns=[
        ("as_of", TS, "the refresh's time (UTC)"),
        ("experiment", STR, "who is charged"),
        ("source", STR, "cluster / untracked"),
        ("usd_per_hour", F64, "spend rate now, USD per hour"),
        ("today_usd", F64, "spent today so far, USD"),
        ("month_usd", F64, "spent this month so far, USD"),
        ("run_rate_usd", F64, "the month's projection at the current $/h, USD"),
    ],
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
