"""Benchmark: Prometheus -> lake against the raw download of the same responses, from a real Prometheus
holding a day of 16 nodes x 8 GPUs at 15 s, in one run. Asset day: `gpu_samples` over the day's 24 hourly
partitions as a backfill runs it (`ours`; `ours_serial` one query at a time) against the floor, `raw`: the
very requests ours sent, replayed one after another with the same HTTP client, bodies dropped (`raw_side`:
the replay at ours' concurrency). One window: a single 24-hour query of util, ours against the obvious
alternative, prometheus-api-client's `custom_query_range` and `MetricRangeDataFrame`. Each method in a fresh
process, methods interleaved within a round, the median counts.

asset day (the target): what a backfill run of a day of gpu_samples does
  ours         lib/tables/gpu.gpu_samples over the day's 24 hourly partitions, every GPU metric of the
               catalog, with a client built as PrometheusResource builds it: an hour's queries side by side
               (FOXHUNT_PROMETHEUS_QUERIES_AT_ONCE, default 4), the next hour downloaded while one is written
  ours_serial  the same with queries_at_once = 1 (the next hour still downloaded while one is written)
  raw          the very requests ours sent (recorded once), replayed one after another with the same HTTP
               client, bodies counted and dropped: the download alone, the floor the target is set against
  raw_side     the same replay, queries_at_once at a time: the floor at ours' concurrency

one window (the comparison with the obvious alternative): a single 24-hour query of util
  raw          the HTTP download alone (fetch_range_body over split_windows)
  client       prometheus-api-client custom_query_range + MetricRangeDataFrame
  ours         collect_gpu_samples for the 24 hours (util only) then Lake.write_partition

Each method runs in a fresh process (so peak RSS is its own), the methods interleaved within a round so that
the machine's load weighs on all alike; the median counts. Imports are not timed: each process first
imports what the asset's process has loaded (lib/tables, which loads pandas, which pyarrow would
otherwise import lazily inside the first conversion it makes).
The asset-day methods also record their CPU seconds (every thread) and Prometheus's over the same span:
client and server share this machine's two cores, and `cpu_floor` says how near raw ours can get here.
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
DAY_METHODS = ("raw", "raw_side", "ours", "ours_serial")
ROUNDS = 7

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


def _settings():
    """ClusterResource's defaults, without importing Dagster (its memory would count in the peak RSS)."""
    from foxhunt_obs.lib.settings import ClusterSettings, csv_list, default

    return ClusterSettings(
        scrape_step_s=float(default("FOXHUNT_SCRAPE_STEP")),
        experiment_label=default("FOXHUNT_EXPERIMENT_LABEL"),
        run_id_label="",
        node_labels=tuple(csv_list(default("FOXHUNT_NODE_LABELS"))),
        exporter_containers=(),
    )


def day_hours() -> list[datetime]:
    return [datetime.fromtimestamp(START.timestamp() + h * 3600, timezone.utc) for h in range(HOURS)]


def asset_day(client):
    """What the gpu_samples asset does for a day of hourly partitions, into a lake thrown away after."""
    import foxhunt_obs.lib.tables.gpu as gpu_tables
    from foxhunt_obs.lib.ingest.metric_catalog import load_catalog
    from foxhunt_obs.lib.lake import Lake

    with tempfile.TemporaryDirectory() as lake_dir:
        return gpu_tables.gpu_samples(Lake(lake_dir), client, load_catalog(), _settings(), day_hours())


def day_method(name: str, url: str, recorded: str, prometheus_pid: int | None = None) -> dict:
    """One asset-day method in this process; `recorded`: the JSON of ours' requests (record_requests);
    with prometheus_pid, the CPU Prometheus used over the same timed span."""
    import foxhunt_obs.lib.tables.gpu  # noqa: F401 - the asset's module: what its process has loaded
    from foxhunt_obs.lib.sources.prometheus import QUERIES_AT_ONCE, PrometheusClient

    extra: dict = {}
    prom0 = _process_cpu_s(prometheus_pid) if prometheus_pid else 0.0
    t0, cpu0 = time.perf_counter(), _cpu_s()
    if name.startswith("raw"):
        sizes = replay(url, json.loads(Path(recorded).read_text()), 1 if name == "raw" else QUERIES_AT_ONCE)
        extra |= {"requests": len(sizes), "bytes": sum(sizes)}
        points = None
    else:
        client = PrometheusClient(url, queries_at_once=1 if name == "ours_serial" else QUERIES_AT_ONCE)
        built = asset_day(client)
        points = built.rows
        extra["checks_passed"] = all(c.passed for c in built.checks)
    seconds, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    if prometheus_pid:
        extra["prometheus_cpu_s"] = _process_cpu_s(prometheus_pid) - prom0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": seconds,
        "cpu_s": cpu,
        "points": points,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        **extra,
    }


