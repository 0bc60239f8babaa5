"""The one place resources are built. Values come from the environment when a run starts.

The lake is a resource, not an IO manager: assets write one partition at a time with a schema
check and read across partitions with SQL (a fresh in-memory DuckDB), which an IO manager's
load-the-upstream-object contract does not fit. Sensors and scripts use the same Lake class.
"""

from typing import Literal

import dagster as dg
from dagster_aws.utils import ResourceWithBoto3Configuration
from dagster_slack import SlackResource
from pydantic import Field
from slack_sdk import WebClient

from foxhunt_obs.lib.delivery.slack_client import slack_web_client
from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.settings import Settings, csv_setting, env
from foxhunt_obs.lib.sources.aws import AwsConfig
from foxhunt_obs.lib.sources.prometheus import PrometheusClient


class LakeResource(dg.ConfigurableResource):
    """The Parquet lake; root defaults to FOXHUNT_LAKE."""

    root: str | None = None

    def lake(self) -> Lake:
        return Lake(self.root or env("FOXHUNT_LAKE"))


class PrometheusResource(dg.ConfigurableResource):
    """Prometheus; url defaults to FOXHUNT_PROMETHEUS_URL, the rest from FOXHUNT_PROMETHEUS_*."""

    url: str | None = None

    def client(self) -> PrometheusClient:
        client = PrometheusClient.from_settings(Settings.from_env())
        if self.url:
            client.url = self.url.rstrip("/")
        return client


class MlflowResource(dg.ConfigurableResource):
    """MLflow; tracking_uri defaults to MLFLOW_TRACKING_URI, the experiment filter and the optional
    backend-store fast path to FOXHUNT_MLFLOW_EXPERIMENTS and FOXHUNT_MLFLOW_BACKEND_STORE_URI."""

    tracking_uri: str | None = None

    def source(self):
        from foxhunt_obs.lib.sources.mlflow import MlflowSource

        names = csv_setting("FOXHUNT_MLFLOW_EXPERIMENTS")
        return MlflowSource(
            self.tracking_uri or env("MLFLOW_TRACKING_URI"),
            experiments=names or None,
            backend_store_uri=env("FOXHUNT_MLFLOW_BACKEND_STORE_URI") or None,
        )


class AwsResource(ResourceWithBoto3Configuration):
    """boto3 clients for CloudWatch, FSx, Cost Explorer, S3 and Budgets. Region defaults to AWS_REGION;
    endpoint_url only when set here (otherwise boto3 honours AWS_ENDPOINT_URL[_<SERVICE>] itself);
    credentials by boto3's usual chain unless given."""

    retry_mode: Literal["standard", "adaptive"] = "standard"

    def config(self) -> AwsConfig:
        return AwsConfig(
            region_name=self.region_name or env("AWS_REGION"),
            profile_name=self.profile_name,
            endpoint_url=self.endpoint_url,
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


class SlackBotResource(SlackResource):
    """dagster-slack's resource for the alert sinks and the weekly report. The token defaults to
    SLACK_BOT_TOKEN and base_url to FOXHUNT_REPORT_SLACK_API_URL (else Slack's), both read when a client
    is built, so a deployment without Slack loads and runs: only a configured channel
    (FOXHUNT_ALERT_SLACK_CHANNEL, FOXHUNT_REPORT_SLACK_CHANNEL) asks for a client. The client has the lib's
    timeout and bounded retries (lib/delivery/slack_client.py)."""

    token: str = Field(
        default="",
        description="Slack bot token (set it with dg.EnvVar); empty: SLACK_BOT_TOKEN, never logged",
    )
    base_url: str = Field(
        default="", description="Slack Web API base URL; empty: FOXHUNT_REPORT_SLACK_API_URL, else Slack's"
    )

    def get_client(self) -> WebClient:
        return slack_web_client(self.token, self.base_url)


@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(
        resources={
            "lake": LakeResource(),
            "prometheus": PrometheusResource(),
            "mlflow": MlflowResource(),
            "aws": AwsResource(),
            "slack": SlackBotResource(),
        }
    )
