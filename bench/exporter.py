"""Benchmark: the foxhunt GPU exporter against spawning nvidia-smi on every poll (the obvious alternative),
in one run: `/metrics` latency over HTTP of a real exporter process with 8 and 64 fake GPUs (2,000 scrapes
per format, keep-alive), its RSS and CPU per scrape, and one poll cycle in-process over the fake backend,
against `nvidia-smi --query-gpu=... --format=csv` spawned and parsed once per poll (on a machine without a
GPU, a shell stand-in printing the same CSV: a lower bound, since the real tool also loads NVML on every
call).

  scrape   /metrics latency over HTTP on 127.0.0.1 (keep-alive client, 2,000 scrapes per format) of a real
           exporter process with 8 and 64 fake GPUs; its RSS and CPU per scrape from /proc
  poll     one poll cycle in-process over the FakeBackend (its synthetic values included; no driver time),
           wall and thread CPU; the poller alone (every read replayed from a memo); and the cost of
           rendering the exposition once (what the poller pays per format after a poll, and what every
           scrape would pay without the render cache)
  smi      `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` spawned and parsed once per poll;
           where no nvidia-smi exists, a /bin/sh stand-in printing the same CSV: a lower bound, since the
           real tool also loads and initialises NVML on every call (typically tens to hundreds of ms)

Writes bench/results/exporter.json and prints a table. Needs the exporter installed in the venv
(`pip install -e 'exporter[dev]'`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
GPU_COUNTS = (8, 64)
TARGETS = {"scrape_p50_ms_8_gpus": 2.0, "rss_mb": 60.0}
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"  # Prometheus'
SMI_QUERY = ["--query-gpu=utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw",
             "--format=csv,noheader,nounits"]  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def proc_status(pid: int) -> tuple[float, float]:
    """(RSS MB, CPU seconds) of a process, from /proc."""
    rss_kb = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.startswith("VmRSS:"))  # fmt: skip
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return rss_kb / 1024, cpu


def start_exporter(args: list[str]) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "foxhunt_gpu_exporter.cli", "--listen-address", "127.0.0.1:0",
                             "--log-level", "INFO", *args], stderr=subprocess.PIPE, text=True)  # fmt: skip
    for line in proc.stderr:
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)/metrics", line)
        if found:
            return proc, int(found.group(1))
    raise RuntimeError(f"exporter {args} did not start (exit {proc.wait()})")


def scrape_run(port: int, accept: str, n: int) -> tuple[list[float], int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)  # keep-alive, as Prometheus scrapes
    latencies, size = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", "/metrics", headers={"Accept": accept})
        response = conn.getresponse()
        body = response.read()
        latencies.append((time.perf_counter() - t0) * 1000)
        assert response.status == 200, response.status
        size = len(body)
    conn.close()
    return latencies, size


def bench_scrapes(gpus: int, scrapes: int, tmp: Path) -> dict:
    scenario = tmp / f"bench-{gpus}.json"
    scenario.write_text(json.dumps({"gpus": gpus, "hostname": "bench-node"}))
    proc, port = start_exporter(["--fake", str(scenario), "--interval", "1"])
    try:
        scrape_run(port, "", 50)  # warm-up: both formats rendered once, a few polls done
        scrape_run(port, OPENMETRICS, 50)
        time.sleep(2.5)
        rss_warm, cpu0 = proc_status(proc.pid)
        out = {"rss_mb_after_warmup": round(rss_warm, 1)}
        for fmt, accept in (("text", ""), ("openmetrics", OPENMETRICS)):
            t0 = time.perf_counter()
            latencies, size = scrape_run(port, accept, scrapes)
            wall = time.perf_counter() - t0
            out[fmt] = {
                "scrapes": scrapes,
                "p50_ms": round(statistics.median(latencies), 3),
                "p99_ms": round(percentile(latencies, 0.99), 3),
                "max_ms": round(max(latencies), 3),
                "scrapes_per_second": round(scrapes / wall),
                "body_bytes": size,
            }
        rss_end, cpu1 = proc_status(proc.pid)
        out["rss_mb_after_scrapes"] = round(rss_end, 1)
        # Includes the 1 s polls (and their re-renders) that ran meanwhile: the exporter's whole CPU.
        out["exporter_cpu_ms_per_scrape"] = round((cpu1 - cpu0) * 1000 / (2 * scrapes), 4)
        return out
    finally:
        proc.terminate()
        proc.wait(10)


def bench_nvml_mode_rss() -> float:
    """RSS of the real-NVML mode (pynvml loaded) on a machine where NVML may be absent: it serves anyway."""
    proc, _ = start_exporter(["--interval", "1"])
    try:
        time.sleep(2.0)
        return round(proc_status(proc.pid)[0], 1)
    finally:
        proc.terminate()
        proc.wait(10)


class Replay:
    """A backend answering every read with the fake's first answer: what remains is the poller's own cost."""

    PASS_THROUGH = {"init", "shutdown", "register_xid_events", "wait_xid_event", "hostname", "driver_version"}

    def __init__(self, backend):
        self._backend, self._memo = backend, {}

    def __getattr__(self, name):
        fn = getattr(self._backend, name)
        if name in self.PASS_THROUGH:
            return fn

        def replay(*args, **kwargs):
            key = (name, args, tuple(kwargs.items()))
            if key not in self._memo:
                self._memo[key] = fn(*args, **kwargs)
            return self._memo[key]

        return replay


def time_polls(poller, polls: int) -> tuple[list[float], list[float]]:
    poller.poll_once()  # init + identities
    walls, cpus = [], []
    for _ in range(polls):
        w0, c0 = time.perf_counter(), time.thread_time()
        poller.poll_once()
        cpus.append(time.thread_time() - c0)
        walls.append(time.perf_counter() - w0)
    return walls, cpus


def bench_poll(gpus: int, polls: int) -> dict:
    from foxhunt_gpu_exporter.app import Exporter
    from foxhunt_gpu_exporter.fake_backend import FakeBackend
    from prometheus_client.exposition import generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    exporter = Exporter(FakeBackend({"gpus": gpus}), hostname="bench-node")
    walls, cpus = time_polls(exporter.poller, polls)
    overhead, _ = time_polls(Exporter(Replay(FakeBackend({"gpus": gpus})), hostname="bench-node").poller, polls)
    renders = {}
    for fmt, encode in (("text", generate_latest), ("openmetrics", generate_openmetrics)):
        t0 = time.perf_counter()
        for _ in range(20):
            encode(exporter.registry)
        renders[fmt] = round((time.perf_counter() - t0) / 20 * 1000, 3)
    return {
        "polls": polls,
        "poll_ms_median": round(statistics.median(walls) * 1000, 3),
        "poll_ms_p99": round(percentile(walls, 0.99) * 1000, 3),
        "cpu_s_per_poll": round(statistics.mean(cpus), 6),
        "poller_overhead_ms_median": round(statistics.median(overhead) * 1000, 3),  # minus the fake's synthesis
        "render_ms": renders,
    }


def smi_stand_in(tmp: Path, gpus: int) -> str:
    rows = "\n".join(f"{60 + i % 30}, {40000 + i}, 81920, {55 + i % 10}, {250.5 + i:.2f}" for i in range(gpus))
    script = tmp / f"nvidia-smi-{gpus}"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{rows}\nEOF\n")
    script.chmod(0o755)
    return str(script)


def bench_nvidia_smi(gpus: int, polls: int, tmp: Path) -> dict:
    """The nvidia-smi way: one nvidia-smi process per poll, CSV parsed into floats."""
    real = shutil.which("nvidia-smi")
    command = [real or smi_stand_in(tmp, gpus), *SMI_QUERY]
    walls, cpus = [], []
    for _ in range(polls):
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0, c0 = time.perf_counter(), time.thread_time()
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        rows = [[float(v) for v in line.split(",")] for line in out.strip().splitlines()]
        walls.append(time.perf_counter() - w0)
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        child_cpu = (children1.ru_utime - children0.ru_utime) + (children1.ru_stime - children0.ru_stime)
        cpus.append(time.thread_time() - c0 + child_cpu)
    assert real or len(rows) == gpus
    return {
        "polls": polls,
        "poll_ms_median": round(statistics.median(walls) * 1000, 3),
        "poll_ms_p99": round(percentile(walls, 0.99) * 1000, 3),
        "cpu_s_per_poll": round(statistics.mean(cpus), 6),
        "metrics_per_gpu": 5,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scrapes", type=int, default=2000)
    parser.add_argument("--polls", type=int, default=200)
    args = parser.parse_args()
    try:
        import foxhunt_gpu_exporter  # noqa: F401
    except ImportError:
        print("bench/exporter.py: foxhunt_gpu_exporter is not installed in this Python "
              f"({sys.executable}); run: {sys.executable} -m pip install -e 'exporter[dev]'", file=sys.stderr)  # fmt: skip
        return 2
    real_smi = shutil.which("nvidia-smi")
    result: dict = {
        "benchmark": "exporter",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "nvidia_smi": real_smi or "stand-in script (no GPU here)",
        "targets": TARGETS,
        "gpus": {},
    }
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for gpus in GPU_COUNTS:
            ours = {"scrape": bench_scrapes(gpus, args.scrapes, tmp), "poll": bench_poll(gpus, args.polls)}
            smi = bench_nvidia_smi(gpus, min(args.polls, 100), tmp)
            result["gpus"][str(gpus)] = {
                "ours": ours,
                "nvidia_smi_per_poll": smi,
                "ratios": {
                    "nvidia_smi_poll_wall_over_ours": round(smi["poll_ms_median"] / ours["poll"]["poll_ms_median"], 1),
                    "nvidia_smi_poll_cpu_over_ours": round(smi["cpu_s_per_poll"] / ours["poll"]["cpu_s_per_poll"], 1),
                    "nvidia_smi_poll_wall_over_poller_overhead": round(
                        smi["poll_ms_median"] / ours["poll"]["poller_overhead_ms_median"], 1),
                    "uncached_render_over_cached_scrape_openmetrics": round(
                        ours["poll"]["render_ms"]["openmetrics"] / ours["scrape"]["openmetrics"]["p50_ms"], 1),
                },
            }  # fmt: skip
        result["rss_mb_nvml_mode"] = bench_nvml_mode_rss()
    eight = result["gpus"]["8"]["ours"]["scrape"]
    rss = max(max(g["ours"]["scrape"]["rss_mb_after_scrapes"] for g in result["gpus"].values()),
              result["rss_mb_nvml_mode"])  # fmt: skip
    result["target_check"] = {
        "scrape_p50_ms_8_gpus": eight["openmetrics"]["p50_ms"],
        "scrape_ok": max(eight["text"]["p50_ms"], eight["openmetrics"]["p50_ms"]) <= TARGETS["scrape_p50_ms_8_gpus"],
        "rss_mb_max": rss,
        "rss_ok": rss <= TARGETS["rss_mb"],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "exporter.json").write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    return 0


def print_table(r: dict) -> None:
    print(f"\nexporter benchmark ({r['machine']['cpus']} CPUs, Python {r['machine']['python']}; "
          f"nvidia-smi: {r['nvidia_smi']})")  # fmt: skip
    head = f"{'GPUs':>4}  {'what':<34}{'p50 ms':>9}{'p99 ms':>9}{'CPU ms':>9}  note"
    print(head + "\n" + "-" * len(head))
    for gpus, g in r["gpus"].items():
        s, p, smi = g["ours"]["scrape"], g["ours"]["poll"], g["nvidia_smi_per_poll"]
        for fmt in ("text", "openmetrics"):
            print(f"{gpus:>4}  {'scrape /metrics ' + fmt:<34}{s[fmt]['p50_ms']:>9.3f}{s[fmt]['p99_ms']:>9.3f}"
                  f"{s['exporter_cpu_ms_per_scrape']:>9.3f}  {s[fmt]['body_bytes']} B, "
                  f"{s[fmt]['scrapes_per_second']}/s")  # fmt: skip
        print(f"{gpus:>4}  {'poll cycle (fake backend)':<34}{p['poll_ms_median']:>9.3f}{p['poll_ms_p99']:>9.3f}"
              f"{p['cpu_s_per_poll'] * 1000:>9.3f}  poller alone {p['poller_overhead_ms_median']} ms; render text "
              f"{p['render_ms']['text']} ms, openmetrics {p['render_ms']['openmetrics']} ms")  # fmt: skip
        print(f"{gpus:>4}  {'nvidia-smi per poll':<34}{smi['poll_ms_median']:>9.3f}{smi['poll_ms_p99']:>9.3f}"
              f"{smi['cpu_s_per_poll'] * 1000:>9.3f}  x{g['ratios']['nvidia_smi_poll_wall_over_ours']} wall, "
              f"x{g['ratios']['nvidia_smi_poll_cpu_over_ours']} CPU vs ours")  # fmt: skip
        print(f"{gpus:>4}  {'exporter RSS MB':<34}{s['rss_mb_after_scrapes']:>9.1f}")
    t = r["target_check"]
    print(f"      real-NVML mode RSS {r['rss_mb_nvml_mode']} MB")
    print(f"targets: scrape p50 <= {r['targets']['scrape_p50_ms_8_gpus']} ms for 8 GPUs: "
          f"{'ok' if t['scrape_ok'] else 'MISSED'}; RSS <= {r['targets']['rss_mb']} MB: "
          f"{'ok' if t['rss_ok'] else 'MISSED'} ({t['rss_mb_max']} MB)")  # fmt: skip
    print(f"wrote {RESULTS / 'exporter.json'}")


if __name__ == "__main__":
    sys.exit(main())
