"""MLflow source: runs through MlflowClient, metric histories by the fastest exact path there is.

One class, `MlflowSource`, over three paths, a module each:

* client.py: experiments and runs through MlflowClient (REST mode), its retries bounded by ours;
* rest.py: metric histories over REST (`get-history-bulk-interval`, then `get-history` where a window
  comes back full), on a thread pool;
* sql.py: backend-store mode, experiments, runs and histories from MLflow's own SQL tables, read-only.

model.py holds what they share: `MlflowRun`, `MlflowAuth`, the history table and the error.

What the server sends, as measured on MLflow 3.17: NaN as the JSON string "NaN"; ±Inf as
±1.7976931348623157e308, because the SQL store saves ±Inf as ±DBL_MAX; both are mapped back here
(NaN kept, ±DBL_MAX → ±inf). An unknown run_id gets `200 {}` from get-history, so an empty answer for
a key the run listed is checked with `runs/get`, which says 404 RESOURCE_DOES_NOT_EXIST.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa

from foxhunt_obs.lib.redact import redact_url
from foxhunt_obs.lib.sources.mlflow.client import ClientPath
from foxhunt_obs.lib.sources.mlflow.model import HISTORY_SCHEMA, MlflowAuth, MlflowRun, MlflowSourceError
from foxhunt_obs.lib.sources.mlflow.rest import BULK_MAX_RESULTS, BULK_MAX_RUNS, HISTORY_PAGE, RestPath
from foxhunt_obs.lib.sources.mlflow.sql import SqlPath, store_where

__all__ = [
    "BULK_MAX_RESULTS",
    "BULK_MAX_RUNS",
    "HISTORY_PAGE",
    "HISTORY_SCHEMA",
    "MlflowAuth",
    "MlflowRun",
    "MlflowSource",
    "MlflowSourceError",
]


class MlflowSource:
    """Runs and metric histories of an MLflow tracking server, or of its SQL store directly.

    `retries` counts tries of one request (as in the Prometheus client): 3 means at most 2 retries,
    with backoff 0.5 s, 1 s, ...; only connection errors, timeouts, 429 and 5xx are retried.
    """

    def __init__(
        self,
        tracking_uri: str,
        *,
        experiments: Sequence[str] | None = None,
        backend_store_uri: str | None = None,
        workers: int = 8,
        timeout_s: float = 60.0,
        retries: int = 3,
        page_size: int = 1000,
        auth: MlflowAuth | None = None,
    ):
        if isinstance(experiments, str):  # a bare name would be read as a list of letters
            experiments = [experiments]
        self.tracking_uri = (tracking_uri or "").rstrip("/")
        self.experiment_names = list(experiments) if experiments is not None else None
        self.backend_store_uri = backend_store_uri
        self.workers = max(1, workers)
        self.timeout_s = timeout_s
        self.retries = max(1, retries)
        self.page_size = page_size
        auth = auth or MlflowAuth()
        uri = redact_url(self.tracking_uri)
        self.client = ClientPath(
            self.tracking_uri, uri, timeout_s=timeout_s, retries=self.retries, page_size=page_size, auth=auth
        )
        self.rest = RestPath(
            self.tracking_uri, uri, workers=self.workers, timeout_s=timeout_s, retries=self.retries, auth=auth
        )
        # errors name the setting the URI comes from, never its password
        self.sql = SqlPath(backend_store_uri, store_where(backend_store_uri)) if backend_store_uri else None

    def experiments(self) -> dict[str, str]:
        """id -> name of every experiment (active and deleted), only the named ones when a filter is set."""
        found = self.sql.experiments() if self.sql else self.client.experiments()
        return self._filter_experiments(found)

    def runs(self) -> list[MlflowRun]:
        """Every run of those experiments, deleted ones included (flagged `deleted`)."""
        exps = self.experiments()
        if not exps:
            return []
        return self.sql.runs(exps) if self.sql else self.client.runs(exps)

    def histories(self, runs: Iterable[MlflowRun]) -> pa.Table:
        """Every point of every metric key of each run, sorted by run_id, key, step, ts."""
        runs = list(runs)
        if not runs:
            return HISTORY_SCHEMA.empty_table()
        return self.sql.histories(runs) if self.sql else self.rest.histories(runs)

    def where(self) -> str:
        """The store or server read, as errors name it (never credentials)."""
        return self.sql.where if self.sql else self.client.where

    def _filter_experiments(self, found: dict[str, str]) -> dict[str, str]:
        if self.experiment_names is None:
            return found
        wanted = set(self.experiment_names)
        missing = sorted(wanted - set(found.values()))
        if missing:  # a typo must not read as "no runs"
            raise MlflowSourceError(
                f"MLflow at {self.where()}: experiments not found: {', '.join(missing)} "
                f"(known: {', '.join(sorted(found.values())) or 'none'})"
            )
        return {i: n for i, n in found.items() if n in wanted}
