"""FSx metrics job and schedule (STOPPED by default: turn it on in the UI)."""

import dagster as dg

fsx_ingest_job = dg.define_asset_job(
    "fsx_ingest_job",
    selection=dg.AssetSelection.assets("fsx_metrics"),
    description="One hour of CloudWatch AWS/FSx metrics into the lake.",
)

# The previous hour, 20 minutes after it ends: CloudWatch publishes FSx metrics a few minutes late.
fsx_ingest_schedule = dg.build_schedule_from_partitioned_job(
    fsx_ingest_job, name="fsx_ingest_schedule", minute_of_hour=20
)
