"""Benchmark: the lake on S3 at scale. One week of 1,024 GPUs at 15 s (bench/report.py's synthetic
cluster) written through `Lake.write_partition` and the weekly report computed from it, on an S3 lake served
by a moto server against a local-disk lake in the same run, each step in a fresh process; the two lakes'
outputs must agree. moto answers on loopback from memory: the S3 figures carry the S3 API's request and
(de)serialisation cost, not a real bucket's latency.

The week is bench/report.py's synthetic cluster (p4de nodes of 8 GPUs, pods holding a node or half of one,
stalls, a driver reload, CUR lines per instance-hour), written through Lake.write_partition as the ingest
assets write theirs (lib/tables/gpu.py, costs.py): the samples are generated, not fetched from Prometheus,
which at ~400k points/s (bench/results/prometheus_ingest.json) would need most of an hour per backend here. The
report is bench/report.py's run_ours: gpu_hourly -> cost_allocation -> utilization_per_dollar ->
outcome_per_dollar -> weekly_cost_report, the lib functions the assets call, on the lake the resource opens
(Lake with AWS_ENDPOINT_URL).

  local   the lake in a temp folder on this machine's disk
  s3      the lake at s3://foxhunt-bench-lake/lake on a moto server (a real HTTP server process, as the
          sandbox runs it; objects in its memory, so S3's network latency is not in the figures)

Each step (write, report) runs in a fresh process, so its peak RSS is its own (ru_maxrss); the report runs
RUNS times per backend and the median counts. The two backends' outputs must agree (rows, GPU-hours, the
bill, the report's figures): a difference fails the bench. Writes bench/results/lake_s3.json, prints a table.
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
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run as a script from anywhere

RESULTS = HERE / "results"
GPUS = 1024
RUNS = 2
BUCKET = "foxhunt-bench-lake"
S3_ROOT = f"s3://{BUCKET}/lake"
NOTE = (
    "moto keeps objects in its own process's memory and answers on loopback: the S3 figures carry the "
    "S3 API's request and (de)serialisation cost, not a real bucket's latency or bandwidth. Wall seconds "
    "on 2 shared cores move with the load (load_average_1m)."
)


def child(args: list[str], env: dict[str, str]) -> dict:
    """bench/report.py's --build or --method ours in a process of its own; its last stdout line."""
    out = subprocess.run(
        [sys.executable, str(HERE / "report.py"), *args],
        capture_output=True, text=True, env=env, timeout=3600,
    )  # fmt: skip
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        raise SystemExit(f"bench/report.py {' '.join(args)} failed with {out.returncode}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def same_outputs(a: dict, b: dict) -> list[str]:
    """The report outputs of two runs compared key by key (floats to 1e-9 relative); the differing keys."""
    bad: list[str] = []

    def walk(x, y, path):
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), f"{path}.{k}")
        elif isinstance(x, float) or isinstance(y, float):
            if x is None or y is None or abs(x - y) > 1e-9 * max(abs(x), abs(y), 1.0):
                bad.append(path)
        elif x != y:
            bad.append(path)

    walk(a, b, "out")
    return bad


