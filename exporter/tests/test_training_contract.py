"""The trainers' metrics library against the training metric contract in docs/contracts/trainers.md (parsed,
not copied), and the fold rules it states: every series from the fold's start, active workers 0 and progress
1 at its end, series kept; registration that never clashes; bad figures refused with a clear error."""

from __future__ import annotations

import math
import re
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from exporter_helpers import samples
from foxhunt_gpu_exporter import training
from foxhunt_gpu_exporter.training.contract import CONTRACT
from prometheus_client.parser import text_string_to_metric_families

README = Path(__file__).resolve().parents[2] / "docs" / "contracts" / "trainers.md"
ROW = re.compile(r"^\| `(foxhunt_training_\w+)` \| (\w+) \| ([\w, ]+) \| (.*) \|$", re.M)


@pytest.fixture(scope="module")
def documented() -> dict[str, dict]:
    """name -> {kind, labels, buckets} from the contract table (docs/contracts/trainers.md)."""
    if not README.exists():
        pytest.skip(f"{README} not here (the exporter outside its repository)")
    rows = {}
    for name, kind, labels, meaning in ROW.findall(README.read_text()):
        buckets = re.search(r"buckets ([\d., ]+)", meaning)
        rows[name] = {
            "kind": kind,
            "labels": {label.strip() for label in labels.split(",")},
            "buckets": tuple(float(b) for b in buckets.group(1).strip(" ,").split(", ")) if buckets else (),
        }
    assert len(rows) >= 19, "the contract table did not parse"
    return rows


def telemetry() -> training.Telemetry:
    return training.Telemetry(mlflow=None, tracer=None)


def exposition(t: training.Telemetry) -> str:
    return t.metrics.render()[0].decode()


def values(text: str, name: str, **match: str) -> list[float]:
    return [s.value for s in samples(text, name) if all(s.labels.get(k) == v for k, v in match.items())]


def test_library_table_is_the_documented_contract(documented):
    assert {s.name: s.kind for s in CONTRACT} == {n: row["kind"] for n, row in documented.items()}
    for spec in CONTRACT:
        assert spec.buckets == documented[spec.name]["buckets"], spec.name


def test_a_started_fold_exposes_every_contract_metric_with_its_type_labels_and_buckets(documented):
    t = telemetry()
    t.fold("ppo-policy", 0, epochs=3).start()
    families = {f.name: f for f in text_string_to_metric_families(exposition(t))}
    for name, row in documented.items():
        family = families[name.removesuffix("_total") if row["kind"] == "counter" else name]
        assert family.type == row["kind"], name
        series = [s for s in family.samples if not s.name.endswith("_created")]
        assert series, f"{name}: no series at fold start"
        for s in series:
            assert set(s.labels) - {"le"} == row["labels"] == {"model", "fold"}, (name, s.labels)
            assert (s.labels["model"], s.labels["fold"]) == ("ppo-policy", "0")
        if row["kind"] == "histogram":
            bounds = [float(s.labels["le"]) for s in series if s.name == f"{name}_bucket"]
            assert bounds == [*row["buckets"], math.inf], name


