"""Benchmark: the alert sensor's tick for 64 GPUs (8 nodes x 8) against the sandbox Prometheus, in one run.

The scenario (generated below: 6 h at 15 s, three experiments, pods that start, end and share nodes, a
stall, ECC bursts, a node lost for 30 min, an idle node) is backfilled into a TSDB with the recording
rules (build_tsdb, cached under bench/results/tmp/), and a real Prometheus serves it. Only the Prometheus
source is configured, so a tick evaluates the catalog's 9 Prometheus rules of 15 (the 3 MLflow, 1
CloudWatch and 2 lake rules are skipped, as when their source is not configured).

  ours    engine.tick(rules, Sources(prometheus=PrometheusClient(url)), sinks=[], cursor, now) at 60
          evaluation times spread over the scenario (every 6 min), the cursor carried from tick to tick as
          the sensor does; a new client per tick, as the sensor builds its resources per tick. Every
          instant query is timed (per rule) inside the tick.
  client  the obvious alternative, what a hand-written sensor would do: the same 9 rule expressions as
          prometheus-api-client PrometheusConnect.custom_query(expr, params={"time": now}) per rule, a new
          PrometheusConnect per tick, no evaluation, no alert state (so it is a floor for ours: ours makes
          the same calls through the same client, then evaluates, moves the state and writes the cursor)
  floor   one instant query round trip, `vector(1)`, through a warm PrometheusConnect and a bare requests
          Session; and Prometheus's own execution time of each rule's query (stats=all), per rule

Each method runs in a fresh process (imports are not timed), three times, alternating; one discarded
`ours` pass first warms Prometheus's page and chunk caches. The ticks of the three passes are pooled for
p50 / p95 / max. Writes bench/results/sensors.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script from anywhere

RESULTS = HERE / "results"
TARGETS = {"tick_p95_s": 1.0}
PASSES = 3
NODES, GPUS, HOURS, STEP = 8, 8, 6, 15
TICKS, EVERY = 60, timedelta(minutes=6)
START = datetime(2026, 11, 16, tzinfo=timezone.utc)
FIRST_TICK = START + timedelta(minutes=3)
ROUND_TRIPS = 200
NODE_NAMES = [f"ip-10-0-3-{10 + i}" for i in range(NODES)]

# (name, experiment, node, gpus, start_h, end_h, util base, amplitude, period_h, noise)
_ALL, _LO, _HI = list(range(8)), [0, 1, 2, 3], [4, 5, 6, 7]
PODS = [
    ("ppo-humanoid-0", "ppo-humanoid", 0, _ALL, 0, 6, 85, 8, 1, 3),
    ("ppo-humanoid-1", "ppo-humanoid", 1, _ALL, 0, 3, 80, 10, 0.5, 4),
    ("ppo-humanoid-2", "ppo-humanoid", 1, _ALL, 3.25, 6, 82, 6, 2, 3),
    ("dqn-atari-0", "dqn-atari", 2, _LO, 0, 6, 45, 15, 1.5, 5),  # under 70 %: gpu_underutilized
    ("dqn-atari-1", "dqn-atari", 2, _HI, 0.5, 5.5, 60, 5, 0, 5),
    ("grpo-math-0", "grpo-math", 3, _ALL, 0, 6, 92, 4, 1, 2),  # stalls 02:00-02:45
    ("grpo-math-1", "grpo-math", 4, _ALL, 0, 4, 90, 5, 1, 2),  # node idle from 04:00: idle_spend
    ("ppo-humanoid-3", "ppo-humanoid", 5, _LO, 1, 6, 75, 10, 1, 4),
    ("grpo-math-2", "grpo-math", 6, _ALL, 0, 3.5, 88, 5, 1, 3),  # node lost 04:00-04:30 in between
    ("grpo-math-3", "grpo-math", 6, _ALL, 5, 6, 88, 5, 1, 3),
    ("dqn-atari-2", "dqn-atari", 7, _ALL, 2, 6, 65, 10, 1, 5),  # node idle until 02:00: idle_spend
]
INCIDENTS = [
    "{kind: stall, pod: grpo-math-0, start_h: 2, minutes: 45}",
    f"{{kind: ecc_sbe, node: {NODE_NAMES[2]}, gpu: 1, start_h: 1.5, minutes: 4, count: 5}}",
    f'{{kind: ecc_dbe, node: {NODE_NAMES[5]}, gpu: 0, start_h: "3:10", minutes: 0.25, count: 1}}',
    f"{{kind: node_lost, node: {NODE_NAMES[6]}, start_h: 4, minutes: 30}}",
]
SCENARIO = (
    f"""