def s3_bytes(endpoint: str) -> tuple[int, int]:
    """Objects and bytes under the S3 lake (the report's files included)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    n = size = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for o in page.get("Contents", []):
            n, size = n + 1, size + o["Size"]
    return n, size


def local_bytes(root: str) -> tuple[int, int]:
    n = size = 0
    for d, _, files in os.walk(root):
        for f in files:
            n, size = n + 1, size + os.path.getsize(os.path.join(d, f))
    return n, size


def backend(name: str, root: str, gpus: int, env: dict[str, str], count) -> dict:
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    built = child(["--build", root, "--gpus", str(gpus)], env)
    write_s = time.perf_counter() - t0
    print(f"{name}: {gpus} GPUs written in {write_s:.1f} s", file=sys.stderr)
    runs = []
    for i in range(RUNS):
        runs.append(child(["--method", "ours", "--lake", root], env))
        print(f"{name}: report run {i + 1}: {runs[-1]['total_s']:.1f} s", file=sys.stderr)
    objects, size = count()
    med = statistics.median
    return {
        "root": root,
        "write": {
            "seconds": round(write_s, 2),
            "peak_rss_mb": built["build_peak_rss_mb"],
            "gpu_samples_rows": built["gpu_samples_rows"],
        },
        "objects": objects,
        "bytes": size,
        "report": {
            "seconds_median": round(med(r["total_s"] for r in runs), 2),
            "seconds_all": [round(r["total_s"], 2) for r in runs],
            "cpu_s_median": round(med(r["total_cpu_s"] for r in runs), 2),
            "stages_s_median": {
                s: round(med(r["stages_s"][s] for r in runs), 2) for s in runs[0]["stages_s"]
            },
            "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs)),
        },
        "out": runs[0]["out"],
        "outputs_stable_across_runs": all(not same_outputs(runs[0]["out"], r["out"]) for r in runs),
        "load_average_1m": {"before": round(load, 2), "after": round(os.getloadavg()[0], 2)},
    }


def main(gpus: int) -> None:
    import boto3
    import duckdb
    import pyarrow as pa

    from foxhunt_obs.sandbox.servers.moto_server import MotoServer

    t_bench = time.perf_counter()
    result: dict = {
        "benchmark": "lake_s3",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "mem_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "python": platform.python_version(),
            "duckdb": duckdb.__version__,
            "pyarrow": pa.__version__,
            "boto3": boto3.__version__,
        },
        "data": {"gpus": gpus, "days": 7, "step_s": 15.0, "source": "bench/report.py build_lake"},
        "note": NOTE,
    }
    with tempfile.TemporaryDirectory(prefix="foxhunt-bench-lake-s3-") as work:
        # the local lake: no AWS in its environment at all
        local_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        local_root = f"{work}/lake"
        result["local"] = backend("local", local_root, gpus, local_env, lambda: local_bytes(local_root))
        with MotoServer(workdir=Path(work) / "moto") as moto:
            s3_env = {
                **local_env,
                "AWS_ENDPOINT_URL": moto.url,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true",
            }
            os.environ.update({k: s3_env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
            boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
            result["s3"] = backend("s3", S3_ROOT, gpus, s3_env, lambda: s3_bytes(moto.url))
            result["s3"]["moto_peak_rss_mb"] = round(moto.rss_bytes() / 2**20)

    local, s3 = result["local"], result["s3"]
    diff = same_outputs(local["out"], s3["out"])
    result["same_outputs"] = {"equal": not diff, "differing": diff}
    result["ratios"] = {
        "s3_over_local_write_seconds": round(s3["write"]["seconds"] / local["write"]["seconds"], 2),
        "s3_over_local_report_seconds": round(
            s3["report"]["seconds_median"] / local["report"]["seconds_median"], 2
        ),
        "s3_over_local_report_peak_rss": round(
            s3["report"]["peak_rss_mb"] / local["report"]["peak_rss_mb"], 2
        ),
    }
    result["bench_seconds"] = round(time.perf_counter() - t_bench, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "lake_s3.json").write_text(json.dumps(result, indent=2) + "\n")

    print(f"{gpus} GPUs x 7 days at 15 s ({local['write']['gpu_samples_rows']:,} gpu_samples rows)")
    print(f"{'':24} {'local disk':>12} {'S3 (moto)':>12} {'S3/local':>9}")
    rows = [
        ("write s", local["write"]["seconds"], s3["write"]["seconds"]),
        ("write peak RSS MB", local["write"]["peak_rss_mb"], s3["write"]["peak_rss_mb"]),
        ("report s (median)", local["report"]["seconds_median"], s3["report"]["seconds_median"]),
        ("report peak RSS MB", local["report"]["peak_rss_mb"], s3["report"]["peak_rss_mb"]),
        ("lake MB", local["bytes"] / 2**20, s3["bytes"] / 2**20),
    ]
    for label, a, b in rows:
        print(f"{label:24} {a:12.1f} {b:12.1f} {b / a:9.2f}")
    for st in local["report"]["stages_s_median"]:
        a, b = local["report"]["stages_s_median"][st], s3["report"]["stages_s_median"][st]
        print(f"  {st:22} {a:12.2f} {b:12.2f} {b / max(a, 1e-9):9.2f}")
    print(f"same outputs on both lakes: {not diff}" + (f" (differing: {', '.join(diff)})" if diff else ""))
    if diff:
        raise SystemExit("the S3 lake's report differs from the local lake's")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=GPUS)
    main(p.parse_args().gpus)
