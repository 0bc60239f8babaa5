"""Fold-level figures to a real `mlflow server`, one run per fold, tagged so that foxhunt_obs's batch side
(its MLflow source and sync) attributes the run to the pod; MLflow down never stops training."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from foxhunt_gpu_exporter import training
from foxhunt_gpu_exporter.training.mlflow_runs import MlflowWriter, redact_uri

mlflow_server = pytest.importorskip("foxhunt_obs.sandbox.servers.mlflow_server")  # the repo's test stack
MlflowClient = pytest.importorskip("mlflow.tracking").MlflowClient

LOSSES = [0.9, 0.6, 0.45]


@pytest.fixture(scope="module")
def mlflow_url(tmp_path_factory):
    work = tmp_path_factory.mktemp("training-mlflow")
    with mlflow_server.MlflowServer(work / "store", workdir=work) as server:
        yield server.url


def train(t: training.Telemetry, fold: int, fail: bool = False) -> None:
    with t.fold("ppo-policy", fold, epochs=len(LOSSES), params={"lr": 0.01}) as f:
        for epoch, loss in enumerate(LOSSES):
            f.epoch_started(epoch)
            f.batch(0.1)
            f.batch(0.1)
            f.epoch_ended(loss + fold)
            f.evaluated(loss + 0.1, accuracy=0.5 + epoch / 10, f1=0.4, precision=0.5, recall=1 / 3)
            if fail and epoch == 1:
                raise RuntimeError("diverged")
        f.nan_detected()
        f.checkpoint_saved(2.0, size_bytes=1 << 20)


@pytest.mark.servers
def test_each_fold_is_an_mlflow_run_the_batch_side_attributes_to_the_pod(mlflow_url, monkeypatch):
    from foxhunt_obs.lib.ingest.mlflow_sync import snapshot_row
    from foxhunt_obs.lib.sources.mlflow import MlflowSource

    monkeypatch.setenv("POD_NAME", "training-ppo-policy-7x2k")
    monkeypatch.setenv("POD_NAMESPACE", "training")
    t = training.Telemetry(mlflow=MlflowWriter(mlflow_url), tracer=None, experiment="rl-ppo")
    train(t, 0)
    with pytest.raises(RuntimeError, match="diverged"):
        train(t, 1, fail=True)

    source = MlflowSource(mlflow_url, experiments=["rl-ppo"])
    runs = {r.run_name: r for r in source.runs()}
    assert set(runs) == {"ppo-policy-fold-0", "ppo-policy-fold-1"}
    ok, failed = runs["ppo-policy-fold-0"], runs["ppo-policy-fold-1"]
    assert (ok.status, failed.status) == ("FINISHED", "FAILED")
    row = snapshot_row(ok, "FINISHED", 0, ok.end_time)
    assert (row["pod"], row["namespace"], row["experiment"]) == (
        "training-ppo-policy-7x2k",
        "training",
        "rl-ppo",
    )
    assert ok.tags["model"] == "ppo-policy" and ok.tags["fold"] == "0" and failed.tags["fold"] == "1"
    assert ok.params == {"model": "ppo-policy", "fold": "0", "epochs": "3", "workers": "1", "lr": "0.01"}

    history = source.histories([ok]).to_pylist()
    by_key: dict[str, list] = {}
    for point in history:
        by_key.setdefault(point["key"], []).append((point["step"], point["value"]))
    assert sorted(by_key["epoch_loss"]) == list(enumerate(LOSSES))
    assert sorted(by_key["eval_accuracy"]) == [(0, 0.5), (1, 0.6), (2, 0.7)]
    assert sorted(by_key["fold_progress_ratio"]) == [(0, 1 / 3), (1, 2 / 3), (2, 1.0)]
    assert by_key["batches"] == [(2, 6.0)] and by_key["nan_detected"] == [(2, 1.0)]
    assert by_key["checkpoint_size_bytes"] == [(2, float(1 << 20))]
    failed_history = {p["key"]: p for p in source.histories([failed]).to_pylist() if p["key"] == "batches"}
    assert failed_history["batches"]["value"] == 4.0  # two epochs' batches before it raised


def test_mlflow_down_is_logged_once_and_never_stops_training(monkeypatch, caplog):
    monkeypatch.setenv(
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0"
    )  # fail at once rather than back off for minutes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    writer = MlflowWriter(f"http://user:s3cret@127.0.0.1:{port}", timeout_s=5.0)
    t = training.Telemetry(mlflow=writer, tracer=None)
    started = time.monotonic()
    with caplog.at_level(logging.DEBUG, logger="foxhunt_gpu_exporter.training.mlflow_runs"):
        train(t, 0)
        train(t, 1)
    assert time.monotonic() - started < 2 * writer.timeout_s  # each fold end waits at most timeout_s
    text = t.metrics.render()[0].decode()
    assert 'foxhunt_training_batches_total{fold="1",model="ppo-policy"} 6.0' in text
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"127.0.0.1:{port}" in warnings[0], warnings
    assert writer.failures >= 2
    assert all("s3cret" not in r.getMessage() for r in caplog.records)


class SilentServer:
    """A TCP server that accepts every connection and never answers: an MLflow that hangs."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.connections.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.connections:  # the client's pending read ends at once
            conn.close()


@pytest.fixture
def silent():
    server = SilentServer()
    yield server
    server.close()


MLFLOW_HTTP = (
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
)