name: bench-sensors-{NODES}x{GPUS}
start: {START.strftime("%Y-%m-%dT%H:%M:%SZ")}
hours: {HOURS}
scrape_interval_s: {STEP}
seed: 7
node_defaults: {{instance_type: p4de.24xlarge, gpus: {GPUS}, model: NVIDIA A100-SXM4-80GB, mem_mib: 81920}}
nodes: [{", ".join(NODE_NAMES)}]
experiments:
  - {{name: ppo-humanoid, namespace: rl-train}}
  - {{name: dqn-atari, namespace: rl-atari}}
  - {{name: grpo-math, namespace: llm-rl}}
pods:
"""
    + "".join(
        f"  - {{name: {n}, experiment: {e}, node: {NODE_NAMES[node]}, gpus: {g}, start_h: {s}, end_h: {t},"
        f" util: {{base: {b}, amplitude: {a}, period_h: {p}, noise: {z}}}}}\n"
        for n, e, node, g, s, t, b, a, p, z in PODS
    )
    + "incidents:\n"
    + "".join(f"  - {i}\n" for i in INCIDENTS)
)


def tick_times() -> list[datetime]:
    return [FIRST_TICK + k * EVERY for k in range(TICKS)]


def prometheus_rules():
    from foxhunt_obs.lib.alerts.rules import load_rules

    return [r for r in load_rules(overrides="") if r.enabled and r.source == "prometheus"]


# ------------------------------------------------------------------------------------------------ methods
def run_ours(url: str) -> dict:
    """engine.tick at every evaluation time, the cursor carried along; every instant query timed."""
    import prometheus_api_client  # noqa: F401 - the client imports it lazily on the first query

    from foxhunt_obs.lib.alerts.collect import Sources
    from foxhunt_obs.lib.alerts.engine import tick
    from foxhunt_obs.lib.alerts.rules import load_rules
    from foxhunt_obs.lib.sources.prometheus import PrometheusClient

    log: list[tuple[str, float, int]] = []

    class TimedClient(PrometheusClient):
        def query(self, query, at, what=""):
            t = time.perf_counter()
            out = super().query(query, at, what)
            log.append((what.removeprefix("alert rule "), time.perf_counter() - t, len(out)))
            return out

    all_rules = load_rules(overrides="")
    rules = [r for r in all_rules if r.enabled]
    load_rules_s = []
    for _ in range(20):  # the sensor loads the catalog every tick, before tick(): reported beside it
        t = time.perf_counter()
        load_rules()
        load_rules_s.append(time.perf_counter() - t)

    ticks, queries_s, evaluated, findings, notes, cursor = [], [], set(), 0, defaultdict(int), None
    for now in tick_times():
        sources = Sources(prometheus=TimedClient(url))  # the sensor builds its resources every tick
        n0 = len(log)
        t = time.perf_counter()
        cursor, report = tick(rules, sources, [], cursor, now)
        ticks.append(time.perf_counter() - t)
        queries_s.append(sum(s for _, s, _ in log[n0:]))
        if report.source_errors or report.failed:
            raise RuntimeError(f"tick at {now:%H:%M}: {report.source_errors or report.failed}")
        evaluated |= report.evaluated
        findings += report.findings
        for n in report.sent:
            notes[f"{n.rule} {n.status}"] += 1
    per_rule: dict[str, list] = defaultdict(list)
    series: dict[str, list] = defaultdict(list)
    for what, s, n in log:
        per_rule[what].append(s)
        series[what].append(n)
    return {
        "ticks_s": ticks,
        "queries_s": queries_s,
        "per_query_s": dict(per_rule),
        "per_query_series_max": {k: max(v) for k, v in series.items()},
        "evaluated": sorted(evaluated),
        "rules_in_catalog": len(all_rules),
        "findings": findings,
        "notifications": dict(notes),
        "cursor_bytes": len(cursor or ""),
        "load_rules_s_median": statistics.median(load_rules_s),
    }


def run_client(url: str) -> dict:
    """The hand-written sensor: one PrometheusConnect.custom_query per rule expression, nothing else."""
    from prometheus_api_client import PrometheusConnect

    exprs = [r.expr() for r in prometheus_rules()]
    ticks, rows = [], 0
    for now in tick_times():
        api = PrometheusConnect(url=url)
        at = now.timestamp()
        t = time.perf_counter()
        for e in exprs:
            rows += len(api.custom_query(e, params={"time": at}))
        ticks.append(time.perf_counter() - t)
    return {"ticks_s": ticks, "queries_per_tick": len(exprs), "series_returned": rows}


def run_floor(url: str) -> dict:
    """vector(1) round trips (warm client, warm session) and Prometheus's own time per rule (stats=all)."""
    import requests
    from prometheus_api_client import PrometheusConnect

    at = FIRST_TICK.timestamp()
    api, session = PrometheusConnect(url=url), requests.Session()
    api.custom_query("vector(1)", params={"time": at})
    session.get(f"{url}/api/v1/query", params={"query": "vector(1)", "time": at}).json()
    client_s, raw_s = [], []
    for _ in range(ROUND_TRIPS):
        t = time.perf_counter()
        api.custom_query("vector(1)", params={"time": at})
        client_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        r = session.get(f"{url}/api/v1/query", params={"query": "vector(1)", "time": at})
        r.raise_for_status()
        r.json()
        raw_s.append(time.perf_counter() - t)
    server: dict[str, list] = defaultdict(list)
    for now in tick_times():
        for rule in prometheus_rules():
            r = session.get(
                f"{url}/api/v1/query", params={"query": rule.expr(), "time": now.timestamp(), "stats": "all"}
            )
            r.raise_for_status()
            timings = r.json()["data"]["stats"]["timings"]
            server[rule.id].append(timings["execTotalTime"])
    return {
        "vector1_client_s_median": statistics.median(client_s),
        "vector1_requests_s_median": statistics.median(raw_s),
        "server_exec_s_median": {k: statistics.median(v) for k, v in server.items()},
    }


