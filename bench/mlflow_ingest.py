"""Benchmark: every metric history of 48 runs x 8 keys x 2,000 steps (768k points) from a real MLflow
tracking server, in one run. `ours` (`MlflowSource.histories`: bulk-interval step windows on a thread pool)
against the obvious alternative, `naive` (`MlflowClient.get_metric_history` per run and key), and against
`backend_store`, the same read from MLflow's SQL tables; `ours_1_worker` is ours against a one-worker
server.

  naive          for each run, for each key: MlflowClient.get_metric_history(run_id, key)
  ours           MlflowSource(uri).histories(runs): get-history-bulk-interval step windows (exact re-reads
                 with get-history where a window could be sampled) on a thread pool
  backend_store  MlflowSource(uri, backend_store_uri=sqlite:///...).histories(runs): MLflow's SQL tables

The server runs `mlflow server`'s default 4 workers: answering costs the server far more per point than
parsing costs us, so the REST path wins by asking for cheaper answers and keeping several workers busy. `ours` is also timed
against a 1-worker server (`ours_1_worker`) to show that dependency.

The store is built once under bench/results/tmp/ (gitignored): schema, experiment and runs through
MLflow's own SqlAlchemyStore, the 768k points bulk-inserted into its `metrics` and `latest_metrics`
tables in one transaction (what SqlAlchemyStore.log_batch writes, at ~5k rows/s, takes ~6 s this way).
Writes bench/results/mlflow_ingest.json and prints a table.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script from anywhere

RESULTS = HERE / "results"
RUNS, KEYS, STEPS = 48, 8, 2000
POINTS = RUNS * KEYS * STEPS
T0 = 1_764_000_000_000  # ms
STORE = RESULTS / "tmp" / f"mlflow-bench-{RUNS}x{KEYS}x{STEPS}"
COMPLETE = "COMPLETE"


def build_store(root: Path = STORE) -> tuple[Path, float]:
    """The benchmark's MLflow SQLite store (root/mlflow.db), built on first use; (path, build seconds)."""
    db = root / "mlflow.db"
    if (root / COMPLETE).exists():
        return db, 0.0
    t0 = time.perf_counter()
    shutil.rmtree(root, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent if root.parent.exists() else None))
    try:
        _write_store(tmp)
        (tmp / COMPLETE).write_text(f"{RUNS}x{KEYS}x{STEPS}\n")
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return db, time.perf_counter() - t0


def _write_store(tmp: Path) -> None:
    from mlflow.entities import RunStatus
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    db = tmp / "mlflow.db"
    store = SqlAlchemyStore(f"sqlite:///{db}", str(tmp / "artifacts"))  # creates and migrates the schema
    exp = store.create_experiment("bench")
    run_ids = []
    for i in range(RUNS):
        run = store.create_run(exp, "bench", T0 - 3_600_000 + i, [], f"bench-{i:02d}")
        run_ids.append(run.info.run_id)
        store.update_run_info(run.info.run_id, RunStatus.FINISHED, T0 + STEPS * 1000, f"bench-{i:02d}")
    store.engine.dispose()

    rng = random.Random(7)
    keys = [f"train/k{k}" for k in range(KEYS)]
    rows, latest = [], []
    for i, rid in enumerate(run_ids):
        for k, key in enumerate(keys):
            for s in range(STEPS):
                v = round(math.exp(-s / 500) + rng.gauss(0, 0.01), 6)
                is_nan = i == 0 and k == 0 and s in (100, 101)  # a NaN burst, stored as MLflow does
                if i == 0 and k == 0 and s == 102:
                    v = sys.float_info.max  # +Inf, as MLflow's SQL store keeps it
                rows.append((key, 0.0 if is_nan else v, T0 + s * 1000, rid, s, int(is_nan)))
            key_, v, ts, _, s, nan = rows[-1]
            latest.append((key_, v, ts, s, nan, rid))
    con = sqlite3.connect(db)
    try:
        with con:  # one transaction: a crash leaves no half-written store (and the tmp dir is dropped)
            con.executemany(
                "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            con.executemany(
                "INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) VALUES (?, ?, ?, ?, ?, ?)",
                latest,
            )
    finally:
        con.close()


