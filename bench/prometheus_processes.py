"""Experiment: would downloading and parsing each range query in worker processes bring the asset day
nearer the raw download than threads do? Ours runs at about one core (the GIL); processes could use both.
Same Prometheus, day and recorded requests as bench/prometheus_ingest.py: `raw` replayed, `threads` as the
asset runs, `processes_4` and `processes_2` with each query run in a worker forked from a forkserver started
before the timing. Not a product path: the evidence for not building one.

In one process, interleaved:
  raw          the recorded requests replayed one after another (prometheus_ingest's `raw`)
  threads      gpu_samples over the day as the asset runs it (prometheus_ingest's `ours`)
  processes_4  the same, each query_range (download and parse) run in one of 4 worker processes
               (forked from a forkserver started before the timing, the client module preloaded), its
               RangeResult pickled back
  processes_2  the same with 2 workers (still 4 queries asked for at a time, as the threads do)

CPU counts this process and the workers (read from /proc before they stop; also on their own) and
Prometheus apart. Workers are started per day, as a run would start them. Writes
bench/results/prometheus_processes.json.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from multiprocessing import forkserver
from pathlib import Path

import prometheus_ingest as bench

from foxhunt_obs.lib.sources.prometheus import QUERIES_AT_ONCE, PrometheusClient

ROUNDS = 5
_WORKER: PrometheusClient | None = None


def _start_worker(url: str) -> None:
    global _WORKER
    _WORKER = PrometheusClient(url)


def _query_range(query: str, start: float, end: float, step: float, what: str):
    return _WORKER.query_range(query, start, end, step, what)


class ProcessClient(PrometheusClient):
    """A client whose range queries run in worker processes; instant queries stay in this process."""

    def __init__(self, url: str, workers: int):
        super().__init__(url, queries_at_once=QUERIES_AT_ONCE)
        context = mp.get_context("forkserver")
        self.pool = ProcessPoolExecutor(
            workers, mp_context=context, initializer=_start_worker, initargs=(url,)
        )

    def query_range(self, query, start, end, step, what=""):
        return self.pool.submit(_query_range, query, start, end, step, what).result()

    def close(self) -> float:
        """Stop the workers; the CPU seconds they used."""
        cpu = sum(bench._process_cpu_s(pid) for pid in self.pool._processes)
        self.pool.shutdown()
        return cpu


def one(method: str, url: str, requests: list) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of this process and its workers, of the workers alone)."""
    cpu0, t0, workers_cpu = bench._cpu_s(), time.perf_counter(), 0.0
    if method == "raw":
        bench.replay(url, requests, 1)
    elif method == "threads":
        bench.asset_day(PrometheusClient(url))
    else:
        client = ProcessClient(url, int(method.rsplit("_", 1)[1]))
        bench.asset_day(client)
        workers_cpu = client.close()
    return time.perf_counter() - t0, bench._cpu_s() - cpu0 + workers_cpu, workers_cpu


def main(rounds: int = ROUNDS) -> None:
    from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer, build_tsdb, copy_tsdb
    from foxhunt_obs.sandbox.story.scenario import parse_scenario
    from foxhunt_obs.sandbox.writers.openmetrics import ALL_METRICS

    mp.set_forkserver_preload(["foxhunt_obs.lib.sources.prometheus"])
    forkserver.ensure_running()  # its start-up (and the preload's imports) outside every timed run
    metrics = {m for m in ALL_METRICS if m.startswith("DCGM_")} | {"up", "kube_pod_labels", "kube_node_info"}
    tsdb = build_tsdb(parse_scenario(bench.SCENARIO, "bench"), bench.RESULTS / "tmp", metrics=metrics)
    methods = ["raw", "threads", "processes_4", "processes_2"]
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as work:
        copy_tsdb(tsdb, Path(work) / "tsdb")
        with PrometheusServer(Path(work) / "tsdb", workdir=Path(work)) as prom:
            recorded = Path(work) / "requests.json"
            bench.record_requests(prom.url, recorded)  # also warms Prometheus's caches
            requests = json.loads(recorded.read_text())
            for r in range(rounds):
                print(f"round {r + 1}/{rounds}", file=sys.stderr, flush=True)
                for m in methods if r % 2 == 0 else methods[::-1]:
                    prom0 = bench._process_cpu_s(prom.pid)
                    wall, cpu, workers_cpu = one(m, prom.url, requests)
                    runs[m].append(
                        {
                            "seconds": wall,
                            "cpu_s": cpu,
                            "workers_cpu_s": workers_cpu,
                            "prometheus_cpu_s": bench._process_cpu_s(prom.pid) - prom0,
                        }
                    )
    summary = {
        m: {
            k: statistics.median(x[k] for x in rs)
            for k in ("seconds", "cpu_s", "workers_cpu_s", "prometheus_cpu_s")
        }
        | {"seconds_all": [round(x["seconds"], 3) for x in rs]}
        for m, rs in runs.items()
    }
    per_round = {
        m: [round(a["seconds"] / b["seconds"], 3) for a, b in zip(runs[m], runs["raw"])] for m in methods[1:]
    }
    result = {
        "benchmark": "prometheus_processes",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
        "requests": len(requests),
        "methods": summary,
        "over_raw_per_round": per_round,
        # the median of the per-round ratios (bench/summary.py prints these)
        "ratios": {f"{m}_over_raw": statistics.median(v) for m, v in per_round.items()},
    }
    bench.RESULTS.mkdir(parents=True, exist_ok=True)
    (bench.RESULTS / "prometheus_processes.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"  {'method':12} {'seconds':>8} {'CPU s':>6} {'workers':>8} {'Prom CPU s':>10} {'/ raw':>6}")
    for m, s in summary.items():
        ratio = result["ratios"].get(f"{m}_over_raw", 1.0)
        print(
            f"  {m:12} {s['seconds']:8.3f} {s['cpu_s']:6.2f} {s['workers_cpu_s']:8.2f} "
            f"{s['prometheus_cpu_s']:10.2f} {ratio:6.2f}"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else ROUNDS)
