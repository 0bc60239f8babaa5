"""How AWS clients are built: the retry mode is explicit, the endpoint is boto3's unless configured."""

import pytest

from foxhunt_obs.defs.resources import AwsResource
from foxhunt_obs.lib.sources.aws import AwsConfig, product_code, tag_column


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for k in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_CE",
        "AWS_ENDPOINT_URL_S3",
        "AWS_RETRY_MODE",
        "AWS_PROFILE",
    ):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def test_env_endpoints_are_honoured_not_overridden(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:4001")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:4002")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    resource = AwsResource()
    assert resource.client("ce").meta.endpoint_url == "http://127.0.0.1:4001"
    assert resource.client("s3").meta.endpoint_url == "http://127.0.0.1:4002"
    assert resource.client("fsx").meta.region_name == "eu-west-1"
    explicit = AwsResource(endpoint_url="http://127.0.0.1:4003")
    assert explicit.client("s3").meta.endpoint_url == "http://127.0.0.1:4003"


def test_real_endpoints_by_default(monkeypatch):
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    assert (
        AwsResource().client("cloudwatch").meta.endpoint_url == "https://monitoring.us-east-1.amazonaws.com"
    )


def test_retry_mode_is_explicit_even_when_the_environment_says_legacy(monkeypatch):
    monkeypatch.setenv("AWS_RETRY_MODE", "legacy")
    retries = AwsResource().client("ce").meta.config.retries
    assert retries["mode"] == "standard" and retries["total_max_attempts"] == 5
    assert AwsResource(retry_mode="adaptive").client("ce").meta.config.retries["mode"] == "adaptive"
    with pytest.raises(ValueError, match="legacy does not retry Cost Explorer's LimitExceededException"):
        AwsConfig(retry_mode="legacy")


def test_names_normalised():
    assert product_code("Amazon Elastic Compute Cloud - Compute") == "AmazonEC2"
    assert product_code("EC2 - Other") == "AmazonEC2"
    assert product_code("Some New Service") == "Some New Service"
    assert {
        tag_column(k) for k in ("user:Project", "user_project", "Project", "resource_tags_user_project")
    } == {"project"}
