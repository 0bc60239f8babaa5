"""The one place resources are built, and where (with the CLI, and partitions.py at load) the environment
is read.

Every setting in lib/settings.py's registry is a field of one of these resources. `resources()` gives each
field `dg.EnvVar(NAME)` where that variable is set when the code location loads (Dagster reads its value
when a run or tick starts, and the UI's Resources page shows the variable's name, never a secret's value)
and the registry's default otherwise. Tests and scripts pass values explicitly: `LakeResource(root=...)`.

The lake is a resource, not an IO manager: assets write one partition at a time with a schema check and
read across partitions with SQL (a fresh in-memory DuckDB), which an IO manager's load-the-upstream-object
contract does not fit. Sensors and scripts use the same Lake class.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

import dagster as dg
from dagster_aws.utils import ResourceWithBoto3Configuration
from dagster_slack import SlackResource
from pydantic import Field
from slack_sdk import WebClient

from foxhunt_obs.lib import settings
from foxhunt_obs.lib.delivery.slack_client import slack_web_client
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.settings import SETTING, ClusterSettings
from foxhunt_obs.lib.sources.aws import AwsConfig
from foxhunt_obs.lib.sources.prometheus import PrometheusClient


def setting(name: str, fallback: str | None = None):
    """A resource field bound to the registry's setting `name`: its default, its meaning, its variable;
    `fallback`: a variable read where `name` is unset (boto3's AWS_DEFAULT_REGION behind AWS_REGION)."""
    s = SETTING[name]
    extra = {"env": name, **({"fallback_env": fallback} if fallback else {})}
    return Field(default=s.default, description=f"{s.meaning} ({name})", json_schema_extra=extra)


def _setting_of(cls: type, field: str, key: str = "env") -> str | None:
    extra = cls.model_fields[field].json_schema_extra
    return extra.get(key) if isinstance(extra, dict) else None


class FromSettings:
    """Mixin of the resources whose fields are settings."""

    @classmethod
    def from_env(cls, *, resolve: bool = False, **given):
        """The resource with `dg.EnvVar(NAME)` for every setting whose variable is set now (Dagster reads
        it when a run or tick starts), the registry's default for the others, and `given` as it is.
        resolve=True takes the variables' values now instead: for the CLI and scripts, outside Dagster."""
        values = dict(given)
        for field in cls.model_fields:  # type: ignore[attr-defined]
            if field in values:
                continue
            names = (_setting_of(cls, field), _setting_of(cls, field, "fallback_env"))
            name = next((n for n in names if n and os.environ.get(n)), None)
            if name:
                values[field] = os.environ[name] if resolve else dg.EnvVar(name)
        return cls(**values)

    def value(self, field: str) -> str:
        """The field's value; empty means the registry's default, as an empty variable does."""
        raw = getattr(self, field)
        name = _setting_of(type(self), field)
        return raw if raw or name is None else SETTING[name].default

    def number(self, field: str, integer: bool = False) -> float:
        return settings.positive_number(_setting_of(type(self), field) or field, self.value(field), integer)

    def flag(self, field: str) -> bool:
        return settings.flag(_setting_of(type(self), field) or field, self.value(field))

    def items(self, field: str) -> list[str]:
        return settings.csv_list(self.value(field))


def bound_settings(cls: type) -> dict[str, str]:
    """field -> setting name, for the fields of `cls` bound to a setting."""
    return {f: n for f in cls.model_fields if (n := _setting_of(cls, f))}  # type: ignore[attr-defined]


class LakeResource(FromSettings, dg.ConfigurableResource):
    """The Parquet lake: a local folder or s3://bucket/prefix (S3 with its region and endpoint)."""

    root: str = setting("FOXHUNT_LAKE")
    region: str = setting("AWS_REGION", fallback="AWS_DEFAULT_REGION")
    endpoint_url: str = setting("AWS_ENDPOINT_URL")
    s3_endpoint_url: str = setting("AWS_ENDPOINT_URL_S3")

    def lake(self) -> Lake:
        endpoint = self.value("s3_endpoint_url") or self.value("endpoint_url")
        return Lake(self.value("root"), region=self.value("region"), endpoint_url=endpoint or None)


class PrometheusResource(FromSettings, dg.ConfigurableResource):
    """The Prometheus HTTP API: where, how long a request may take, how big, gzip, the bearer token."""

    url: str = setting("FOXHUNT_PROMETHEUS_URL")
    timeout_s: str = setting("FOXHUNT_PROMETHEUS_TIMEOUT")
    max_points: str = setting("FOXHUNT_PROMETHEUS_MAX_POINTS")
    queries_at_once: str = setting("FOXHUNT_PROMETHEUS_QUERIES_AT_ONCE")
    gzip: str = setting("FOXHUNT_PROMETHEUS_GZIP")
    bearer_token: str = setting("FOXHUNT_PROMETHEUS_BEARER_TOKEN")

    def client(self) -> PrometheusClient:
        return PrometheusClient(
            self.value("url"),
            timeout_s=self.number("timeout_s"),
            gzip=self.flag("gzip"),
            max_points=int(self.number("max_points", integer=True)),
            queries_at_once=int(self.number("queries_at_once", integer=True)),
            bearer_token=self.bearer_token,
        )


class ClusterResource(FromSettings, dg.ConfigurableResource):
    """How the cluster's series are named and sampled: the scrape step and the labels that name a series'
    node, experiment and MLflow run."""

    scrape_step: str = setting("FOXHUNT_SCRAPE_STEP")
    experiment_label: str = setting("FOXHUNT_EXPERIMENT_LABEL")
    run_id_pod_label: str = setting("FOXHUNT_RUN_ID_POD_LABEL")
    node_labels: str = setting("FOXHUNT_NODE_LABELS")
    exporter_containers: str = setting("FOXHUNT_EXPORTER_CONTAINERS")

    def settings(self) -> ClusterSettings:
        return ClusterSettings(
            scrape_step_s=self.number("scrape_step"),
            experiment_label=self.value("experiment_label"),
            run_id_label=self.value("run_id_pod_label").strip(),
            node_labels=tuple(self.items("node_labels")),
            exporter_containers=tuple(self.items("exporter_containers")),
        )


class MlflowResource(FromSettings, dg.ConfigurableResource):
    """MLflow: the tracking server (with MLflow's own auth and TLS variables, which foxhunt_obs's REST calls
    use as MLflow's client does), the experiment filter, and the optional backend-store fast path."""

    tracking_uri: str = setting("MLFLOW_TRACKING_URI")
    experiments: str = setting("FOXHUNT_MLFLOW_EXPERIMENTS")
    backend_store_uri: str = setting("FOXHUNT_MLFLOW_BACKEND_STORE_URI")
    username: str = setting("MLFLOW_TRACKING_USERNAME")
    password: str = setting("MLFLOW_TRACKING_PASSWORD")
    token: str = setting("MLFLOW_TRACKING_TOKEN")
    insecure_tls: str = setting("MLFLOW_TRACKING_INSECURE_TLS")
    server_cert_path: str = setting("MLFLOW_TRACKING_SERVER_CERT_PATH")
    client_cert_path: str = setting("MLFLOW_TRACKING_CLIENT_CERT_PATH")

    def source(self):
        from foxhunt_obs.lib.sources.mlflow import MlflowAuth, MlflowSource

        auth = MlflowAuth(
            username=self.username,
            password=self.password,
            token=self.token,
            insecure_tls=self.flag("insecure_tls"),
            server_cert_path=self.server_cert_path,
            client_cert_path=self.client_cert_path,
        )
        return MlflowSource(
            self.value("tracking_uri"),
            experiments=self.items("experiments") or None,
            backend_store_uri=self.backend_store_uri or None,
            auth=auth,
        )


class AwsResource(FromSettings, ResourceWithBoto3Configuration):
    """boto3 clients for CloudWatch, FSx, Cost Explorer, S3, Budgets and EC2. endpoint_url is not bound to
    AWS_ENDPOINT_URL: left empty, boto3 resolves AWS_ENDPOINT_URL_<SERVICE> and AWS_ENDPOINT_URL itself
    (one value here would override the per-service ones). Credentials by boto3's usual chain unless given."""

    region_name: str = setting("AWS_REGION", fallback="AWS_DEFAULT_REGION")
    retry_mode: Literal["standard", "adaptive"] = "standard"

    def config(self) -> AwsConfig:
        return AwsConfig(
            region_name=self.value("region_name"),
            profile_name=self.profile_name,
            endpoint_url=self.endpoint_url or None,
            retry_mode=self.retry_mode,
            max_attempts=self.max_attempts,
            use_ssl=self.use_ssl,
            verify=self.verify,
            aws_access_key_id=self.aws_access_key_id,
            aws_secret_access_key=self.aws_secret_access_key,
            aws_session_token=self.aws_session_token,
        )

    def client(self, service: str):
        return self.config().client(service)

    def clients(self, service: str, regions: list[str]) -> dict:
        """region -> a client of ``service`` there (the resource's region when ``regions`` is empty)."""
        config = self.config()
        wanted = regions or [config.region_name]
        return {r: dataclasses.replace(config, region_name=r).client(service) for r in wanted if r}


class FsxResource(FromSettings, dg.ConfigurableResource):
    """Which FSx for Lustre file systems are read (through the aws resource's clients)."""

    fsx_ids: str = setting("FOXHUNT_FSX_IDS")

    def ids(self) -> list[str] | None:
        """The configured ids; None: every Lustre file system."""
        return self.items("fsx_ids") or None


class CostsResource(FromSettings, dg.ConfigurableResource):
    """The bill: the CUR export, the cost-allocation tag keys, the price table's region, how far back Cost
    Explorer restates, and whether to ask for its forecast."""

    cur_s3_uri: str = setting("FOXHUNT_CUR_S3_URI")
    cost_tags: str = setting("FOXHUNT_COST_TAGS")
    price_region: str = setting("FOXHUNT_PRICE_REGION")
    ce_restate_days: str = setting("FOXHUNT_CE_RESTATE_DAYS")
    ce_forecast: str = setting("FOXHUNT_CE_FORECAST")
    ec2_regions: str = setting("FOXHUNT_EC2_REGIONS")
    pushgateway_url: str = setting("FOXHUNT_PUSHGATEWAY_URL")

    def tags(self) -> tuple[str, str, str]:
        return settings.cost_tags(self.value("cost_tags"))

    def restate_days(self) -> int:
        return int(self.number("ce_restate_days", integer=True))

    def untracked(self, aws: AwsResource, prometheus):
        """The running EC2 instances outside the cluster, as untracked_spend and spend_now read them."""
        from foxhunt_obs.lib.ingest.untracked import UntrackedSpend
        from foxhunt_obs.lib.sources.ec2 import Ec2Inventory

        inventory = Ec2Inventory(aws.clients("ec2", self.items("ec2_regions")))
        return UntrackedSpend(inventory, prometheus, experiment_tag=self.tags()[2])


class SlackBotResource(FromSettings, SlackResource):
    """dagster-slack's resource for the alert sinks and the weekly report. Only a configured channel
    (the alerting and report resources') asks for a client, so a deployment without Slack loads and runs.
    The client has the lib's timeout and bounded retries (lib/delivery/slack_client.py)."""

    token: str = setting("SLACK_BOT_TOKEN")
    base_url: str = setting("FOXHUNT_REPORT_SLACK_API_URL")

    def get_client(self) -> WebClient:
        return slack_web_client(self.token, self.value("base_url"))


class ReportResource(FromSettings, dg.ConfigurableResource):
    """The weekly report: its headline basis, and where it is sent (SMTP e-mail, a Slack channel)."""

    activity_basis: str = setting("FOXHUNT_ACTIVITY_BASIS")
    smtp_host: str = setting("FOXHUNT_REPORT_SMTP_HOST")
    smtp_port: str = setting("FOXHUNT_REPORT_SMTP_PORT")
    smtp_user: str = setting("FOXHUNT_REPORT_SMTP_USER")
    smtp_password: str = setting("FOXHUNT_REPORT_SMTP_PASSWORD")
    smtp_starttls: str = setting("FOXHUNT_REPORT_SMTP_STARTTLS")
    email_from: str = setting("FOXHUNT_REPORT_EMAIL_FROM")
    email_to: str = setting("FOXHUNT_REPORT_EMAIL_TO")
    slack_channel: str = setting("FOXHUNT_REPORT_SLACK_CHANNEL")

    def basis(self) -> str:
        return settings.activity_basis(self.value("activity_basis"))

    def delivery(self):
        from foxhunt_obs.lib.delivery.send import ReportDelivery

        return ReportDelivery(
            smtp_host=self.smtp_host,
            smtp_port=self.value("smtp_port"),
            smtp_user=self.smtp_user,
            smtp_password=self.smtp_password,
            smtp_starttls=self.value("smtp_starttls"),
            email_from=self.email_from,
            email_to=self.email_to,
            slack_channel=self.slack_channel,
        )


class AlertingResource(FromSettings, dg.ConfigurableResource):
    """The alert sensors: the rule overrides file, the sinks (Alertmanager, Slack, a signed webhook; the
    lake's alerts table always), the Dagster UI URL their links point to, and the logs and trace links."""

    rules_file: str = setting("FOXHUNT_ALERT_RULES")
    alertmanager_url: str = setting("FOXHUNT_ALERTMANAGER_URL")
    slack_channel: str = setting("FOXHUNT_ALERT_SLACK_CHANNEL")
    webhook_url: str = setting("FOXHUNT_ALERT_WEBHOOK_URL")
    webhook_secret: str = setting("FOXHUNT_ALERT_WEBHOOK_SECRET")
    dagster_url: str = setting("FOXHUNT_DAGSTER_URL")
    logs_url_template: str = setting("FOXHUNT_LOGS_URL_TEMPLATE")
    trace_url_template: str = setting("FOXHUNT_TRACE_URL_TEMPLATE")

    def links(self):
        """The alerts' links to a pod's logs and a run's trace (lib/tracing.LinkTemplates)."""
        from foxhunt_obs.lib.tracing import LinkTemplates

        return LinkTemplates(logs=self.logs_url_template.strip(), trace=self.trace_url_template.strip())

    def sinks(self, lake: Lake, slack: SlackBotResource) -> list:
        from foxhunt_obs.lib.delivery.alert_sinks import configured_sinks

        return configured_sinks(
            lake,
            alertmanager_url=self.alertmanager_url,
            slack_channel=self.slack_channel,
            webhook_url=self.webhook_url,
            webhook_secret=self.webhook_secret,
            slack_client=slack.get_client,
        )


# The Dagster pool of the steps that query Prometheus (gpu_samples, node_samples, ray_samples, spend_now): a backfill of
# hundreds of hourly partitions becomes many runs, and the pool's limit (deploy/dagster/dagster.yaml's
# concurrency default_limit, or `dagster instance concurrency set prometheus N`) caps how many of those
# steps run at once; each sends up to FOXHUNT_PROMETHEUS_QUERIES_AT_ONCE queries side by side.
PROMETHEUS_POOL = "prometheus"

RESOURCES = {
    "lake": LakeResource,
    "prometheus": PrometheusResource,
    "cluster": ClusterResource,
    "mlflow": MlflowResource,
    "aws": AwsResource,
    "fsx": FsxResource,
    "costs": CostsResource,
    "slack": SlackBotResource,
    "report": ReportResource,
    "alerting": AlertingResource,
}


@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(resources={key: cls.from_env() for key, cls in RESOURCES.items()})
