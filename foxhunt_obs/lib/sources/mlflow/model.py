"""What every path of the MLflow source shares: a run as read (`MlflowRun`), the auth of its calls
(`MlflowAuth`), the metric history table (`HISTORY_SCHEMA`, `history_table`), its error and a call's span."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa

from foxhunt_obs.lib import tracing
from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.redact import remember, scrub

DBL_MAX = 1.7976931348623157e308  # how MLflow's SQL store saves ±Inf

HISTORY_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("key", pa.string()),
        ("step", pa.int64()),
        ("ts", pa.timestamp("ms", tz="UTC")),
        ("value", pa.float64()),
    ]
)
_SORT = [("run_id", "ascending"), ("key", "ascending"), ("step", "ascending"), ("ts", "ascending")]


class MlflowSourceError(InputError, RuntimeError):
    """A failed call; the message names the tracking URI (never credentials), the call, the HTTP status
    and MLflow's own error text."""


@dataclass(frozen=True)
class MlflowRun:
    run_id: str
    experiment_id: str
    experiment_name: str
    run_name: str
    status: str  # RUNNING / SCHEDULED / FINISHED / FAILED / KILLED
    deleted: bool  # lifecycle_stage == "deleted" (deleting an experiment marks its runs deleted too)
    start_time: datetime | None  # UTC
    end_time: datetime | None
    user: str
    params: dict[str, str]
    tags: dict[str, str]
    metric_keys: tuple[str, ...]  # keys of the run's latest metrics
    last_metric_time: datetime | None  # max timestamp among the run's latest metrics (UTC)
    latest_steps: dict[str, int] = field(default_factory=dict)  # key -> step of its latest metric (max step)


@dataclass(frozen=True)
class MlflowAuth:
    """Auth and TLS of foxhunt_obs's own REST calls: the values MLflow's client takes from its
    MLFLOW_TRACKING_* variables (basic auth over the bearer token, as MLflow does)."""

    username: str = ""
    password: str = field(default="", repr=False)
    token: str = field(default="", repr=False)
    insecure_tls: bool = False
    server_cert_path: str = ""
    client_cert_path: str = ""

    def __post_init__(self) -> None:
        remember(self.password, self.token)


def call_error(where: str, call: str, text: str) -> MlflowSourceError:
    """The error of one call to the server (or store) shown as `where`, its text scrubbed of secrets."""
    return MlflowSourceError(f"MLflow at {where}: {call}: {scrub(text)}")


def next_token(token: str | None, seen: set[str], call: str, where: str) -> str | None:
    """The next page's token; one the server already gave would page forever: an error."""
    if token and token in seen:
        raise call_error(where, call, f"next_page_token {token[:40]!r} repeated: the server pages in a loop")
    if token:
        seen.add(token)
    return token


def call_span(name: str, call: str, method: str | None, url: str):
    """The span of one call (lib/tracing.py): the HTTP conventions' attributes and the call's text."""
    attributes = {**tracing.http_attributes(method, url), tracing.SOURCE: "mlflow", tracing.QUERY: call}
    return tracing.span(name, attributes, kind=tracing.CLIENT)


def history_table(
    run_id: pa.Array, key: pa.Array, step: np.ndarray, ts: np.ndarray, value: np.ndarray
) -> pa.Table:
    """The points as HISTORY_SCHEMA (±DBL_MAX back to ±inf), sorted by run_id, key, step, ts, value."""
    value = np.where(value >= DBL_MAX, np.inf, np.where(value <= -DBL_MAX, -np.inf, value))
    table = pa.Table.from_arrays(
        [
            run_id,
            key,
            pa.array(step, pa.int64()),
            pa.array(ts, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            pa.array(value, pa.float64()),
        ],
        schema=HISTORY_SCHEMA,
    )
    # value last: the same step logged twice at the same ms sorts the same way on every path
    return table.sort_by([*_SORT, ("value", "ascending")]).combine_chunks()


def flat(chunks: Iterable[list[tuple]]) -> Iterator[tuple]:
    for rows in chunks:
        yield from rows


def utc(ms) -> datetime | None:
    """Epoch milliseconds as a UTC datetime; None for unset (None, or 0 in protobuf)."""
    if ms is None or ms == 0:  # MLflow leaves end_time unset (None, or 0 in protobuf) while running
        return None
    return datetime.fromtimestamp(int(ms) / 1000, tz=timezone.utc)