def test_fold_start_sets_every_series_and_fold_end_keeps_them_with_workers_0_and_progress_1():
    t = telemetry()
    fold = t.fold("ppo-policy", 3, epochs=4, workers=2).start()
    text = exposition(t)
    one = {"model": "ppo-policy", "fold": "3"}
    assert values(text, "foxhunt_training_active_workers", **one) == [2.0]
    assert values(text, "foxhunt_training_fold_progress_ratio", **one) == [0.0]
    assert values(text, "foxhunt_training_epoch", **one) == [0.0]
    for counter in ("batches", "checkpoint_saves", "checkpoint_failures", "nan_detected", "gradient_explosions",
                    "feature_errors"):  # fmt: skip
        assert values(text, f"foxhunt_training_{counter}_total", **one) == [0.0], counter
    assert values(text, "foxhunt_training_iteration_seconds_count", **one) == [0.0]
    # no value yet is NaN, never a plausible 0
    for gauge in ("epoch_loss", "validation_loss", "eval_accuracy", "checkpoint_size_bytes"):
        (v,) = values(text, f"foxhunt_training_{gauge}", **one)
        assert math.isnan(v), gauge

    fold.epoch_started(0)
    fold.batch(0.2, data_load_seconds=0.03)
    fold.batch(0.4)
    fold.epoch_ended(0.9)
    fold.nan_detected()
    fold.gradient_explosion(2)
    fold.feature_errors(5)
    fold.evaluated(1.1, accuracy=0.75, f1=0.5, precision=0.4, recall=2 / 3)
    fold.checkpoint_saved(1.5, size_bytes=4096)
    fold.end()
    text = exposition(t)
    assert values(text, "foxhunt_training_active_workers", **one) == [0.0]
    assert values(text, "foxhunt_training_fold_progress_ratio", **one) == [1.0]
    assert values(text, "foxhunt_training_batches_total", **one) == [2.0]
    assert values(text, "foxhunt_training_iteration_seconds_sum", **one) == [pytest.approx(0.6)]
    assert values(text, "foxhunt_training_iteration_seconds_bucket", le="0.25", **one) == [1.0]
    assert values(text, "foxhunt_training_data_load_seconds_count", **one) == [1.0]
    assert values(text, "foxhunt_training_epoch_loss", **one) == [0.9]
    assert values(text, "foxhunt_training_validation_loss", **one) == [1.1]
    assert values(text, "foxhunt_training_eval_recall", **one) == [pytest.approx(2 / 3)]
    assert values(text, "foxhunt_training_nan_detected_total", **one) == [1.0]
    assert values(text, "foxhunt_training_gradient_explosions_total", **one) == [2.0]
    assert values(text, "foxhunt_training_feature_errors_total", **one) == [5.0]
    assert values(text, "foxhunt_training_checkpoint_saves_total", **one) == [1.0]
    assert values(text, "foxhunt_training_checkpoint_size_bytes", **one) == [4096.0]
    assert values(text, "foxhunt_training_checkpoint_duration_seconds", **one) == [1.5]


def test_a_failed_fold_ends_with_no_workers_and_its_real_progress():
    t = telemetry()
    with pytest.raises(RuntimeError, match="boom"), t.fold("m", 0, epochs=4) as fold:
        fold.epoch_started(0)
        fold.epoch_ended(1.0)
        raise RuntimeError("boom")
    text = exposition(t)
    assert values(text, "foxhunt_training_active_workers", model="m", fold="0") == [0.0]
    assert values(text, "foxhunt_training_fold_progress_ratio", model="m", fold="0") == [0.25]


def test_checkpoint_context_times_the_save_and_counts_a_missing_file_as_a_failure(tmp_path):
    t = telemetry()
    fold = t.fold("m", 0, epochs=1).start()
    with fold.checkpoint(tmp_path / "ok.bin"):
        (tmp_path / "ok.bin").write_bytes(b"x" * 1234)
    with fold.checkpoint(tmp_path / "never-written.bin"):
        pass  # "saved", but nothing is on storage
    with pytest.raises(OSError), fold.checkpoint(tmp_path / "missing" / "c.bin"):
        (tmp_path / "missing" / "c.bin").write_bytes(b"x")
    text = exposition(t)
    assert values(text, "foxhunt_training_checkpoint_saves_total", model="m") == [1.0]
    assert values(text, "foxhunt_training_checkpoint_failures_total", model="m") == [2.0]
    assert values(text, "foxhunt_training_checkpoint_size_bytes", model="m") == [1234.0]


def test_checkpoint_to_a_uri_it_cannot_stat_is_a_save_of_unknown_size():
    t = telemetry()
    fold = t.fold("m", 0, epochs=1).start()
    fold.checkpoint_saved(1.0, size_bytes=4096)  # an earlier save's size must not pass for this one's
    with fold.checkpoint("s3://ckpt-bucket/ppo/fold-0/epoch-3.pt"):
        pass  # uploaded by the trainer's own S3 client: nothing here can confirm it or measure it
    with fold.checkpoint("gs://ckpt-bucket/ppo/epoch-3.pt") as save:
        save.size_bytes = 777  # the block knows the size: kept
    text = exposition(t)
    assert values(text, "foxhunt_training_checkpoint_saves_total", model="m") == [3.0]
    assert values(text, "foxhunt_training_checkpoint_failures_total", model="m") == [0.0]
    assert values(text, "foxhunt_training_checkpoint_size_bytes", model="m") == [777.0]
    with fold.checkpoint("s3://ckpt-bucket/ppo/fold-0/epoch-4.pt"):
        pass
    (size,) = values(exposition(t), "foxhunt_training_checkpoint_size_bytes", model="m")
    assert math.isnan(size)
    (seconds,) = values(exposition(t), "foxhunt_training_checkpoint_duration_seconds", model="m")
    assert 0.0 <= seconds < 1.0  # this save's duration, not the earlier 1.0 s


