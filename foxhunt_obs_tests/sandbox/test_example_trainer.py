"""The example trainer scraped by a real Prometheus, as the sandbox runs it: every query of the training
cockpit (variables substituted as Grafana would) finds data, and the figures are what the trainer did."""

from __future__ import annotations

import json
import os
import time

import pytest
import requests

from foxhunt_obs.sandbox.example_trainer import SANDBOX_POD, start_example_trainer
from foxhunt_obs.sandbox.servers import prometheus as sandbox_prometheus
from foxhunt_obs.sandbox.servers.local_server import free_port, kill_group
from foxhunt_obs.sandbox.servers.prometheus import RECORDING_RULES, TRAINER_JOB, PrometheusServer
from foxhunt_obs_tests.deploy.test_dashboards import COCKPIT, VARIABLES, load, panels, substitute

pytestmark = pytest.mark.servers

FOLDS, EPOCHS, BATCHES, GPUS = 2, 2, 3, 2
# 0.25 s a batch: an epoch lasts 0.75 s, so a 0.5 s scrape sees each fold at 0 before its NaN (epoch 1)
ARGS = ("--model", "toy-logreg", "--folds", str(FOLDS), "--epochs", str(EPOCHS), "--batches", str(BATCHES),
        "--step-seconds", "0.25", "--checkpoint-failure-fold", "1", "--fake-gpus", str(GPUS),
        "--gpu-interval", "0.5")  # fmt: skip


def query(server: PrometheusServer, expr: str) -> list[dict]:
    r = requests.get(f"{server.url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body.get('error')}"
    return body["data"]["result"]


def scalar(server: PrometheusServer, expr: str) -> float:
    (sample,) = query(server, expr)
    return float(sample["value"][1])


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """(Prometheus, the trainer's summary) once training is over and Prometheus has scraped its end."""
    work = tmp_path_factory.mktemp("example-trainer")
    port, summary = free_port(), work / "summary.json"
    server = PrometheusServer(
        work / "tsdb", workdir=work, scrape_jobs={TRAINER_JOB: [f"127.0.0.1:{port}"]}, scrape_interval="500ms",
        rule_files=(RECORDING_RULES,), sample_labels={TRAINER_JOB: SANDBOX_POD},
    )  # fmt: skip
    server.start()
    trainer = None
    try:
        # Prometheus sends new targets to its scrapers a few seconds after it starts: the trainer starts once
        # its (still closed) port has been scraped, so that every fold is scraped from its start
        wait_for(
            lambda: query(server, f'up{{job="{TRAINER_JOB}"}}'), 30, "the first scrape of the trainer's port"
        )
        trainer = start_example_trainer(port, work, *ARGS, "--summary", str(summary))
        wait_for(summary.exists, 60, "the trainer to finish")
        expected = FOLDS * EPOCHS * BATCHES

        def final_state_scraped() -> bool:
            batches = query(server, "sum(foxhunt_training_batches_total)")
            return (
                bool(batches)
                and float(batches[0]["value"][1]) == expected
                and len(query(server, "foxhunt_training_active_workers == 0")) == FOLDS
                and len(query(server, "foxhunt:gpu_util:ratio")) == GPUS
            )

        wait_for(final_state_scraped, 30, "Prometheus to scrape the end of training")
        yield server, json.loads(summary.read_text())
    finally:
        server.stop()
        if trainer is not None:
            kill_group(trainer.pid, 5.0, trainer)


def test_every_cockpit_query_finds_the_trainers_series(scraped):
    server, _ = scraped
    empty = []
    for p in panels(load(COCKPIT)):
        for t in p.get("targets", []):
            if not query(server, substitute(t["expr"], {**VARIABLES, "model": "toy-logreg"})):
                empty.append(f"{p['title']!r}: {t['expr']}")
    assert not empty, "cockpit queries with no data from the example trainer:\n" + "\n".join(empty)


def test_the_figures_are_what_the_trainer_did(scraped):
    server, done = scraped
    assert scalar(server, "sum(foxhunt_training_batches_total)") == FOLDS * EPOCHS * BATCHES
    assert scalar(server, "sum(foxhunt_training_nan_detected_total)") == FOLDS  # one poisoned batch a fold
    assert scalar(server, "sum(foxhunt_training_gradient_explosions_total)") == FOLDS  # one exploding batch
    assert scalar(server, "sum(foxhunt_training_checkpoint_saves_total)") == FOLDS * EPOCHS - 1
    assert scalar(server, 'foxhunt_training_checkpoint_failures_total{fold="1"}') == 1
    assert scalar(server, "sum(foxhunt_training_feature_errors_total)") == done["feature_errors"] > 0
    assert done["batches"] == FOLDS * EPOCHS * BATCHES and done["nan_detected"] == FOLDS
    assert {s["metric"]["fold"] for s in query(server, "foxhunt_training_epoch == 1")} == {"0", "1"}

    board = {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in panels(load(COCKPIT))}

    def panel(title: str, values: dict | None = None) -> list[dict]:
        return query(server, substitute(board[title][0], {**VARIABLES, **(values or {})}))

    assert float(panel("Active workers")[0]["value"][1]) == 0  # every fold over
    assert float(panel("Folds running")[0]["value"][1]) == 0
    assert float(panel("Mean fold progress")[0]["value"][1]) == 1
    (nan,) = panel("NaN detected (time range)", {"__range": "10m"})
    assert abs(float(nan["value"][1]) - FOLDS) < 0.5  # increase() extrapolates a little past the samples
    gpus = panel("GPU utilization", {"fold": "0"})
    assert {s["metric"]["pod"] for s in gpus} == {SANDBOX_POD["pod"]} and len(gpus) == GPUS
    # the pod is on the trainer's samples, not on its `up`: else the rules would read its GPUs as unheld
    assert "pod" not in query(server, f'up{{job="{TRAINER_JOB}"}}')[0]["metric"]


def test_sandbox_down_stops_the_trainer_by_pid(tmp_path):
    trainer = start_example_trainer(free_port(), tmp_path, "--gpu-interval", "0")
    (tmp_path / "sandbox.json").write_text(json.dumps({"trainer_pid": trainer.pid}))
    sandbox_prometheus.down(tmp_path)
    trainer.wait(timeout=5)  # reaped: it is gone
    with pytest.raises(ProcessLookupError):
        os.killpg(trainer.pid, 0)
