"""boto3 clients for the AWS sources (CloudWatch, FSx, Cost Explorer, S3, Budgets).

One place decides how clients are built so every source retries the same way: the retry mode is set
explicitly (standard by default, adaptive on request) because botocore's legacy mode does not retry Cost
Explorer's LimitExceededException. The endpoint is passed only when configured: left unset, boto3 itself
resolves AWS_ENDPOINT_URL_<SERVICE> and AWS_ENDPOINT_URL (the sandbox's moto server), which an explicit
value would override.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from foxhunt_obs.lib import tracing
from foxhunt_obs.lib.yaml_text import load_yaml

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
        client = session.client(service, **kwargs)
        if tracing.enabled():
            _trace(client)
        return client


# -- one span per API call (lib/tracing.py), by botocore's own events: before-call starts it (retries
# included), after-call or after-call-error ends it. Names and attributes after OpenTelemetry's AWS SDK
# conventions (https://opentelemetry.io/docs/specs/semconv/cloud-providers/aws-sdk/): span
# `Service.Operation`, rpc.system aws-api, rpc.service, rpc.method, aws.request_id.
_SPAN = "foxhunt_span"  # the key of the call's span in botocore's per-call request context


def _trace(client: Any) -> None:
    events = client.meta.events
    events.register("before-call", _span_start, unique_id="foxhunt-trace-start")
    events.register("after-call", _span_end, unique_id="foxhunt-trace-end")
    events.register("after-call-error", _span_error, unique_id="foxhunt-trace-error")


def _span_start(model, params, context, **_) -> None:
    service = model.service_model.service_id
    attributes = {
        **tracing.http_attributes(params.get("method", "POST"), params.get("url", "")),
        tracing.RPC_SYSTEM: "aws-api",
        tracing.RPC_SERVICE: str(service),
        tracing.RPC_METHOD: model.name,
        tracing.SOURCE: f"aws {service.hyphenize()}",
    }
    span = tracing.tracer().start_span(f"{service}.{model.name}", kind=tracing.CLIENT)
    tracing.set_attributes(span, attributes)
    context[_SPAN] = span


def _span_end(http_response, parsed, context, **_) -> None:
    span = context.pop(_SPAN, None)
    if span is None:
        return
    meta = parsed.get("ResponseMetadata", {}) if isinstance(parsed, dict) else {}
    size = http_response.headers.get("content-length")
    tracing.set_attributes(
        span,
        {
            tracing.HTTP_STATUS: http_response.status_code,
            tracing.AWS_REQUEST_ID: meta.get("RequestId"),
            tracing.HTTP_RESEND_COUNT: meta.get("RetryAttempts"),
            tracing.RESPONSE_BYTES: int(size) if size and size.isdigit() else None,
            # the items of the answer's lists (MetricDataResults, FileSystems, ResultsByTime, ...)
            tracing.ROWS: sum(len(v) for v in parsed.values() if isinstance(v, list))
            if isinstance(parsed, dict)
            else None,
        },
    )
    if http_response.status_code >= 300:
        error = parsed.get("Error", {}) if isinstance(parsed, dict) else {}
        code = str(error.get("Code") or f"HTTP {http_response.status_code}")
        tracing.record_error(span, _AwsError(f"{code}: {error.get('Message', '')}"), code)
    span.end()


def _span_error(exception, context, **_) -> None:
    span = context.pop(_SPAN, None)
    if span is not None:
        tracing.record_error(span, exception)
        span.end()


class _AwsError(Exception):
    """An error answer of an AWS API (botocore raises its own once the span has ended)."""


_SERVICES_FILE = Path(__file__).resolve().parents[2] / "data" / "aws_services.yaml"


@lru_cache(maxsize=1)
def _ce_names() -> dict[str, str]:
    raw = load_yaml(_SERVICES_FILE.read_text())["services"]
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


def aws_snake(text: str) -> str:
    """A name as AWS's billing data spells it in column names and CUR 2.0 map keys: an underscore before every
    upper-case letter (each one, so acronyms go letter by letter: ARN -> a_r_n), lower case, every other
    character that is not a letter or digit -> '_', runs of '_' as one, none at either end. Digits stay
    attached ('k8s', 'avx2').

    What the sources show (tests cite each case): camelCase splits (aws:ecs:serviceName ->
    aws_ecs_service_name, lambda:createdBy -> lambda_created_by); consecutive capitals split per letter
    (reservation/ReservationARN -> reservation_reservation_a_r_n, STAGE -> s_t_a_g_e,
    AWSApplicationMigrationServiceManaged -> a_w_s_application_migration_service_managed); '.', '/', '-' and
    ':' become '_' (app.kubernetes.io/part-of -> app_kubernetes_io_part_of). Runs of '_' collapse
    (user:CostCenter -> user_cost_center, not user__cost_center); spaces and leading/trailing separators are
    not shown by any source and follow the same rule."""
    out: list[str] = []
    for c in text:
        if c.isupper():
            out.append("_" + c.lower())
        elif c.isalnum():
            out.append(c)
        else:
            out.append("_")
    return _UNDERSCORES.sub("_", "".join(out)).strip("_")


_UNDERSCORES = re.compile(r"_+")


def cur_tag_key(key: str) -> str:
    """A tag key as CUR 2.0 writes it into resource_tags: 'user_' + aws_snake(key) for user-defined tags
    (CostCenter -> user_cost_center, team:owner -> user_team_owner), aws_snake(key) for AWS-generated ones
    (aws:createdBy -> aws_created_by)."""
    k = key.strip()
    return aws_snake(k) if k.startswith("aws:") else "user_" + aws_snake(k)


def tag_column(key: str) -> str:
    """The one normalised form of a tag key, whoever spells it: a configured key (FOXHUNT_COST_TAGS:
    'CostCenter'), Cost Explorer's or legacy CUR's 'user:CostCenter' / 'resourceTags/user:CostCenter', a CUR 2.0
    resource_tags key ('user_cost_center') or a legacy Athena column ('resource_tags_user_cost_center') all
    become 'cost_center'; AWS-generated tags keep their 'aws_' ('aws:createdBy', 'aws_created_by' ->
    'aws_created_by'). It is aws_snake() of the key without its user prefix, so a configured key meets the
    spelling AWS writes. The prefixes are matched in lower case, as AWS writes them: 'User_Name' is a key of
    its own (CUR: user_user_name -> 'user_name')."""
    k = key.strip()
    for prefix in ("resourceTags/", "resource_tags_"):
        if k.startswith(prefix):
            k = k[len(prefix) :]
            break
    if k.startswith(("user:", "user_")):
        k = k[len("user:") :]
    return aws_snake(k)
