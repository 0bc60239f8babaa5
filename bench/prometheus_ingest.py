"""Benchmark: one day x 128 GPU series at 15 s from a real Prometheus, three ways, in one run.

  raw        the HTTP download alone (fetch_range_body over split_windows, one request after another):
             the floor the target is measured against
  client     prometheus-api-client custom_query_range + MetricRangeDataFrame: the obvious alternative
  ours       what the gpu_samples asset runs (lib/tables/gpu.py): collect_gpu_samples with a client built
             as PrometheusResource builds it, then Lake.write_partition

Each method runs in a fresh process (so peak RSS is its own), five rounds, the methods interleaved within a
round so that the machine's load weighs on all alike; the median counts. Imports are not timed: each process
first imports what the asset's process has loaded (lib/tables, which loads pandas, which pyarrow would
otherwise import lazily inside the first conversion it makes).
Writes bench/results/prometheus_ingest.json (machine, load average before and after, ratios and targets)
and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
QUERY = "last_over_time(DCGM_FI_DEV_GPU_UTIL[14999ms])"  # what the ingest asks for util, step 15 s
STEP = 15.0
NODES, GPUS, HOURS = 16, 8, 24
START = datetime(2026, 11, 16, tzinfo=timezone.utc)
METHODS = ("raw", "client", "ours")
ROUNDS = 5

SCENARIO = (
    f"""
name: bench-{NODES}x{GPUS}
start: {START.strftime("%Y-%m-%dT%H:%M:%SZ")}
hours: {HOURS}
scrape_interval_s: {int(STEP)}
seed: 7
node_defaults: {{instance_type: p4de.24xlarge, gpus: {GPUS}, model: NVIDIA A100-SXM4-80GB, mem_mib: 81920}}
nodes: [{", ".join(f"ip-10-0-2-{i}" for i in range(NODES))}]
experiments: [{{name: bench, namespace: rl-train}}]
pods:
"""
    + "".join(
        f"""  - {{name: bench-{i}, experiment: bench, node: ip-10-0-2-{i}, gpus: {list(range(GPUS))}, start_h: 0,
       end_h: {HOURS}, util: {{base: 70, amplitude: 20, period_h: 3, noise: 5}}}}
