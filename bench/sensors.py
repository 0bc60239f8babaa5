"""Benchmark: the alert sensor's tick (`engine.tick` as the sensor calls it) against a real Prometheus
holding 6 h at 15 s of 64 GPUs (8 p4de nodes x 8) and 1,024 GPUs (128 nodes), at 60 evaluation times a
pass, in one run. Against: the same one query at a time (`ours_serial`, whose findings must match tick by
tick); the obvious alternative, a hand-written sensor's prometheus-api-client `custom_query` per rule
(`client`); and the floor, Prometheus's own execution of the rules' queries.

The scenario (generated below: 6 h at 15 s; per group of 8 nodes three experiments, pods that start, end and
share nodes, a stall, ECC bursts, a node lost for 30 min, idle nodes, an under-used pod; 1,024 GPUs repeat
the group 16 times, so the incidents and findings grow with the cluster) is backfilled into a TSDB holding
only what the Prometheus rules read (RAW_METRICS, then the canonical RECORDS evaluated over them by the
sandbox's rule backfill), cached under bench/results/tmp/. A real Prometheus serves it. Only the Prometheus
source is configured, so a tick evaluates the catalog's Prometheus rules (the MLflow, CloudWatch, EC2 and
lake rules are skipped, as when their source is not configured).

  ours         engine.tick as foxhunt_obs/defs/alerts/sensors.py calls it (load_rules_or_last_good, its
               budgets; sinks=[]) at 60 evaluation times spread over the scenario (every 6 min), the cursor
               carried from tick to tick; a new client per tick, as the sensor builds its resources per
               tick. The rules' queries run side by side (the client's queries_at_once). Every instant
               query is timed, and every tick's findings hashed.
  ours_serial  the same with queries_at_once = 1 (the queries one after another, as they
               ran before queries_at_once); its findings must hash the same at every tick
  client       the obvious alternative, what a hand-written sensor would do: the same rule expressions as
               prometheus-api-client PrometheusConnect.custom_query(expr, params={"time": now}) one after
               another, a new PrometheusConnect per tick, no evaluation, no alert state
  floor        one instant query round trip, `vector(1)`, through a warm PrometheusConnect and a bare requests
               Session; and Prometheus's own execution time of each rule's query (stats=all), per rule

Each method runs in a fresh process (imports are not timed), PASSES times, alternating; one discarded `ours`
pass first warms Prometheus's page and chunk caches. The ticks of the passes are pooled for p50 / p95 / max.
Writes bench/results/sensors.json and prints a table. `--cross-check` also runs `ours` at 64 GPUs on the
sandbox's full build (every metric, every record) and compares the findings tick by tick.
"""

from __future__ import annotations

import argparse
import hashlib
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
GROUP_NODES, GPUS, HOURS, STEP = 8, 8, 6, 15
SIZES = (1, 16)  # groups of 8 nodes: 64 and 1,024 GPUs (128 p4de nodes), in the same run
PASSES = {1: 3, 16: 2}  # per size: 1,024 GPUs' ticks take longer, two passes keep the bench under 10 min
TICKS, EVERY = 60, timedelta(minutes=6)
START = datetime(2026, 11, 16, tzinfo=timezone.utc)
FIRST_TICK = START + timedelta(minutes=3)
ROUND_TRIPS = 200

# The series the Prometheus rules read, through the canonical records (deploy/prometheus/
# foxhunt-recording-rules.yaml): a TSDB of these alone answers every rule as the full one does (checked at
# 64 GPUs: the same findings and notifications), and 1,024 GPUs build in minutes, not the better part of an
# hour. GR_ENGINE_ACTIVE is foxhunt:gpu_util:ratio's fallback for GPUs without GPU_UTIL (MIG slices): none here.
RAW_METRICS = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_XID_ERRORS",
    "up",
    "kube_pod_container_status_restarts_total",
}
RECORDS = {  # the canonical records the catalog's Prometheus rules read
    "foxhunt:gpu_util:ratio",
    "foxhunt:gpu_temp:celsius",
    "foxhunt:gpu_power:watts",
    "foxhunt:gpu_ecc_sbe:total",
    "foxhunt:gpu_ecc_dbe:total",
    "foxhunt:gpu_rows_remapped_uncorrectable:total",
    "foxhunt:gpu_rows_remapped_correctable:total",
    "foxhunt:gpu_row_remap_failure:bool",
    "foxhunt:gpu_xid_last:code",
}

