"""The CLI's configuration: the code location's own resources, their settings read from the environment now
(outside Dagster there is no run to resolve a `dg.EnvVar`), so a command and a run see the same values."""

from __future__ import annotations

from foxhunt_obs.defs import resources
from foxhunt_obs.lib.lake import Lake


def lake() -> Lake:
    return resources.LakeResource.from_env(resolve=True).lake()


def prometheus():
    return resources.PrometheusResource.from_env(resolve=True).client()


def cluster():
    return resources.ClusterResource.from_env(resolve=True).settings()


def mlflow():
    return resources.MlflowResource.from_env(resolve=True).source()


def aws() -> resources.AwsResource:
    return resources.AwsResource.from_env(resolve=True)


def fsx_ids() -> list[str] | None:
    return resources.FsxResource.from_env(resolve=True).ids()


def price_region() -> str:
    return resources.CostsResource.from_env(resolve=True).value("price_region")


def costs() -> resources.CostsResource:
    return resources.CostsResource.from_env(resolve=True)


def alerting() -> resources.AlertingResource:
    return resources.AlertingResource.from_env(resolve=True)
