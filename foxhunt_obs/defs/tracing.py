"""The root span of each run's trace (lib/tracing.py). A run's steps, each in a process of its own, send
their spans under a root whose ids come from the run id; this sensor sends that root once the run has
ended, with the run's real start and end, its job, partition and status. Tracing off (no
OTEL_EXPORTER_OTLP_ENDPOINT), every tick is skipped at once."""

import json
from datetime import datetime, timedelta, timezone

import dagster as dg

RUN_TRACE_TICK_SECONDS = 30
RUNS_PER_TICK = 200  # runs read per tick, oldest first: a backlog is worked off over ticks
FIRST_LOOKBACK = timedelta(hours=1)  # how far back the first tick (no cursor yet) looks
# Each tick reads again the runs updated in the OVERLAP before its cursor: a run's update time is stamped
# by its own process (another pod, another clock) and committed later, so a run may land behind a cursor
# that a later run already moved past. The runs sent in that overlap are remembered, so none goes twice,
# also when a tag added after the end (a retry's) moves an ended run's update time again.
OVERLAP = timedelta(minutes=10)
ENDED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]


def _when(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    return float(value)


def _load(cursor: str | None) -> tuple[float | None, dict[str, float]]:
    """(the newest update time seen, {run id sent: its update time}); an old cursor (a bare number) too."""
    if not cursor:
        return None, {}
    try:
        data = json.loads(cursor)
    except ValueError:
        return None, {}
    if isinstance(data, (int, float)):
        return float(data), {}
    return data.get("after"), dict(data.get("sent", {}))


def _ours(context: dg.SensorEvaluationContext, run: dg.DagsterRun) -> bool:
    """Whether the run is this code location's: by the location's name where both are known (every
    location has the asset job __ASSET_JOB), else by the job's name."""
    origin = getattr(context, "code_location_origin", None)
    ours = getattr(origin, "location_name", None)
    theirs = run.remote_job_origin.location_name if run.remote_job_origin else None
    if ours and theirs:
        return ours == theirs
    repo = context.repository_def
    return repo is None or repo.has_job(run.job_name)


@dg.sensor(
    minimum_interval_seconds=RUN_TRACE_TICK_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Sends the root span of every ended run's trace (OpenTelemetry, when OTEL_EXPORTER_OTLP_ENDPOINT "
        "is set): the run with its real start and end, over its steps' and requests' spans."
    ),
)
def run_trace_sensor(context: dg.SensorEvaluationContext):
    from foxhunt_obs.lib import tracing

    if not tracing.enabled():
        return dg.SkipReason("tracing is off (OTEL_EXPORTER_OTLP_ENDPOINT is not set)")
    newest, sent_before = _load(context.cursor)
    now = datetime.now(timezone.utc)
    after = datetime.fromtimestamp(newest, timezone.utc) if newest is not None else now - FIRST_LOOKBACK
    records = context.instance.get_run_records(
        filters=dg.RunsFilter(statuses=ENDED, updated_after=after - OVERLAP),
        order_by="update_timestamp",
        ascending=True,
        limit=RUNS_PER_TICK,
    )
    sent = 0
    for record in records:
        run = record.dagster_run
        updated = _when(record.update_timestamp)
        newest = max(newest or updated, updated)
        if run.run_id in sent_before or not _ours(context, run):
            sent_before[run.run_id] = max(sent_before.get(run.run_id, updated), updated)
            continue
        start = _when(record.start_time) or _when(record.create_timestamp)
        end = _when(record.end_time) or updated
        failed = run.status != dg.DagsterRunStatus.SUCCESS
        tracing.emit_run_span(
            run.run_id,
            f"run {run.job_name}",
            start,
            end,
            error=f"run {run.status.value.lower()}" if failed else None,
            attributes={
                "dagster.job": run.job_name,
                "dagster.status": run.status.value,
                "dagster.partition": run.tags.get("dagster/partition"),
            },
        )
        sent_before[run.run_id] = updated
        sent += 1
    tracing.flush()
    if newest is not None:
        # forget what fell out of the overlap: it is never read again
        keep = newest - 2 * OVERLAP.total_seconds()
        sent_before = {r: t for r, t in sent_before.items() if t >= keep}
        context.update_cursor(json.dumps({"after": newest, "sent": sent_before}, sort_keys=True))
    return dg.SkipReason(f"{sent} run traces ended")