# One group of 8 nodes; a bigger cluster repeats it (node, pod and incident names made unique), so the
# findings grow with the cluster: every group has its stall, ECC bursts, lost node and idle nodes.
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
# (kind, pod or node index, fields)
INCIDENTS = [
    ("stall", "grpo-math-0", "start_h: 2, minutes: 45"),
    ("ecc_sbe", 2, "gpu: 1, start_h: 1.5, minutes: 4, count: 5"),
    ("ecc_dbe", 5, 'gpu: 0, start_h: "3:10", minutes: 0.25, count: 1'),
    ("node_lost", 6, "start_h: 4, minutes: 30"),
]


def node_name(group: int, i: int) -> str:
    return f"ip-10-0-3-{10 + i}" if group == 0 else f"ip-10-{group}-3-{10 + i}"


def pod_name(group: int, name: str) -> str:
    return name if group == 0 else f"{name}-g{group}"


def scenario_text(groups: int) -> str:
    nodes = [node_name(g, i) for g in range(groups) for i in range(GROUP_NODES)]
    pods = "".join(
        f"  - {{name: {pod_name(g, n)}, experiment: {e}, node: {node_name(g, node)}, gpus: {gs}, start_h: {s},"
        f" end_h: {t}, util: {{base: {b}, amplitude: {a}, period_h: {p}, noise: {z}}}}}\n"
        for g in range(groups)
        for n, e, node, gs, s, t, b, a, p, z in PODS
    )
    incidents = "".join(
        f"  - {{kind: {kind}, pod: {pod_name(g, who)}, {fields}}}\n"
        if isinstance(who, str)
        else f"  - {{kind: {kind}, node: {node_name(g, who)}, {fields}}}\n"
        for g in range(groups)
        for kind, who, fields in INCIDENTS
    )
    return f"""
name: bench-sensors-{groups * GROUP_NODES}x{GPUS}
start: {START.strftime("%Y-%m-%dT%H:%M:%SZ")}
hours: {HOURS}
scrape_interval_s: {STEP}
seed: 7
node_defaults: {{instance_type: p4de.24xlarge, gpus: {GPUS}, model: NVIDIA A100-SXM4-80GB, mem_mib: 81920}}
nodes: [{", ".join(nodes)}]
experiments:
  - {{name: ppo-humanoid, namespace: rl-train}}
  - {{name: dqn-atari, namespace: rl-atari}}
  - {{name: grpo-math, namespace: llm-rl}}
pods:
{pods}incidents:
{incidents}"""


def is_built(groups: int) -> bool:
    """Whether the restricted TSDB of ``groups`` is already in the cache (the bench then builds nothing)."""
    from foxhunt_obs.sandbox.servers.prometheus import tsdb_path
    from foxhunt_obs.sandbox.story.scenario import parse_scenario
    from foxhunt_obs.sandbox.writers.cache import COMPLETE

    scenario = parse_scenario(scenario_text(groups), "bench/sensors.py")
    return (tsdb_path(scenario, RESULTS / "tmp", RAW_METRICS | RECORDS).parent / COMPLETE).exists()


