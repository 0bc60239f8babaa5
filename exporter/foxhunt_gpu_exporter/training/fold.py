"""One fold of training as the contract sees it: what a trainer calls, and the rules it follows.

Rules (docs/contracts/trainers.md, "Rules for implementers"): every series of the fold exists from its start
(gauges at their first value, counters at 0), so rate()/increase() see the first event and panels show the
fold at once; at its end active_workers is 0 and, on success, progress is 1; series stay until the process
exits. Gauges with no value yet (a loss before the first epoch ends, a checkpoint before the first save)
start at NaN, not 0: a missing figure never reads as a plausible one. With several processes on one fold,
only rank 0 sets the fold-level gauges and logs to MLflow; every rank counts its own batches and errors.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from .contract import CONTRACT
from .mlflow_runs import FoldRun
from .redact import scrub
from .registry import TrainingMetrics
from .spans import SPAN_NAME

RATIOS = ("eval_accuracy", "eval_f1", "eval_precision", "eval_recall")
COUNTED = ("batches", "checkpoint_saves", "checkpoint_failures", "nan_detected", "gradient_explosions",
           "feature_errors")  # fmt: skip
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # s3://, gs://, hdfs://: storage it cannot stat


@dataclass
class BatchTimer:
    """Handed out by Fold.timed_batch: call loaded() when the batch has arrived."""

    started: float
    loaded_at: float | None = None

    def loaded(self) -> None:
        self.loaded_at = time.perf_counter()


@dataclass
class CheckpointSave:
    """Handed out by Fold.checkpoint: set size_bytes if no path was given."""

    size_bytes: int | None = None


def run_status(error: BaseException | None) -> str:
    """The MLflow run status a fold ends with."""
    if error is None:
        return "FINISHED"
    return "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"


class Fold:
    """Use as a context manager (the fold ends, failed or not, when the block does), or call start/end."""

    def __init__(
        self,
        metrics: TrainingMetrics,
        model: str,
        fold: int | str,
        epochs: int,
        *,
        workers: int = 1,
        rank: int = 0,
        run: FoldRun | None = None,
        tracer=None,
    ):
        if not model or not isinstance(model, str):
            raise ValueError(f"training fold: model must be a non-empty name, got {model!r}")
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
            raise ValueError(
                f"training fold {model}/{fold}: epochs must be a whole number >= 1, got {epochs!r}"
            )
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(
                f"training fold {model}/{fold}: workers must be a whole number >= 1, got {workers!r}"
            )
        self.metrics, self.model, self.fold, self.epochs = metrics, model, str(fold), epochs
        self.workers, self.rank, self.run, self.tracer = workers, rank, run, tracer
        self.epoch = 0
        self.epochs_completed = 0
        self.last: dict[str, float] = {}  # fold-level figures as last set (span attributes at the end)
        self.counts: Counter[str] = Counter()  # this fold's events in this process (MLflow at the end)
        self.started = self.ended = False
        self._lock = threading.Lock()  # counts: data-loader threads may count batches and errors too
        self._span = None
        self._token = None  # the span made current by `with` (never across start()/end() calls)

    # -- life cycle ---------------------------------------------------------------------------------------

    def __enter__(self) -> Fold:
        """Start the fold; within the `with` block its span is the current one, so the trainer's own spans
        nest under it (a `with` enters and leaves on one thread: the context is detached where attached)."""
        self.start()
        if self._span is not None and self._token is None:
            from opentelemetry import context, trace

            self._token = context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(self, kind, error, tb) -> None:
        try:
            self.end(error)
        finally:
            if self._token is not None:
                from opentelemetry import context

                context.detach(self._token)
                self._token = None

    def start(self) -> Fold:
        """Start the fold (its series, its span). The span is not made current here: start() and end() may
        run on different threads, and a context attached on one cannot be detached on another."""
        if self.started:
            return self
        self.started = True
        for spec in CONTRACT:
            if spec.fold_level and not self.leader:
                continue
            series = self._series(spec.key)  # creating a counter's or histogram's series exports it at 0
            if spec.key == "active_workers":
                series.set(self.workers)
            elif spec.kind == "gauge":
                series.set(0.0 if spec.key in ("fold_progress_ratio", "epoch") else math.nan)
        if self.tracer is not None:
            self._span = self.tracer.start_span(SPAN_NAME, attributes={
                "training.model": self.model, "training.fold": self.fold, "training.epochs": self.epochs,
                "training.workers": self.workers, "training.rank": self.rank,
            })  # fmt: skip
        return self

    def end(self, error: BaseException | None = None) -> None:
        """The fold is over: active_workers 0, progress 1 unless it failed, the MLflow run and span closed."""
        if self.ended or not self.started:
            return
        self.ended = True
        self._series("active_workers").set(0)
        if error is None and self.leader:
            self._set("fold_progress_ratio", 1.0)
        if self.run is not None and self.leader:
            for key in COUNTED:
                self.run.log(key, float(self.counts[key]), self.epoch)
            self.run.end(run_status(error))
        if self._span is not None:
            self._end_span(error)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    # -- what a trainer records ---------------------------------------------------------------------------

    def epoch_started(self, epoch: int) -> None:
        if not 0 <= epoch < self.epochs:
            raise ValueError(
                f"training fold {self.model}/{self.fold}: epoch {epoch} is outside its {self.epochs} planned "
                f"epochs (0..{self.epochs - 1})"
            )
        self.epoch = epoch
        self._set("epoch", epoch)

    def epoch_ended(self, loss: float) -> None:
        """The epoch's mean training loss (NaN is recorded as NaN; count the step with nan_detected)."""
        self.epochs_completed = max(self.epochs_completed, self.epoch + 1)
        self._set("epoch_loss", loss, log=True)
        self._set("fold_progress_ratio", self.epochs_completed / self.epochs, log=True)

    def batch(self, seconds: float, data_load_seconds: float | None = None) -> None:
        """One training iteration: `seconds` from asking for the batch to the end of the optimizer step."""
        self._check_duration("iteration_seconds", seconds)
        self._series("batches").inc()
        with self._lock:
            self.counts["batches"] += 1
        self._series("iteration_seconds").observe(seconds)
        if data_load_seconds is not None:
            self._check_duration("data_load_seconds", data_load_seconds)
            self._series("data_load_seconds").observe(data_load_seconds)

    @contextmanager
    def timed_batch(self):
        """Times one iteration; call `.loaded()` on what it yields when the batch has arrived. An iteration
        that raises is not counted."""
        timer = BatchTimer(time.perf_counter())
        yield timer
        end = time.perf_counter()
        load = None if timer.loaded_at is None else timer.loaded_at - timer.started
        self.batch(end - timer.started, load)

    def evaluated(
        self,
        validation_loss: float | None = None,
        *,
        accuracy: float | None = None,
        f1: float | None = None,
        precision: float | None = None,
        recall: float | None = None,
    ) -> None:
        """An evaluation's figures; the scores are ratios 0-1, never percent."""
        scores = {
            "eval_accuracy": accuracy,
            "eval_f1": f1,
            "eval_precision": precision,
            "eval_recall": recall,
        }
        for key, value in scores.items():
            if value is not None and not (math.isnan(value) or 0.0 <= value <= 1.0):
                raise ValueError(
                    f"training fold {self.model}/{self.fold}: {key} {value!r} is not a ratio 0-1 (percent?)"
                )
        if validation_loss is not None:
            self._set("validation_loss", validation_loss, log=True)
        for key, value in scores.items():
            if value is not None:
                self._set(key, value, log=True)

    def checkpoint_saved(self, seconds: float, size_bytes: int | None = None) -> None:
        self._check_duration("checkpoint_duration_seconds", seconds)
        if size_bytes is not None and size_bytes < 0:
            raise ValueError(f"training fold {self.model}/{self.fold}: checkpoint size {size_bytes} < 0")
        self._count("checkpoint_saves")
        self._set("checkpoint_duration_seconds", seconds, log=True)
        if size_bytes is not None:
            self._set("checkpoint_size_bytes", float(size_bytes), log=True)
        else:  # this save's size is unknown: NaN, not the previous save's size (nothing logged to MLflow)
            self._set("checkpoint_size_bytes", math.nan)

    def checkpoint_failed(self, seconds: float) -> None:
        self._check_duration("checkpoint_duration_seconds", seconds)
        self._count("checkpoint_failures")
        self._set("checkpoint_duration_seconds", seconds, log=True)

    @contextmanager
    def checkpoint(self, path: str | Path | None = None):
        """Times a checkpoint save. It fails if the block raises (re-raised) or, given a local `path`, if
        nothing is there afterwards: no file, or a directory holding no file (not confirmed on storage). Its
        size is the file's, or the sum of the directory's files, or what the block sets. A URI this library
        cannot stat (`s3://...`) is a save of unknown size (NaN) unless the block sets it."""
        save, started = CheckpointSave(), time.perf_counter()
        try:
            yield save
        except BaseException:
            self.checkpoint_failed(time.perf_counter() - started)
            raise
        seconds = time.perf_counter() - started
        local = None if path is None else local_path(path)
        if local is not None:
            size = stored_size(local)
            if size is None:
                self.checkpoint_failed(seconds)
                return
            save.size_bytes = size
        self.checkpoint_saved(seconds, save.size_bytes)

    def nan_detected(self, steps: int = 1) -> None:
        self._count("nan_detected", steps)

    def gradient_explosion(self, steps: int = 1) -> None:
        self._count("gradient_explosions", steps)

    def feature_errors(self, samples: int = 1) -> None:
        self._count("feature_errors", samples)

    # -- plumbing -----------------------------------------------------------------------------------------

    def _series(self, key: str):
        return self.metrics.child(key, self.model, self.fold)

    def _count(self, key: str, n: int = 1) -> None:
        if n < 0:
            raise ValueError(f"training fold {self.model}/{self.fold}: {key} cannot go down ({n})")
        self._series(key).inc(n)
        with self._lock:
            self.counts[key] += n

    def _set(self, key: str, value: float, log: bool = False) -> None:
        if not self.leader:  # fold-level figures come from rank 0 only
            return
        value = float(value)
        self._series(key).set(value)
        self.last[key] = value
        if log and self.run is not None:
            self.run.log(key, value, self.epoch)

    def _check_duration(self, key: str, seconds: float) -> None:
        if not seconds >= 0:  # also refuses NaN
            raise ValueError(
                f"training fold {self.model}/{self.fold}: {key} must be seconds >= 0, got {seconds!r}"
            )

    def _end_span(self, error: BaseException | None) -> None:
        from opentelemetry.trace import Status, StatusCode

        span = self._span
        span.set_attribute("training.epochs_completed", self.epochs_completed)
        span.set_attribute("training.batches", self.counts["batches"])
        span.set_attribute("training.nan_detected", self.counts["nan_detected"])
        for key in ("epoch_loss", "validation_loss"):
            if key in self.last:
                span.set_attribute(f"training.{key}", self.last[key])
        if error is not None:
            # Not span.record_exception: its message and stack trace would carry whatever the error holds
            # (a presigned checkpoint URL, a tracking URI with its password). The semantic conventions'
            # exception event (opentelemetry.io/docs/specs/semconv/exceptions/exceptions-spans/) with its
            # type and the message scrubbed; no stack trace (only recommended there).
            message = scrub(str(error))
            event = {"exception.type": exception_type(error), "exception.message": message}
            span.add_event("exception", event)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {message}"))
        span.end()


def exception_type(error: BaseException) -> str:
    """The error's class as OpenTelemetry's SDK names it: module-qualified, except for builtins."""
    kind = type(error)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def local_path(path: str | Path) -> Path | None:
    """The local path a checkpoint target names (a `file://` URI's too); None for a URI of other storage."""
    if not isinstance(path, str):  # a Path (any os.PathLike) is local
        return Path(path)
    if path.startswith("file://"):
        return Path(unquote(urlsplit(path).path))
    return None if _URI.match(path) else Path(path)


def stored_size(path: Path) -> int | None:
    """Bytes at `path`: a file's size, or the sum of the files under a directory; None if nothing is there
    (no such path, or a directory without a file)."""
    try:
        if not path.is_dir():
            return path.stat().st_size
    except OSError:
        return None
    total, files = 0, 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:  # removed while we walked, or a dangling link: not part of the checkpoint
                continue
            files += 1
    return total if files else None
