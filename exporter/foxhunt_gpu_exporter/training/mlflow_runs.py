"""Fold-level figures to MLflow, one run per fold, when MLFLOW_TRACKING_URI is set: the batch side
(foxhunt_obs's MLflow ingest) then reads the same run the live endpoint showed.

The run carries the tags foxhunt_obs joins runs to pods with (foxhunt_obs/lib/ingest/mlflow_sync.py reads
`pod`, `namespace` and `experiment`): `pod` from POD_NAME (the Downward API) or the host name, which is
the pod's name in Kubernetes, `namespace` from POD_NAMESPACE when set, plus `model` and `fold`.

Training never waits on MLflow: calls go to one daemon thread in order; a fold's end waits for them at
most `timeout_s`. A failed call is logged once (later ones at debug) and training goes on.

Each call is bounded. MlflowClient reads its HTTP timeout and retries from the environment on every request
(mlflow/utils/rest_utils.py, http_request), and its defaults (mlflow/environment_variables.py:
MLFLOW_HTTP_REQUEST_TIMEOUT 120 s, MLFLOW_HTTP_REQUEST_MAX_RETRIES 7, backoff factor 2) let one call to an
MLflow that accepts and never answers take many minutes, holding up every later fold's run on the one
ordered thread. So while a call runs, those variables the user has not set are ours: 10 s per request, 2
retries, backoff factor 1 (sleeps 0 s then about 2 s), about 35 s at worst for a call. A run whose metric
call failed after those retries logs no more metrics (its end is still sent): one stuck run costs one call's
bound, not one per metric.

At interpreter exit the runs still open are ended, within a short wait shared by all writers (EXIT_WAIT_S):
the fold ends already queued, and folds never ended (status KILLED). What could not be ended in time is
logged by name; those runs stay RUNNING in MLflow.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .redact import redact_uri, scrub

__all__ = ["FoldRun", "MlflowWriter", "pod_tags", "redact_uri", "writer_from_env"]

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 10.0
QUEUE_MAX = 10_000  # calls waiting at most; past that (MLflow far behind) new ones are dropped
REQUEST_TIMEOUT_S = 10  # one HTTP request (MLflow takes whole seconds)
REQUEST_RETRIES = 2
EXIT_WAIT_S = 5.0  # at interpreter exit, for every writer together

_ENV_LOCK = threading.Lock()
_ENV_OURS: dict[str, int] = {}  # MLflow variables we set -> calls in flight that need them


@contextmanager
def bounded_requests(timeout_s: int, retries: int) -> Iterator[None]:
    """MLflow's HTTP timeout and retries bounded for the calls made within, unless the user set them: a
    variable already in the environment (and not ours) is left alone. Ours are counted per call in flight
    and removed when the last one ends, so the trainer's own MLflow calls get MLflow's defaults after."""
    bounds = {
        "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, int(timeout_s))),
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries),
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    }
    with _ENV_LOCK:
        mine = [k for k in bounds if k not in os.environ or k in _ENV_OURS]
        for k in mine:
            os.environ.setdefault(k, bounds[k])
            _ENV_OURS[k] = _ENV_OURS.get(k, 0) + 1
    try:
        yield
    finally:
        with _ENV_LOCK:
            for k in mine:
                _ENV_OURS[k] -= 1
                if not _ENV_OURS[k]:
                    del _ENV_OURS[k]
                    os.environ.pop(k, None)


def pod_tags() -> dict[str, str]:
    tags = {"pod": os.environ.get("POD_NAME") or socket.gethostname()}
    if os.environ.get("POD_NAMESPACE"):
        tags["namespace"] = os.environ["POD_NAMESPACE"]
    return tags


class MlflowWriter:
    """One MlflowClient on one daemon thread; `submit` queues a call, `flush` waits for the queue.

    `timeout_s` is what a fold's end waits at most; `request_timeout_s` and `retries` bound each HTTP
    request of a call (where the user has not set MLflow's variables)."""

    def __init__(
        self,
        tracking_uri: str,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        request_timeout_s: int = REQUEST_TIMEOUT_S,
        retries: int = REQUEST_RETRIES,
    ):
        self.tracking_uri, self.shown_uri, self.timeout_s = tracking_uri, redact_uri(tracking_uri), timeout_s
        self.request_timeout_s, self.retries = request_timeout_s, retries
        self.failures = 0
        self._warned = False
        self._client = None
        self._open: dict[int, FoldRun] = {}  # runs created or queued and not yet ended
        self._open_lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue(QUEUE_MAX)
        self._thread = threading.Thread(target=self._run, name="foxhunt-mlflow", daemon=True)
        self._thread.start()
        _WRITERS.add(self)

    def client(self):
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def submit(self, what: str, call: Callable[[], None]) -> None:
        try:
            self._queue.put_nowait((what, call))
        except queue.Full:
            self._failed(what, "MLflow is too far behind; call dropped")

    def flush(self, timeout_s: float | None = None, *, report: bool = True) -> bool:
        """Wait until every call queued so far is done, at most timeout_s; False if it was not."""
        wait = self.timeout_s if timeout_s is None else timeout_s
        done = threading.Event()
        self.submit("flush", done.set)
        if done.wait(wait):
            return True
        if report:
            self._failed("flush", f"no answer within {wait:g}s; training goes on")
        return False

    def open_runs(self) -> list[FoldRun]:
        with self._open_lock:
            return list(self._open.values())

    def _opened(self, run: FoldRun, is_open: bool) -> None:
        with self._open_lock:
            if is_open:
                self._open[id(run)] = run
            else:
                self._open.pop(id(run), None)

    def end_at_exit(self, wait_s: float) -> list[str]:
        """End the open runs (a fold never ended: KILLED), waiting at most wait_s; the names of those that
        were not ended in time, logged (they stay RUNNING)."""
        runs = self.open_runs()
        if not runs:
            return []
        for run in runs:
            if not run.end_requested:
                run.end("KILLED", wait=False)
        self.flush(max(wait_s, 0.0), report=False)
        left = [run.run_name for run in self.open_runs()]
        if left:
            log.warning(
                "MLflow at %s: %d run(s) not ended at exit (waited up to %.3gs), left RUNNING: %s",
                self.shown_uri, len(left), wait_s, ", ".join(left),
            )  # fmt: skip
        return left

    def _run(self) -> None:
        while True:
            what, call = self._queue.get()
            try:
                with bounded_requests(self.request_timeout_s, self.retries):
                    call()
            except Exception as e:  # never let MLflow stop the thread (or training)
                self._failed(what, e)

    def _failed(self, what: str, error: object) -> None:
        self.failures += 1
        message = scrub(str(error).replace(self.tracking_uri, self.shown_uri))
        if not self._warned:
            self._warned = True
            log.warning(
                "MLflow at %s: %s failed: %s (logged once; training goes on)", self.shown_uri, what, message
            )
        else:
            log.debug("MLflow at %s: %s failed: %s", self.shown_uri, what, message)


class FoldRun:
    """The MLflow run of one fold: created, fed and ended on the writer's thread, in order."""

    def __init__(
        self, writer: MlflowWriter, experiment: str, run_name: str, tags: dict[str, str], params: dict
    ):
        self.writer, self.run_name = writer, run_name
        self.run_id: str | None = None
        self.end_requested = False
        self.metrics_failed = False  # a metric call failed (after MLflow's retries): log no more of them
        writer._opened(self, True)
        self.writer.submit(f"create run {run_name}", lambda: self._create(experiment, run_name, tags, params))

    def _create(self, experiment: str, run_name: str, tags: dict[str, str], params: dict) -> None:
        client = self.writer.client()
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        run = client.create_run(experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        for key, value in params.items():
            client.log_param(self.run_id, key, value)

    def log(self, key: str, value: float, step: int) -> None:
        if value is None:
            return
        ts = int(time.time() * 1000)
        self.writer.submit(f"log {key}", lambda: self._log(key, float(value), ts, step))

    def _log(self, key: str, value: float, ts: int, step: int) -> None:
        # no run (its creation failed) or a metric call already failed: nothing more (already reported)
        if self.run_id is None or self.metrics_failed:
            return
        try:
            self.writer.client().log_metric(self.run_id, key, value, timestamp=ts, step=step)
        except Exception:
            self.metrics_failed = True
            raise

    def end(self, status: str, *, wait: bool = True) -> None:
        """End the run with `status`; wait (at most the writer's timeout_s) for it and what came before."""
        self.end_requested = True
        self.writer.submit(f"end run {self.run_name} ({status})", lambda: self._end(status))
        if wait:
            self.writer.flush()

    def _end(self, status: str) -> None:
        if self.run_id is not None:  # None: never created, nothing to end (already reported)
            self.writer.client().set_terminated(self.run_id, status=status)
        self.writer._opened(self, False)  # not reached if that raised: the run is named at exit


_WRITERS: weakref.WeakSet[MlflowWriter] = weakref.WeakSet()


@atexit.register
def _end_runs_at_exit() -> None:
    """Daemon threads still run while atexit handlers do: give the writers EXIT_WAIT_S, all together."""
    deadline = time.monotonic() + EXIT_WAIT_S
    for writer in list(_WRITERS):
        writer.end_at_exit(deadline - time.monotonic())


def writer_from_env(timeout_s: float = DEFAULT_TIMEOUT_S) -> MlflowWriter | None:
    """A writer when MLFLOW_TRACKING_URI is set and mlflow is importable; else None (one log line says why)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if not uri:
        log.info("MLFLOW_TRACKING_URI not set: fold figures go to Prometheus only")
        return None
    try:
        import mlflow.tracking  # noqa: F401
    except ImportError as e:
        log.warning("MLFLOW_TRACKING_URI is set but mlflow is not installed (%s): no MLflow runs", e)
        return None
    return MlflowWriter(uri, timeout_s)
