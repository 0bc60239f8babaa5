"""The training metric contract (docs/contracts/trainers.md), as data.

One row per metric a training process exposes: name as exposed (counters end in _total), type, help,
histogram buckets, and whether it is a fold-level figure (rank 0 only when several processes share a
fold, since panels take `max by (model, fold)`) or a per-process one (panels `sum by (model, fold)`).
exporter/tests/test_training_contract.py parses the page's table and holds this one to it.
"""

from __future__ import annotations

from dataclasses import dataclass

LABELS = ("model", "fold")  # and nothing else: namespace, pod, job, instance come from the scrape

ITERATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DATA_LOAD_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class MetricSpec:
    name: str  # as exposed: a counter's name ends in _total
    kind: str  # "gauge" | "counter" | "histogram"
    help: str
    fold_level: bool  # set by rank 0 only (a figure of the fold, not of this process)
    buckets: tuple[float, ...] = ()

    @property
    def key(self) -> str:
        """The short name (MLflow key, attribute name): the metric name without prefix or _total."""
        short = self.name.removeprefix("foxhunt_training_")
        return short.removesuffix("_total") if self.kind == "counter" else short


CONTRACT = (
    MetricSpec("foxhunt_training_active_workers", "gauge",
               "Training workers (ranks) this process runs for the fold right now; 0 once it ends.", False),
    MetricSpec("foxhunt_training_fold_progress_ratio", "gauge",
               "Share of the fold's planned epochs completed, 0-1.", True),
    MetricSpec("foxhunt_training_epoch", "gauge", "Current epoch number (0-based).", True),
    MetricSpec("foxhunt_training_epoch_loss", "gauge", "Mean training loss over the last completed epoch.", True),
    MetricSpec("foxhunt_training_validation_loss", "gauge",
               "Loss on the validation split at the last evaluation.", True),
    MetricSpec("foxhunt_training_batches_total", "counter", "Training batches processed.", False),
    MetricSpec("foxhunt_training_iteration_seconds", "histogram",
               "Wall time of one training iteration, batch request to end of the optimizer step.", False,
               ITERATION_BUCKETS),
    MetricSpec("foxhunt_training_data_load_seconds", "histogram", "Time an iteration waited for its batch.",
               False, DATA_LOAD_BUCKETS),
    MetricSpec("foxhunt_training_checkpoint_saves_total", "counter", "Checkpoints written successfully.", False),
    MetricSpec("foxhunt_training_checkpoint_failures_total", "counter",
               "Checkpoint saves that raised or were not confirmed on storage.", False),
    MetricSpec("foxhunt_training_checkpoint_duration_seconds", "gauge",
               "Wall time of the last checkpoint save (successful or not).", True),
    MetricSpec("foxhunt_training_checkpoint_size_bytes", "gauge", "Size on storage of the last checkpoint written.",
               True),
    MetricSpec("foxhunt_training_eval_accuracy", "gauge", "Accuracy at the last evaluation, 0-1.", True),
    MetricSpec("foxhunt_training_eval_f1", "gauge", "F1 score at the last evaluation, 0-1.", True),
    MetricSpec("foxhunt_training_eval_precision", "gauge", "Precision at the last evaluation, 0-1.", True),
    MetricSpec("foxhunt_training_eval_recall", "gauge", "Recall at the last evaluation, 0-1.", True),
    MetricSpec("foxhunt_training_nan_detected_total", "counter", "Steps whose loss or gradients were NaN/Inf.",
               False),
    MetricSpec("foxhunt_training_gradient_explosions_total", "counter",
               "Steps whose global gradient norm exceeded the explosion threshold (before clipping).", False),
    MetricSpec("foxhunt_training_feature_errors_total", "counter",
               "Samples rejected or defaulted by feature extraction.", False),
)  # fmt: skip

BY_KEY = {spec.key: spec for spec in CONTRACT}
