"""A real MLflow tracking server holding a scenario's training runs (docs/design.md#the-sandbox).

``MlflowServer`` runs ``python -m mlflow server`` (the venv's own interpreter) on a SQLite store on
127.0.0.1, in its own process group: mlflow forks a uvicorn worker that outlives a plain kill of the
parent, so ``stop()`` takes the whole group down. ``build_store`` logs the scenario into a fresh store once
per scenario fingerprint (``training.log_scenario``) and caches it; servers run on a copy
(``copy_store``), since the server writes into its store. ``up_mlflow``/``down_mlflow``/``mlflow_status``
keep one detached server per state directory for the demo and the CLI.

Measured here (2 cores, mlflow 3.17.2, ``--workers 1``): ready in ~11 s; two processes (the ``mlflow
server`` parent and one uvicorn worker), ~290 MB RSS each, ~0.58 GB for the group.

The cached store lives in ``<cache_root>/<name>-<fingerprint[:12]>-mlflow/``, a sibling of the
Prometheus TSDB's ``<name>-<fingerprint[:12]>/`` rather than inside it: ``build_tsdb`` treats that folder
as its own and replaces it whole when its COMPLETE marker is missing, which would wipe an MLflow store
built there first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from foxhunt_obs.sandbox.servers.local_server import (
    LocalServer,
    alive,
    http_ok,
    kill_group,
    read_state,
)
from foxhunt_obs.sandbox.story.scenario import Scenario, load_scenario
from foxhunt_obs.sandbox.writers.cache import build_once
from foxhunt_obs.sandbox.writers.training import log_scenario

RUN_IDS = "run_ids.json"
STATE_FILE = "mlflow.json"


class MlflowServer(LocalServer):
    """``mlflow server`` on the SQLite store in ``store_dir`` (``mlflow.db``, ``artifacts/``), listening on
    127.0.0.1 only, one worker, job execution off. Logs to ``workdir/mlflow.log``."""

    label = "MLflow server"
    log_name = "mlflow.log"
    poll_s = 0.2
    start_timeout_s = 60.0

    def __init__(self, store_dir: Path, port: int = 0, workdir: Path | None = None):
        super().__init__(port, workdir)
        self.store_dir = Path(store_dir).resolve()

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--backend-store-uri",
            f"sqlite:///{self.store_dir / 'mlflow.db'}",
            "--artifacts-destination",
            str(self.store_dir / "artifacts"),
            "--workers",
            "1",
        ]

    def prepare(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        return {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}

    def ready(self, timeout: float) -> bool:
        return http_ok(f"{self.url}/health", timeout)

    def describe(self) -> str:
        return f"{self.label} on {self.url} (store {self.store_dir})"


def store_path(scenario: Scenario, cache_root: Path) -> Path:
    return Path(cache_root) / f"{scenario.name}-{scenario.fingerprint()[:12]}-mlflow" / "mlflow"


def build_store(scenario: Scenario, cache_root: Path) -> Path:
    """The scenario's MLflow store (``mlflow.db``, ``artifacts/``, ``run_ids.json``: run_name → run_id),
    under ``<cache_root>/<name>-<fingerprint[:12]>-mlflow/mlflow``, built on first use: a server on a
    store in a temp dir beside it, ``log_scenario``, server stopped (sandbox/writers/cache.py makes it atomic)."""

    def build(tmp: Path) -> None:
        store = tmp / "mlflow"
        with MlflowServer(store, workdir=tmp) as server:
            ids = log_scenario(scenario, server.url)
        (store / RUN_IDS).write_text(json.dumps(ids, indent=2) + "\n")

    final = store_path(scenario, cache_root).parent
    return build_once(final, build, f"{scenario.name} {scenario.fingerprint()}") / "mlflow"


def copy_store(src: Path, dst: Path) -> Path:
    """Copy a store for a server to write into; ``dst`` must not exist."""
    shutil.copytree(src, dst)
    return Path(dst)


def run_ids(store_dir: Path) -> dict[str, str]:
    return json.loads((Path(store_dir) / RUN_IDS).read_text())


# ---- one detached server per state directory (demo, CLI) ----

_DETACHED: dict[int, subprocess.Popen] = {}  # started here, so down_mlflow() here can reap them


def up_mlflow(scenario_name: str, state_dir: Path, port: int = 0) -> dict:
    """Build or reuse the scenario's store under ``state_dir/cache``, run an MLflow server on a fresh copy
    in ``state_dir/run/mlflow`` (detached: it outlives this process; log ``state_dir/run/mlflow.log``) and
    record it in ``state_dir/mlflow.json``. A server already recorded there is stopped first."""
    state_dir = Path(state_dir)
    scenario = load_scenario(scenario_name)
    cached = build_store(scenario, state_dir / "cache")
    down_mlflow(state_dir)
    run = state_dir / "run"
    store = copy_store(cached, run / "mlflow")
    server = MlflowServer(store, port=port, workdir=run).start()
    _DETACHED[server.pid] = server.process
    state = {
        "pid": server.pid,
        "url": server.url,
        "scenario": scenario.name,
        "fingerprint": scenario.fingerprint(),
        "store": str(store),
        "log": str(server.log_path),
        "run_ids": run_ids(store),
    }
    (state_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    return state


def _state(state_dir: Path) -> dict | None:
    return read_state(Path(state_dir) / STATE_FILE)


def down_mlflow(state_dir: Path) -> None:
    """Stop the server recorded in ``state_dir/mlflow.json`` and remove its store copy and log; fine if
    none runs. Leaves the rest of ``state_dir/run`` (Prometheus's) alone."""
    state_dir = Path(state_dir)
    state = _state(state_dir)
    if state:
        pid = state.get("pid")
        process = _DETACHED.pop(pid, None)
        if pid and alive(pid):
            kill_group(pid, 10.0, process)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    shutil.rmtree(state_dir / "run" / "mlflow", ignore_errors=True)
    (state_dir / "run" / "mlflow.log").unlink(missing_ok=True)


def mlflow_status(state_dir: Path) -> dict | None:
    """The recorded state if its server is alive and healthy, else None."""
    state = _state(state_dir)
    if state and alive(state["pid"]) and http_ok(f"{state['url']}/health"):
        return state
    return None