def _server(store_dir: Path, workdir: Path, workers: int):
    from foxhunt_obs.sandbox.servers.mlflow_server import MlflowServer

    class Server(MlflowServer):  # the sandbox's server, with a worker count
        def command(self) -> list[str]:
            cmd = super().command()
            cmd[cmd.index("--workers") + 1] = str(workers)
            return cmd

    return Server(store_dir, workdir=workdir)


def _timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    import mlflow
    import numpy as np
    from mlflow import MlflowClient

    from foxhunt_obs.lib.sources.mlflow import MlflowSource

    db, build_s = build_store()
    methods: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="foxhunt-mlflow-bench-") as work:
        work = Path(work)
        store = work / "store"
        store.mkdir()
        shutil.copy2(db, store / "mlflow.db")  # the server may write into its store; the cache stays pristine
        backend_uri = f"sqlite:///{store / 'mlflow.db'}"

        for workers in (4, 1):
            with _server(store, work / f"w{workers}", workers) as server:
                src = MlflowSource(server.url)
                runs = src.runs()
                assert len(runs) == RUNS and all(len(r.metric_keys) == KEYS for r in runs), len(runs)
                src.histories(runs[:2])  # warm the server's workers and SQLite's page cache

                if workers == 4:
                    client = MlflowClient(server.url)

                    def naive(client=client, runs=runs) -> int:
                        return sum(
                            len(client.get_metric_history(r.run_id, k)) for r in runs for k in r.metric_keys
                        )

                    s, n = _timed(naive)
                    methods["naive"] = {"seconds": s, "points": n, "server_workers": workers}
                    s, table = _timed(lambda src=src, runs=runs: src.histories(runs))
                    methods["ours"] = {"seconds": s, "points": table.num_rows, "server_workers": workers}
                    sql = MlflowSource(server.url, backend_store_uri=backend_uri)
                    s, sql_table = _timed(lambda sql=sql, runs=runs: sql.histories(runs))
                    methods["backend_store"] = {
                        "seconds": s,
                        "points": sql_table.num_rows,
                        "server_workers": None,
                    }
                    same = sql_table.drop_columns("value").equals(
                        table.drop_columns("value")
                    ) and np.array_equal(
                        sql_table.column("value").to_numpy(), table.column("value").to_numpy(), equal_nan=True
                    )
                    assert same, "backend-store and REST histories differ"
                else:
                    s, table = _timed(lambda src=src, runs=runs: src.histories(runs))
                    methods["ours_1_worker"] = {
                        "seconds": s,
                        "points": table.num_rows,
                        "server_workers": workers,
                    }

    for name, m in methods.items():
        assert m["points"] == POINTS, (name, m["points"], POINTS)
        m["points_per_second"] = POINTS / m["seconds"]
    ratios = {
        "naive_over_ours": methods["naive"]["seconds"] / methods["ours"]["seconds"],
        "naive_over_ours_1_worker": methods["naive"]["seconds"] / methods["ours_1_worker"]["seconds"],
        "naive_over_backend_store": methods["naive"]["seconds"] / methods["backend_store"]["seconds"],
    }
    result = {
        "benchmark": "mlflow_ingest",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "mlflow": mlflow.__version__,
        },
        "data": {
            "runs": RUNS,
            "keys": KEYS,
            "steps": STEPS,
            "points": POINTS,
            "store_build_seconds": round(build_s, 1),
        },
        "methods": methods,
        "ratios": ratios,
        "targets": {"naive_over_ours": ">= 3"},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "mlflow_ingest.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'method':14} {'server workers':>14} {'seconds':>8} {'points/s':>12} {'naive / it':>10}")
    for name, m in methods.items():
        w = m["server_workers"] or "-"
        print(
            f"{name:14} {w!s:>14} {m['seconds']:8.2f} {m['points_per_second']:12,.0f} "
            f"{methods['naive']['seconds'] / m['seconds']:9.1f}x"
        )
    print(f"{POINTS:,} points; {os.cpu_count()} CPUs; store built in {build_s:.1f} s (0 = cached)")


if __name__ == "__main__":
    main()