def build_bench_tsdb(groups: int, full: bool = False) -> Path:
    """The scenario's TSDB (cached under bench/results/tmp/): RAW_METRICS backfilled by promtool, then the
    RECORDS evaluated over them by the sandbox's rule backfill (the same sandbox functions build_tsdb
    calls). ``full``: the sandbox's own build_tsdb (every metric, every record; the cross-check)."""
    from foxhunt_obs.sandbox.servers.prometheus import (
        RECORDING_RULES,
        backfill_openmetrics,
        backfill_rules,
        inline_records,
        tsdb_path,
    )
    from foxhunt_obs.sandbox.story.scenario import parse_scenario
    from foxhunt_obs.sandbox.writers.cache import build_once
    from foxhunt_obs.sandbox.writers.openmetrics import write_blocks

    scenario = parse_scenario(scenario_text(groups), "bench/sensors.py")
    if full:
        from foxhunt_obs.sandbox.servers.prometheus import build_tsdb

        return build_tsdb(scenario, RESULTS / "tmp")
    rules = inline_records(RECORDING_RULES)
    for group in rules["groups"]:
        group["rules"] = [r for r in group["rules"] if r["record"] in RECORDS]
    window = int(scenario.start.timestamp()), int(scenario.end.timestamp()), scenario.step_s

    def build(tmp: Path) -> None:
        files = write_blocks(scenario, tmp / "openmetrics", RAW_METRICS)
        for n, f in enumerate(files, 1):
            backfill_openmetrics(f, tmp / "tsdb")
            f.unlink()
            print(f"  {scenario.name}: series block {n} of {len(files)}", file=sys.stderr)
        backfill_rules(tmp / "tsdb", tmp, [rules], *window, what="recording rules")

    final = tsdb_path(scenario, RESULTS / "tmp", RAW_METRICS | RECORDS).parent
    return build_once(final, build, f"{scenario.name} {scenario.fingerprint()}") / "tsdb"


def tick_times() -> list[datetime]:
    return [FIRST_TICK + k * EVERY for k in range(TICKS)]


def prometheus_rules():
    from foxhunt_obs.lib.alerts.rules import load_rules

    return [r for r in load_rules(overrides="") if r.enabled and r.source == "prometheus"]


# ------------------------------------------------------------------------------------------------ methods
def findings_digest(findings) -> str:
    """The findings of one tick, in the order collect returned them, as a short hash (rule, labels, value,
    extra): two methods with the same digests at every tick found the same things."""
    rows = [(f.rule, sorted(f.labels.items()), repr(f.value), sorted(f.extra.items())) for f in findings]
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def run_ours(url: str, at_once: int | None = None) -> dict:
    """engine.tick at every evaluation time as the alert sensor calls it (its rules loader, its budgets), the
    cursor carried along; every instant query timed, every tick's findings hashed. ``at_once``: the
    Prometheus queries side by side (the client's queries_at_once; None: the default; 1 = one after another)."""
    import prometheus_api_client  # noqa: F401 - the client imports it lazily on the first query

    from foxhunt_obs.defs.alerts.sensors import DELIVERY_BUDGET_S, SINK_BUDGET_S, SOURCE_BUDGET_S
    from foxhunt_obs.lib.alerts import collect as collect_module
    from foxhunt_obs.lib.alerts import engine
    from foxhunt_obs.lib.alerts.collect import Sources
    from foxhunt_obs.lib.alerts.rules import load_rules_or_last_good
    from foxhunt_obs.lib.sources.prometheus import PrometheusClient

    log: list[tuple[str, float, int]] = []

    class TimedClient(PrometheusClient):
        def query(self, query, at, what=""):
            t = time.perf_counter()
            out = super().query(query, at, what)
            log.append((what.removeprefix("alert rule "), time.perf_counter() - t, len(out)))
            return out

    digests: list[str] = []

    def recorded(*args, **kwargs):  # the engine's own collect, its findings hashed on the way out
        evaluation = collect_module.collect(*args, **kwargs)
        digests.append(findings_digest(evaluation.findings))
        return evaluation

    engine.collect = recorded
    load_rules_s = []
    for _ in range(20):  # the sensor loads the catalog every tick, before tick(): reported beside it
        t = time.perf_counter()
        all_rules, error = load_rules_or_last_good(overrides="")
        load_rules_s.append(time.perf_counter() - t)
    assert not error, error
    rules = [r for r in all_rules if r.enabled]

    ticks, queries_s, evaluated, findings, notes, cursor = [], [], set(), 0, defaultdict(int), None
    for now in tick_times():
        # the sensor builds its resources every tick
        client = TimedClient(url, **({"queries_at_once": at_once} if at_once else {}))
        sources = Sources(prometheus=client)
        n0 = len(log)
        t = time.perf_counter()
        cursor, report = engine.tick(
            rules,
            sources,
            [],
            cursor,
            now,
            budget_s=DELIVERY_BUDGET_S,
            source_budget_s=SOURCE_BUDGET_S,
            sink_budget_s=SINK_BUDGET_S,
        )
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
        "findings_digests": digests,
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
        "server_exec_s_sum_median": statistics.median(
            sum(server[k][i] for k in server) for i in range(len(tick_times()))
        ),
    }


