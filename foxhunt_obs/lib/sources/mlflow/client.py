"""Experiments and runs through MlflowClient (REST mode), its HTTP retries bounded by the source's and
its auth given for the call only."""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import requests

from foxhunt_obs.lib.sources.mlflow.model import (
    MlflowAuth,
    MlflowRun,
    call_error,
    call_span,
    next_token,
    utc,
)

_ENV_LOCK = threading.RLock()
_ENV_OURS: dict[str, int] = {}  # MLflow variables we set -> calls in flight that need them


class ClientPath:
    """experiments() and runs() of the tracking server at `tracking_uri` (shown as `where`)."""

    def __init__(
        self,
        tracking_uri: str,
        where: str,
        *,
        timeout_s: float,
        retries: int,
        page_size: int,
        auth: MlflowAuth,
    ):
        self.tracking_uri = tracking_uri
        self.where = where
        self.timeout_s = timeout_s
        self.retries = retries
        self.page_size = page_size
        self._auth_env = auth_env(auth)

    def _client(self):
        from mlflow import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri)

    def experiments(self) -> dict[str, str]:
        from mlflow.entities import ViewType

        client, found, token, page, seen = self._client(), {}, None, 1, set()
        while True:
            with self.call(f"search_experiments page {page}"):
                batch = client.search_experiments(
                    view_type=ViewType.ALL, max_results=self.page_size, page_token=token
                )
            found.update({e.experiment_id: e.name for e in batch})
            token = next_token(batch.token, seen, f"search_experiments page {page}", self.where)
            page += 1
            if not token:
                return found

    def runs(self, exps: dict[str, str]) -> list[MlflowRun]:
        from mlflow.entities import ViewType

        client, out, token, page, seen = self._client(), {}, None, 1, set()
        while True:
            with self.call(f"search_runs page {page}"):
                batch = client.search_runs(
                    list(exps),
                    run_view_type=ViewType.ALL,
                    max_results=self.page_size,
                    page_token=token,
                )
            for r in batch:
                latest = r.data.to_proto().metrics  # the public way to the latest metrics' timestamps
                info = r.info
                # by run_id: offset paging can repeat a run when another starts between two pages
                out[info.run_id] = MlflowRun(
                    run_id=info.run_id,
                    experiment_id=str(info.experiment_id),
                    experiment_name=exps.get(str(info.experiment_id), ""),
                    run_name=info.run_name or "",
                    status=str(info.status),
                    deleted=info.lifecycle_stage == "deleted",
                    start_time=utc(info.start_time),
                    end_time=utc(info.end_time),
                    user=info.user_id or "",
                    params=dict(r.data.params),
                    tags=dict(r.data.tags),
                    metric_keys=tuple(sorted({m.key for m in latest})),
                    last_metric_time=utc(max((m.timestamp for m in latest), default=None)),
                    latest_steps={m.key: int(m.step) for m in latest},
                )
            token = next_token(batch.token, seen, f"search_runs page {page}", self.where)
            page += 1
            if not token:
                return list(out.values())

    @contextmanager
    def call(self, call: str) -> Iterator[None]:
        """Run an MlflowClient call with its HTTP retries bounded by ours, its errors wrapped in ours.

        MlflowClient reads its retry settings from the environment on every request; left at their
        defaults (7 retries, backoff factor 2, 120 s timeout) a dead server takes minutes to fail. Its
        auth and TLS come from variables too: the source's MlflowAuth is set there for the call, so
        listing runs and reading histories authenticate alike. Variables the user set are left alone.
        """
        from mlflow.exceptions import MlflowException

        bounds = {
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(self.retries - 1),
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",  # an int for MLflow: sleeps 0 s, 2 s, 4 s, ...
            "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, math.ceil(self.timeout_s))),
            **self._auth_env,  # MlflowClient takes its auth and TLS from these too, nowhere else
        }
        # The variables are ours while any call needs them (counted), not held under a lock during the
        # call: a call that hangs must not block another thread's (the alert tick gives up on a late one).
        with _ENV_LOCK:
            mine = [k for k in bounds if k not in os.environ or k in _ENV_OURS]
            for k in mine:
                os.environ.setdefault(k, bounds[k])
                _ENV_OURS[k] = _ENV_OURS.get(k, 0) + 1
        try:
            with call_span(f"MlflowClient {call.split(' page ')[0]}", call, None, self.tracking_uri):
                yield
        except MlflowException as e:
            raise call_error(self.where, call, _mlflow_text(e)) from None
        except requests.RequestException as e:
            raise call_error(self.where, call, f"{type(e).__name__}: {e}") from None
        finally:
            with _ENV_LOCK:
                for k in mine:
                    _ENV_OURS[k] -= 1
                    if not _ENV_OURS[k]:
                        del _ENV_OURS[k]
                        os.environ.pop(k, None)


def auth_env(auth: MlflowAuth) -> dict[str, str]:
    """The auth given to the source as the variables MlflowClient reads (only those with a value)."""
    values = {
        "MLFLOW_TRACKING_USERNAME": auth.username,
        "MLFLOW_TRACKING_PASSWORD": auth.password,
        "MLFLOW_TRACKING_TOKEN": auth.token,
        "MLFLOW_TRACKING_INSECURE_TLS": "true" if auth.insecure_tls else "",
        "MLFLOW_TRACKING_SERVER_CERT_PATH": auth.server_cert_path,
        "MLFLOW_TRACKING_CLIENT_CERT_PATH": auth.client_cert_path,
    }
    return {k: v for k, v in values.items() if v}


def _mlflow_text(e) -> str:
    code = getattr(e, "error_code", "")
    msg = getattr(e, "message", None) or str(e)
    return f"{code}: {msg}" if code and code not in msg else msg