def replay(url: str, requests: list, at_once: int) -> list[int]:
    """Send the recorded requests (record_requests) again, `at_once` at a time, through the client's own
    request code (deadline, streaming read); each body counted and dropped. Returns the bodies' sizes."""
    from functools import partial

    from foxhunt_obs.lib.side_by_side import side_by_side
    from foxhunt_obs.lib.sources.prometheus import PrometheusClient

    client = PrometheusClient(url)

    def download(path: str, params: dict) -> int:
        size = [0]
        client._send(path, params, lambda chunk: size.__setitem__(0, size[0] + len(chunk)), RuntimeError)
        return size[0]

    return side_by_side([partial(download, path, params) for path, params in requests], at_once)


def _cpu_s() -> float:
    """CPU seconds of this process, every thread, user + system."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _process_cpu_s(pid: int) -> float:
    """CPU seconds a process (Prometheus) has used so far, from /proc (utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def record_requests(url: str, out: Path) -> int:
    """Run ours once, writing every request it sends (path, form parameters) to `out`, in the order sent."""
    from foxhunt_obs.lib.sources.prometheus import PrometheusClient

    sent: list = []

    class Recording(PrometheusClient):
        def _send(self, path, params, *args, **kwargs):
            sent.append((path, dict(params)))
            return super()._send(path, params, *args, **kwargs)

    asset_day(Recording(url))
    out.write_text(json.dumps(sent))
    return len(sent)


def run_in_subprocess(name: str, url: str, recorded: str = "", prometheus_pid: int | None = None) -> dict:
    """One method in a fresh process (an asset-day one when `recorded` is given, with the CPU Prometheus
    used while it ran: on this machine the client and the server share the two cores)."""
    args = ["--day-method", name, "--recorded", recorded] if recorded else ["--method", name]
    if prometheus_pid:
        args += ["--prometheus-pid", str(prometheus_pid)]
    out = subprocess.run(
        [sys.executable, __file__, *args, "--url", url], capture_output=True, text=True, check=True
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


def _summary(runs: dict[str, list[dict]]) -> dict:
    out = {}
    for m, rs in runs.items():
        out[m] = {
            "seconds_median": statistics.median(r["seconds"] for r in rs),
            "seconds_all": [round(r["seconds"], 4) for r in rs],
            "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
            "points": rs[0]["points"],
            **{k: rs[0][k] for k in ("requests", "bytes", "checks_passed") if k in rs[0]},
            **{
                f"{k}_median": statistics.median(r[k] for r in rs)
                for k in ("cpu_s", "prometheus_cpu_s")
                if k in rs[0]
            },
        }
    return out


def main(rounds: int = ROUNDS) -> None:
    from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer, build_tsdb, copy_tsdb
    from foxhunt_obs.sandbox.story.scenario import parse_scenario
    from foxhunt_obs.sandbox.writers.openmetrics import ALL_METRICS

    scenario = parse_scenario(SCENARIO, "bench")
    cache = RESULTS / "tmp"
    # what gpu_samples asks Prometheus for: the GPU series, scrape targets, pod labels, node IPs
    metrics = {m for m in ALL_METRICS if m.startswith("DCGM_")} | {"up", "kube_pod_labels", "kube_node_info"}
    t0 = time.perf_counter()
    tsdb = build_tsdb(scenario, cache, metrics=metrics)
    build_s = time.perf_counter() - t0
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as work:
        copy_tsdb(tsdb, Path(work) / "tsdb")
        with PrometheusServer(Path(work) / "tsdb", workdir=Path(work)) as prom:
            recorded = Path(work) / "requests.json"
            # in a process of its own: a child inherits its parent's peak RSS, which must stay small
            n_requests = int(
                subprocess.run(
                    [sys.executable, __file__, "--record", str(recorded), "--url", prom.url],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()[-1]
            )  # also warms Prometheus's caches
            run_in_subprocess("raw", prom.url)
            idle0 = _process_cpu_s(prom.pid)
            time.sleep(3)
            prometheus_idle_cpu_per_s = (_process_cpu_s(prom.pid) - idle0) / 3
            window: dict[str, list[dict]] = {m: [] for m in METHODS}
            day: dict[str, list[dict]] = {m: [] for m in DAY_METHODS}
            for i in range(rounds):
                print(f"round {i + 1}/{rounds}", file=sys.stderr, flush=True)
                for m in DAY_METHODS:
                    day[m].append(run_in_subprocess(m, prom.url, str(recorded), prom.pid))
                for m in METHODS:
                    window[m].append(run_in_subprocess(m, prom.url))
    load_after = os.getloadavg()
    day_s, window_s = _summary(day), _summary(window)
    hour_points = NODES * GPUS * 3600 / STEP
    expected_points = hour_points * HOURS
    for m in ("client", "ours"):
        assert window_s[m]["points"] == expected_points, (m, window_s[m]["points"], expected_points)
    for m in ("ours", "ours_serial"):
        assert day_s[m]["points"] == expected_points, (m, day_s[m]["points"], expected_points)
        assert day_s[m]["checks_passed"], m
    assert day_s["raw"]["requests"] == n_requests
    for summary in (day_s, window_s):
        for m in summary:
            summary[m]["points_per_second"] = expected_points / summary[m]["seconds_median"]
    med = {m: s["seconds_median"] for m, s in day_s.items()}
    wmed = {m: s["seconds_median"] for m, s in window_s.items()}
    per_round = [o["seconds"] / r["seconds"] for o, r in zip(day["ours"], day["raw"])]
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
            "points_per_metric": int(expected_points),
            "metrics_in_tsdb": sorted(metrics),
            "asset_day_requests": n_requests,
            "asset_day_response_bytes": day["raw"][0]["bytes"],
            "one_window_query": QUERY,
            "one_window_response_bytes": window["raw"][0]["bytes"],
            "tsdb_build_seconds": round(build_s, 1),
            "prometheus_idle_cpu_per_s": round(prometheus_idle_cpu_per_s, 3),
        },
        "asset_day": day_s,
        "one_window": window_s,
        "ratios": {
            "ours_over_raw": med["ours"] / med["raw"],
            "ours_over_raw_per_round": [round(x, 3) for x in per_round],
            "ours_over_raw_side_by_side": med["ours"] / med["raw_side"],
            "ours_serial_over_raw": med["ours_serial"] / med["raw"],
            "client_over_ours_one_window": wmed["client"] / wmed["ours"],
            "ours_over_raw_one_window": wmed["ours"] / wmed["raw"],
        },
        "cpu_floor": cpu_floor(day_s, med["raw"]),
        "targets": {"ours_over_raw": "<= 1.3", "client_over_ours_one_window": ">= 3"},
    }
    result["met"] = {
        "ours_over_raw": result["ratios"]["ours_over_raw"] <= 1.3,
        "client_over_ours_one_window": result["ratios"]["client_over_ours_one_window"] >= 3,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "prometheus_ingest.json").write_text(json.dumps(result, indent=2) + "\n")
    for title, summary in (
        ("asset day (gpu_samples, 24 hourly partitions)", day_s),
        ("one window", window_s),
    ):
        print(title)
        print(
            f"  {'method':12} {'seconds':>8} {'CPU s':>6} {'Prom CPU s':>10} {'points/s':>12} {'peak RSS MB':>12}"
        )
        for m, s in summary.items():
            cpu, prom_cpu = (
                s.get("cpu_s_median", float("nan")),
                s.get("prometheus_cpu_s_median", float("nan")),
            )
            print(
                f"  {m:12} {s['seconds_median']:8.3f} {cpu:6.2f} {prom_cpu:10.2f} {s['points_per_second']:12,.0f} "
                f"{s['peak_rss_mb']:12.0f}"
            )
    r = result["ratios"]
    print(
        f"asset day: ours / raw = {r['ours_over_raw']:.2f}x (target <= 1.3; per round "
        f"{', '.join(f'{x:.2f}' for x in per_round)}), ours / raw side by side = "
        f"{r['ours_over_raw_side_by_side']:.2f}x, ours one query at a time / raw = {r['ours_serial_over_raw']:.2f}x; "
        f"one window: client / ours = {r['client_over_ours_one_window']:.1f}x (target >= 3), ours / raw = "
        f"{r['ours_over_raw_one_window']:.2f}x; load {load_before[0]:.2f} -> {load_after[0]:.2f}"
    )
    f = result["cpu_floor"]
    print(
        f"asset day CPU: ours {f['ours_cpu_s']:.2f} s ({f['ours_cpu_over_raw']:.2f}x raw's wall), Prometheus "
        f"{f['prometheus_cpu_s']:.2f} s; both over 2 cores {f['two_core_floor_over_raw']:.2f}x raw at best; "
        f"1.3x needs ours under {f['ours_cpu_for_1_3x_s']:.2f} s of CPU"
    )


def cpu_floor(day: dict, raw_s: float) -> dict:
    """How near raw ours can be on this machine, from the CPU each side spent: client and server share its
    two cores, so ours cannot end before their CPU seconds together (Prometheus's over ours' timed span),
    spread over both, are spent; and the GIL keeps most of ours on one core (its CPU seconds came out at
    or under its wall seconds in every run), so its own CPU seconds bound it too."""
    ours, prom = day["ours"]["cpu_s_median"], day["ours"]["prometheus_cpu_s_median"]
    return {
        "ours_cpu_s": ours,
        "prometheus_cpu_s": prom,
        "ours_cpu_over_raw": ours / raw_s,
        "two_core_floor_over_raw": (ours + prom) / 2 / raw_s,
        "ours_cpu_for_1_3x_s": 1.3 * raw_s,
    }


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--method", choices=METHODS)
    p.add_argument("--day-method", choices=DAY_METHODS)
    p.add_argument("--recorded")
    p.add_argument("--record", help="run ours once, writing its requests to this file")
    p.add_argument("--prometheus-pid", type=int)
    p.add_argument("--url")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    a = p.parse_args()
    if a.method:
        print(json.dumps(method(a.method, a.url)))
    elif a.record:
        print(record_requests(a.url, Path(a.record)))
    elif a.day_method:
        print(json.dumps(day_method(a.day_method, a.url, a.recorded, a.prometheus_pid)))
    else:
        main(a.rounds)