METHODS = {
    "ours": run_ours,
    "ours_serial": lambda url: run_ours(url, at_once=1),
    "client": run_client,
    "floor": run_floor,
}
TIMED = ("ours", "ours_serial", "client")  # alternated, PASSES times each


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


def summary(runs: list[dict]) -> dict:
    ticks = [s for r in runs for s in r["ticks_s"]]
    return {
        "p50_s": round(pct(ticks, 0.5), 5),
        "p95_s": round(pct(ticks, 0.95), 5),
        "max_s": round(max(ticks), 5),
        "ticks": len(ticks),
        "p95_s_per_pass": [round(pct(r["ticks_s"], 0.95), 5) for r in runs],
    }


def prometheus_version() -> str:
    try:
        out = subprocess.run(["/usr/bin/prometheus", "--version"], capture_output=True, text=True).stdout
        return out.split()[2] if out else "?"
    except (OSError, IndexError):
        return "?"


def measure(tsdb: Path, passes: int) -> dict:
    """Every method against a Prometheus on a copy of ``tsdb``: one discarded `ours` pass warms its page and
    chunk caches, then PASSES alternating passes of the TIMED methods, then the floor."""
    from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer, copy_tsdb

    with tempfile.TemporaryDirectory(prefix="foxhunt-bench-sensors-") as work:
        copy_tsdb(tsdb, Path(work) / "tsdb")
        with PrometheusServer(Path(work) / "tsdb", workdir=Path(work)) as prom:
            child("ours", prom.url)
            runs: dict[str, list[dict]] = {m: [] for m in TIMED}
            for k in range(passes):
                for m in TIMED:
                    runs[m].append(child(m, prom.url))
                    print(f"    pass {k + 1} of {passes}: {m} done", file=sys.stderr)
            floor = child("floor", prom.url)
    return {"runs": runs, "floor": floor}


def report_size(runs: dict[str, list[dict]], floor: dict) -> dict:
    ours, serial, client = (summary(runs[m]) for m in TIMED)
    first = runs["ours"][0]
    digests = {tuple(r["findings_digests"]) for m in ("ours", "ours_serial") for r in runs[m]}
    # one after another, the tick is its queries plus the engine (evaluate, state, cursor)
    serial_runs = runs["ours_serial"]
    serial["queries_s_median"] = round(statistics.median(q for r in serial_runs for q in r["queries_s"]), 5)
    serial["engine_s_median"] = round(
        statistics.median(t - q for r in serial_runs for t, q in zip(r["ticks_s"], r["queries_s"])), 5
    )
    per_rule = {}
    for rid in first["per_query_s"]:
        samples = [s for r in serial_runs for s in r["per_query_s"].get(rid, [])]
        exec_s = floor["server_exec_s_median"].get(rid)
        per_rule[rid] = {
            "query_s_median_serial": round(statistics.median(samples), 5),
            "query_s_max_serial": round(max(samples), 5),
            "calls_per_pass": len(first["per_query_s"][rid]),
            "prometheus_exec_s_median": round(exec_s, 5) if exec_s is not None else None,
            "series_max": first["per_query_series_max"][rid],
        }
    return {
        "methods": {"ours": ours, "ours_serial": serial, "client": client},
        "findings": {
            "rules_evaluated": first["evaluated"],
            "rules_in_catalog": first["rules_in_catalog"],
            "findings_per_pass": first["findings"],
            "notifications_per_pass": first["notifications"],
            "cursor_bytes_at_end": first["cursor_bytes"],
            # every pass of both orders found the same things at every tick
            "same_findings_every_tick_ours_and_serial": len(digests) == 1,
        },
        "per_rule": per_rule,
        "floor": {
            "vector1_round_trip_s_prometheus_api_client": round(floor["vector1_client_s_median"], 6),
            "vector1_round_trip_s_requests": round(floor["vector1_requests_s_median"], 6),
            "prometheus_exec_s_all_rules_median": round(floor["server_exec_s_sum_median"], 5),
        },
        "load_rules_s_median": round(statistics.median(r["load_rules_s_median"] for r in runs["ours"]), 5),
        "ratios": {
            "p95_over_target": round(ours["p95_s"] / TARGETS["tick_p95_s"], 3),
            "serial_over_ours_p95": round(serial["p95_s"] / ours["p95_s"], 3),
            "client_over_ours_p95": round(client["p95_s"] / ours["p95_s"], 3),
            "ours_p50_over_prometheus_exec_all_rules": round(
                ours["p50_s"] / floor["server_exec_s_sum_median"], 2
            ),
        },
    }


