"""Fixtures the lib tests share."""

import pytest


@pytest.fixture
def moto_s3(monkeypatch):
    """A moto server in this process for S3, with the environment cleared of a user's AWS settings:
    (its endpoint URL, an S3 client on it). AWS_ENDPOINT_URL points at it."""
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        for k in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
            monkeypatch.delenv(k, raising=False)
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        yield url, boto3.client("s3", endpoint_url=url, region_name="us-east-1")
    finally:
        server.stop()
