"""boto3 clients for the AWS sources (CloudWatch, FSx, Cost Explorer, S3, Budgets).

One place decides how clients are built so every source retries the same way: the retry mode is set
explicitly (standard by default, adaptive on request) because botocore's legacy mode does not retry Cost
Explorer's LimitExceededException. The endpoint is passed only when configured: left unset, boto3 itself
resolves AWS_ENDPOINT_URL_<SERVICE> and AWS_ENDPOINT_URL (the sandbox's moto server), which an explicit
value would override.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

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


_SERVICES_FILE = Path(__file__).resolve().parents[2] / "data" / "aws_services.yaml"


@lru_cache(maxsize=1)
def _ce_names() -> dict[str, str]:
    raw = yaml.safe_load(_SERVICES_FILE.read_text())["services"]
    return {name: code for code, names in raw.items() for name in names}


def product_code(ce_service: str) -> str:
    """Cost Explorer's SERVICE name → the CUR product code (unknown names are kept as they are)."""
    return _ce_names().get(ce_service, ce_service)


def ce_service_name(code: str) -> str:
    """A CUR product code → Cost Explorer's (first) SERVICE name for it."""
    for name, c in _ce_names().items():
        if c == code:
            return name
    return code


def tag_column(key: str) -> str:
    """A tag key as CUR 2.0 and Cost Explorer spell it, normalised: 'user:Project', 'user_project' and
    'Project' all become 'project'."""
    k = key.strip()
    for prefix in ("user:", "user_", "resource_tags_user_"):
        if k.lower().startswith(prefix):
            k = k[len(prefix) :]
            break
    return k.lower()