def machine(load: dict) -> dict:
    return {
        "cpus": os.cpu_count(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "prometheus": prometheus_version(),
        "prometheus_api_client": _version("prometheus-api-client"),
        "requests": _version("requests"),
        "pandas": _version("pandas"),
        "load_average_1m": load,
    }


def main(cross_check: bool = False) -> None:
    import prometheus_api_client  # noqa: F401 - only to fail early when it is missing

    t_bench = time.perf_counter()
    sizes, built = {}, {}
    for groups in SIZES:
        gpus = groups * GROUP_NODES * GPUS
        t0 = time.perf_counter()
        cached = is_built(groups)
        built[gpus] = (build_bench_tsdb(groups), round(time.perf_counter() - t0, 1), cached)
        print(f"TSDB of {gpus} GPUs ready in {built[gpus][1]:.1f} s: {built[gpus][0]}", file=sys.stderr)
    load_before = os.getloadavg()[0]
    for groups, (gpus, (tsdb, _, _)) in zip(SIZES, built.items()):
        print(f"  measuring {gpus} GPUs", file=sys.stderr)
        m = measure(tsdb, PASSES[groups])
        sizes[gpus] = report_size(m["runs"], m["floor"])
    load_after = os.getloadavg()[0]
    check = None
    if cross_check:  # the restricted TSDB against the sandbox's full build, at 64 GPUs
        with tempfile.TemporaryDirectory(prefix="foxhunt-bench-sensors-") as work:
            from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer, copy_tsdb

            digests = []
            for tsdb in (build_bench_tsdb(1, full=True), built[min(built)][0]):
                copy_tsdb(tsdb, Path(work) / tsdb.parent.name)
                with PrometheusServer(Path(work) / tsdb.parent.name, workdir=Path(work)) as prom:
                    digests.append(child("ours", prom.url)["findings_digests"])
        check = {"same_findings_every_tick_full_and_restricted_tsdb_64_gpus": digests[0] == digests[1]}

    small, big = sizes[min(sizes)], sizes[max(sizes)]
    o_small, o_big = small["methods"]["ours"], big["methods"]["ours"]
    result = {
        "benchmark": "sensors",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine({"before": round(load_before, 2), "after": round(load_after, 2)}),
        "data": {
            "sizes_gpus": sorted(sizes),
            "nodes_per_group": GROUP_NODES,
            "gpus_per_node": GPUS,
            "hours": HOURS,
            "step_s": STEP,
            "pods_per_group": len(PODS),
            "incidents_per_group": len(INCIDENTS),
            "ticks_per_pass": TICKS,
            "tick_every_s": EVERY.total_seconds(),
            "passes": {str(g * GROUP_NODES * GPUS): n for g, n in PASSES.items()},
            "sources": "Prometheus only (sinks=[]): the catalog's Prometheus rules, the others skipped",
            "tsdb": {
                str(g): {"build_seconds": s, "from_cache": c, "metrics": sorted(RAW_METRICS | RECORDS)}
                for g, (_, s, c) in built.items()
            },
            "queries_at_once": _at_once(),
        },
        "targets": TARGETS,
        "sizes": {str(g): v for g, v in sizes.items()},
        "growth": {
            f"p50_{max(sizes)}_over_{min(sizes)}": round(o_big["p50_s"] / o_small["p50_s"], 2),
            f"p95_{max(sizes)}_over_{min(sizes)}": round(o_big["p95_s"] / o_small["p95_s"], 2),
        },
        "cross_check": check,
        "mlflow": (
            "not measured: the sandbox's MLflow store is written through a running `mlflow server` "
            "(sandbox/servers/mlflow_server.build_store), and the sensor reads MLflow over REST by default; "
            "bench/mlflow_ingest.py measures that source"
        ),
        "target_check": {
            "gpus": max(sizes),
            "tick_p95_s": o_big["p95_s"],
            "ok": o_big["p95_s"] <= TARGETS["tick_p95_s"],
        },
    }
    result["bench_seconds"] = round(time.perf_counter() - t_bench, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sensors.json").write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)


def print_table(result: dict) -> None:
    sizes = result["sizes"]
    first = next(iter(sizes.values()))["findings"]
    print(
        f"alert tick (engine.tick as the sensor calls it), {len(first['rules_evaluated'])} Prometheus rules of "
        f"{first['rules_in_catalog']}, {result['data']['queries_at_once']} queries at once"
    )
    print(f"{'GPUs':>5} {'method':34} {'p50 s':>8} {'p95 s':>8} {'max s':>8}")
    names = {
        "ours": "ours (engine.tick)",
        "ours_serial": "ours, queries one after another",
        "client": "client (custom_query per rule)",
    }
    for g, size in sizes.items():
        for m, label in names.items():
            s = size["methods"][m]
            print(f"{g:>5} {label:34} {s['p50_s']:8.4f} {s['p95_s']:8.4f} {s['max_s']:8.4f}")
    for g, size in sizes.items():
        f, r = size["findings"], size["ratios"]
        print(
            f"{g:>5} GPUs: findings/pass {f['findings_per_pass']}, same every tick serial vs concurrent: "
            f"{f['same_findings_every_tick_ours_and_serial']}; p95/target {r['p95_over_target']:.3f}, "
            f"serial/ours p95 {r['serial_over_ours_p95']:.2f}x, client/ours p95 {r['client_over_ours_p95']:.2f}x, "
            f"Prometheus exec all rules {size['floor']['prometheus_exec_s_all_rules_median']:.4f} s"
        )
    big = sizes[max(sizes, key=int)]
    print(
        f"{'query at ' + max(sizes, key=int) + ' GPUs (serial median)':40} {'ours s':>8} {'prom s':>8} {'series':>8}"
    )
    for rid, p in big["per_rule"].items():
        exec_s = p["prometheus_exec_s_median"]
        shown = f"{exec_s:8.4f}" if exec_s is not None else f"{'-':>8}"
        print(f"{rid:40} {p['query_s_median_serial']:8.4f} {shown} {p['series_max']:8d}")
    print(f"growth {max(sizes, key=int)}/{min(sizes, key=int)}: {result['growth']}")
    if result["cross_check"]:
        print(f"cross-check: {result['cross_check']}")
    tc = result["target_check"]
    print(
        f"tick p95 at {tc['gpus']} GPUs {tc['tick_p95_s']:.3f} s (target <= {TARGETS['tick_p95_s']}: "
        f"{'ok' if tc['ok'] else 'MISSED'}); bench {result['bench_seconds']:.0f} s, load "
        f"{result['machine']['load_average_1m']}"
    )


def _at_once() -> int:
    from foxhunt_obs.lib.sources.prometheus import QUERIES_AT_ONCE

    return QUERIES_AT_ONCE


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
    p.add_argument(
        "--cross-check", action="store_true", help="also compare with the sandbox's full TSDB (64 GPUs)"
    )
    a = p.parse_args()
    if a.method:
        print(json.dumps(METHODS[a.method](a.url)))
    else:
        main(a.cross_check)
