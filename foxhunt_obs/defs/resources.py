"""The one place resources are built. Values come from the environment when a run starts.

The lake is a resource, not an IO manager: assets write one partition at a time with a schema
check and read across partitions with SQL (a fresh in-memory DuckDB), which an IO manager's
load-the-upstream-object contract does not fit. Sensors and scripts use the same Lake class.
"""

from typing import Literal

import dagster as dg
from dagster_aws.utils import ResourceWithBoto3Configuration

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


@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(
        resources={
            "lake": LakeResource(),
            "prometheus": PrometheusResource(),
            "mlflow": MlflowResource(),
            "aws": AwsResource(),
        }
    )