"""
        for i in range(NODES)
    )
    + "incidents: []\n"
)


def method(name: str, url: str) -> dict:
    """Run one method in this process; return seconds, points and peak RSS. Imports are not timed."""
    from prometheus_api_client import MetricRangeDataFrame, PrometheusConnect

    import foxhunt_obs.lib.tables.gpu  # noqa: F401 - the asset's module: what its process has loaded
    from foxhunt_obs.lib.ingest.gpu_series import Window, collect_gpu_samples
    from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
    from foxhunt_obs.lib.lake import Lake
    from foxhunt_obs.lib.schemas import GPU_SAMPLES
    from foxhunt_obs.lib.sources.prometheus import PrometheusClient, split_windows

    start, end = START.timestamp(), START.timestamp() + HOURS * 3600
    extra: dict = {}
    t0 = time.perf_counter()
    if name == "raw":
        client = PrometheusClient(url)
        windows = split_windows(start, end, STEP, 11000)
        extra["bytes"] = sum(len(client.fetch_range_body(QUERY, s, e, STEP)) for s, e in windows)
        extra["requests"] = len(windows)
        points = None
    elif name == "client":
        api = PrometheusConnect(url=url)
        data = api.custom_query_range(
            QUERY,
            start_time=datetime.fromtimestamp(start, timezone.utc),
            end_time=datetime.fromtimestamp(end - STEP, timezone.utc),
            step=f"{int(STEP)}",
        )
        points = len(MetricRangeDataFrame(data))
    else:
        with tempfile.TemporaryDirectory() as lake_dir:
            table = collect_gpu_samples(
                PrometheusClient(url),
                load_catalog(),
                Window(start, end, STEP, "bench"),
                node_labels=("node", "Hostname", "instance"),
                columns=["util"],
            )
            extra["parquet_bytes"] = Lake(lake_dir).write_partition(GPU_SAMPLES, "bench", table).bytes
        points = table.num_rows
    seconds = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"seconds": seconds, "points": points, "peak_rss_mb": usage.ru_maxrss / 1024, **extra}


def run_in_subprocess(name: str, url: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--method", name, "--url", url], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def prometheus_version() -> str:
    from foxhunt_obs.sandbox.servers.prometheus import PROMETHEUS

    out = subprocess.run([PROMETHEUS, "--version"], capture_output=True, text=True, timeout=30).stdout
    return out.split("\n", 1)[0].strip()


def machine() -> dict:
    from importlib.metadata import version

    return {
        "cpus": os.cpu_count(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {
            "prometheus": prometheus_version(),
            **{
                lib: version(lib)
                for lib in ("numpy", "pyarrow", "requests", "urllib3", "prometheus-api-client")
            },
        },
    }


def main() -> None:
    from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer, build_tsdb, copy_tsdb
    from foxhunt_obs.sandbox.story.scenario import parse_scenario

    scenario = parse_scenario(SCENARIO, "bench")
    cache = RESULTS / "tmp"
    t0 = time.perf_counter()
    tsdb = build_tsdb(scenario, cache, metrics={"DCGM_FI_DEV_GPU_UTIL"})
    build_s = time.perf_counter() - t0
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as work:
        copy_tsdb(tsdb, Path(work) / "tsdb")
        with PrometheusServer(Path(work) / "tsdb", workdir=Path(work)) as prom:
            run_in_subprocess("raw", prom.url)  # warm Prometheus's page cache and chunk cache once
            runs: dict[str, list[dict]] = {m: [] for m in METHODS}
            for i in range(ROUNDS):
                print(f"round {i + 1}/{ROUNDS}: {', '.join(METHODS)}", file=sys.stderr, flush=True)
                for m in METHODS:
                    runs[m].append(run_in_subprocess(m, prom.url))
    load_after = os.getloadavg()
    summary = {}
    for m, rs in runs.items():
        summary[m] = {
            "seconds_median": statistics.median(r["seconds"] for r in rs),
            "seconds_all": [round(r["seconds"], 4) for r in rs],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
            "points": rs[0]["points"],
            **({"requests": rs[0]["requests"]} if "requests" in rs[0] else {}),
        }
    expected_points = NODES * GPUS * HOURS * 3600 / STEP
    for m in ("client", "ours"):
        assert summary[m]["points"] == expected_points, (m, summary[m]["points"], expected_points)
    for m in summary:
        summary[m]["points_per_second"] = expected_points / summary[m]["seconds_median"]
    med = {m: s["seconds_median"] for m, s in summary.items()}
    per_round = [o["seconds"] / r["seconds"] for o, r in zip(runs["ours"], runs["raw"])]
    result = {
        "benchmark": "prometheus_ingest",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in load_after],
        },
        "data": {
            "series": NODES * GPUS,
            "hours": HOURS,
            "step_s": STEP,
            "points": int(expected_points),
            "query": QUERY,
            "response_bytes": runs["raw"][0]["bytes"],
            "tsdb_build_seconds": round(build_s, 1),
        },
        "methods": summary,
        "ratios": {
            "client_over_ours": med["client"] / med["ours"],
            "ours_over_raw": med["ours"] / med["raw"],
            "ours_over_raw_per_round": [round(x, 3) for x in per_round],
        },
        "targets": {"client_over_ours": ">= 3", "ours_over_raw": "<= 1.3"},
    }
    result["met"] = {
        "client_over_ours": result["ratios"]["client_over_ours"] >= 3,
        "ours_over_raw": result["ratios"]["ours_over_raw"] <= 1.3,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "prometheus_ingest.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'method':10} {'seconds':>8} {'points/s':>12} {'peak RSS MB':>12}")
    for m, s in summary.items():
        print(f"{m:10} {s['seconds_median']:8.3f} {s['points_per_second']:12,.0f} {s['peak_rss_mb']:12.0f}")
    r = result["ratios"]
    print(
        f"client / ours = {r['client_over_ours']:.1f}x (target >= 3), "
        f"ours / raw = {r['ours_over_raw']:.2f}x (target <= 1.3; per round "
        f"{', '.join(f'{x:.2f}' for x in per_round)}); "
        f"load {load_before[0]:.2f} -> {load_after[0]:.2f}"
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--method", choices=METHODS)
    p.add_argument("--url")
    a = p.parse_args()
    if a.method:
        print(json.dumps(method(a.method, a.url)))
    else:
        main()
