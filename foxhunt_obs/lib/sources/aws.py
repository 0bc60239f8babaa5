"""boto3 clients for the AWS sources (CloudWatch, FSx, Cost Explorer, S3, Budgets).

One place decides how clients are built so every source retries the same way: the retry mode is set
explicitly (standard by default, adaptive on request) because botocore's legacy mode does not retry Cost
Explorer's LimitExceededException. The endpoint is passed only when configured: left unset, boto3 itself
resolves AWS_ENDPOINT_URL_<SERVICE> and AWS_ENDPOINT_URL (the sandbox's moto server), which an explicit
value would override.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RETRY_MODES = ("standard", "adaptive")


@dataclass(frozen=True)
class AwsConfig:
    region_name: str | None = None
    profile_name: str | None = None
    endpoint_url: str | None = None  # None: boto3's own AWS_ENDPOINT_URL[_<SERVICE>] resolution
    retry_mode: str = "standard"
    max_attempts: int = 5  # the first call included
    use_ssl: bool = True
    verify: bool | None = True
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None
    connect_timeout_s: float = 10
    read_timeout_s: float = 60

    def __post_init__(self) -> None:
        if self.retry_mode not in RETRY_MODES:
            raise ValueError(
                f"AWS retry_mode must be one of {', '.join(RETRY_MODES)} (legacy does not retry Cost "
                f"Explorer's LimitExceededException), got {self.retry_mode!r}"
            )

    def client(self, service: str) -> Any:
        import boto3
        from botocore.config import Config

        session = boto3.session.Session(
            profile_name=self.profile_name,
            region_name=self.region_name,
            aws_access_key_id=self.aws_access_key_id,
            aws_secret_access_key=self.aws_secret_access_key,
            aws_session_token=self.aws_session_token,
        )
        config = Config(
            retries={"mode": self.retry_mode, "total_max_attempts": self.max_attempts},
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
        )
        kwargs: dict[str, Any] = {"use_ssl": self.use_ssl, "verify": self.verify, "config": config}
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        return session.client(service, **kwargs)