@pytest.mark.servers
def test_a_call_to_an_mlflow_that_never_answers_gives_up_within_its_bound(silent, monkeypatch, caplog):
    for name in MLFLOW_HTTP:
        monkeypatch.delenv(name, raising=False)  # MLflow's defaults would be 120 s a request, 7 retries
    writer = MlflowWriter(silent.url, timeout_s=1.0, request_timeout_s=1, retries=1)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="foxhunt_gpu_exporter.training.mlflow_runs"):
        training.mlflow_runs.FoldRun(writer, "rl-ppo", "ppo-policy-fold-0", {}, {"lr": 0.01})
        assert writer.flush(30.0)  # the create call gave up: 2 requests of 1 s, no backoff before the retry
    assert time.monotonic() - started < 8.0
    assert len(silent.connections) == 2  # the request and its one retry
    assert writer.failures == 1 and "Read timed out" in caplog.text
    assert not [name for name in MLFLOW_HTTP if name in os.environ]  # ours only while the call ran


@pytest.mark.servers
def test_mlflow_variables_the_user_set_are_left_alone(silent, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    writer = MlflowWriter(silent.url, timeout_s=1.0, request_timeout_s=1, retries=3)
    training.mlflow_runs.FoldRun(writer, "rl-ppo", "ppo-policy-fold-0", {}, {})
    assert writer.flush(30.0)
    assert len(silent.connections) == 1  # the user's 0 retries, not our 3
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"


@pytest.mark.servers
def test_a_run_whose_metric_call_failed_logs_no_more_metrics(silent, monkeypatch):
    """One hung run costs one call's bound, not one per metric still queued."""
    for name in MLFLOW_HTTP:
        monkeypatch.delenv(name, raising=False)
    writer = MlflowWriter(silent.url, timeout_s=1.0, request_timeout_s=1, retries=0)
    run = training.mlflow_runs.FoldRun(writer, "rl-ppo", "ppo-policy-fold-0", {}, {})
    assert writer.flush(30.0) and len(silent.connections) == 1  # the creation timed out
    run.run_id = "0123456789abcdef"  # as if it had been created before MLflow hung
    started = time.monotonic()
    for epoch in range(3):
        run.log("epoch_loss", 0.5, epoch)
    assert writer.flush(30.0)
    assert len(silent.connections) == 2  # the first metric only; the other two were not sent
    assert time.monotonic() - started < 3 * 1.0  # not three request timeouts
    assert writer.failures == 2
    run.run_id = None  # nothing to end on a server that never held it (and nothing left open at exit)
    run.end("KILLED")


EXITING_TRAINER = """
import mlflow.tracking  # imported before the folds: the writer thread is then only making calls
from foxhunt_gpu_exporter import training
from foxhunt_gpu_exporter.training import mlflow_runs

mlflow_runs.EXIT_WAIT_S = {exit_wait}
t = training.Telemetry(mlflow=mlflow_runs.MlflowWriter({url!r}, timeout_s=0.001), tracer=None,
                       experiment={experiment!r})
with t.fold("ppo-policy", 0, epochs=2) as f:  # its end is queued; the fold does not wait for it
    for epoch in range(2):
        f.epoch_started(epoch)
        f.epoch_ended(0.5 - epoch / 10)
t.fold("ppo-policy", 1, epochs=2).start()  # never ended: the process exits first
print("exiting at", __import__("time").time())
"""


def run_trainer(url: str, experiment: str, exit_wait: float) -> subprocess.CompletedProcess:
    script = textwrap.dedent(EXITING_TRAINER).format(url=url, experiment=experiment, exit_wait=exit_wait)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MLFLOW_"))}
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.servers
def test_runs_still_queued_at_exit_are_ended(mlflow_url):
    r = run_trainer(mlflow_url, "exit-ended", exit_wait=60.0)  # generous: the machine may be busy
    assert r.returncode == 0, r.stderr[-2000:]
    client = MlflowClient(tracking_uri=mlflow_url)
    experiment = client.get_experiment_by_name("exit-ended")
    runs = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}
    assert {name: run.info.status for name, run in runs.items()} == {
        "ppo-policy-fold-0": "FINISHED",  # ended at exit, as the fold did
        "ppo-policy-fold-1": "KILLED",  # the process ended before the fold
    }
    assert runs["ppo-policy-fold-0"].data.metrics["epoch_loss"] == pytest.approx(0.4)


@pytest.mark.servers
def test_at_exit_an_mlflow_that_never_answers_costs_a_bounded_wait_and_the_runs_are_named(silent):
    url = silent.url.replace("http://", "http://trainer:s3cret-pw@")
    r = run_trainer(url, "exit-silent", exit_wait=2.0)
    exited = time.time()
    assert r.returncode == 0, r.stderr[-2000:]
    assert (
        exited - float(r.stdout.split("exiting at ")[1]) < 2.0 + 3.0
    )  # the exit wait, and the interpreter's end
    (line,) = [line for line in r.stderr.splitlines() if "at exit" in line]
    assert (
        "2 run(s) not ended at exit (waited up to 2s), left RUNNING: ppo-policy-fold-0, ppo-policy-fold-1"
        in line
    )
    assert "s3cret-pw" not in r.stderr


def test_tracking_uri_credentials_are_redacted():
    assert redact_uri("https://bob:pw@mlflow.example:8443/x") == "https://mlflow.example:8443/x"
    assert redact_uri("http://mlflow.rlinf.svc.cluster.local") == "http://mlflow.rlinf.svc.cluster.local"