def test_checkpoint_to_a_directory_is_the_size_of_its_files(tmp_path):
    t = telemetry()
    fold = t.fold("m", 0, epochs=1).start()
    ckpt = tmp_path / "step-100"  # a sharded checkpoint: a directory of files, some in subdirectories
    with fold.checkpoint(ckpt):
        (ckpt / "model").mkdir(parents=True)
        (ckpt / "model" / "shard-0.safetensors").write_bytes(b"x" * 1000)
        (ckpt / "model" / "shard-1.safetensors").write_bytes(b"x" * 200)
        (ckpt / "optimizer.pt").write_bytes(b"x" * 34)
    text = exposition(t)
    assert values(text, "foxhunt_training_checkpoint_size_bytes", model="m") == [1234.0]
    with fold.checkpoint(f"file://{ckpt}"):  # the same, named as a file:// URI
        pass
    assert values(exposition(t), "foxhunt_training_checkpoint_size_bytes", model="m") == [1234.0]
    with fold.checkpoint(tmp_path / "empty"):
        (tmp_path / "empty").mkdir()  # a directory and nothing in it: not saved
    text = exposition(t)
    assert values(text, "foxhunt_training_checkpoint_saves_total", model="m") == [2.0]
    assert values(text, "foxhunt_training_checkpoint_failures_total", model="m") == [1.0]


class PreemptedCounter(Counter):
    """A Counter whose read yields the GIL, as a data-loader thread can be preempted between the read and
    the write of `counts[key] += n` (free-threaded Python has no GIL to make that window rare)."""

    def __getitem__(self, key):
        value = super().__getitem__(key)
        time.sleep(0)
        return value


def test_counts_from_several_threads_are_not_lost():
    fold = telemetry().fold("m", 0, epochs=1).start()
    fold.counts = PreemptedCounter()
    threads, each = 8, 300

    def load():  # what data-loader threads may report
        for _ in range(each):
            fold.batch(0.01)
            fold.feature_errors()

    workers = [threading.Thread(target=load) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert fold.counts["batches"] == fold.counts["feature_errors"] == threads * each


def test_other_ranks_count_their_own_work_but_leave_fold_level_figures_to_rank_0():
    t = telemetry()
    fold = t.fold("m", 1, epochs=2, workers=4, rank=1).start()
    fold.batch(0.1)
    fold.epoch_ended(0.5)
    fold.evaluated(0.7, accuracy=0.9)
    text = exposition(t)
    assert values(text, "foxhunt_training_active_workers", model="m") == [4.0]
    assert values(text, "foxhunt_training_batches_total", model="m") == [1.0]
    for gauge in ("epoch_loss", "validation_loss", "eval_accuracy", "fold_progress_ratio", "epoch"):
        assert values(text, f"foxhunt_training_{gauge}", model="m") == [], gauge


def test_bad_figures_are_refused_naming_the_fold():
    fold = telemetry().fold("ppo-policy", 2, epochs=3).start()
    with pytest.raises(ValueError, match=r"ppo-policy/2: eval_accuracy 85.0 is not a ratio 0-1"):
        fold.evaluated(accuracy=85.0)
    with pytest.raises(ValueError, match=r"ppo-policy/2: epoch 3 is outside its 3 planned epochs"):
        fold.epoch_started(3)
    with pytest.raises(ValueError, match=r"iteration_seconds must be seconds >= 0"):
        fold.batch(-1.0)
    with pytest.raises(ValueError, match=r"epochs must be a whole number"):
        telemetry().fold("m", 0, epochs=0)


def test_registration_never_clashes_and_the_process_has_one_telemetry():
    a, b = telemetry(), telemetry()  # two sets of the same names: separate registries, no "Duplicated"
    a.fold("m", 0, epochs=1).start()
    b.fold("m", 0, epochs=1).start()
    assert training.telemetry() is training.telemetry()


@pytest.mark.servers
def test_served_over_http_once_per_process():
    t = telemetry()
    server = t.serve(0, host="127.0.0.1")
    try:
        assert t.serve(server.port) is server  # again on the same port: the same server
        with pytest.raises(RuntimeError, match=f"already served on port {server.port}"):
            t.serve(server.port + 1)
        t.fold("m", 0, epochs=1).start()
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as r:
            body = r.read().decode()
        assert values(body, "foxhunt_training_active_workers", model="m", fold="0") == [1.0]
    finally:
        t.stop()
