"""What an RL trainer imports to feed the training cockpit (the contract is
docs/contracts/trainers.md). No Dagster, no foxhunt_obs: prometheus_client and the exporter's NVML backend;
mlflow and opentelemetry only when installed and configured.

    from foxhunt_gpu_exporter import training

    telemetry = training.start()                       # :9094/metrics, GPU poller every 5 s
    with telemetry.fold("ppo-policy", fold=0, epochs=10) as fold:
        for epoch in range(10):
            fold.epoch_started(epoch)
            for _ in range(batches):
                with fold.timed_batch() as t:
                    batch = next(loader); t.loaded(); step(batch)
            fold.epoch_ended(loss)
            fold.evaluated(val_loss, accuracy=acc, f1=f1, precision=p, recall=r)
            with fold.checkpoint(path):
                save(path)

Modules: contract (the metrics as data), registry (registration and the endpoint), fold (the rules),
gpu (the in-process poller), mlflow_runs (one MLflow run per fold), spans (one span per fold), redact
(secrets out of what leaves: logs, span events).
"""

from __future__ import annotations

import logging
import os
import threading

from prometheus_client.registry import CollectorRegistry

from ..backend import Backend
from ..poller import Poller
from .contract import CONTRACT, MetricSpec
from .fold import Fold
from .gpu import DEFAULT_INTERVAL_S, start_gpu_poller
from .mlflow_runs import FoldRun, MlflowWriter, pod_tags, writer_from_env
from .registry import DEFAULT_PORT, TrainingMetrics
from .spans import tracer_from_env

__all__ = [
    "CONTRACT",
    "DEFAULT_PORT",
    "Fold",
    "MetricSpec",
    "Telemetry",
    "TrainingMetrics",
    "start",
    "telemetry",
]

log = logging.getLogger(__name__)
FROM_ENV = object()  # MLflow and tracing: decided from the environment at the first fold


class Telemetry:
    """The contract's metrics, their endpoint, the GPU poller, and MLflow/tracing for folds.

    One per process is the rule (`telemetry()`/`start()`); tests build their own on their own registry."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        mlflow: MlflowWriter | None | object = FROM_ENV,
        tracer: object = FROM_ENV,
        experiment: str | None = None,
    ):
        self.metrics = TrainingMetrics(registry)
        self.gpu_poller: Poller | None = None
        self._gpu_asked = False
        self._mlflow, self._tracer, self.experiment = mlflow, tracer, experiment
        self._lock = threading.Lock()

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    def serve(self, port: int = DEFAULT_PORT, host: str = ""):
        return self.metrics.serve(port, host)

    def start_gpu_poller(
        self,
        interval: float = DEFAULT_INTERVAL_S,
        backend: Backend | None = None,
        hostname: str | None = None,
    ) -> Poller | None:
        """Once per Telemetry: later calls return the first answer (and say nothing more)."""
        with self._lock:
            if not self._gpu_asked:
                self._gpu_asked = True
                self.gpu_poller = start_gpu_poller(self.registry, interval, backend, hostname)
            return self.gpu_poller

    def fold(
        self,
        model: str,
        fold: int | str,
        epochs: int,
        *,
        workers: int = 1,
        rank: int = 0,
        params: dict | None = None,
    ) -> Fold:
        """A fold to start (`with telemetry.fold(...) as f:`); rank 0 alone logs to MLflow."""
        writer, tracer = self._resolve()
        run = None
        if writer is not None and rank == 0:
            experiment = self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or model
            tags = {**pod_tags(), "model": model, "fold": str(fold)}
            if self.experiment:
                tags["experiment"] = self.experiment
            all_params = {
                "model": model,
                "fold": str(fold),
                "epochs": epochs,
                "workers": workers,
                **(params or {}),
            }
            run = FoldRun(writer, experiment, f"{model}-fold-{fold}", tags, all_params)
        return Fold(self.metrics, model, fold, epochs, workers=workers, rank=rank, run=run, tracer=tracer)

    def _resolve(self):
        with self._lock:
            if self._mlflow is FROM_ENV:
                self._mlflow = writer_from_env()
            if self._tracer is FROM_ENV:
                self._tracer = tracer_from_env()
            return self._mlflow, self._tracer

    def stop(self) -> None:
        """Stop serving and polling (tests; a trainer's threads are daemons and end with it)."""
        self.metrics.stop()
        if self.gpu_poller is not None:
            self.gpu_poller.stop()


_process: Telemetry | None = None
_process_lock = threading.Lock()


def telemetry() -> Telemetry:
    """The process's Telemetry: created on first use, the same one afterwards."""
    global _process
    with _process_lock:
        if _process is None:
            _process = Telemetry()
        return _process


def start(
    port: int | None = DEFAULT_PORT,
    *,
    host: str = "",
    gpu_interval: float | None = DEFAULT_INTERVAL_S,
    gpu_backend: Backend | None = None,
    experiment: str | None = None,
) -> Telemetry:
    """The process's Telemetry, serving on `port` (None: not served) with the GPU poller every
    `gpu_interval` s (None: no poller; in Kubernetes it needs NODE_NAME, else none); `experiment` names
    the MLflow experiment and `experiment` tag of its folds' runs. Safe to call again: nothing is
    registered or started twice."""
    t = telemetry()
    if experiment:
        t.experiment = experiment
    if port is not None:
        t.serve(port, host)
    if gpu_interval:
        t.start_gpu_poller(gpu_interval, gpu_backend)
    return t
