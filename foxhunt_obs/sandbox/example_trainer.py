"""A tiny CPU-only trainer that feeds the training cockpit the way a real one would: K folds of a logistic
regression on synthetic data (numpy), reporting through foxhunt_gpu_exporter.training and nothing else.

    python -m foxhunt_obs.sandbox.example_trainer --port 9094 --folds 3 --epochs 4

Each fold meets, on purpose, what the cockpit's error and checkpoint rows are for: one exploding gradient
(epoch 0, batch 1: a batch scaled up 10^4; clipped), one NaN loss (epoch 1, batch 0: a poisoned batch;
the step is skipped), raw rows with a missing feature (every 50th; defaulted to 0 and counted as feature
errors) and a checkpoint per epoch (`--checkpoint-failure-fold F`: fold F's first save goes nowhere and
fails). With `--fake-gpus N` the GPU poller reads N fake GPUs (the exporter's FakeBackend). After the
rounds it keeps serving until SIGTERM (the last scrape must see the end); `--summary PATH` writes what it
did as JSON. The sandbox runs it (`foxhunt-obs sandbox up`), scraped by its Prometheus.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

log = logging.getLogger("example_trainer")

FEATURES = 8
EXPLOSION_NORM = 100.0  # global gradient norm above which a step counts as an explosion (and is clipped)
MISSING_EVERY = 50  # every 50th raw row misses a feature


def make_data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES))
    y = (x @ rng.normal(size=FEATURES) + 0.5 * rng.normal(size=rows) > 0).astype(float)
    x[::MISSING_EVERY, 3] = np.nan  # what feature extraction has to default
    return x, y


def extract(raw: np.ndarray) -> tuple[np.ndarray, int]:
    """Features of raw rows: a missing value becomes 0; returns (features, rows defaulted)."""
    bad = np.isnan(raw).any(axis=1)
    return np.where(np.isnan(raw), 0.0, raw), int(bad.sum())


def log_loss(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    with np.errstate(all="ignore"):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        p_safe = np.clip(p, 1e-12, 1 - 1e-12)
        loss = float(-np.mean(y * np.log(p_safe) + (1 - y) * np.log(1 - p_safe)))
        if not np.isfinite(x).all():
            loss = math.nan
        return loss, x.T @ (p - y) / len(y)


def scores(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    predicted = (x @ w > 0).astype(float)
    tp = float(((predicted == 1) & (y == 1)).sum())
    precision = tp / predicted.sum() if predicted.sum() else math.nan  # undefined, not 0
    recall = tp / y.sum() if y.sum() else math.nan
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else math.nan
    return {"accuracy": float((predicted == y).mean()), "precision": precision, "recall": recall, "f1": f1}


def train_fold(telemetry, args, fold: int, x: np.ndarray, y: np.ndarray, done: Counter) -> None:
    n = len(y)
    val = np.zeros(n, bool)
    val[fold * n // args.folds : (fold + 1) * n // args.folds] = True
    train_x, train_y, val_x, val_y = x[~val], y[~val], x[val], y[val]
    val_features, _ = extract(val_x)
    w = np.zeros(FEATURES)
    with telemetry.fold(args.model, fold, epochs=args.epochs, params={"lr": args.lr}) as f:
        for epoch in range(args.epochs):
            f.epoch_started(epoch)
            losses = []
            for b in range(args.batches):
                with f.timed_batch() as timer:
                    rows = slice(b * args.batch_size, (b + 1) * args.batch_size)
                    features, defaulted = extract(train_x[rows])
                    time.sleep(args.load_seconds)  # the data loader's wait
                    timer.loaded()
                    if defaulted:
                        f.feature_errors(defaulted)
                        done["feature_errors"] += defaulted
                    if (epoch, b) == (1, 0):
                        with np.errstate(invalid="ignore"):
                            features = features * np.inf  # a poisoned batch
                    elif (epoch, b) == (0, 1):
                        features = features * 1e4  # an exploding one
                    loss, grad = log_loss(w, features, train_y[rows])
                    if not math.isfinite(loss) or not np.isfinite(grad).all():
                        f.nan_detected()  # skip the step
                        done["nan_detected"] += 1
                    else:
                        norm = float(np.linalg.norm(grad))
                        if norm > EXPLOSION_NORM:
                            f.gradient_explosion()
                            done["gradient_explosions"] += 1
                            grad = grad * (EXPLOSION_NORM / norm)  # clipped
                        w -= args.lr * grad
                        losses.append(loss)
                    time.sleep(args.step_seconds)  # the optimizer step of a real model
                done["batches"] += 1
            f.epoch_ended(float(np.mean(losses)) if losses else math.nan)
            val_loss, _ = log_loss(w, val_features, val_y)
            f.evaluated(val_loss, **scores(w, val_features, val_y))
            target = Path(args.checkpoint_dir) / f"{args.model}-fold{fold}-epoch{epoch}.npy"
            if fold == args.checkpoint_failure_fold and epoch == 0:
                target = Path(args.checkpoint_dir) / "missing-dir" / target.name  # the save raises
            try:
                with f.checkpoint(target):
                    np.save(target, w)
                done["checkpoint_saves"] += 1
            except OSError as e:
                log.warning("checkpoint %s failed: %s; training goes on", target, e)
                done["checkpoint_failures"] += 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m foxhunt_obs.sandbox.example_trainer", description=__doc__.split("\n")[0]
    )
    p.add_argument("--port", type=int, default=9094, help="metrics endpoint port (0: a free one, logged)")
    p.add_argument("--host", default="", help="address to listen on (default: every IPv4 address)")
    p.add_argument("--model", default="toy-logreg")
    p.add_argument("--folds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batches", type=int, default=10, help="batches per epoch")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument(
        "--step-seconds", type=float, default=0.05, help="sleep standing in for the optimizer step"
    )
    p.add_argument("--load-seconds", type=float, default=0.005, help="sleep standing in for the data loader")
    p.add_argument("--rounds", type=int, default=1, help="times to run every fold (0: until stopped)")
    p.add_argument("--checkpoint-dir", default=None, help="default: a temporary directory, removed at exit")
    p.add_argument("--checkpoint-failure-fold", type=int, default=-1)
    p.add_argument("--fake-gpus", type=int, default=0, help="poll N fake GPUs instead of NVML")
    p.add_argument("--gpu-interval", type=float, default=5.0, help="GPU poll interval, s (0: no poller)")
    p.add_argument("--summary", default=None, help="write what was done as JSON to this file")
    p.add_argument(
        "--exit-when-done", action="store_true", help="exit after the rounds instead of serving on"
    )
    args = p.parse_args(argv)
    if args.folds < 2 or args.epochs < 2 or args.batches < 2:
        p.error("--folds, --epochs and --batches must each be at least 2 (the scenario needs them)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from foxhunt_gpu_exporter import training
    from foxhunt_gpu_exporter.fake_backend import FakeBackend

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    backend = None
    if args.fake_gpus:
        backend = FakeBackend(
            {"gpus": args.fake_gpus, "model": "NVIDIA H100 80GB HBM3", "hostname": "sandbox-trainer-node"}
        )
    telemetry = training.start(
        args.port, host=args.host, gpu_interval=args.gpu_interval or None, gpu_backend=backend
    )
    own_dir = args.checkpoint_dir is None
    args.checkpoint_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="example-trainer-")
    x, y = make_data(args.folds * 2 * args.batches * args.batch_size, seed=7)
    done: Counter = Counter()
    try:
        rounds = 0
        while not stop.is_set() and (args.rounds == 0 or rounds < args.rounds):
            for fold in range(args.folds):
                if stop.is_set():
                    break
                train_fold(telemetry, args, fold, x, y, done)
                done["folds"] += 1
            rounds += 1
        if args.summary:
            Path(args.summary).write_text(json.dumps(dict(done), indent=2) + "\n")
        log.info("done: %s", dict(done))
        if not args.exit_when_done:
            stop.wait()
    finally:
        if own_dir:
            shutil.rmtree(args.checkpoint_dir, ignore_errors=True)
    return 0


# ---- the sandbox's trainer process ----

SANDBOX_POD = {"namespace": "sandbox", "pod": "sandbox-trainer", "container": "trainer"}


def start_example_trainer(port: int, workdir: Path, *extra: str, timeout_s: float = 30.0) -> subprocess.Popen:
    """The example trainer in its own process group on 127.0.0.1:port, serving when this returns."""
    from foxhunt_obs.sandbox.servers.local_server import wait_serving

    cmd = [sys.executable, "-m", "foxhunt_obs.sandbox.example_trainer", "--host", "127.0.0.1", "--port", str(port),
           *extra]  # fmt: skip
    log_path = Path(workdir) / "example_trainer.log"
    with log_path.open("ab") as out:
        process = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    return wait_serving(process, port, timeout_s, "example trainer", log_path)


if __name__ == "__main__":
    sys.exit(main())
