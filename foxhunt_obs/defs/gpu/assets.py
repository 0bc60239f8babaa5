"""GPU and node series from Prometheus into the lake, and their hourly roll-up."""

import dagster as dg

from foxhunt_obs import assetkit
from foxhunt_obs.defs.partitions import DAILY, HOURLY, days_of, hours_of
from foxhunt_obs.defs.resources import (
    PROMETHEUS_POOL,
    ClusterResource,
    LakeResource,
    PrometheusResource,
)
from foxhunt_obs.lib import schemas
from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
from foxhunt_obs.lib.tables import gpu as gpu_tables
from foxhunt_obs.lib.tables import gpu_hourly as hourly

GPU_SAMPLES_CHECKS = [
    dg.AssetCheckSpec(
        "values_in_range", asset="gpu_samples", description="util in 0-1, temperature -20..130 °C"
    ),
    dg.AssetCheckSpec(
        "unique_uuid_ts",
        asset="gpu_samples",
        description="one row per GPU (uuid, and MIG slice, and time-slicing replica) per timestamp",
    ),
    dg.AssetCheckSpec(
        "core_columns_reported",
        asset="gpu_samples",
        description="every reporting GPU has util (or GR_ENGINE_ACTIVE on a MIG slice), memory used and "
        "power: a missing source is named, never read as an idle GPU",
    ),
    dg.AssetCheckSpec(
        "not_empty_after_gpus",
        asset="gpu_samples",
        description="an hour is not empty when the hour before it had GPUs (exporter or Prometheus gone?): "
        "an error, a warning where the run allowed fewer rows (GPU nodes scaled away on purpose)",
    ),
]


class IngestConfig(dg.Config):
    """Run config of the Prometheus ingest. allow_fewer_rows: replace a partition even when the source
    answers with far fewer GPUs (or none) than the lake has, e.g. after removing nodes on purpose."""

    allow_fewer_rows: bool = False


def _ingest(table_fn, context, config: IngestConfig, lake, prometheus, cluster):
    """A Prometheus ingest table over the run's hours, its log lines into the run's log. A broken metric
    catalog fails the step with its CatalogError's message (assetkit.load), not a traceback."""
    hours = hours_of(context.partition_time_window)
    catalog = assetkit.load(load_catalog)
    built = assetkit.build(
        table_fn, lake.lake(), prometheus.client(), catalog, cluster.settings(), hours,
        allow_fewer_rows=config.allow_fewer_rows,
    )  # fmt: skip
    assetkit.log(context, built)
    yield from assetkit.results(built)


@dg.asset(
    partitions_def=HOURLY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=24),
    pool=PROMETHEUS_POOL,
    group_name="gpu",
    kinds={"prometheus", "parquet"},
    check_specs=GPU_SAMPLES_CHECKS,
    **assetkit.writes(
        schemas.GPU_SAMPLES,
        does="Read from Prometheus (dcgm-exporter or the foxhunt exporter), an hour per partition.",
    ),
)
def gpu_samples(
    context: dg.AssetExecutionContext,
    config: IngestConfig,
    lake: LakeResource,
    prometheus: PrometheusResource,
    cluster: ClusterResource,
):
    yield from _ingest(gpu_tables.gpu_samples, context, config, lake, prometheus, cluster)


@dg.asset(
    partitions_def=HOURLY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=24),
    pool=PROMETHEUS_POOL,
    deps=[gpu_samples],
    group_name="gpu",
    kinds={"prometheus", "parquet"},
    **assetkit.writes(
        schemas.NODE_SAMPLES,
        does="Read from Prometheus; GPUs reporting counted in the same hours' gpu_samples.",
    ),
)
def node_samples(
    context: dg.AssetExecutionContext,
    config: IngestConfig,
    lake: LakeResource,
    prometheus: PrometheusResource,
    cluster: ClusterResource,
):
    yield from _ingest(gpu_tables.node_samples, context, config, lake, prometheus, cluster)


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=7),
    deps=[dg.AssetDep(gpu_samples, partition_mapping=dg.TimeWindowPartitionMapping())],
    group_name="gpu",
    kinds={"duckdb", "parquet"},
    **assetkit.writes(
        schemas.GPU_HOURLY,
        does="Rolled up from gpu_samples (a MIG slice-hour is a row of its own), a day per partition.",
    ),
)
def gpu_hourly(context: dg.AssetExecutionContext, lake: LakeResource):
    yield from assetkit.results(
        assetkit.build(hourly.gpu_hourly, lake.lake(), days_of(context.partition_time_window))
    )
