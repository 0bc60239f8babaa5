"""Jobs and schedules of the GPU assets. Schedules start STOPPED: turn them on in the UI."""

import dagster as dg

gpu_ingest_job = dg.define_asset_job(
    "gpu_ingest_job",
    selection=dg.AssetSelection.assets("gpu_samples", "node_samples"),
    description="Prometheus GPU and node series of one hour into the lake.",
)
gpu_hourly_job = dg.define_asset_job(
    "gpu_hourly_job",
    selection=dg.AssetSelection.assets("gpu_hourly"),
    description="The day's GPU-hour roll-up.",
)

# The previous hour, 10 minutes after it ends: past Prometheus's 5-minute look-back and late scrapes.
gpu_ingest_schedule = dg.build_schedule_from_partitioned_job(
    gpu_ingest_job, name="gpu_ingest_schedule", minute_of_hour=10
)
# The previous day, once its last hour has been ingested.
gpu_hourly_schedule = dg.build_schedule_from_partitioned_job(
    gpu_hourly_job, name="gpu_hourly_schedule", hour_of_day=0, minute_of_hour=40
)
