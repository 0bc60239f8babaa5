"""Anomaly sensors: every tick evaluates the rule catalog (data/alert_rules.yaml) against the live
sources and notifies Alertmanager / Slack / a webhook / the alerts table on transitions only. The alert
state lives in the cursor, with which sink took which transition: a sink that is down gets it on a later
tick, the others never twice (lib/alerts/engine.py).

Both sensors start RUNNING: they only read, and without a sink in the `alerting` resource (Alertmanager
URL, Slack channel, webhook URL) they write nothing but the `alerts` lake table. Turn them off in the UI
(Automation). Slack goes through the `slack` resource (dagster-slack), asked for a client only when the
alerting resource names a channel. Every source and sink comes from the resources, as for the assets.
"""

from datetime import datetime, timezone

import dagster as dg

from foxhunt_obs.defs.resources import (
    AlertingResource,
    AwsResource,
    CostsResource,
    FsxResource,
    LakeResource,
    MlflowResource,
    PrometheusResource,
    SlackBotResource,
)
from foxhunt_obs.lib.schemas import ALERTS

TICK_SECONDS = 60
# Dagster gives up on a sensor evaluation after 60 s (DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS), and then the
# cursor is not saved: sinks that took a transition would get it again. The tick's budget, by part:
#   reading the sources, side by side        <= 20 s  (a late source is not evaluated this tick)
#   starting sinks                           until 35 s after the tick began (the rest: next tick)
#   one sink's delivery                      <= 12 s  (given up: it gets the rest next tick)
#   the Alertmanager refresh                 <= 12 s  (skipped when the tick is already past 35 s)
# so the last sink ends by ~47 s and the cursor is saved well inside the 60.
SOURCE_BUDGET_S = 20.0
DELIVERY_BUDGET_S = 35.0
SINK_BUDGET_S = 12.0


def _sources(
    lake,
    prometheus: PrometheusResource,
    mlflow: MlflowResource,
    aws: AwsResource,
    fsx: FsxResource,
    costs: CostsResource,
    rules,
):
    """The alert sources, as the assets read them. FSx is read like fsx_metrics reads it, and only while
    a CloudWatch rule is enabled; EC2 (untracked_spend) likewise: a deployment without FSx or without
    EC2 access disables those rules (FOXHUNT_ALERT_RULES) and builds no AWS client for them."""
    from foxhunt_obs.lib.alerts.collect import Sources
    from foxhunt_obs.lib.sources.fsx import FsxSource

    def wanted(source: str) -> bool:
        return any(r.enabled and r.source == source for r in rules)

    client = prometheus.client()
    return Sources(
        prometheus=client,
        mlflow=mlflow.source(),
        fsx=FsxSource(aws.client("fsx"), aws.client("cloudwatch")) if wanted("cloudwatch") else None,
        fsx_ids=fsx.ids(),
        lake=lake,
        ec2=costs.untracked(aws, client) if wanted("ec2") else None,
    )


@dg.sensor(
    minimum_interval_seconds=TICK_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Evaluates every alert rule (stalled training, NaN loss, OOM restarts, ECC/XID errors, FSx low "
        "space, missing GPU nodes, budget burn, cost spikes, GPU instances outside the cluster, ...) and notifies firing and resolved "
        "transitions once. Its cursor is the alert state."
    ),
)
def alert_sensor(
    context: dg.SensorEvaluationContext,
    lake: LakeResource,
    prometheus: PrometheusResource,
    mlflow: MlflowResource,
    aws: AwsResource,
    fsx: FsxResource,
    costs: CostsResource,
    slack: SlackBotResource,
    alerting: AlertingResource,
):
    from foxhunt_obs.lib.alerts.engine import LOCATION, tick
    from foxhunt_obs.lib.alerts.rules import load_rules_or_last_good, training_refresh_rules

    store = lake.lake()
    rules, rules_error = load_rules_or_last_good(overrides=alerting.rules_file)
    if rules_error:
        context.log.error(f"alerts: {rules_error}")
    cursor, report = tick(
        rules,
        _sources(store, prometheus, mlflow, aws, fsx, costs, rules),
        alerting.sinks(store, slack),
        context.cursor,
        datetime.now(timezone.utc),
        dagster_url=alerting.value("dagster_url"),
        budget_s=DELIVERY_BUDGET_S,
        source_budget_s=SOURCE_BUDGET_S,
        sink_budget_s=SINK_BUDGET_S,
        links=alerting.links(),
        # the alerts link to this sensor's page, under the location's name in this deployment's workspace
        location=getattr(context.code_location_origin, "location_name", None) or LOCATION,
    )
    if report.note:
        context.log.warning(f"alert state: {report.note}")
    for source, error in report.source_errors.items():
        context.log.warning(
            f"alerts: {source} not evaluated this tick (its alerts keep their state): {error}"
        )
    for sink, error in report.failed.items():
        context.log.error(f"alerts: {sink} refused the notifications, it gets them again next tick: {error}")
    for dropped in report.dropped:
        context.log.error(f"alerts: dropped, a sink refused it for too long: {dropped}")
    for n in report.sent:
        context.log.info(f"alert {n.status}: {n.rule} {n.summary}")
    context.update_cursor(cursor)
    # a training alert makes today's training_health worth refreshing (rules with refreshes_training)
    refreshing = training_refresh_rules(rules)
    if any(n.rule in refreshing for n in report.sent):
        today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
        return dg.SensorResult(
            run_requests=[dg.RunRequest(job_name="training_job", partition_key=today, run_key=None)]
        )
    return dg.SkipReason(
        f"{len(report.evaluated)} rules evaluated, {report.findings} findings, {len(report.sent)} notified"
        + (f". {rules_error}" if rules_error else "")
    )


