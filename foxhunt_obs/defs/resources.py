"""The one place resources are built. Values come from the environment when a run starts.

The lake is a resource, not an IO manager: assets write one partition at a time with a schema
check and read across partitions with SQL (a fresh in-memory DuckDB), which an IO manager's
load-the-upstream-object contract does not fit. Sensors and scripts use the same Lake class.
"""

import dagster as dg

from foxhunt_obs.lib.lake import Lake
from foxhunt_obs.lib.settings import Settings, env
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

        names = [x.strip() for x in env("FOXHUNT_MLFLOW_EXPERIMENTS").split(",") if x.strip()]
        return MlflowSource(
            self.tracking_uri or env("MLFLOW_TRACKING_URI"),
            experiments=names or None,
            backend_store_uri=env("FOXHUNT_MLFLOW_BACKEND_STORE_URI") or None,
        )


@dg.definitions
def resources() -> dg.Definitions:
    return dg.Definitions(
        resources={"lake": LakeResource(), "prometheus": PrometheusResource(), "mlflow": MlflowResource()}
    )