METHODS = {"ours": run_ours, "client": run_client, "floor": run_floor}


# ------------------------------------------------------------------------------------------------ driver
def child(name: str, url: str) -> dict:
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--method", name, "--url", url],
            capture_output=True,
            text=True,
            check=True,
        )
    except subprocess.CalledProcessError as e:
        sys.stderr.write(e.stderr)
        raise
    return json.loads(out.stdout.strip().splitlines()[-1])


def pct(values: list[float], q: float) -> float:
    """The q-quantile, linear between closest ranks (numpy's default)."""
    v = sorted(values)
    i = (len(v) - 1) * q
    lo = int(i)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (i - lo)


def summary(ticks: list[float]) -> dict:
    return {
        "p50_s": round(pct(ticks, 0.5), 5),
        "p95_s": round(pct(ticks, 0.95), 5),
        "max_s": round(max(ticks), 5),
        "ticks": len(ticks),
    }


def prometheus_version() -> str:
    try:
        out = subprocess.run(["/usr/bin/prometheus", "--version"], capture_output=True, text=True).stdout
        return out.split()[2] if out else "?"
    except (OSError, IndexError):
        return "?"


def main() -> None:
    import prometheus_api_client  # noqa: F401 - only to fail early when it is missing

    from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer, build_tsdb, copy_tsdb
    from foxhunt_obs.sandbox.story.scenario import parse_scenario

    t_bench = time.perf_counter()
    scenario = parse_scenario(SCENARIO, "bench/sensors.py")
    t0 = time.perf_counter()
    tsdb = build_tsdb(scenario, RESULTS / "tmp")
    build_s = time.perf_counter() - t0
    print(f"TSDB ready in {build_s:.1f} s: {tsdb}", file=sys.stderr)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="foxhunt-bench-sensors-") as work:
        copy_tsdb(tsdb, Path(work) / "tsdb")
        with PrometheusServer(Path(work) / "tsdb", workdir=Path(work)) as prom:
            child("ours", prom.url)  # warm Prometheus's page and chunk caches once
            runs: dict[str, list[dict]] = {"ours": [], "client": []}
            for _ in range(PASSES):
                for m in runs:
                    runs[m].append(child(m, prom.url))
            floor = child("floor", prom.url)
    load_after = os.getloadavg()[0]

    ours_ticks = [s for r in runs["ours"] for s in r["ticks_s"]]
    client_ticks = [s for r in runs["client"] for s in r["ticks_s"]]
    ours, client = summary(ours_ticks), summary(client_ticks)
    ours["p95_s_per_pass"] = [round(pct(r["ticks_s"], 0.95), 5) for r in runs["ours"]]
    client["p95_s_per_pass"] = [round(pct(r["ticks_s"], 0.95), 5) for r in runs["client"]]
    queries = [s for r in runs["ours"] for s in r["queries_s"]]
    overhead = [t - q for r in runs["ours"] for t, q in zip(r["ticks_s"], r["queries_s"])]
    ours["queries_s_median"] = round(statistics.median(queries), 5)
    ours["engine_s_median"] = round(statistics.median(overhead), 5)  # evaluate, state, cursor
    first = runs["ours"][0]
    rule_ids = [r for r in first["per_query_s"] if r != "GPUs per pod"]
    per_rule = {}
    for rid in [*rule_ids, *(["GPUs per pod"] if "GPUs per pod" in first["per_query_s"] else [])]:
        samples = [s for r in runs["ours"] for s in r["per_query_s"].get(rid, [])]
        per_rule[rid] = {
            "query_s_median": round(statistics.median(samples), 5),
            "query_s_max": round(max(samples), 5),
            "calls_per_pass": len(first["per_query_s"][rid]),
            "prometheus_exec_s_median": (
                round(floor["server_exec_s_median"][rid], 5) if rid in floor["server_exec_s_median"] else None
            ),
            "series_max": first["per_query_series_max"][rid],
        }
    ours.update(
        {
            "rules_evaluated": first["evaluated"],
            "rules_in_catalog": first["rules_in_catalog"],
            "findings_per_pass": first["findings"],
            "notifications_per_pass": first["notifications"],
            "cursor_bytes_at_end": first["cursor_bytes"],
            "load_rules_s_median": round(
                statistics.median(r["load_rules_s_median"] for r in runs["ours"]), 5
            ),
        }
    )
    result = {
        "benchmark": "sensors",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "prometheus": prometheus_version(),
            "prometheus_api_client": _version("prometheus-api-client"),
            "load_average_1m": {"before": round(load_before, 2), "after": round(load_after, 2)},
        },
        "data": {
            "gpus": NODES * GPUS,
            "nodes": NODES,
            "hours": HOURS,
            "step_s": STEP,
            "pods": len(PODS),
            "incidents": len(INCIDENTS),
            "ticks_per_pass": TICKS,
            "tick_every_s": EVERY.total_seconds(),
            "passes": PASSES,
            "sources": "Prometheus only: the 9 Prometheus rules of the catalog's 15; sinks=[]",
            "tsdb_build_seconds": round(build_s, 1),
            "tsdb_from_cache": build_s < 1.0,  # first build on this machine: ~52 s (2 cores)
        },
        "targets": TARGETS,
        "methods": {"ours": ours, "client": client},
        "per_rule": per_rule,
        "floor": {
            "vector1_round_trip_s_prometheus_api_client": round(floor["vector1_client_s_median"], 6),
            "vector1_round_trip_s_requests": round(floor["vector1_requests_s_median"], 6),
        },
        "ratios": {
            "client_over_ours_p50": round(client["p50_s"] / ours["p50_s"], 3),
            "client_over_ours_p95": round(client["p95_s"] / ours["p95_s"], 3),
            "ours_p50_over_vector1_round_trip": round(ours["p50_s"] / floor["vector1_client_s_median"], 1),
        },
        "mlflow": (
            "not measured: the sandbox's MLflow store is written through a running `mlflow server` "
            "(sandbox/servers/mlflow_server.build_store), and the sensor reads MLflow over REST by default; "
            "bench/mlflow_ingest.py measures that source"
        ),
        "target_check": {"tick_p95_s": ours["p95_s"], "ok": ours["p95_s"] <= TARGETS["tick_p95_s"]},
    }
    result["bench_seconds"] = round(time.perf_counter() - t_bench, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sensors.json").write_text(json.dumps(result, indent=2) + "\n")

    n = len(first["evaluated"])
    print(
        f"alert tick, {NODES * GPUS} GPUs, {n} Prometheus rules of {first['rules_in_catalog']} (Prometheus only)"
    )
    print(f"{'method':34} {'p50 s':>8} {'p95 s':>8} {'max s':>8}")
    print(f"{'ours (engine.tick)':34} {ours['p50_s']:8.4f} {ours['p95_s']:8.4f} {ours['max_s']:8.4f}")
    print(
        f"{'client (custom_query per rule)':34} {client['p50_s']:8.4f} {client['p95_s']:8.4f} {client['max_s']:8.4f}"
    )
    print(
        f"ours per tick (median): queries {ours['queries_s_median']:.4f} s, engine {ours['engine_s_median']:.4f} s;"
        f" load_rules() outside tick {ours['load_rules_s_median']:.4f} s"
    )
    print(f"{'query (median of ticks)':34} {'ours s':>8} {'prom s':>8} {'series':>8}")
    for rid, p in per_rule.items():
        exec_s = (
            f"{p['prometheus_exec_s_median']:8.4f}"
            if p["prometheus_exec_s_median"] is not None
            else f"{'-':>8}"
        )
        print(f"{rid:34} {p['query_s_median']:8.4f} {exec_s} {p['series_max']:8d}")
    f = result["floor"]
    print(
        f"vector(1) round trip: {f['vector1_round_trip_s_prometheus_api_client'] * 1000:.2f} ms (prometheus-api-client),"
        f" {f['vector1_round_trip_s_requests'] * 1000:.2f} ms (requests)"
    )
    r = result["ratios"]
    print(f"client / ours: p50 {r['client_over_ours_p50']:.2f}x, p95 {r['client_over_ours_p95']:.2f}x")
    print(f"MLflow source: {result['mlflow']}")
    tc = result["target_check"]
    print(
        f"tick p95 {tc['tick_p95_s']:.3f} s (target <= {TARGETS['tick_p95_s']}: {'ok' if tc['ok'] else 'MISSED'})"
    )


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--method", choices=sorted(METHODS))
    p.add_argument("--url")
    a = p.parse_args()
    if a.method:
        print(json.dumps(METHODS[a.method](a.url)))
    else:
        main()