RUN_FAILURE_TICK_SECONDS = 30
RUNS_PER_TICK = 100  # failed runs read per tick, oldest first: a backlog is worked off over ticks


def _failed_runs(context: dg.SensorEvaluationContext, after: datetime) -> list:
    """This code location's runs that failed and were updated after ``after``, oldest first, each with
    its failure's text (the run's failure and its first failed step's error)."""
    from foxhunt_obs.lib.alerts.run_failures import FailedRun

    records = context.instance.get_run_records(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], updated_after=after),
        order_by="update_timestamp",
        ascending=True,
        limit=RUNS_PER_TICK,
    )
    repo = context.repository_def
    failed = []
    for record in records:
        run = record.dagster_run
        if repo is not None and not repo.has_job(run.job_name):
            continue  # another code location's run: its own sensors report it
        texts = []
        for entry in context.instance.all_logs(
            run.run_id, of_type={dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.STEP_FAILURE}
        ):
            event = entry.dagster_event
            if event.event_type == dg.DagsterEventType.STEP_FAILURE:
                if len(texts) < 2 and event.step_failure_data and event.step_failure_data.error:
                    texts.append(f"{event.step_key}: {event.step_failure_data.error.message.strip()}")
            elif event.message:
                texts.insert(0, event.message)
        updated = record.update_timestamp
        started = record.start_time  # seconds since the epoch; None for a run that never started
        failed.append(
            FailedRun(
                run_id=run.run_id,
                job_name=run.job_name,
                failed_at=updated.replace(tzinfo=timezone.utc) if updated.tzinfo is None else updated,
                message="\n".join(texts) or "run failed",
                started_at=datetime.fromtimestamp(started, timezone.utc) if started else None,
            )
        )
    return failed


@dg.sensor(
    minimum_interval_seconds=RUN_FAILURE_TICK_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "A failed Dagster run (an ingest, a report) is an alert too: sent to the same sinks, each until "
        "it takes it. Its cursor keeps the notices a sink refused."
    ),
)
def run_failure_alert(
    context: dg.SensorEvaluationContext,
    lake: LakeResource,
    slack: SlackBotResource,
    alerting: AlertingResource,
):
    from foxhunt_obs.lib.alerts import run_failures

    now = datetime.now(timezone.utc)
    cursor = run_failures.Cursor.load(context.cursor, now)
    failed = _failed_runs(context, cursor.after - run_failures.OVERLAP)
    cursor, report = run_failures.tick(
        cursor,
        failed,
        alerting.sinks(lake.lake(), slack),
        now,
        dagster_url=alerting.value("dagster_url"),
        budget_s=DELIVERY_BUDGET_S,
        sink_budget_s=SINK_BUDGET_S,
        links=alerting.links(),
    )
    for sink, error in report.failed.items():
        context.log.error(f"run failure alert: {sink} refused, it gets the notice again next tick: {error}")
    for dropped in report.dropped:
        context.log.error(f"run failure alert: dropped, a sink refused it for too long: {dropped}")
    for n in report.sent:
        context.log.info(f"run failure alert sent: {n.summary} ({n.fingerprint})")
    context.update_cursor(cursor.dumps())
    waiting = len(cursor.pending)
    return dg.SkipReason(
        f"{len(report.sent)} failed runs notified"
        + (f", {waiting} waiting for a sink: {', '.join(sorted(report.failed))}" if waiting else "")
    )


# Lake tables no asset writes: both sensors write `alerts`, one row per transition, through the lake sink
# (lib/delivery/alert_sinks.py). The tables page names them as its writers; no asset may claim it.
WRITTEN_BY_SENSORS = {ALERTS.name: (alert_sensor.name, run_failure_alert.name)}
