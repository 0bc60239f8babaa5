"""Ray's cluster state from Prometheus into the lake (ray_samples)."""

import dagster as dg

from foxhunt_obs import assetkit
from foxhunt_obs.defs.gpu.assets import IngestConfig
from foxhunt_obs.defs.partitions import HOURLY, hours_of
from foxhunt_obs.defs.resources import (
    PROMETHEUS_POOL,
    ClusterResource,
    LakeResource,
    PrometheusResource,
)
from foxhunt_obs.lib import schemas
from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
from foxhunt_obs.lib.ingest.ray_series import load_ray_catalog
from foxhunt_obs.lib.tables import ray as ray_tables

RAY_SAMPLES_CHECKS = [
    dg.AssetCheckSpec(
        "core_series_reported",
        asset="ray_samples",
        description="every Ray node that answered its scrape reported its object store (ray_metrics.yaml "
        "core columns): a missing series is named with every spelling looked for",
    ),
    dg.AssetCheckSpec(
        "ray_pods_scraped",
        asset="ray_samples",
        description="every KubeRay pod (kube_pod_labels ray.io/node-type) is a Ray target carrying the "
        "ray_io_cluster label: a missing PodMonitor is named, never read as a cluster without workers",
    ),
    dg.AssetCheckSpec("unique_pod_ts", asset="ray_samples", description="one row per Ray pod per timestamp"),
]


# In the gpu group: the same hourly ingest and freshness window as gpu_samples (data/freshness.yaml).
@dg.asset(
    partitions_def=HOURLY,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=24),
    pool=PROMETHEUS_POOL,
    group_name="gpu",
    kinds={"prometheus", "parquet"},
    check_specs=RAY_SAMPLES_CHECKS,
    **assetkit.writes(
        schemas.RAY_SAMPLES,
        does="Read from Prometheus (the Ray targets and kube-state-metrics); experiment via the head pod.",
    ),
)
def ray_samples(
    context: dg.AssetExecutionContext,
    config: IngestConfig,
    lake: LakeResource,
    prometheus: PrometheusResource,
    cluster: ClusterResource,
):
    # a broken catalog fails the step with its CatalogError's message (assetkit.load), not a traceback
    ray, catalog = assetkit.load(load_ray_catalog), assetkit.load(load_catalog)
    built = assetkit.build(
        ray_tables.ray_samples, lake.lake(), prometheus.client(), ray, catalog,
        cluster.settings(), hours_of(context.partition_time_window), allow_fewer_rows=config.allow_fewer_rows,
    )  # fmt: skip
    assetkit.log(context, built)
    yield from assetkit.results(built)
