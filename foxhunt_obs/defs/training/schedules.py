"""Training jobs and schedules. Both schedules start STOPPED: turn them on in the UI."""

from datetime import datetime, timezone

import dagster as dg

training_job = dg.define_asset_job(
    "training_job",
    selection=dg.AssetSelection.assets("training_runs", "training_metrics", "training_health"),
    description="MLflow runs, the day's metric points and training health.",
)


@dg.schedule(cron_schedule="30 0 * * *", job_name="training_job", execution_timezone="UTC")
def training_daily_schedule(context: dg.ScheduleEvaluationContext):
    """Yesterday, complete, shortly after midnight UTC."""
    from foxhunt_obs.defs.partitions import DAILY

    day = DAILY.get_last_partition_key(current_time=context.scheduled_execution_time)
    return dg.RunRequest(partition_key=day, run_key=f"daily-{day}")


@dg.schedule(cron_schedule="*/10 * * * *", job_name="training_job", execution_timezone="UTC")
def training_refresh_schedule(context: dg.ScheduleEvaluationContext):
    """Every 10 minutes: RUNNING runs re-read and today's metrics and health (stalls, NaN losses)
    refreshed, so a broken run shows up within minutes, not tomorrow."""
    today = context.scheduled_execution_time.astimezone(timezone.utc).strftime("%Y-%m-%d")
    return dg.RunRequest(
        partition_key=today, run_key=None, tags={"refresh": datetime.now(timezone.utc).isoformat()}
    )
