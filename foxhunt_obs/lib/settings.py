"""Every setting foxhunt_obs has, with its environment variable, default and meaning: the one registry.

Each setting is a field of a Dagster resource (defs/resources.py), which takes it from its variable
(`dg.EnvVar`, so the UI's Resources page shows the configuration and never a secret's value); lib/ code
is handed the values and never reads the environment. The parsers below check a value and name the
variable in their error. The README's configuration table is checked against `SETTINGS` by a test, so a
new variable must be documented to land.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone


@dataclass(frozen=True)
class Setting:
    env: str
    default: str
    meaning: str
    secret: bool = False  # never shown: the resource field holds the variable's name, not its value


SETTINGS: tuple[Setting, ...] = (
    Setting("FOXHUNT_LAKE", ".foxhunt/lake", "Lake root: a local folder or s3://bucket/prefix"),
    Setting("FOXHUNT_PROMETHEUS_URL", "http://127.0.0.1:19090", "Prometheus base URL"),
    Setting("FOXHUNT_SCRAPE_STEP", "15", "Query step in seconds: one gpu_samples row per GPU per step"),
    Setting("FOXHUNT_EXPERIMENT_LABEL", "experiment", "Pod (or namespace) label naming the experiment"),
    Setting(
        "FOXHUNT_RUN_ID_POD_LABEL",
        "",
        "Pod label carrying the MLflow run id (kube_pod_labels): a run is charged every pod with it, in "
        "any window (empty: runs are matched by their `pod` and `namespace` tags)",
    ),
    Setting(
        "FOXHUNT_ACTIVITY_BASIS",
        "util",
        "Headline basis of active GPU-hours in the report and metadata: util (DCGM_FI_DEV_GPU_UTIL, every "
        "dashboard's) or sm (SM activity, DCGM_FI_PROF_SM_ACTIVE, where reported)",
    ),
    Setting(
        "FOXHUNT_NODE_LABELS",
        "node,kubernetes_node,Hostname,hostname,instance",
        "Labels tried in order for a series' node (instance loses its :port)",
    ),
    Setting(
        "FOXHUNT_EXPORTER_CONTAINERS",
        "",
        "Comma-separated exporter container names whose pod never holds a GPU, for scrape setups whose "
        "`up` has no pod label (static configs, federation)",
    ),
    Setting(
        "FOXHUNT_PARTITIONS_START", "2026-11-01", "First hourly/daily partition (read when definitions load)"
    ),
    Setting("FOXHUNT_PROMETHEUS_GZIP", "0", "1 = ask Prometheus for gzip (pays over a slow WAN link)"),
    Setting(
        "FOXHUNT_PROMETHEUS_TIMEOUT", "120", "Seconds one Prometheus request may take in all (not per read)"
    ),
    Setting("FOXHUNT_PROMETHEUS_MAX_POINTS", "11000", "Most points per series in one query_range request"),
    Setting(
        "FOXHUNT_PROMETHEUS_QUERIES_AT_ONCE",
        "4",
        "Queries one step (an ingest run, an alert tick) sends Prometheus side by side; 1 = one after another",
    ),
    Setting("FOXHUNT_PROMETHEUS_BEARER_TOKEN", "", "Bearer token for Prometheus (never logged)", secret=True),
    Setting(
        "MLFLOW_TRACKING_URI", "http://127.0.0.1:15000", "MLflow tracking server (MLflow's own variable)"
    ),
    Setting("MLFLOW_TRACKING_USERNAME", "", "MLflow basic-auth user (MLflow's own variable)"),
    Setting(
        "MLFLOW_TRACKING_PASSWORD", "", "MLflow basic-auth password (MLflow's own; never logged)", secret=True
    ),
    Setting(
        "MLFLOW_TRACKING_TOKEN",
        "",
        "MLflow bearer token, used when no user and password are set (MLflow's own; never logged)",
        secret=True,
    ),
    Setting("MLFLOW_TRACKING_INSECURE_TLS", "false", "true = skip TLS verification (MLflow's own variable)"),
    Setting("MLFLOW_TRACKING_SERVER_CERT_PATH", "", "CA bundle verifying MLflow's TLS (MLflow's own)"),
    Setting("MLFLOW_TRACKING_CLIENT_CERT_PATH", "", "Client certificate for MLflow's TLS (MLflow's own)"),
    Setting(
        "FOXHUNT_MLFLOW_EXPERIMENTS", "", "Comma-separated MLflow experiment names to ingest (empty: all)"
    ),
    Setting(
        "FOXHUNT_MLFLOW_BACKEND_STORE_URI",
        "",
        "Read MLflow's SQL store directly (a read replica: sqlite:///… or postgresql://…): the fast path",
    ),
    Setting(
        "AWS_REGION",
        "us-east-1",
        "AWS region of CloudWatch, FSx, S3 and Budgets (boto3's own variable; else AWS_DEFAULT_REGION)",
    ),
    Setting(
        "AWS_ENDPOINT_URL", "", "An AWS endpoint for every service (boto3's own; the sandbox's moto server)"
    ),
    Setting(
        "AWS_ENDPOINT_URL_S3",
        "",
        "S3's own endpoint for an s3:// lake, before AWS_ENDPOINT_URL (boto3's own)",
    ),
    Setting("FOXHUNT_FSX_IDS", "", "Comma-separated FSx file system ids (empty: every Lustre file system)"),
    Setting(
        "FOXHUNT_CUR_S3_URI", "", "CUR 2.0 Data Export root: s3://bucket/prefix/export-name (empty: no CUR)"
    ),
    Setting(
        "FOXHUNT_COST_TAGS",
        "Project,Environment,Experiment",
        "Cost-allocation tag keys for the project, environment and experiment columns, in that order",
    ),
    Setting("FOXHUNT_PRICE_REGION", "us-east-1", "Region of the price table used for the live cost estimate"),
    Setting(
        "FOXHUNT_EC2_REGIONS",
        "",
        "Comma-separated regions whose running EC2 instances untracked_spend and spend_now list (empty: "
        "AWS_REGION's)",
    ),
    Setting(
        "FOXHUNT_PUSHGATEWAY_URL",
        "",
        "Prometheus Pushgateway that spend_now pushes the lake's daily $ and untracked instances to, for "
        "the cost dashboard (empty: no push)",
    ),
    Setting(
        "FOXHUNT_CE_RESTATE_DAYS", "3", "Trailing days re-pulled from Cost Explorer each run (it restates)"
    ),
    Setting(
        "FOXHUNT_CE_FORECAST", "0", "1 = also ask Cost Explorer for this month's forecast ($0.01 a call)"
    ),
    Setting("FOXHUNT_REPORT_SMTP_HOST", "", "SMTP server for the weekly report by e-mail (empty: no e-mail)"),
    Setting("FOXHUNT_REPORT_SMTP_PORT", "587", "SMTP port (submission, STARTTLS)"),
    Setting("FOXHUNT_REPORT_SMTP_USER", "", "SMTP login user (empty: no login)"),
    Setting("FOXHUNT_REPORT_SMTP_PASSWORD", "", "SMTP password (never logged)", secret=True),
    Setting("FOXHUNT_REPORT_SMTP_STARTTLS", "1", "1 = STARTTLS before login and sending; 0 = plain SMTP"),
    Setting("FOXHUNT_REPORT_EMAIL_FROM", "", "The report's From address (empty: the SMTP user)"),
    Setting("FOXHUNT_REPORT_EMAIL_TO", "", "Comma-separated recipients of the weekly report"),
    Setting(
        "FOXHUNT_REPORT_SLACK_CHANNEL",
        "",
        "Slack channel for the weekly report, #name or id (empty: no Slack)",
    ),
    Setting(
        "SLACK_BOT_TOKEN",
        "",
        "Slack bot token, scopes chat:write and files:write (never logged)",
        secret=True,
    ),
    Setting("FOXHUNT_REPORT_SLACK_API_URL", "https://slack.com/api/", "Slack Web API base URL"),
    Setting(
        "FOXHUNT_ALERT_RULES",
        "",
        "YAML file overriding alert rule thresholds, durations, severities or enabling",
    ),
    Setting(
        "FOXHUNT_ALERTMANAGER_URL",
        "",
        "Alertmanager base URL the alerts are posted to (empty: no Alertmanager)",
    ),
    Setting(
        "FOXHUNT_ALERT_SLACK_CHANNEL",
        "",
        "Slack channel for alert notifications, #name or id (empty: no Slack)",
    ),
    Setting(
        "FOXHUNT_ALERT_WEBHOOK_URL", "", "URL alert notifications are POSTed to as signed JSON (empty: none)"
    ),
    Setting(
        "FOXHUNT_ALERT_WEBHOOK_SECRET",
        "",
        "HMAC-SHA256 key signing the alert webhook's body (never logged)",
        secret=True,
    ),
    Setting(
        "FOXHUNT_DAGSTER_URL",
        "http://127.0.0.1:3000",
        "Dagster UI base URL: the alerts' links (generatorURL)",
    ),
    Setting(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "",
        "OTLP/HTTP collector or Tempo base URL for traces, /v1/traces appended (OpenTelemetry's own, read by "
        "its SDK with the other OTEL_* variables; empty: no tracing)",
    ),
    Setting(
        "FOXHUNT_LOGS_URL_TEMPLATE",
        "",
        "URL of a pod's logs with {namespace}, {pod}, {from_ms}, {to_ms}, e.g. Grafana Explore on Loki: "
        "alerts on a pod link to it (empty: no link)",
    ),
    Setting(
        "FOXHUNT_TRACE_URL_TEMPLATE",
        "",
        "URL of a run's trace with {trace_id}, {from_ms}, {to_ms}, e.g. Grafana Explore on Tempo (empty: "
        "no link)",
    ),
)

SETTING = {s.env: s for s in SETTINGS}


def env(name: str) -> str:
    """The variable's value, or its documented default. Only where resources are built and in the CLI."""
    return os.environ.get(name) or SETTING[name].default


