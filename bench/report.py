"""Benchmark: the whole weekly cost report over a synthetic week at 15 s of 64, 512 and 4,096 GPUs (p4de
nodes of 8 GPUs, pods holding a node or half of one, idle stretches, CUR lines per instance-hour), in one
run: `gpu_hourly` -> `cost_allocation` -> `utilization_per_dollar` -> `outcome_per_dollar` ->
`weekly_cost_report`, the functions the assets call, each run in a fresh process. Against the obvious
alternative, pandas doing the biggest stage, `gpu_hourly`, with the same output checked row by row; and
`gpu_hourly` summed from the samples instead of each hour's parts.

The lake is written straight to Parquet (no Prometheus, no AWS) with the project's schemas, once per size,
outside the timing: gpu_samples (hour partitions, written by the ingest's own write, with each hour's parts
in the footer; p4de.24xlarge nodes of 8 GPUs; pods hold a node or half a node for hours at a time, with
unheld gaps and idle stretches) and node_samples, costs_hourly (one CUR line per instance-hour at the price
table's p4de price, tagged Project/Environment, plus FSx, EKS and tagged S3 lines) and costs_daily (the CUR
rows summed per resource, as the costs_daily asset does, plus the estimate). The parts' cost to the ingest
is timed on the first day's hours (lake.ingest_parts_ms_per_hour). No MLflow tables: the lake's views are
empty, so outcome_per_dollar is empty, as on a cluster without runs.

  ours    what the assets do, without Dagster, for a run of the 7 days: gpu_hourly -> cost_allocation ->
          utilization_per_dollar -> outcome_per_dollar (the functions the assets call, in lib/tables/:
          each partition written, each asset's metadata queries and checks run), then weekly_cost_report
          (weekly_report_data + render_weekly_report + Lake.write_files; its matplotlib import counted, as
          the asset imports it lazily)
  ours_from_samples
          the same on a lake whose gpu_samples have no parts (written before they existed): gpu_hourly
          sums the samples themselves
  pandas  the obvious alternative for the biggest stage, gpu_hourly: read the week's gpu_samples with
          pandas.read_parquet (only the columns it needs), groupby GPU-hour with the same outputs, write the
          same 7 partitions; its output is checked against ours, and against ours_from_samples

Sizes: 64 and 512 GPUs (ours three times, pandas three times, the median counts) and 4,096 GPUs (ours once,
no pandas: ~15 GB), which shows whether the time grows linearly. `--sizes 64,512` runs fewer. Each method
runs in a fresh process (so peak RSS is its own: ru_maxrss of that process). Imports of
duckdb/pyarrow/pandas/foxhunt_obs are not timed. The targets are in TARGETS.
Writes bench/results/report.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
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
SIZES = (64, 512, 4096)
RUNS = {64: 3, 512: 3, 4096: 1}  # 4,096 GPUs: one run (~2 min), to show the growth is linear
# ours on a lake without the ingest's parts (gpu_samples written before them): gpu_hourly sums the samples
FROM_SAMPLES_RUNS = {64: 3, 512: 1, 4096: 0}
PANDAS_RUNS = {64: 3, 512: 3, 4096: 0}  # pandas at 4,096 GPUs would hold ~15 GB
PANDAS_TIMEOUT_S = 240  # per run; past it the 512-GPU pandas figure is reported as not measured
# The targets: gpu_hourly and the whole report at 64 and 512 GPUs, memory at 512, and growth no worse than
# linear from 512 to 4,096 GPUs (seconds per GPU at 4,096 within 1.25x of 512's)
TARGETS = {
    "gpu_hourly_s_64": 0.8,
    "pandas_over_ours_gpu_hourly_64": 4.0,
    "total_s_64": 2.5,
    "total_s_512": 12.0,
    "peak_rss_gb_512": 1.0,
    "per_gpu_4096_over_512": 1.25,
}

WEEK_START = datetime(2026, 11, 16, tzinfo=timezone.utc)  # a Monday
DAYS = 7
STEP = 15.0
STEPS_PER_HOUR = int(3600 / STEP)
HOURS = DAYS * 24
GPUS_PER_NODE = 8
INSTANCE_TYPE = "p4de.24xlarge"
MODEL = "NVIDIA A100-SXM4-80GB"
MEM_TOTAL = 81920 * 2**20
ACCOUNT = "123456789012"
PROJECT, ENVIRONMENT = "foxhunt", "prod"
FSX_ID, FSX_TYPE, FSX_TIER = "fs-0bench0000000001", "PERSISTENT_2", 125
# experiment, namespace, mean util of its pods, its S3 bucket's $/day (a line tagged Experiment)
EXPERIMENTS = [
    ("dreamer-atari", "rl-train", 0.55, 4.10),
    ("eval-suite", "rl-eval", 0.25, 0.0),
    ("grpo-math-7b", "llm-rl", 0.85, 11.50),
    ("muzero-go", "rl-train", 0.70, 6.20),
    ("ppo-humanoid", "rl-train", 0.62, 2.30),
    ("sac-ant", "rl-train", 0.40, 1.10),
]

NOTE = (
    "Wall seconds on 2 shared cores move with whatever else runs (load_average_1m per size); CPU seconds "
    "(every thread, user + system) are steadier. DuckDB runs 2 threads, pandas' groupby one."
)
STAGES = (
    "gpu_hourly",
    "cost_allocation",
    "utilization_per_dollar",
    "outcome_per_dollar",
    "weekly_cost_report",
)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    """CPU seconds of this process, every thread (user + system): steadier than wall time on a shared box."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def mem_available_mb() -> float:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) / 1024


def open_lake(root: str):
    """The lake at ``root`` with the endpoint the lake resource would take from AWS_ENDPOINT_URL (on S3:
    bench/lake_s3.py's moto server). Not the resource itself: that imports Dagster, whose memory would
    count in the peak RSS measured here."""
    from foxhunt_obs.lib.lake import Lake

    return Lake(root, endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None)


