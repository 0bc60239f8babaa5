"""The Ray ingest job and its schedule. Schedules start STOPPED: turn them on in the UI."""

import dagster as dg

ray_ingest_job = dg.define_asset_job(
    "ray_ingest_job",
    selection=dg.AssetSelection.assets("ray_samples"),
    description="Ray's cluster state (Prometheus) of one hour into the lake.",
)

# The previous hour, 10 minutes after it ends, as gpu_ingest_schedule.
ray_ingest_schedule = dg.build_schedule_from_partitioned_job(
    ray_ingest_job, name="ray_ingest_schedule", minute_of_hour=10
)
