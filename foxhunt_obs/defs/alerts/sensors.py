"""Anomaly sensors: every tick evaluates the rule catalog (data/alert_rules.yaml) against the live
sources and notifies Alertmanager / Slack / a webhook / the alerts table on transitions only. The alert
state lives in the cursor, with which sink took which transition: a sink that is down gets it on a later
tick, the others never twice (lib/alerts/engine.py).

Both sensors start RUNNING: they only read, and without FOXHUNT_ALERTMANAGER_URL / _SLACK_CHANNEL /
_WEBHOOK_URL they write nothing but the `alerts` lake table. Turn them off in the UI (Automation).
Slack goes through the `slack` resource (dagster-slack; defs/resources.py), asked for a client only when
FOXHUNT_ALERT_SLACK_CHANNEL is set.
"""

from datetime import datetime, timezone

import dagster as dg

from foxhunt_obs.defs.resources import (
    AwsResource,
    LakeResource,
    MlflowResource,
    PrometheusResource,
    SlackBotResource,
)
from foxhunt_obs.lib.settings import csv_setting, env

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


def _sources(lake: LakeResource, prometheus: PrometheusResource, mlflow: MlflowResource, aws: AwsResource):
    from foxhunt_obs.lib.alerts.collect import Sources
    from foxhunt_obs.lib.sources.fsx import FsxSource

    fsx = None
    if env("AWS_ENDPOINT_URL") or env("FOXHUNT_FSX_IDS") or env("FOXHUNT_CUR_S3_URI"):
        fsx = FsxSource(aws.client("fsx"), aws.client("cloudwatch"))  # only where AWS is configured
    return Sources(
        prometheus=prometheus.client(),
        mlflow=mlflow.source(),
        fsx=fsx,
        fsx_ids=csv_setting("FOXHUNT_FSX_IDS") or None,
        lake=lake.lake(),
    )


@dg.sensor(
    minimum_interval_seconds=TICK_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Evaluates every alert rule (stalled training, NaN loss, OOM restarts, ECC/XID errors, FSx low "
        "space, missing GPU nodes, budget burn, cost spikes, ...) and notifies firing and resolved "
        "transitions once. Its cursor is the alert state."
    ),
)
def alert_sensor(
    context: dg.SensorEvaluationContext,
    lake: LakeResource,
    prometheus: PrometheusResource,
    mlflow: MlflowResource,
    aws: AwsResource,
    slack: SlackBotResource,
):
    from foxhunt_obs.lib.alerts.catalog import load_rules_or_last_good
    from foxhunt_obs.lib.alerts.engine import tick
    from foxhunt_obs.lib.delivery.alert_sinks import sinks_from_env

    store = lake.lake()
    rules, rules_error = load_rules_or_last_good()
    if rules_error:
        context.log.error(f"alerts: {rules_error}")
    cursor, report = tick(
        rules,
        _sources(lake, prometheus, mlflow, aws),
        sinks_from_env(store, slack.get_client),
        context.cursor,
        datetime.now(timezone.utc),
        dagster_url=env("FOXHUNT_DAGSTER_URL"),
        budget_s=DELIVERY_BUDGET_S,
        source_budget_s=SOURCE_BUDGET_S,
        sink_budget_s=SINK_BUDGET_S,
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
    # a training alert makes today's training_health worth refreshing
    if any(n.rule in ("nan_loss", "success_rate_drop", "entropy_collapse") for n in report.sent):
        today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
        return dg.SensorResult(
            run_requests=[dg.RunRequest(job_name="training_job", partition_key=today, run_key=None)]
        )
    return dg.SkipReason(
        f"{len(report.evaluated)} rules evaluated, {report.findings} findings, {len(report.sent)} notified"
        + (f". {rules_error}" if rules_error else "")
    )


@dg.run_failure_sensor(
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="A failed Dagster run (an ingest, a report) is an alert too: sent to the same sinks.",
)
def run_failure_alert(context: dg.RunFailureSensorContext, slack: SlackBotResource):
    from foxhunt_obs.lib.delivery.alert_sinks import Notification, deliver_all, sinks_from_env
    from foxhunt_obs.lib.lake import Lake
    from foxhunt_obs.lib.redact import scrub

    run = context.dagster_run
    now = datetime.now(timezone.utc)
    # the failure's text as Dagster has it, scrubbed once more: a source error is, an arbitrary one may not be
    message = scrub(context.failure_event.message or "run failed")
    note = Notification(
        rule="dagster_run_failed",
        fingerprint=run.run_id,
        status="firing",
        severity="warning",
        labels={"job": run.job_name, "run_id": run.run_id},
        summary=f"Dagster run of {run.job_name} failed",
        description=message[:2000],
        value=1.0,
        starts_at=now,
        ends_at=None,
        generator_url=f"{env('FOXHUNT_DAGSTER_URL').rstrip('/')}/runs/{run.run_id}",
    )
    results = deliver_all(sinks_from_env(Lake(env("FOXHUNT_LAKE")), slack.get_client), [note])
    failed = {k: v for k, v in results.items() if v}
    if failed:
        raise RuntimeError(f"run failure alert for {run.run_id} not delivered: {failed}")