# ------------------------------------------------------------------------------------------------ the lake
def build_lake(root: str, gpus: int, seed: int = 7) -> dict:
    """Write the synthetic week (and the day before it is left empty: the lake starts on the Monday)."""
    import duckdb
    import numpy as np
    import pyarrow as pa

    from foxhunt_obs.lib.analysis.cost_estimate import StorageCapacity, estimate_day, node_hours
    from foxhunt_obs.lib.analysis.prices import load_price_table
    from foxhunt_obs.lib.schemas import COSTS_DAILY, COSTS_HOURLY, GPU_SAMPLES, NODE_SAMPLES
    from foxhunt_obs.lib.tables.gpu_hour_parts import COLUMNS as PART_COLUMNS
    from foxhunt_obs.lib.tables.gpu_hour_parts import hour_parts, write_gpu_samples

    t0 = time.perf_counter()
    parts_con = duckdb.connect(":memory:")  # one for the build, as the ingest has one for its run
    parts_s: list[float] = []
    rng = np.random.default_rng(seed)
    lake = open_lake(root)
    prices = load_price_table("us-east-1")
    p4de = float(prices.get("AmazonEC2", INSTANCE_TYPE).usd)
    fsx_price = prices.get("AmazonFSx", f"{FSX_TYPE}/{FSX_TIER}")
    nodes_n = gpus // GPUS_PER_NODE
    fsx_gib = 1200 * nodes_n
    nodes = sorted(f"ip-10-0-{i // 200}-{i % 200 + 10}" for i in range(nodes_n))
    instance_ids = [f"i-0{rng.integers(16**15):015x}" for _ in nodes]
    uuids = [
        f"GPU-{rng.integers(16**8):08x}-{rng.integers(16**4):04x}-{rng.integers(16**12):012x}"
        for _ in range(gpus)
    ]
    uuid_rank = np.argsort(np.argsort(uuids)).astype(np.int32)  # GPU index -> index in the sorted dictionary
    uuid_dict = pa.array(sorted(uuids), pa.string())
    exp_names = [e[0] for e in EXPERIMENTS]
    namespaces = sorted({e[1] for e in EXPERIMENTS})
    exp_ns = np.array([namespaces.index(e[1]) for e in EXPERIMENTS])

    # Who holds each GPU at each step: pods take a node (8 GPUs) or half of one for 2-14 h, with a few
    # minutes unheld between pods and whole unheld stretches; some pods stall (near-zero util) for a while.
    total = HOURS * STEPS_PER_HOUR
    holder = np.full((gpus, total), -1, np.int32)
    stall = np.zeros((gpus, total), bool)
    pod_names, pod_exp, pod_base, pod_period, pod_phase, pod_mem = [], [], [], [], [], []
    counters = defaultdict(int)

    def new_pod(exp: int) -> int:
        counters[exp] += 1
        pod_names.append(f"{exp_names[exp]}-{counters[exp]:04d}-worker")
        pod_exp.append(exp)
        pod_base.append(min(0.97, max(0.05, EXPERIMENTS[exp][2] + rng.normal(0, 0.08))))
        pod_period.append(rng.uniform(0.5, 4) * STEPS_PER_HOUR)
        pod_phase.append(rng.uniform(0, 2 * np.pi))
        pod_mem.append(rng.uniform(0.35, 0.95))
        return len(pod_names) - 1

    for n in range(nodes_n):
        for half in ((0, 8),) if rng.random() < 0.6 else ((0, 4), (4, 8)):
            t = int(rng.integers(0, 2 * STEPS_PER_HOUR))
            while t < total:
                length = int(rng.uniform(2, 14) * STEPS_PER_HOUR + rng.integers(0, STEPS_PER_HOUR))
                g0, g1 = n * GPUS_PER_NODE + half[0], n * GPUS_PER_NODE + half[1]
                if rng.random() >= 0.12:  # else: nobody holds these GPUs for the stretch
                    pod = new_pod(int(rng.integers(len(EXPERIMENTS))))
                    holder[g0:g1, t : t + length] = pod
                    if rng.random() < 0.3:  # a stall: data loader, checkpoint, waiting on an eval
                        s = t + int(rng.integers(0, max(1, length - 4 * 60)))
                        stall[g0:g1, s : s + int(rng.integers(80, 360))] = True
                t += length + int(rng.integers(0, 80))  # up to 20 minutes unheld before the next pod
    pod_exp_a, pod_base_a = np.array(pod_exp), np.array(pod_base)
    pod_period_a, pod_phase_a, pod_mem_a = np.array(pod_period), np.array(pod_phase), np.array(pod_mem)
    pod_names_a = np.array(pod_names, dtype=object)

    energy = rng.uniform(1e9, 5e9, gpus)  # joules since driver load
    sbe = np.zeros(gpus)
    sbe_rate = np.where(rng.random(gpus) < 0.05, 2e-3, 0.0)  # a few GPUs with correctable ECC errors
    node_of = np.repeat(np.arange(nodes_n, dtype=np.int32), GPUS_PER_NODE)
    gpu_of = np.tile(np.arange(GPUS_PER_NODE, dtype=np.int32), nodes_n)
    reset_hour = 3 * 24 + 9  # node 0's driver reloads: its energy counters restart from 0
    rows = 0

    def dictionary(codes, values) -> pa.DictionaryArray:
        """Per-partition sorted, duplicate-free dictionary, as the ingest writes it."""
        uniq, inv = np.unique(codes, return_inverse=True)
        names = [values(u) for u in uniq]
        order = np.argsort(names, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        return pa.DictionaryArray.from_arrays(
            pa.array(rank[inv].astype(np.int32)), pa.array([names[i] for i in order], pa.string())
        )

    for h in range(HOURS):
        hour = WEEK_START + timedelta(hours=h)
        sl = slice(h * STEPS_PER_HOUR, (h + 1) * STEPS_PER_HOUR)
        steps = np.arange(sl.start, sl.stop)
        hp = holder[:, sl]  # (gpus, steps)
        held = hp >= 0
        pc = np.where(held, hp, 0)
        wave = np.sin(2 * np.pi * steps[None, :] / pod_period_a[pc] + pod_phase_a[pc])
        util = pod_base_a[pc] + 0.12 * wave + rng.normal(0, 0.05, hp.shape)
        util = np.where(stall[:, sl], rng.uniform(0, 0.03, hp.shape), util)
        util = np.round(np.clip(np.where(held, util, 0.0), 0, 1), 2)  # dcgm reports whole percent
        power = np.round(60 + 340 * util + rng.normal(0, 4, hp.shape), 3)
        if h == reset_hour:
            energy[:GPUS_PER_NODE] = 0.0
        e = energy[:, None] + np.cumsum(power * STEP, axis=1)
        energy = e[:, -1].copy()
        s = sbe[:, None] + np.cumsum(rng.random(hp.shape) < sbe_rate[:, None], axis=1)
        sbe = s[:, -1].copy()
        mem = (
            np.round(
                (np.where(held, pod_mem_a[pc] * MEM_TOTAL, 5.2e8) + rng.normal(0, 2e7, hp.shape)) / 2**20
            )
            * 2**20
        )
        util_out = util.copy()
        util_out[rng.random(hp.shape) < 1e-4] = np.nan  # the odd missing reading

        def cells(a):
            return np.ascontiguousarray(a.T).ravel()  # step-major: (ts, node, gpu) order

        n_rows = hp.size
        hp_rows = cells(hp)
        exp_rows = np.where(hp_rows >= 0, pod_exp_a[np.maximum(hp_rows, 0)], -1)
        ts = (hour.timestamp() * 1000 + np.repeat(np.arange(STEPS_PER_HOUR) * STEP * 1000, gpus)).astype(
            "int64"
        )
        table = pa.table(
            {
                "ts": pa.array(ts, pa.timestamp("ms", tz="UTC")),
                "node": pa.DictionaryArray.from_arrays(
                    pa.array(np.tile(node_of, STEPS_PER_HOUR)), pa.array(nodes)
                ),
                "gpu": pa.array(np.tile(gpu_of, STEPS_PER_HOUR)),
                "uuid": pa.DictionaryArray.from_arrays(
                    pa.array(np.tile(uuid_rank, STEPS_PER_HOUR)), uuid_dict
                ),
                "model": pa.DictionaryArray.from_arrays(
                    pa.array(np.zeros(n_rows, np.int32)), pa.array([MODEL])
                ),
                "namespace": dictionary(exp_rows, lambda x: "" if x < 0 else namespaces[exp_ns[x]]),
                "pod": dictionary(hp_rows, lambda x: "" if x < 0 else pod_names_a[x]),
                "container": dictionary(np.minimum(hp_rows, 0), lambda x: "" if x < 0 else "trainer"),
                "experiment": dictionary(exp_rows, lambda x: "" if x < 0 else exp_names[x]),
                "util": cells(util_out),
                "mem_used_bytes": cells(mem),
                "mem_free_bytes": cells(MEM_TOTAL - mem),
                "mem_total_bytes": np.full(n_rows, float(MEM_TOTAL)),
                "temp_celsius": cells(np.round(32 + 45 * util + rng.normal(0, 0.7, hp.shape))),
                "power_watts": cells(power),
                "sm_clock_hz": cells(np.where(held, 1410e6, 210e6)),
                "mem_clock_hz": np.full(n_rows, 1593e6),
                "energy_joules": cells(e),
                "ecc_sbe_total": cells(s),
                "ecc_dbe_total": np.zeros(n_rows),
                "xid_last": np.zeros(n_rows),
                "nvlink_bandwidth_total": cells(util * 1.2e11),
                "gr_engine_active": cells(util * 0.96),
                "step_seconds": np.full(n_rows, STEP),
                # whole GPUs (no MIG), util from DCGM_FI_DEV_GPU_UTIL, stock counters (no remap events)
                "gpu_instance": pa.nulls(n_rows, pa.int32()),
                "gpu_profile": dictionary(np.full(n_rows, -1), lambda x: ""),
                "gpu_share": np.ones(n_rows),
                "util_basis": dictionary(np.zeros(n_rows, np.int64), lambda x: "DCGM_FI_DEV_GPU_UTIL"),
                "mem_reserved_bytes": np.full(n_rows, 559.0 * 2**20),
                "rows_remapped_uncorrectable_total": np.zeros(n_rows),
                "rows_remapped_correctable_total": np.zeros(n_rows),
                "row_remap_failure": np.zeros(n_rows),
                # profiling fields on (SM activity uncommented in the counters file): both activity bases
                "sm_active": cells(np.round(util * 0.8, 3)),
                "tensor_active": cells(np.round(util * 0.5, 3)),
                "vgpu": dictionary(np.full(n_rows, -1), lambda x: ""),
                "step_share": np.ones(n_rows),  # no time-slicing: one row per GPU and step
                "run_id": dictionary(np.full(n_rows, -1), lambda x: ""),
            },
            schema=GPU_SAMPLES.schema,
        )
        # the ingest's write (lib/tables/gpu.py): the samples with their hour's parts in the footer; the
        # parts alone timed on the first day (what moving gpu_hourly's sums to the ingest costs it)
        if h < 24:
            t_parts = time.perf_counter()
            hour_parts(parts_con, table.select(PART_COLUMNS), np.full(n_rows, int(hour.timestamp()) // 3600))
            parts_s.append(time.perf_counter() - t_parts)
        write_gpu_samples(lake, hour, table, parts_con)
        rows += n_rows

        busy = util.reshape(nodes_n, GPUS_PER_NODE, -1).mean(axis=1)  # (nodes, steps)
        nrows = nodes_n * STEPS_PER_HOUR
        node_table = pa.table(
            {
                "ts": pa.array(
                    (
                        hour.timestamp() * 1000 + np.repeat(np.arange(STEPS_PER_HOUR) * STEP * 1000, nodes_n)
                    ).astype("int64"),
                    pa.timestamp("ms", tz="UTC"),
                ),
                "node": np.tile(np.array(nodes, dtype=object), STEPS_PER_HOUR),
                "instance_type": np.full(nrows, INSTANCE_TYPE, dtype=object),
                "instance_id": np.tile(np.array(instance_ids, dtype=object), STEPS_PER_HOUR),
                "cpu_busy": cells(np.clip(0.05 + 0.5 * busy + rng.normal(0, 0.03, busy.shape), 0, 1)),
                "mem_used_bytes": cells(3e10 + 6e11 * busy),
                "mem_total_bytes": np.full(nrows, 1.1e12),
                "net_tx_bytes_per_second": cells(busy * 2e9),
                "net_rx_bytes_per_second": cells(busy * 3e9),
                "gpus_reporting": np.full(nrows, GPUS_PER_NODE, np.int32),
                "gpu_node_up": np.ones(nrows, bool),
                "step_seconds": np.full(nrows, STEP),
            },
            schema=NODE_SAMPLES.schema,
        )
        lake.write_partition(NODE_SAMPLES, NODE_SAMPLES.key(hour), node_table)

    # The bill: CUR 2.0 lines per resource-hour, tags normalised as the CUR source writes them.
    def tags(**kw) -> str:
        return json.dumps(
            {k: v for k, v in kw.items() if v is not None}, sort_keys=True, separators=(",", ":")
        )

    fsx_hourly = float(fsx_price.usd) * fsx_gib / 720  # November: 720 hours
    cur_daily_sql = """
    SELECT CAST($day AS DATE) AS day, 'cur' AS source, project, environment, experiment, service, resource_id,
      sum(cost_usd) AS cost_usd, sum(amortized_usd) AS amortized_usd, sum(usage_amount) AS usage_quantity,
      false AS estimated
    FROM costs_hourly WHERE day = $key
    GROUP BY ALL ORDER BY project, environment, experiment, service, resource_id
    """  # the costs_daily asset's CUR_DAILY_SQL
    node_tags = tags(environment=ENVIRONMENT, project=PROJECT)

    def line(
        hour, service, usage_type, operation, resource_id, amount, usd, experiment="", itype="", tg=None
    ):
        return {
            "hour": hour,
            "billing_period": hour.strftime("%Y-%m"),
            "account_id": ACCOUNT,
            "line_item_type": "Usage",
            "service": service,
            "usage_type": usage_type,
            "operation": operation,
            "instance_type": itype,
            "resource_id": resource_id,
            "usage_amount": amount,
            "cost_usd": usd,
            "amortized_usd": usd,
            "project": PROJECT,
            "environment": ENVIRONMENT,
            "experiment": experiment,
            "tags": tg or node_tags,
            "manifest": "bench-synthetic",
        }

    cur_rows = 0
    for d in range(DAYS):
        day = WEEK_START + timedelta(days=d)
        key = day.strftime("%Y-%m-%d")
        lines = []
        for hh in range(24):
            hour = day + timedelta(hours=hh)
            for iid in instance_ids:
                lines.append(
                    line(
                        hour,
                        "AmazonEC2",
                        f"USE1-BoxUsage:{INSTANCE_TYPE}",
                        "RunInstances",
                        iid,
                        1.0,
                        p4de,
                        itype=INSTANCE_TYPE,
                    )
                )
            lines.append(
                line(
                    hour,
                    "AmazonFSx",
                    "USE1-Lustre-PERSISTENT_2-125",
                    "CreateFileSystem",
                    FSX_ID,
                    fsx_gib / 720,
                    fsx_hourly,
                )
            )
            lines.append(
                line(
                    hour,
                    "AmazonEKS",
                    "USE1-AmazonEKS-Hours:perCluster",
                    "CreateOperation",
                    "arn:aws:eks:bench",
                    1.0,
                    0.10,
                )
            )
        for name, _, _, s3_usd in EXPERIMENTS:
            if s3_usd:
                tg = tags(environment=ENVIRONMENT, experiment=name, project=PROJECT)
                lines.append(
                    line(
                        day,
                        "AmazonS3",
                        "USE1-TimedStorage-ByteHrs",
                        "StandardStorage",
                        f"foxhunt-{name}",
                        s3_usd / 0.023,
                        s3_usd,
                        name,
                        tg=tg,
                    )
                )
        lake.write_partition(COSTS_HOURLY, key, pa.Table.from_pylist(lines, schema=COSTS_HOURLY.schema))
        cur_rows += len(lines)

        con = lake.connect([COSTS_HOURLY, NODE_SAMPLES])
        try:
            cur = con.execute(cur_daily_sql, {"day": day.date(), "key": key}).to_arrow_table()
            est = estimate_day(
                day.date(),
                node_hours(con, day.date()),
                [StorageCapacity(FSX_ID, FSX_TYPE, FSX_TIER, fsx_gib, 24.0)],
                prices,
            )
        finally:
            con.close()
        daily = pa.concat_tables(
            [t.select(COSTS_DAILY.schema.names).cast(COSTS_DAILY.schema) for t in (cur, est.table)]
        )
        lake.write_partition(COSTS_DAILY, key, daily)

    parts_con.close()
    held_frac = float((holder >= 0).mean())
    size = sum(f.stat().st_size for f in Path(root, GPU_SAMPLES.name).rglob("*.parquet"))
    return {
        "gpus": gpus,
        "nodes": nodes_n,
        "gpu_samples_rows": rows,
        "gpu_samples_bytes": size,
        "node_samples_rows": nodes_n * HOURS * STEPS_PER_HOUR,
        "costs_hourly_rows": cur_rows,
        "pods": len(pod_names),
        "held_fraction": round(held_frac, 3),
        "stalled_fraction_of_held": round(float(stall[holder >= 0].mean()), 3),
        "build_seconds": round(time.perf_counter() - t0, 2),
        "build_peak_rss_mb": round(rss_mb()),
        # the ingest's added work per hour partition: its parts (median of the first day's hours)
        "ingest_parts_ms_per_hour": round(1000 * statistics.median(parts_s), 2),
    }


# ------------------------------------------------------------------------------------------------ ours
def run_ours(root: str, from_samples: bool = False) -> dict:
    """The five report assets' work for the week, in order, as their code does it (no Dagster).
    from_samples: as on a lake whose gpu_samples have no parts in their footers (written before them)."""

    from foxhunt_obs.lib.analysis.prices import load_price_table
    from foxhunt_obs.lib.tables import gpu_hour_parts

    if from_samples:
        gpu_hour_parts.FOOTER_KEY = "foxhunt.bench.no_parts"  # no footer has this key: every hour is summed

    store = open_lake(root)
    rss_after_imports = rss_mb()
    days = [WEEK_START + timedelta(days=d) for d in range(DAYS)]
    parts: dict[str, dict[str, float]] = {s: defaultdict(float) for s in STAGES}
    stage_s: dict[str, float] = {}
    stage_cpu: dict[str, float] = {}
    rss_after: dict[str, float] = {}
    out: dict = {}

    class timer:
        def __init__(self, stage: str, part: str):
            self.stage, self.part = stage, part

        def __enter__(self):
            self.t = time.perf_counter()

        def __exit__(self, *exc):
            parts[self.stage][self.part] += time.perf_counter() - self.t

    t_all, c_all = time.perf_counter(), cpu_s()

    # the four daily tables, by the functions their assets call (lib/tables/), metadata included
    from foxhunt_obs.lib.tables.cost_allocation import cost_allocation
    from foxhunt_obs.lib.tables.gpu_hourly import gpu_hourly
    from foxhunt_obs.lib.tables.per_dollar import outcome_per_dollar, utilization_per_dollar

    with timer("cost_allocation", "prices"):
        prices = load_price_table("us-east-1")
    for st, call in (
        ("gpu_hourly", lambda: gpu_hourly(store, days)),
        ("cost_allocation", lambda: cost_allocation(store, days, prices)),
        ("utilization_per_dollar", lambda: utilization_per_dollar(store, days)),
        ("outcome_per_dollar", lambda: outcome_per_dollar(store, days)),
    ):
        t0, c0 = time.perf_counter(), cpu_s()
        built = call()
        stage_s[st], stage_cpu[st], rss_after[st] = time.perf_counter() - t0, cpu_s() - c0, rss_mb()
        out[st] = {"rows": built.rows}
        if st == "gpu_hourly":
            out[st] |= {
                k: built.summary[k]
                for k in ("gpus", "gpu_hours", "active_gpu_hours", "energy_kwh", "hours_summed_from_samples")
            }
        if st == "cost_allocation":
            (check,) = built.checks
            out[st] |= {
                "sums_to_the_bill": check.passed,
                "mismatches": [] if check.passed else check.metadata["mismatches"].split("\n"),
                "week_bill_usd": sum(b[0] for b in built.extra["bills"].values()),
            }

    # weekly_cost_report: the asset's function (it imports matplotlib lazily, so it pays for it here)
    from foxhunt_obs.lib.delivery.send import ReportDelivery
    from foxhunt_obs.lib.tables.weekly import weekly_cost_report

    st = "weekly_cost_report"
    t0, c0 = time.perf_counter(), cpu_s()
    built = weekly_cost_report(store, WEEK_START.date(), "util", ReportDelivery())  # no sink: nothing sent
    stage_s[st], stage_cpu[st], rss_after[st] = time.perf_counter() - t0, cpu_s() - c0, rss_mb()
    report = built.extra["report"]
    out[st] = {
        "files": len(built.summary["files"].splitlines()),
        "html_bytes": len(report.html.encode()),
        "figures": {k: round(float(v), 4) for k, v in report.figures.items() if v == v},
    }

    return {
        "total_s": time.perf_counter() - t_all,
        "total_cpu_s": cpu_s() - c_all,
        "stages_s": stage_s,
        "stages_cpu_s": stage_cpu,
        "parts_s": {s: dict(p) for s, p in parts.items()},
        "rss_mb_after_imports": rss_after_imports,
        "rss_mb_after": rss_after,
        "peak_rss_mb": rss_mb(),
        "out": out,
    }


# ------------------------------------------------------------------------------------------------ pandas
PANDAS_COLUMNS = [
    "ts", "node", "gpu", "uuid", "model", "namespace", "pod", "experiment", "util", "step_seconds",
    "energy_joules", "temp_celsius", "power_watts", "mem_used_bytes", "ecc_sbe_total", "ecc_dbe_total",
    "util_basis", "sm_active", "tensor_active",
]  # fmt: skip


def run_pandas(root: str, out_root: str) -> dict:
    """gpu_hourly the usual way: the week's samples into one DataFrame, groupby GPU-hour, write per day."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    from foxhunt_obs.lib.lake import Lake
    from foxhunt_obs.lib.names import UNATTRIBUTED
    from foxhunt_obs.lib.schemas import GPU_HOURLY, GPU_SAMPLES

    rss_after_imports = rss_mb()
    parts: dict[str, float] = {}
    t_all, c_all = time.perf_counter(), cpu_s()

    t = time.perf_counter()
    df = pd.read_parquet(f"{root}/{GPU_SAMPLES.name}", columns=PANDAS_COLUMNS)
    parts["read"] = time.perf_counter() - t
    rows_read = len(df)

    t = time.perf_counter()
    df = df.sort_values(["uuid", "ts"], kind="stable")
    # counter increases between consecutive samples of a GPU; a decrease is a reset (counts from zero)
    for col, name in (
        ("energy_joules", "inc_energy"),
        ("ecc_sbe_total", "inc_sbe"),
        ("ecc_dbe_total", "inc_dbe"),
    ):
        d = df.groupby("uuid", observed=True, sort=False)[col].diff()
        df[name] = np.where(d < 0, df[col], d)
    df["hour"] = df["ts"].dt.floor("h")
    # per holder: each pod that held the GPU in the hour is a row, the unheld rest a row with pod ''
    # (the bench's cluster has no time-slicing: one row per GPU and step, step_share 1)
    for c in ("namespace", "pod"):
        df[c] = df[c].astype(str)
    held = df["pod"] != ""
    df["experiment"] = np.where(held, df["experiment"].astype(str), UNATTRIBUTED)
    df["active"] = df["util"] * df["step_seconds"]
    df["held_s"] = np.where(held, df["step_seconds"], 0.0)
    df["known_s"] = np.where(df["util"].notna(), df["step_seconds"], 0.0)
    df["watt_s"] = df["power_watts"] * df["step_seconds"]
    df["sm_s"] = df["sm_active"] * df["step_seconds"]
    df["sm_known_s"] = np.where(df["sm_active"].notna(), df["step_seconds"], 0.0)
    df["tensor_s"] = df["tensor_active"] * df["step_seconds"]
    unit = ["hour", "node", "gpu", "uuid"]
    keys = [*unit, "namespace", "pod", "experiment"]
    g = df.groupby(keys, observed=True, sort=True)
    out = g.agg(
        model=("model", "first"),
        samples=("ts", "size"),
        seconds_with_data=("step_seconds", "sum"),
        util_mean=("util", "mean"),
        active_gpu_seconds=("active", "sum"),
        held_seconds=("held_s", "sum"),
        held_wall_seconds=("held_s", "sum"),  # one row per GPU and step: held wall-clock = held seconds
        energy_j=("inc_energy", "sum"),
        watt_s=("watt_s", "sum"),
        temp_max_celsius=("temp_celsius", "max"),
        power_mean_watts=("power_watts", "mean"),
        mem_used_max_bytes=("mem_used_bytes", "max"),
        ecc_sbe_delta=("inc_sbe", "sum"),
        ecc_dbe_delta=("inc_dbe", "sum"),
        activity_seconds=("known_s", "sum"),
        util_basis=("util_basis", "first"),
        sm_active_gpu_seconds=("sm_s", "sum"),
        sm_activity_seconds=("sm_known_s", "sum"),
        tensor_active_gpu_seconds=("tensor_s", "sum"),
    )
    out["util_p95"] = g["util"].quantile(0.95)
    out = out.reset_index()
    # the unit-hour's energy goes to its holders by the power each drew over its seconds
    per_unit = out.groupby(unit, observed=True)
    out["device_seconds"] = per_unit["seconds_with_data"].transform("sum")
    share = out["watt_s"] / per_unit["watt_s"].transform("sum")
    out["energy_kwh"] = per_unit["energy_j"].transform("sum") * share / 3.6e6
    out["pods_seen"] = (out["pod"] != "").groupby([out[c] for c in unit]).transform("sum").astype("int32")
    out = out.drop(columns=["energy_j", "watt_s"])
    for c in ("node", "uuid", "model", "namespace", "experiment"):
        out[c] = out[c].astype(object)
    out["run_id"] = ""
    # the bench's cluster has no MIG: whole GPUs (the lake's own SQL handles slices)
    out["gpu_instance"], out["gpu_profile"], out["gpu_share"] = None, "", 1.0
    out["util_basis"] = out["util_basis"].astype(object)
    parts["groupby"] = time.perf_counter() - t

    t = time.perf_counter()
    lake = Lake(out_root)
    day_of = out["hour"].dt.strftime("%Y-%m-%d")
    for key, part in out.groupby(day_of, sort=True):
        table = pa.Table.from_pandas(part[GPU_HOURLY.schema.names], preserve_index=False)
        lake.write_partition(GPU_HOURLY, key, table)
    parts["write"] = time.perf_counter() - t
    return {
        "seconds": time.perf_counter() - t_all,
        "cpu_s": cpu_s() - c_all,
        "parts_s": parts,
        "rows_read": rows_read,
        "rows_out": len(out),
        "rss_mb_after_imports": rss_after_imports,
        "peak_rss_mb": rss_mb(),
    }


def compare_gpu_hourly(ours_root: str, pandas_root: str) -> dict:
    """Both methods' gpu_hourly for the week, row for row: keys, holders and every number."""
    import numpy as np
    import pyarrow.parquet as pq

    def load(root):
        t = pq.read_table(f"{root}/gpu_hourly").drop_columns(["day"]).to_pandas()
        return t.sort_values(["hour", "node", "gpu", "uuid", "namespace", "pod"]).reset_index(drop=True)

    a, b = load(ours_root), load(pandas_root)
    if len(a) != len(b):
        return {"equal": False, "why": f"rows {len(a)} vs {len(b)}"}
    bad = []
    for c in a.columns:
        x, y = a[c].to_numpy(), b[c].to_numpy()
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            ok = np.allclose(x.astype(float), y.astype(float), rtol=1e-9, atol=1e-6, equal_nan=True)
        else:
            ok = bool((x == y).all())
        if not ok:
            bad.append(c)
    return {"equal": not bad, "rows": len(a), "columns_differing": bad}


# ------------------------------------------------------------------------------------------------ driver
def child(args: list[str], timeout: float | None = None, checkout: str | None = None) -> dict | None:
    """This script in a process of its own; ``checkout``: that checkout's own bench and foxhunt_obs."""
    env = {**os.environ, "PYTHONPATH": checkout} if checkout else None
    script = os.path.join(checkout, "bench", "report.py") if checkout else __file__
    try:
        out = subprocess.run(
            [sys.executable, script, *args], capture_output=True, text=True, check=True, timeout=timeout,
            env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return None
    except subprocess.CalledProcessError as e:
        sys.stderr.write(e.stderr)
        raise
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict]) -> dict:
    med = statistics.median
    return {
        "total_s_median": round(med(r["total_s"] for r in runs), 3),
        "total_s_all": [round(r["total_s"], 3) for r in runs],
        "total_cpu_s_median": round(med(r["total_cpu_s"] for r in runs), 3),
        "stages_s_median": {s: round(med(r["stages_s"][s] for r in runs), 3) for s in STAGES},
        "stages_cpu_s_median": {s: round(med(r["stages_cpu_s"][s] for r in runs), 3) for s in STAGES},
        "parts_s_median": {
            s: {p: round(med(r["parts_s"][s].get(p, 0.0) for r in runs), 3) for p in runs[0]["parts_s"][s]}
            for s in STAGES
        },
        "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs)),
        "rss_mb_after_imports": round(max(r["rss_mb_after_imports"] for r in runs)),
        "rss_mb_after_stage": {s: round(max(r["rss_mb_after"][s] for r in runs)) for s in STAGES},
        "out": runs[0]["out"],
    }


def main(sizes: tuple[int, ...] = SIZES) -> None:
    import duckdb
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    t_bench = time.perf_counter()
    result: dict = {
        "benchmark": "report",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "duckdb": duckdb.__version__,
            "pyarrow": pa.__version__,
            "pandas": pd.__version__,
            "numpy": np.__version__,
        },
        "data": {
            "week_start": WEEK_START.date().isoformat(),
            "days": DAYS,
            "step_s": STEP,
            "instance_type": INSTANCE_TYPE,
            "gpus_per_node": GPUS_PER_NODE,
            "experiments": [e[0] for e in EXPERIMENTS],
            "training_tables": "none (empty views): outcome_per_dollar is empty",
        },
        "targets": TARGETS,
        "note": NOTE,
        "sizes": {},
    }
    per_row_mb = None
    # FOXHUNT_BENCH_BASELINE=<git rev>: the same stages with that revision's code, in the same run, on the
    # same lake (e.g. the commit before a change of grain), so the ratio is not across machines or loads
    baseline_rev = os.environ.get("FOXHUNT_BENCH_BASELINE", "")
    baseline_dir = tempfile.mkdtemp(prefix="foxhunt-bench-baseline-") if baseline_rev else None
    if baseline_rev:
        subprocess.run(["git", "worktree", "add", "--detach", baseline_dir, baseline_rev], check=True,
                       capture_output=True, cwd=os.path.dirname(os.path.abspath(__file__)))  # fmt: skip
        result["baseline"] = {"rev": baseline_rev}
    try:
        for gpus in sizes:
            load_before = os.getloadavg()[0]
            with tempfile.TemporaryDirectory(prefix=f"foxhunt-bench-report-{gpus}-") as work:
                lake_dir, pandas_dir = f"{work}/lake", f"{work}/pandas"
                lake_info = child(["--build", lake_dir, "--gpus", str(gpus)])
                print(f"{gpus} GPUs: lake built in {lake_info['build_seconds']} s", file=sys.stderr)
                ours_runs = [child(["--method", "ours", "--lake", lake_dir]) for _ in range(RUNS[gpus])]
                pandas_runs, skipped = [], None
                # pandas holds the whole week in memory: from the 64-GPU run's peak, scaled by rows, decide
                # whether this size fits in what the machine has free now (with a 30 % margin)
                need = None
                if per_row_mb is not None:
                    need = 180 + per_row_mb * lake_info["gpu_samples_rows"]
                    if need * 1.3 > mem_available_mb():
                        skipped = f"needs ~{need / 1024:.1f} GB (scaled from 64 GPUs), {mem_available_mb() / 1024:.1f} GB free: not run"
                for _ in range(PANDAS_RUNS[gpus] if skipped is None else 0):
                    shutil.rmtree(pandas_dir, ignore_errors=True)
                    r = child(
                        ["--method", "pandas", "--lake", lake_dir, "--out", pandas_dir], PANDAS_TIMEOUT_S
                    )
                    if r is None:
                        skipped = f"a run took over {PANDAS_TIMEOUT_S} s: not measured"
                        break
                    pandas_runs.append(r)
                check = compare_gpu_hourly(lake_dir, pandas_dir) if pandas_runs else None
                samples_runs = [
                    child(["--method", "ours", "--lake", lake_dir, "--from-samples"])
                    for _ in range(FROM_SAMPLES_RUNS[gpus])
                ]
                samples_check = (
                    compare_gpu_hourly(lake_dir, pandas_dir) if pandas_runs and samples_runs else None
                )
                # last: the baseline rewrites the lake's derived tables in its own grain
                base_runs = [
                    child(["--method", "ours", "--lake", lake_dir], checkout=baseline_dir)
                    for _ in range(RUNS[gpus] if baseline_dir else 0)
                ]
            ours = summarize(ours_runs)
            entry: dict = {"lake": lake_info, "ours": ours}
            if samples_runs:
                fs = summarize(samples_runs)
                entry["ours_from_samples"] = {
                    k: fs[k]
                    for k in ("total_s_median", "stages_s_median", "stages_cpu_s_median", "peak_rss_mb")
                }
                entry["ours_from_samples"]["gpu_hourly_out"] = fs["out"]["gpu_hourly"]
                entry["ours_from_samples"]["same_gpu_hourly_as_pandas"] = samples_check
            if base_runs:
                base = summarize(base_runs)
                entry["baseline"] = {k: base[k] for k in ("total_s_median", "stages_s_median", "peak_rss_mb")}
                entry["ours_over_baseline"] = {
                    "total_seconds": round(ours["total_s_median"] / base["total_s_median"], 2),
                    "peak_rss": round(ours["peak_rss_mb"] / base["peak_rss_mb"], 2),
                }
                print(
                    f"{gpus} GPUs: ours {ours['total_s_median']} s, {ours['peak_rss_mb']} MB; baseline "
                    f"{baseline_rev[:10]} {base['total_s_median']} s, {base['peak_rss_mb']} MB",
                    file=sys.stderr,
                )
            if pandas_runs:
                p_med = statistics.median(r["seconds"] for r in pandas_runs)
                entry["pandas_gpu_hourly"] = {
                    "seconds_median": round(p_med, 3),
                    "seconds_all": [round(r["seconds"], 3) for r in pandas_runs],
                    "parts_s_median": {
                        k: round(statistics.median(r["parts_s"][k] for r in pandas_runs), 3)
                        for k in pandas_runs[0]["parts_s"]
                    },
                    "peak_rss_mb": round(max(r["peak_rss_mb"] for r in pandas_runs)),
                    "rows_read": pandas_runs[0]["rows_read"],
                    "rows_out": pandas_runs[0]["rows_out"],
                    "same_output_as_ours": check,
                }
                p_cpu = statistics.median(r["cpu_s"] for r in pandas_runs)
                p_rss = max(r["peak_rss_mb"] for r in pandas_runs)
                entry["pandas_gpu_hourly"]["cpu_s_median"] = round(p_cpu, 3)
                entry["pandas_gpu_hourly"]["predicted_peak_rss_mb"] = round(need) if need else None
                entry["ratios"] = {
                    "pandas_over_ours_gpu_hourly_seconds": round(
                        p_med / ours["stages_s_median"]["gpu_hourly"], 2
                    ),
                    "pandas_over_ours_gpu_hourly_cpu_seconds": round(
                        p_cpu / ours["stages_cpu_s_median"]["gpu_hourly"], 2
                    ),
                    "pandas_gpu_hourly_over_ours_whole_report_peak_rss": round(
                        p_rss / ours["peak_rss_mb"], 2
                    ),
                }
                if per_row_mb is None:
                    per_row_mb = (p_rss - pandas_runs[0]["rss_mb_after_imports"]) / pandas_runs[0][
                        "rows_read"
                    ]
            else:
                entry["pandas_gpu_hourly"] = {"skipped": skipped or "not run at this size"}
            entry["load_average_1m"] = {
                "before": round(load_before, 2),
                "after": round(os.getloadavg()[0], 2),
            }
            result["sizes"][str(gpus)] = entry

    finally:
        if baseline_dir:
            subprocess.run(["git", "worktree", "remove", "--force", baseline_dir], capture_output=True,
                           cwd=os.path.dirname(os.path.abspath(__file__)))  # fmt: skip
    result["target_check"] = check_targets(result["sizes"])
    first = min(int(g) for g in result["sizes"])
    result["growth_over_smallest"] = {
        g: {
            "gpus": int(g) / first,
            "total_s": round(
                e["ours"]["total_s_median"] / result["sizes"][str(first)]["ours"]["total_s_median"], 2
            ),
            "peak_rss": round(
                e["ours"]["peak_rss_mb"] / result["sizes"][str(first)]["ours"]["peak_rss_mb"], 2
            ),
        }
        for g, e in result["sizes"].items()
    }
    result["bench_seconds"] = round(time.perf_counter() - t_bench, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "report.json").write_text(json.dumps(result, indent=2) + "\n")

    print_table(result)


def check_targets(sizes: dict) -> dict:
    def ours(g: int) -> dict | None:
        return sizes[str(g)]["ours"] if str(g) in sizes else None

    small, mid, big = ours(64), ours(512), ours(4096)
    check: dict = {}

    def target(name: str, value: float | None, ok) -> None:
        if value is not None:
            check[name] = {
                "value": round(value, 3),
                "target": TARGETS[name],
                "ok": bool(ok(value, TARGETS[name])),
            }

    if small:
        target("gpu_hourly_s_64", small["stages_s_median"]["gpu_hourly"], lambda v, t: v <= t)
        target("total_s_64", small["total_s_median"], lambda v, t: v <= t)
        ratio = sizes["64"].get("ratios", {}).get("pandas_over_ours_gpu_hourly_seconds")
        target("pandas_over_ours_gpu_hourly_64", ratio, lambda v, t: v >= t)
    if mid:
        target("total_s_512", mid["total_s_median"], lambda v, t: v <= t)
        target("peak_rss_gb_512", mid["peak_rss_mb"] / 1024, lambda v, t: v <= t)
    if mid and big:
        per_gpu = (big["total_s_median"] / 4096) / (mid["total_s_median"] / 512)
        target("per_gpu_4096_over_512", per_gpu, lambda v, t: v <= t)
    check["sums_to_the_bill"] = all(
        sizes[g]["ours"]["out"]["cost_allocation"]["sums_to_the_bill"] for g in sizes
    )
    check["same_output_as_pandas"] = all(
        e["pandas_gpu_hourly"]["same_output_as_ours"]["equal"]
        for e in sizes.values()
        if "same_output_as_ours" in e["pandas_gpu_hourly"]
    )
    return check


def print_table(result: dict) -> None:
    sizes = result["sizes"]
    gs = list(sizes)
    print(f"{'stage (median, s)':26}" + "".join(f"{g + ' GPUs':>11}" for g in gs))
    for st in STAGES:
        print(f"{st:26}" + "".join(f"{sizes[g]['ours']['stages_s_median'][st]:11.3f}" for g in gs))
    print(f"{'total':26}" + "".join(f"{sizes[g]['ours']['total_s_median']:11.3f}" for g in gs))
    print(f"{'peak RSS MB':26}" + "".join(f"{sizes[g]['ours']['peak_rss_mb']:11.0f}" for g in gs))
    print(
        f"{'load average (1 min)':26}" + "".join(f"{sizes[g]['load_average_1m']['before']:11.2f}" for g in gs)
    )
    for g in gs:
        p = sizes[g]["pandas_gpu_hourly"]
        if "skipped" in p:
            continue
        print(
            f"gpu_hourly {g} GPUs: pandas {p['seconds_median']:.2f} s / ours "
            f"{sizes[g]['ours']['stages_s_median']['gpu_hourly']:.2f} s = "
            f"{sizes[g]['ratios']['pandas_over_ours_gpu_hourly_seconds']:.1f}x; same output: "
            f"{p['same_output_as_ours']['equal']}"
        )
    for g in gs:
        if "ours_from_samples" in sizes[g]:
            f = sizes[g]["ours_from_samples"]
            print(
                f"without the ingest's parts, {g} GPUs: gpu_hourly {f['stages_s_median']['gpu_hourly']:.2f} s, "
                f"total {f['total_s_median']:.2f} s; parts cost the ingest "
                f"{sizes[g]['lake']['ingest_parts_ms_per_hour']:.1f} ms an hour"
            )
    for name, c in result["target_check"].items():
        if isinstance(c, dict):
            print(f"target {name}: {c['value']} (target {c['target']}): {'ok' if c['ok'] else 'MISSED'}")
        else:
            print(f"{name}: {c}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--build", metavar="DIR")
    p.add_argument("--gpus", type=int)
    p.add_argument("--method", choices=["ours", "pandas"])
    p.add_argument("--lake")
    p.add_argument("--out")
    p.add_argument("--from-samples", action="store_true")
    p.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")), default=SIZES)
    a = p.parse_args()
    if a.build:
        print(json.dumps(build_lake(a.build, a.gpus)))
    elif a.method == "ours":
        print(json.dumps(run_ours(a.lake, a.from_samples), default=str))
    elif a.method == "pandas":
        print(json.dumps(run_pandas(a.lake, a.out)))
    else:
        main(a.sizes)