def default(name: str) -> str:
    return SETTING[name].default


@dataclass(frozen=True)
class ClusterSettings:
    """How the cluster's series are named and sampled: what the Prometheus ingest needs besides a client."""

    scrape_step_s: float
    experiment_label: str
    run_id_label: str  # "" = runs matched by their pod and namespace tags
    node_labels: tuple[str, ...]
    exporter_containers: tuple[str, ...]


# -- parsers: a raw value in, a checked one out; errors name the variable -----------------------------------
ACTIVITY_BASES = ("util", "sm")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def activity_basis(raw: str) -> str:
    """FOXHUNT_ACTIVITY_BASIS, checked: util or sm."""
    basis = raw.strip().lower()
    if basis not in ACTIVITY_BASES:
        raise ValueError(f"FOXHUNT_ACTIVITY_BASIS must be one of {', '.join(ACTIVITY_BASES)}, got {basis!r}")
    return basis


def positive_number(name: str, raw: str, integer: bool = False) -> float:
    """A numeric setting that must be a finite number > 0 (nan, inf, 0, negatives and words refused,
    naming the variable): a zero step or timeout would loop or give up at once, silently."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0) or (integer and value != int(value)):
        kind = "a positive whole number" if integer else "a positive number"
        raise ValueError(f"{name} must be {kind}, got {raw!r}")
    return value


def flag(name: str, raw: str) -> bool:
    """A 1/0 setting (true/false, yes/no too); anything else is refused, naming the variable."""
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name} must be 1 or 0 (true/false, yes/no, on/off), got {value!r}")


def cost_tags(raw: str) -> tuple[str, str, str]:
    """FOXHUNT_COST_TAGS: the AWS tag keys behind costs_daily's project, environment and experiment columns."""
    keys = tuple(x.strip() for x in raw.split(","))
    if len(keys) != 3 or not all(keys):
        raise ValueError(
            f"FOXHUNT_COST_TAGS must name three tag keys (project, environment, experiment), got {raw!r}"
        )
    return keys  # type: ignore[return-value]


def csv_list(raw: str) -> list[str]:
    """A comma-separated setting as a list, blanks dropped."""
    return [x.strip() for x in raw.split(",") if x.strip()]


def partitions_start(raw: str) -> datetime:
    """FOXHUNT_PARTITIONS_START as a UTC datetime."""
    try:
        return datetime.fromisoformat(raw.strip()).replace(tzinfo=timezone.utc)
    except ValueError:
        raise ValueError(f"FOXHUNT_PARTITIONS_START must be a date (2026-11-01), got {raw!r}") from None
