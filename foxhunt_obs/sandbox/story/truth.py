"""Ground truth of a scenario: every sample the sandbox writes, computed exactly and deterministically.

Each GPU and node draws from its own ``np.random.default_rng((seed, node index, gpu index))``, so adding a
pod to one GPU does not change another's numbers. Values are rounded the way openmetrics.py writes them
(integers for %, MiB, MHz, °C, counters; power to the milliwatt), so what Prometheus returns equals the
truth exactly, not approximately.

Per-GPU series, dcgm-exporter units (canonical lake units alongside, see lib/schemas.py):

* util_pct 0..100 int (idle GPU 0..2, stalled pod exactly 0); util = util_pct / 100
* fb_used_mib / fb_free_mib: ~56-70 GiB while a pod holds the GPU, 0..500 MiB idle
* temp_c int, power_w = 60 + 3.3 × util ± noise (< 400 W, 3 decimals), sm/mem clocks in MHz
* energy_mj: counter since driver load, a per-GPU offset + Σ power × step (exact integer mJ)
* ecc_sbe / ecc_dbe: volatile counters, 0 at start, rising only inside ecc_* incidents
* xid: dcgm's last-XID gauge, always 0
* nvlink_total: a COUNTER (dcgm-exporter declares DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL a counter); it
  rises by util_pct × 1e6 per scrape while a multi-GPU pod holds the GPU, else stays flat.
* gr_active: DCGM_FI_PROF_GR_ENGINE_ACTIVE (a ratio, on by default in every stock counters file):
  0.95 × util_pct / 100 to 4 decimals on a whole GPU, whose util still comes from GPU_UTIL.
* sm_active, tensor_active: DCGM_FI_PROF_SM_ACTIVE and DCGM_FI_PROF_PIPE_TENSOR_ACTIVE (ratios):
  0.8 × and 0.5 × util_pct / 100 to 4 decimals (the same noise as util, clipped with it), on the whole
  GPUs of GPU Operator nodes only: their counters file is the stock one with SM_ACTIVE uncommented
  (every stock list leaves it commented out; PIPE_TENSOR_ACTIVE is on by default). The Helm chart's node
  and MIG slices report neither (NaN in gpu_samples).

A time-sliced GPU (``node.time_sliced``) is held by up to ``replicas`` pods at once: ``holders`` has one
row per replica (the pod index holding it, -1 when free). Each pod's util profile draws its own noise
(``(seed, node index, gpu index, 3000 + pod index)``) and the device is as busy as its pods together,
util = 100 × (1 − Π (1 − u_pod / 100)); each pod keeps its memory level / replicas allocated and
fb_used is their sum. Every device value is the GPU's, whoever holds it.

A MIG GPU (``node.mig``) is reported per slice, as dcgm-exporter does, with no whole-GPU unit
(``gpu_units``): each slice has its own ``holders`` (one row), its own activity ``gr_active`` (the
holder's util profile / 100 to 4 decimals, 0 while no pod holds it; no util_pct: GPU_UTIL is not
reported on slices)
and its own fb_used_mib / fb_free_mib out of the profile's memory (70-86 % of it held, 8-32 MiB idle),
each slice drawing from ``(seed, node index, gpu index, 1000 + GPU instance id)``. The device values
(temp_c, power_w, clocks, energy_mj, xid) are the GPU's, repeated on every slice; they follow the GPU's
activity, the slices' gr_active weighed by their shares. Slices report no ECC and no NVLink counters.
A node with ``exporter: helm-chart`` reports no ECC counters (the chart's counters list has none).

A lost node's GPUs and node_exporter keep running in the truth (counters keep counting) but none of
their samples appear in the tables or the OpenMetrics files.

Nodes are EC2 instances (``bills.instances``): ``instance_id`` is ``i-0`` + 16 hex digits, and a
``node_lost`` incident replaces the instance (the old id up to the loss, a new one from the incident's
end, none in between). kube-state-metrics tells it as ``kube_node_info{provider_id="aws:///<az>/<id>"}``.

Pods are referred to by index (``scenario.pods[i]``, ``Pod.index``), never by name: a name may be reused
(a StatefulSet's pod recreated) and exist in several namespaces. What the pipeline can see is the pair
(namespace, pod name) on a series, so the cost truth (``gpu_allocations``, ``pod_dollars``,
``run_dollars``) charges holders by that pair, as the pipeline must.

The cost policy (docs/cost-model.md), which ``gpu_allocations``, ``pod_dollars`` and ``run_dollars`` implement:

* A unit is a whole GPU or a MIG slice. A unit-hour's cost C = its node's EC2 cost for the hour (the line
  items of the node's instances) ÷ the GPUs reporting on the node in that hour × the unit's gpu_share
  (1 for a whole GPU, the profile's share for a slice); what no slice of a MIG GPU covers is
  ``mig_unsliced``, cluster idle.
* Each reported scrape step of the unit is held by k pods (k = 0 unheld, 1 normally, ≥ 2 on a time-sliced
  GPU): each of the k gets step_s / k held seconds. seconds_with_data = step_s × the unit-hour's reported
  steps (a lost node's steps are not reported).
* A holder P's allocated_usd for the unit-hour = C × held_seconds(P) / seconds_with_data; the unheld part,
  C × unheld_seconds / seconds_with_data, is unallocated (cluster idle).
* active GPU-seconds of P = Σ over its steps of util × step_s / k × gpu_share, util as the device reports
  it (0..1: GPU_UTIL on a whole GPU, GR_ENGINE_ACTIVE on a slice); sm_active_gpu_seconds the same with
  SM_ACTIVE where it is reported (NaN where not). idle_usd of P = allocated_usd × (1 − active_gpu_seconds /
  (held_seconds × gpu_share)).
* A run's dollars: for each of its pods (matched on namespace AND name) and each hour h overlapping the
  run's window [start, end) (a RUNNING run's window ends with the day computed, or where the next run on
  one of its pods starts), the pod's allocated_usd in h on each unit × the seconds of h inside
  [start, end) / the larger of the pod's wall-clock held seconds on that unit in h and the seconds all
  runs' windows cover of that row. Why: the pipeline sees a pod only by (namespace, name), and a reused
  name (a StatefulSet's trainer-0 under one run, then under the next) can hold the same unit in the
  boundary hour between two runs; each run takes the part of the pod-unit-hour its window covers,
  together never more than the row, so neither run inherits the other's spend. It is exact when the
  incarnations hold the same units in a shared hour (the scenarios keep to that); when they hold
  different units, each run's window also covers the other's unit in that hour.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from foxhunt_obs.lib.names import UNATTRIBUTED
from foxhunt_obs.sandbox.story.scenario import MigSlice, Node, Pod, Scenario
from foxhunt_obs.sandbox.writers import bills

MEM_CLOCK_MHZ = 1593  # A100 80GB HBM2e
SM_CLOCK_BUSY_MHZ, SM_CLOCK_IDLE_MHZ = 1410, 210
GR_OF_UTIL = 0.95  # a whole GPU's GR_ENGINE_ACTIVE, as a share of its GPU_UTIL
SM_OF_UTIL, TENSOR_OF_UTIL = 0.8, 0.5  # a whole GPU's SM_ACTIVE and PIPE_TENSOR_ACTIVE, likewise
UTIL_SOURCE, GR_SOURCE = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # util_basis values
# the columns of a MIG GPU's device that every one of its slices repeats (dcgm-exporter's MIG pages)
DEVICE_COLUMNS = ("temp_c", "power_w", "sm_clock_mhz", "mem_clock_mhz", "energy_mj", "xid")
# what an exporter's counters list leaves out (the Helm chart's has no ECC fields)
EXPORTER_LACKS = {
    "gpu-operator": (),
    # and the GPU Operator nodes' counters file has SM_ACTIVE uncommented, the chart's has not
    "helm-chart": ("ecc_sbe", "ecc_dbe", "sm_active", "tensor_active"),
}


def gpu_uuid(scenario: Scenario, node: str, gpu: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{scenario.name}/{node}/{gpu}"))


def pod_restarts(scenario: Scenario, pod: Pod | int | str) -> np.ndarray:
    """kube_pod_container_status_restarts_total of the pod's container at every scrape: 0, then one step
    up per restart of its oom_loop incidents, spread evenly over each window (a crash-looping trainer).
    ``pod``: a Pod, its index, or a name that names one pod only."""
    p = scenario.pod(pod)
    step, n = scenario.step_s, scenario.steps
    bumps = np.zeros(n, dtype=np.int64)
    for inc in scenario.incidents:
        if inc.kind == "oom_loop" and inc.pod_index == p.index:
            a, b = inc.start_s // step, inc.end_s // step
            np.add.at(bumps, a + (np.arange(inc.count) * (b - a)) // inc.count, 1)
    return np.cumsum(bumps)


def pod_uid(scenario: Scenario, pod: Pod | int | str) -> str:
    """The pod's metadata.uid: one per pod, so a reused name gets a new uid, as Kubernetes gives it."""
    p = scenario.pod(pod)
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{scenario.name}/pod/{p.namespace}/{p.name}/{p.start_s}"))


def grid_seconds(scenario: Scenario) -> np.ndarray:
    """Unix seconds of every scrape: start + k * step for k in range(steps), i.e. [start, end)."""
    return int(scenario.start.timestamp()) + np.arange(scenario.steps, dtype=np.int64) * scenario.step_s


def _steps(scenario: Scenario, start_s: int, end_s: int) -> slice:
    return slice(start_s // scenario.step_s, end_s // scenario.step_s)


def _holders(scenario: Scenario, node: Node, gpu: int, mig: MigSlice | None = None) -> np.ndarray:
    """(replicas, steps) int64: the index of the pod holding each replica of the unit at every scrape,
    -1 where free. One row, except a time-sliced GPU's (a row per replica, the pod's ``vgpu``)."""
    rows = 1 if mig else node.replicas_of(gpu)
    out = np.full((rows, scenario.steps), -1, dtype=np.int64)
    for p in scenario.pods:
        if p.node != node.name:
            continue
        if (mig is None and gpu in p.gpus) or (mig is not None and (mig.gpu, mig.instance) in p.slices):
            out[(p.replica(gpu) or 0) if mig is None else 0, _steps(scenario, p.start_s, p.end_s)] = p.index
    return out


def observed(scenario: Scenario, node: str) -> np.ndarray:
    """True at the scrapes where the node answers (False while it is lost)."""
    up = np.ones(scenario.steps, dtype=bool)
    for inc in scenario.incidents:
        if inc.kind == "node_lost" and inc.node == node:
            up[_steps(scenario, inc.start_s, inc.end_s)] = False
    return up


def availability_zone(scenario: Scenario) -> str:
    """Every node's zone: the first of the ``aws:`` block's region (us-east-1 without one)."""
    return f"{scenario.aws.region if scenario.aws else 'us-east-1'}a"


def provider_id(scenario: Scenario, instance_id: str) -> str:
    """A node's ``spec.providerID`` on EKS, as kube_node_info's ``provider_id`` label carries it."""
    return f"aws:///{availability_zone(scenario)}/{instance_id}"


def node_instances(scenario: Scenario, node: str) -> list[tuple[str, np.ndarray]]:
    """(instance id, True at the scrapes it stands for the node) of each of the node's instances."""
    ts = grid_seconds(scenario)
    return [
        (i.instance_id, (ts >= i.start.timestamp()) & (ts < i.end.timestamp()))
        for i in bills.instances(scenario)
        if i.node == node
    ]


def instance_ids(scenario: Scenario, node: str) -> np.ndarray:
    """The node's EC2 instance id at every scrape of the grid, '' where it has none (lost)."""
    out = np.full(scenario.steps, "", dtype=object)
    for iid, alive in node_instances(scenario, node):
        out[alive] = iid
    return out


def _util_of(scenario: Scenario, p: Pod, s: slice, noise: np.ndarray) -> np.ndarray:
    """The pod's util % (unclipped, unrounded) over its steps ``s``: its profile plus ``noise[s]``."""
    t_h = np.arange(s.stop - s.start) * scenario.step_s / 3600
    wave = p.util.amplitude * np.sin(2 * np.pi * t_h / p.util.period_h) if p.util.period_h else 0.0
    return p.util.base + wave + p.util.noise * noise[s]


def slice_track(scenario: Scenario, node: Node, mig: MigSlice) -> dict[str, np.ndarray]:
    """A MIG slice's own values over the full grid: ``holders`` (1 × steps: the index in scenario.pods
    of its pod, -1 when none), ``gr_active`` (ratio), ``fb_used_mib``, ``fb_free_mib``."""
    n = scenario.steps
    rng = np.random.default_rng((scenario.seed, node.index, mig.gpu, 1000 + mig.instance))
    noise = rng.standard_normal(n)
    low, high = int(mig.mem_mib * 0.70), int(mig.mem_mib * 0.86)
    mem_level = rng.integers(low, high, len(scenario.pods))  # MiB a pod keeps allocated, per pod
    mem_jitter = rng.integers(-128, 129, n)
    mem_idle = rng.integers(8, 33, n)
    holders = _holders(scenario, node, mig.gpu, mig)
    holder = holders[0]
    util = np.zeros(n)
    for p in scenario.pods:
        if p.node == node.name and (mig.gpu, mig.instance) in p.slices:
            s = _steps(scenario, p.start_s, p.end_s)
            util[s] = _util_of(scenario, p, s, noise)
    fb_used = np.where(holder >= 0, mem_level[holder] + mem_jitter, mem_idle).astype(np.int64)
    return {
        "holders": holders,
        "gr_active": np.round(np.clip(util, 0, 100) / 100, 4),
        "fb_used_mib": fb_used,
        "fb_free_mib": mig.mem_mib - fb_used,
    }


def gpu_track(scenario: Scenario, node: Node, gpu: int) -> dict[str, np.ndarray]:
    """Every dcgm value of one GPU over the full grid (lost scrapes included), plus ``holders``
    (replicas × steps): the index in scenario.pods of the pod holding each replica of the GPU, -1 when
    none (one row unless the GPU is time-sliced). A MIG GPU's track is its device (no pod holds it whole,
    util_pct is its slices' activity weighed by their shares) with its slices' tracks under ``slices``
    (GPU instance id -> slice_track): what it reports is ``gpu_units``."""
    n, step = scenario.steps, scenario.step_s
    rng = np.random.default_rng((scenario.seed, node.index, gpu))
    # All draws happen up front, in a fixed order, whatever the pods: the numbers depend only on the seed.
    idle_util = rng.integers(0, 3, n)
    noise = rng.standard_normal(n)
    mem_level = rng.integers(57_000, 71_000, len(scenario.pods))  # MiB a pod keeps allocated, per pod
    mem_jitter = rng.integers(-256, 257, n)
    mem_idle = rng.integers(0, 501, n)
    temp_noise = rng.normal(0.0, 0.8, n)
    power_noise = rng.normal(0.0, 2.0, n)
    energy0 = int(rng.integers(10**9, 10**11))
    nvlink0 = int(rng.integers(0, 10**9))

    holders = _holders(scenario, node, gpu)
    shared = node.is_time_sliced(gpu)
    util = idle_util.astype(float)
    multi = np.zeros(n, dtype=bool)  # held by a multi-GPU pod: NVLink traffic
    free = np.ones(n)  # time-sliced: Π (1 - u / 100) over the pods holding it
    mem_held = np.zeros(n, dtype=np.int64)  # MiB its pods keep allocated, together
    for p in scenario.pods:
        if p.node != node.name or gpu not in p.gpus:
            continue
        s = _steps(scenario, p.start_s, p.end_s)
        multi[s] |= len(p.gpus) > 1
        if shared:  # each pod its own noise; the GPU as busy as its pods together
            own = np.random.default_rng((scenario.seed, node.index, gpu, 3000 + p.index)).standard_normal(n)
            free[s] *= 1 - np.clip(_util_of(scenario, p, s, own), 0, 100) / 100
            mem_held[s] += mem_level[p.index] // node.replicas
        else:
            util[s] = _util_of(scenario, p, s, noise)
            mem_held[s] = mem_level[p.index]
    held = (holders >= 0).any(axis=0)
    if shared:
        util = np.where(held, 100 * (1 - free), util)
    slices = {m.instance: slice_track(scenario, node, m) for m in node.slices(gpu)}
    if slices:  # the device is as busy as its slices together
        util = 100 * sum(m.share * slices[m.instance]["gr_active"] for m in node.slices(gpu))
    ecc = {"ecc_sbe": np.zeros(n, dtype=np.int64), "ecc_dbe": np.zeros(n, dtype=np.int64)}
    for inc in scenario.incidents:
        if inc.kind == "stall" and inc.node == node.name and gpu in scenario.pods[inc.pod_index].gpus:
            util[_steps(scenario, inc.start_s, inc.end_s)] = 0.0
        elif inc.kind in ("ecc_sbe", "ecc_dbe") and inc.node == node.name and inc.gpu == gpu:
            a, b = inc.start_s // step, inc.end_s // step
            # `count` errors spread evenly over the window's scrapes (several per scrape if needed)
            np.add.at(ecc[inc.kind], a + (np.arange(inc.count) * (b - a)) // inc.count, 1)

    util_pct = np.clip(np.rint(util), 0, 100).astype(np.int64)
    fb_used = np.where(held, mem_held + mem_jitter, mem_idle).astype(np.int64)
    power_mw = np.clip(np.rint((60 + 3.3 * util_pct + power_noise) * 1000), 50_000, 399_000).astype(np.int64)
    track = {
        "holders": holders,
        "util_pct": util_pct,
        "fb_used_mib": fb_used,
        "fb_free_mib": node.mem_mib - fb_used,
        "temp_c": np.rint(32 + 0.38 * util_pct + temp_noise).astype(np.int64),
        # mW / 1000 is the float nearest the 3-decimal value Prometheus parses from the text
        "power_w": power_mw / 1000,
        "sm_clock_mhz": np.where(util_pct >= 5, SM_CLOCK_BUSY_MHZ, SM_CLOCK_IDLE_MHZ).astype(np.int64),
        "mem_clock_mhz": np.full(n, MEM_CLOCK_MHZ, dtype=np.int64),
        "energy_mj": energy0 + np.cumsum(power_mw * step),  # mW × s = mJ, exact in int64
        "ecc_sbe": np.cumsum(ecc["ecc_sbe"]),
        "ecc_dbe": np.cumsum(ecc["ecc_dbe"]),
        "xid": np.zeros(n, dtype=np.int64),
        "nvlink_total": nvlink0 + np.cumsum(np.where(multi, util_pct * 1_000_000, 0)),
        "gr_active": np.round(util_pct * GR_OF_UTIL / 100, 4),
        "sm_active": np.round(util_pct * SM_OF_UTIL / 100, 4),
        "tensor_active": np.round(util_pct * TENSOR_OF_UTIL / 100, 4),
    }
    if slices:
        track["slices"] = slices
    return track


def gpu_units(
    scenario: Scenario, node: Node, gpu: int, track: dict | None = None
) -> list[tuple[MigSlice | None, dict[str, np.ndarray]]]:
    """What dcgm-exporter reports for one GPU: ``(None, track)`` for a whole GPU, else one
    ``(slice, track)`` per MIG slice (the slice's own values plus its GPU's DEVICE_COLUMNS). A track holds
    exactly the truth columns the unit reports (plus ``holders``): no util_pct, ECC, NVLink, SM_ACTIVE or
    PIPE_TENSOR_ACTIVE on a slice, nothing a node's exporter's counters list lacks (EXPORTER_LACKS).
    ``track``: gpu_track's, when already computed."""
    t = track if track is not None else gpu_track(scenario, node, gpu)
    lacks = EXPORTER_LACKS[node.exporter]
    if "slices" not in t:
        return [(None, {k: v for k, v in t.items() if k not in lacks})]
    return [
        (m, {**t["slices"][m.instance], **{c: t[c] for c in DEVICE_COLUMNS if c not in lacks}})
        for m in node.slices(gpu)
    ]


def node_track(scenario: Scenario, node: Node) -> dict[str, np.ndarray]:
    """node_exporter values over the full grid. cpu_busy, network rates and memory change once an hour,
    so rate() over a window inside an hour recovers them; counters accumulate them exactly."""
    n, step, per_hour = scenario.steps, scenario.step_s, 3600 // scenario.step_s
    rng = np.random.default_rng((scenario.seed, node.index, 1_000_000))  # apart from every GPU's seed
    held = np.zeros(n)
    share = {(m.gpu, m.instance): m.share for m in node.mig}
    for p in scenario.pods:
        if p.node == node.name:
            gpus = len(set(p.gpus) - set(node.time_sliced)) + sum(share[u] for u in p.slices)
            held[_steps(scenario, p.start_s, p.end_s)] += gpus / node.gpus
    for g in node.time_sliced:  # a shared GPU counts once, however many pods hold it
        held += (_holders(scenario, node, g) >= 0).any(axis=0) / node.gpus
    held_h = held.reshape(scenario.hours, per_hour).mean(axis=1)

    def hourly(a: np.ndarray) -> np.ndarray:
        return np.repeat(a, per_hour)

    busy = hourly(np.rint((0.04 + 0.5 * held_h + rng.uniform(0, 0.06, scenario.hours)) * 100) / 100)
    used_frac = 0.05 + 0.3 * held_h + rng.uniform(0, 0.03, scenario.hours)
    mem_used = hourly((node.mem_total_bytes * used_frac).astype(np.int64) // 4096 * 4096)
    tx = hourly((1e5 + 1.5e9 * held_h * rng.uniform(0.5, 1.0, scenario.hours)).astype(np.int64))
    rx = hourly((1e5 + 2.0e9 * held_h * rng.uniform(0.5, 1.0, scenario.hours)).astype(np.int64))
    track = {
        "cpu_busy": busy,
        "mem_total_bytes": np.full(n, node.mem_total_bytes, dtype=np.int64),
        "mem_used_bytes": mem_used,
        "net_tx_bytes_per_second": tx,
        "net_rx_bytes_per_second": rx,
        "net_tx_bytes_total": int(rng.integers(10**9, 10**11)) + np.cumsum(tx * step),
        "net_rx_bytes_total": int(rng.integers(10**9, 10**11)) + np.cumsum(rx * step),
    }
    # Every CPU equally busy, 80 % of the busy time in user mode; counters start at a per-CPU uptime.
    uptime = rng.uniform(1e5, 1e6, node.cpus).round()
    for c in range(node.cpus):
        track[f"cpu{c}_idle"] = uptime[c] + np.cumsum(step * (1 - busy))
        track[f"cpu{c}_user"] = uptime[c] * 0.01 + np.cumsum(step * busy * 0.8)
        track[f"cpu{c}_system"] = uptime[c] * 0.002 + np.cumsum(step * busy * 0.2)
    return track


GPU_COLUMNS = (
    "util_pct fb_used_mib fb_free_mib temp_c power_w sm_clock_mhz mem_clock_mhz "
    "energy_mj ecc_sbe ecc_dbe xid nvlink_total gr_active sm_active tensor_active"
).split()


def _held_rows(
    node: Node, gpu: int, holders: np.ndarray, up: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray, str]]:
    """What dcgm-exporter writes a unit's series as, per scrape kept by ``up``: (step indexes, holder + 1
    there (0: none), vgpu label) for each replica a pod holds, and for the scrapes no pod holds it."""
    steps = np.flatnonzero(up)
    h = holders[:, up]
    out = [
        (steps[h[r] >= 0], h[r][h[r] >= 0] + 1, str(r) if node.is_time_sliced(gpu) else "")
        for r in range(len(h))
    ]
    free = ~(h >= 0).any(axis=0)
    out.append((steps[free], np.zeros(int(free.sum()), dtype=np.int64), ""))
    return out


def gpu_samples(scenario: Scenario) -> pd.DataFrame:
    """One row per GPU (or MIG slice) per holder per scrape on [start, end), lost nodes' scrapes excluded,
    sorted by ts, node, gpu, gpu_instance, vgpu: one row per scrape where one pod or none holds the unit,
    one per pod where a time-sliced GPU's pods share it (each with the GPU's device values and its own
    namespace/pod/container/experiment and ``vgpu``, the replica it holds: what dcgm-exporter writes in
    --kubernetes-virtual-gpus mode; '' elsewhere).

    dcgm units (util_pct, fb_*_mib, temp_c, power_w, *_mhz, energy_mj, ecc_*, xid, nvlink_total,
    gr_active, sm_active, tensor_active; NaN where the unit does not report the field: see gpu_units) and
    the lake's canonical units (util 0-1, mem_*_bytes, temp_celsius, power_watts, *_hz, energy_joules,
    gr_engine_active, ...; sm_active and tensor_active are ratios already). A MIG slice's row has
    ``gpu_instance`` (GPU_I_ID; <NA> on a whole GPU), ``gpu_profile`` ('' on a whole GPU), ``gpu_share``
    (its share of the GPU; 1 on a whole GPU), its GPU's ``uuid``, and util from GR_ENGINE_ACTIVE:
    ``util_basis`` names the source each row's util came from.
    """
    ts = grid_seconds(scenario)
    pods = scenario.pods
    namespace = np.array([""] + [p.namespace for p in pods], dtype=object)
    pod = np.array([""] + [p.name for p in pods], dtype=object)
    container = np.array([""] + [p.container for p in pods], dtype=object)
    experiment = np.array([UNATTRIBUTED] + [p.experiment for p in pods], dtype=object)
    parts = []
    for node in scenario.nodes:
        up = observed(scenario, node.name)
        for g in range(node.gpus):
            for mig, t in gpu_units(scenario, node, g):
                for at, h, vgpu in _held_rows(node, g, t["holders"], up):
                    if not len(at):
                        continue
                    nan = np.full(len(at), np.nan)
                    part = {
                        "ts": ts[at],
                        "node": node.name,
                        "gpu": g,
                        "gpu_instance": mig.instance if mig else pd.NA,
                        "gpu_profile": mig.profile if mig else "",
                        "gpu_share": mig.share if mig else 1.0,
                        "uuid": gpu_uuid(scenario, node.name, g),
                        "model": node.model,
                        "namespace": namespace[h],
                        "pod": pod[h],
                        "container": container[h],
                        "experiment": experiment[h],
                        "vgpu": vgpu,
                        **{c: t[c][at] if c in t else nan for c in GPU_COLUMNS},
                        "util_basis": GR_SOURCE if mig else UTIL_SOURCE,
                        "mem_total_bytes": float((mig.mem_mib if mig else node.mem_mib) << 20),
                    }
                    parts.append(pd.DataFrame(part))
    df = pd.concat(parts, ignore_index=True)
    df["ts"] = pd.to_datetime(df["ts"], unit="s", utc=True).astype("datetime64[ns, UTC]")
    df["gpu_instance"] = df["gpu_instance"].astype("Int32")
    whole = df["gpu_instance"].isna().to_numpy()
    df["util"] = np.where(whole, df["util_pct"] / 100, df["gr_active"])
    df["gr_engine_active"] = df["gr_active"].astype(float)
    df["sm_active"] = df["sm_active"].astype(float)
    df["tensor_active"] = df["tensor_active"].astype(float)
    df["mem_used_bytes"] = df["fb_used_mib"] * float(1 << 20)
    df["mem_free_bytes"] = df["fb_free_mib"] * float(1 << 20)
    df["temp_celsius"] = df["temp_c"].astype(float)
    df["power_watts"] = df["power_w"]
    df["sm_clock_hz"] = df["sm_clock_mhz"] * 1e6
    df["mem_clock_hz"] = df["mem_clock_mhz"] * 1e6
    df["energy_joules"] = df["energy_mj"] / 1000
    df["ecc_sbe_total"] = df["ecc_sbe"].astype(float)
    df["ecc_dbe_total"] = df["ecc_dbe"].astype(float)
    df["xid_last"] = df["xid"].astype(float)
    df["nvlink_bandwidth_total"] = df["nvlink_total"].astype(float)
    return df.sort_values(
        ["ts", "node", "gpu", "gpu_instance", "vgpu"], ignore_index=True, na_position="first"
    )


NODE_COLUMNS = (
    "cpu_busy",
    "mem_total_bytes",
    "mem_used_bytes",
    "net_tx_bytes_per_second",
    "net_rx_bytes_per_second",
)


def node_samples(scenario: Scenario) -> pd.DataFrame:
    """One row per node per scrape, lost scrapes excluded: ts, node, instance_type, instance_id (the EC2
    instance at that scrape), cpu_busy (0-1, mean over CPUs), mem_total_bytes, mem_used_bytes,
    net_tx/rx_bytes_per_second."""
    ts = grid_seconds(scenario)
    parts = []
    for node in scenario.nodes:
        up = observed(scenario, node.name)
        t = node_track(scenario, node)
        part = {
            "ts": ts[up],
            "node": node.name,
            "instance_type": node.instance_type,
            "instance_id": instance_ids(scenario, node.name)[up],
        }
        parts.append(pd.DataFrame({**part, **{c: t[c][up] for c in NODE_COLUMNS}}))
    df = pd.concat(parts, ignore_index=True)
    df["ts"] = pd.to_datetime(df["ts"], unit="s", utc=True).astype("datetime64[ns, UTC]")
    return df.sort_values(["ts", "node"], ignore_index=True)


@dataclass(frozen=True)
class IncidentWindow:
    """An injected incident as the pipeline should find it. ``count``: stalled or missed scrapes per GPU
    for stall / node_lost, errors added for ecc_sbe / ecc_dbe."""

    kind: str
    start: datetime
    end: datetime  # exclusive
    node: str
    gpus: tuple[int, ...]
    uuids: tuple[str, ...]
    pod: str = ""  # the pod holding the GPU(s), "" when none
    namespace: str = ""
    experiment: str = ""
    count: int = 0


def _windows(scenario: Scenario, kinds: tuple[str, ...]) -> list[IncidentWindow]:
    out = []
    for inc in scenario.incidents:
        if inc.kind not in kinds:
            continue
        node = scenario.node(inc.node)
        holder = None
        if inc.kind == "node_lost":
            gpus = tuple(range(node.gpus))
        elif inc.kind == "stall":
            holder = scenario.pods[inc.pod_index]
            gpus = holder.gpus
        else:
            gpus = (inc.gpu,)
        if holder is None:  # the first pod (in file order) holding the first GPU when it begins
            holder = next(
                (
                    p
                    for p in scenario.pods
                    if p.node == inc.node and gpus[0] in p.gpus and p.start_s <= inc.start_s < p.end_s
                ),
                None,
            )
        steps = (inc.end_s - inc.start_s) // scenario.step_s
        out.append(
            IncidentWindow(
                kind=inc.kind,
                start=inc.start,
                end=inc.end,
                node=inc.node,
                gpus=gpus,
                uuids=tuple(gpu_uuid(scenario, inc.node, g) for g in gpus),
                pod=holder.name if holder else "",
                namespace=holder.namespace if holder else "",
                experiment=holder.experiment if holder else "",
                count=inc.count if inc.kind.startswith("ecc") else steps,
            )
        )
    return sorted(out, key=lambda w: (w.start, w.node))


def stalls(scenario: Scenario) -> list[IncidentWindow]:
    return _windows(scenario, ("stall",))


def ecc_bursts(scenario: Scenario) -> list[IncidentWindow]:
    """Both kinds, ecc_sbe and ecc_dbe (see ``kind``)."""
    return _windows(scenario, ("ecc_sbe", "ecc_dbe"))


def lost_windows(scenario: Scenario) -> list[IncidentWindow]:
    return _windows(scenario, ("node_lost",))


# ---- Ray (the scenario's `ray:` clusters) ------------------------------------------------------------
# Every Ray node (a KubeRay pod) reports, while its raylet runs: its logical GPUs (all of its pod's GPUs,
# all in use: one training task per GPU, so none available), RAY_OBJECT_STORE_BYTES of object store of
# which 25-35 % is in use (integer bytes, from the pod's own seed), tasks_running = its GPUs. The head
# also reports what its driver and GCS count: tasks waiting for a node and failed, and the actors (one per
# Ray node: the learner on the head, a rollout worker per worker). A worker_lost incident: the worker
# reports nothing (its scrape fails, alive false), its actor is RESTARTING and its rollout task waits for
# a node (PENDING_NODE_ASSIGNMENT) on the head; the task it ran has FAILED (the count stays); afterwards
# the actor is ALIVE again. Nothing of it touches a GPU sample.
RAY_OBJECT_STORE_BYTES = 16 << 30
RAY_VERSION = "2.6.1"  # the labels written are those of a real Ray 2.6.1 page (fixtures/real/ray/)
RAY_COLUMNS = (
    "gpus_total gpus_used gpus_available tasks_pending tasks_running tasks_failed actors_alive "
    "actors_restarting actors_dead object_store_used_bytes object_store_capacity_bytes"
).split()


def ray_node_ip(scenario: Scenario, pod: Pod | int) -> str:
    """A Ray node's NodeAddress: its pod's IP, in the pod CIDR 10.1.<node index>.0/24."""
    p = scenario.pod(pod)
    return f"10.1.{scenario.node(p.node).index}.{10 + p.index}"


def ray_lost(scenario: Scenario, pod: Pod | int) -> np.ndarray:
    """True at the scrapes where the Ray node's raylet is gone (its worker_lost windows)."""
    p = scenario.pod(pod)
    lost = np.zeros(scenario.steps, dtype=bool)
    for c in scenario.ray:
        for inc in c.incidents:
            if inc.pod_index == p.index:
                lost[_steps(scenario, inc.start_s, inc.end_s)] = True
    return lost


def ray_track(scenario: Scenario, cluster, pod: Pod | int) -> dict[str, np.ndarray]:
    """One Ray node's values over the full grid: ``exists`` (its pod lives), ``alive`` (its raylet
    answers) and RAY_COLUMNS (NaN where the node does not report the column: not alive, or a head-only
    column on a worker)."""
    p = scenario.pod(pod)
    n = scenario.steps
    exists = np.zeros(n, dtype=bool)
    exists[_steps(scenario, p.start_s, p.end_s)] = True
    alive = exists & ~ray_lost(scenario, p)
    nan = np.full(n, np.nan)
    used_share = np.random.default_rng((scenario.seed, 9000 + p.index)).uniform(0.25, 0.35, n)
    gpus = float(len(p.gpus))
    t = {
        "exists": exists,
        "alive": alive,
        "gpus_total": np.where(alive, gpus, nan),
        "gpus_used": np.where(alive, gpus, nan),
        "gpus_available": np.where(alive, 0.0, nan),
        "tasks_running": np.where(alive, gpus, nan),
        "object_store_used_bytes": np.where(alive, np.rint(used_share * RAY_OBJECT_STORE_BYTES), nan),
        "object_store_capacity_bytes": np.where(alive, float(RAY_OBJECT_STORE_BYTES), nan),
    }
    head_only = ("tasks_pending", "tasks_failed", "actors_alive", "actors_restarting", "actors_dead")
    if p.index != cluster.head:
        return {**t, **{c: nan.copy() for c in head_only}}
    restarting, alive_actors, failed = np.zeros(n), alive.astype(float), np.zeros(n)
    for w in cluster.workers:
        wp = scenario.pods[w]
        w_exists = np.zeros(n, dtype=bool)
        w_exists[_steps(scenario, wp.start_s, wp.end_s)] = True
        w_lost = w_exists & ray_lost(scenario, w)
        alive_actors += w_exists & ~w_lost
        restarting += w_lost
    for inc in cluster.incidents:
        failed[inc.start_s // scenario.step_s :] += 1
    return {
        **t,
        "tasks_pending": np.where(alive, restarting, nan),
        "tasks_failed": np.where(alive, failed, nan),
        "actors_alive": np.where(alive, alive_actors, nan),
        "actors_restarting": np.where(alive, restarting, nan),
        "actors_dead": np.where(alive, 0.0, nan),
    }


def ray_samples(scenario: Scenario) -> pd.DataFrame:
    """What ray_samples must hold: one row per Ray node per scrape while its pod lives (alive false, values
    NaN, while its raylet is gone), sorted by ts, ray_cluster, namespace, pod."""
    ts = grid_seconds(scenario)
    parts = []
    for c in scenario.ray:
        for i in c.pods:
            p = scenario.pods[i]
            t = ray_track(scenario, c, i)
            keep = t["exists"]
            parts.append(
                pd.DataFrame(
                    {
                        "ts": ts[keep],
                        "ray_cluster": c.name,
                        "namespace": p.namespace,
                        "pod": p.name,
                        "node_type": "head" if i == c.head else "worker",
                        "experiment": c.experiment,
                        "alive": t["alive"][keep],
                        **{col: t[col][keep] for col in RAY_COLUMNS},
                        "step_seconds": float(scenario.step_s),
                    }
                )
            )
    if not parts:
        return pd.DataFrame(
            columns=["ts", "ray_cluster", "namespace", "pod", "node_type", "experiment", "alive"]
        )
    df = pd.concat(parts, ignore_index=True)
    df["ts"] = pd.to_datetime(df["ts"], unit="s", utc=True).astype("datetime64[ns, UTC]")
    return df.sort_values(["ts", "ray_cluster", "namespace", "pod"], ignore_index=True)


@dataclass(frozen=True)
class RayOutage:
    """A worker_lost incident as the alert must see it: while [start, end), the cluster has a Ray node
    down and an actor restarting."""

    cluster: str
    namespace: str
    pod: str
    start: datetime
    end: datetime


def ray_outages(scenario: Scenario) -> list[RayOutage]:
    return sorted(
        (
            RayOutage(
                c.name,
                c.namespace,
                scenario.pods[inc.pod_index].name,
                scenario.start + timedelta(seconds=inc.start_s),
                scenario.start + timedelta(seconds=inc.end_s),
            )
            for c in scenario.ray
            for inc in c.incidents
        ),
        key=lambda o: (o.start, o.cluster),
    )


def pod_labels(scenario: Scenario) -> list[tuple[str, str, str]]:
    """(namespace, pod, experiment) of every pod, as kube_pod_labels tells them (a reused name once per
    pod: its series differ by ``uid``)."""
    return [(p.namespace, p.name, p.experiment) for p in scenario.pods]


ALLOCATION_COLUMNS = (
    "hour node gpu gpu_instance gpu_profile gpu_share kind pod namespace experiment seconds_with_data "
    "held_seconds cost_usd allocated_usd unallocated_usd active_gpu_seconds sm_active_gpu_seconds idle_usd "
    "held_wall_seconds"
).split()


def _node_hour_cost(scenario: Scenario, items: list[bills.LineItem]) -> dict[str, np.ndarray]:
    """Each node's EC2 cost per hour of the scenario: the line items of its instances."""
    node_of = {i.instance_id: i.node for i in bills.instances(scenario)}
    cost = {n.name: np.zeros(scenario.hours) for n in scenario.nodes}
    for i in items:
        if i.service == bills.EC2 and i.resource_id in node_of:
            cost[node_of[i.resource_id]][int((i.hour - scenario.start).total_seconds()) // 3600] += float(
                i.cost
            )
    return cost


def gpu_allocations(scenario: Scenario, items: list[bills.LineItem] | None = None) -> pd.DataFrame:
    """What cost_allocation must charge, by the cost policy in the module docstring: one row per
    (unit-hour, holder) with held seconds > 0, a holder being a (namespace, pod) (a reused name's pods in
    one hour are one holder: the pipeline cannot tell them apart), plus one row with pod '' for the
    unit-hour's unheld seconds when there are any (kind ``gpu``: a whole GPU or a MIG slice), plus, per
    MIG GPU-hour, the part no slice covers (kind ``mig_unsliced``, gpu_share 1 − Σ shares, all
    unallocated). Only unit-hours with at least one reported scrape have rows.

    * ``cost_usd``: the unit-hour's cost C (the same on each of its rows: sum allocated_usd +
      unallocated_usd, not cost_usd, to get the bill).
    * ``seconds_with_data``: step_s × the unit-hour's reported scrapes; ``held_seconds``: the holder's
      Σ step_s / k (k pods holding the unit at that step), on the '' row the unheld seconds: a unit-hour's
      rows' held_seconds add up to its seconds_with_data.
    * ``allocated_usd`` = C × held_seconds / seconds_with_data (0 on the '' row); ``unallocated_usd`` =
      C × unheld_seconds / seconds_with_data on the '' row (0 on a holder's).
    * ``active_gpu_seconds`` = Σ util × step_s / k × gpu_share over the holder's steps (util 0..1 as the
      device reports it: GPU_UTIL on a whole GPU, GR_ENGINE_ACTIVE on a slice; on the '' row over the
      unheld steps, k = 1); ``sm_active_gpu_seconds`` likewise from SM_ACTIVE, NaN where the unit does not
      report it (the Helm chart's node, MIG slices).
    * ``idle_usd`` = allocated_usd × (1 − active_gpu_seconds / (held_seconds × gpu_share)); 0 on the ''
      row (its dollars are unallocated_usd) and on mig_unsliced rows.

    Columns (ALLOCATION_COLUMNS): hour, node, gpu, gpu_instance (<NA> whole), gpu_profile ('' whole,
    'unsliced'), gpu_share, kind, pod, namespace, experiment ('' on the '' and mig_unsliced rows),
    seconds_with_data, held_seconds, cost_usd, allocated_usd, unallocated_usd, active_gpu_seconds,
    sm_active_gpu_seconds, idle_usd (float; $ unrounded). Sorted by hour, kind, node, gpu, gpu_instance,
    namespace, pod."""
    items = items if items is not None else bills.line_items(scenario)
    node_cost = _node_hour_cost(scenario, items)
    step, hours = scenario.step_s, scenario.hours
    per_hour = scenario.steps // hours

    def hsum(a: np.ndarray) -> np.ndarray:
        return a.reshape(hours, per_hour).sum(axis=1)

    rows = []
    for node in scenario.nodes:
        up = observed(scenario, node.name)
        swd = hsum(up.astype(np.int64)) * float(step)
        reporting = swd > 0
        # every GPU of a node reports when it does: C of a whole GPU-hour
        gpu_cost = np.where(reporting, node_cost[node.name] / node.gpus, 0.0)
        for g in range(node.gpus):
            for mig, t in gpu_units(scenario, node, g):
                share = mig.share if mig else 1.0
                usd = gpu_cost * share
                holders = t["holders"]
                k = (holders >= 0).sum(axis=0)
                per_holder = np.where(k > 0, step / np.maximum(k, 1), 0.0)  # seconds each holder gets
                util = t["gr_active"] if mig else t["util_pct"] / 100
                sm = t.get("sm_active")
                sm = sm.astype(float) if sm is not None else None
                unit = {
                    "node": node.name,
                    "gpu": g,
                    "gpu_instance": mig.instance if mig else pd.NA,
                    "gpu_profile": mig.profile if mig else "",
                    "gpu_share": share,
                    "kind": "gpu",
                }
                acc: dict[tuple[str, str], dict[str, np.ndarray]] = {}
                for i in np.unique(holders[holders >= 0]):
                    p = scenario.pods[int(i)]
                    mine = (holders == i).any(axis=0) & up
                    w = np.where(mine, per_holder, 0.0)
                    a = acc.setdefault(
                        (p.namespace, p.name),
                        {"experiment": p.experiment, "held": 0.0, "active": 0.0, "sm": 0.0, "wall": 0.0},
                    )
                    a["held"] = a["held"] + hsum(w)
                    a["wall"] = a["wall"] + hsum(mine.astype(np.int64)) * float(step)  # wall-clock seconds
                    a["active"] = a["active"] + hsum(util * w) * share
                    a["sm"] = a["sm"] + (hsum(sm * w) * share if sm is not None else np.nan)
                free = up & (k == 0)
                unheld = hsum(free.astype(np.int64)) * float(step)
                unheld_active = hsum(np.where(free, util * step, 0.0)) * share
                unheld_sm = hsum(np.where(free, sm * step, 0.0)) * share if sm is not None else None
                for h in np.flatnonzero(reporting):
                    hour = scenario.start + timedelta(hours=int(h))
                    base = {**unit, "hour": hour, "seconds_with_data": swd[h], "cost_usd": usd[h]}
                    if unheld[h] > 0:
                        rows.append(
                            {
                                **base,
                                "pod": "",
                                "namespace": "",
                                "experiment": "",
                                "held_seconds": unheld[h],
                                "held_wall_seconds": unheld[h],
                                "allocated_usd": 0.0,
                                "unallocated_usd": usd[h] * unheld[h] / swd[h],
                                "active_gpu_seconds": unheld_active[h],
                                "sm_active_gpu_seconds": unheld_sm[h] if unheld_sm is not None else np.nan,
                                "idle_usd": 0.0,
                            }
                        )
                    for (ns, name), a in sorted(acc.items()):
                        held = a["held"][h]
                        if held <= 0:
                            continue
                        allocated = usd[h] * held / swd[h]
                        active = a["active"][h]
                        rows.append(
                            {
                                **base,
                                "pod": name,
                                "namespace": ns,
                                "experiment": a["experiment"],
                                "held_seconds": held,
                                "held_wall_seconds": a["wall"][h],
                                "allocated_usd": allocated,
                                "unallocated_usd": 0.0,
                                "active_gpu_seconds": active,
                                "sm_active_gpu_seconds": a["sm"][h] if sm is not None else np.nan,
                                "idle_usd": allocated * (1 - active / (held * share)),
                            }
                        )
            rest = 1 - sum(m.share for m in node.slices(g))
            if node.is_mig(g) and rest > 1e-9:
                for h in np.flatnonzero(reporting):
                    rows.append(
                        {
                            "hour": scenario.start + timedelta(hours=int(h)),
                            "node": node.name,
                            "gpu": g,
                            "gpu_instance": pd.NA,
                            "gpu_profile": "unsliced",
                            "gpu_share": rest,
                            "kind": "mig_unsliced",
                            "pod": "",
                            "namespace": "",
                            "experiment": "",
                            "seconds_with_data": swd[h],
                            "held_seconds": 0.0,
                            "cost_usd": gpu_cost[h] * rest,
                            "allocated_usd": 0.0,
                            "unallocated_usd": gpu_cost[h] * rest,
                            "active_gpu_seconds": 0.0,
                            "sm_active_gpu_seconds": np.nan,
                            "idle_usd": 0.0,
                            "held_wall_seconds": 0.0,
                        }
                    )
    df = pd.DataFrame(rows, columns=ALLOCATION_COLUMNS)
    df["hour"] = pd.to_datetime(df["hour"], utc=True)
    df["gpu_instance"] = df["gpu_instance"].astype("Int32")
    for c in ALLOCATION_COLUMNS[ALLOCATION_COLUMNS.index("seconds_with_data") :]:
        df[c] = df[c].astype(float)
    return df.sort_values(
        ["hour", "kind", "node", "gpu", "gpu_instance", "namespace", "pod"],
        ignore_index=True,
        na_position="first",
    )


def _day_window(day) -> tuple[pd.Timestamp, pd.Timestamp]:
    """[00:00, 24:00) UTC of a date, datetime, Timestamp or "YYYY-MM-DD"."""
    start = pd.Timestamp(day)
    start = (start.tz_localize("UTC") if start.tzinfo is None else start.tz_convert("UTC")).normalize()
    return start, start + pd.Timedelta(days=1)


def pod_dollars(scenario: Scenario, day=None, alloc: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each pod's dollars, by (namespace, pod): the Σ of its gpu_allocations rows (every unit it held,
    every hour; a reused name's pods together, as the pipeline sees them), over the whole scenario or,
    with ``day``, over that UTC day's hours. Columns: namespace, pod, experiment, held_seconds (Σ over
    units), active_gpu_seconds, allocated_usd, idle_usd. One row per (namespace, pod) that held a unit
    then, sorted by namespace, pod. ``alloc``: gpu_allocations(scenario), when already computed."""
    alloc = alloc if alloc is not None else gpu_allocations(scenario)
    rows = alloc[(alloc["kind"] == "gpu") & (alloc["pod"] != "")]
    if day is not None:
        start, end = _day_window(day)
        rows = rows[(rows["hour"] >= start) & (rows["hour"] < end)]
    cols = ["held_seconds", "active_gpu_seconds", "allocated_usd", "idle_usd"]
    out = rows.groupby(["namespace", "pod", "experiment"], as_index=False)[cols].sum()
    return out.sort_values(["namespace", "pod"], ignore_index=True)


def run_dollars(scenario: Scenario, day, alloc: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each MLflow run's dollars so far at the end of UTC day ``day`` (the cost policy's run rule, in the
    module docstring): its window is [start, end) cut at the day's end, a RUNNING run's [start, the day's
    end) (MLflow has no end time for it); for each of its pods, matched on (namespace, pod) as the
    pipeline joins the run's ``namespace`` and ``pod`` tags to the allocation, and each unit-hour row of
    that pod overlapping the window: allocated_usd (and idle_usd) × the seconds of the hour inside the
    window / the larger of the pod's wall-clock held seconds on that unit in that hour and the seconds all
    runs' windows cover of it. So a boundary hour a reused pod name shares between two runs is split by
    the time each run's window covers, capped at what the pod held, and together the runs never take more
    than the row. A RUNNING run's window also ends where the next run naming one of its pods starts (a
    killed run MLflow still calls RUNNING does not take its successor's hours).

    Runs started by the day's end, in file order (deleted ones included, flagged). Columns: run_name
    (MLflow run ids are random: the name is the key), experiment, namespace, pod (the tag; None without
    one), status, deleted, start, end (the window's end used), allocated_usd, idle_usd (0 for a run
    without pods). ``alloc``: gpu_allocations(scenario), when already computed."""
    if scenario.training is None:
        raise ValueError(f"scenario {scenario.name} has no training: block")
    alloc = alloc if alloc is not None else gpu_allocations(scenario)
    held = alloc[(alloc["kind"] == "gpu") & (alloc["pod"] != "")]
    day_start, day_end = _day_window(day)
    hour_s = held["hour"].astype("int64").to_numpy() // 10**9
    wall = held["held_wall_seconds"].to_numpy()
    runs = [r for r in scenario.training.runs if pd.Timestamp(r.start) < day_end]
    live = [r for r in runs if not r.deleted]  # deleted runs are charged nothing and share no hour
    keys_of = {r.name: {(scenario.pods[i].namespace, scenario.pods[i].name) for i in r.pods} for r in runs}
    covers: dict[str, np.ndarray] = {}
    windows = {}
    for run in runs:
        start = pd.Timestamp(run.start)
        end = day_end if run.status == "RUNNING" else min(pd.Timestamp(run.end), day_end)
        if run.status == "RUNNING":  # a run MLflow still calls RUNNING ends where the next on its pods starts
            later = [pd.Timestamp(o.start) for o in live if o is not run and keys_of[o.name] & keys_of[run.name]
                     and pd.Timestamp(o.start) > start]  # fmt: skip
            end = min([end, *later])
        windows[run.name] = (start, end)
        s, e = int(start.timestamp()), int(end.timestamp())
        mine = np.array([(ns, p) in keys_of[run.name] for ns, p in zip(held["namespace"], held["pod"])], bool)
        covers[run.name] = np.where(
            mine, np.clip(np.minimum(hour_s + 3600, e) - np.maximum(hour_s, s), 0, None), 0
        )
    # a row the windows of several runs cover: each its covered seconds over what the pod held, or over
    # their sum when the windows cover more than that (together never more than the row)
    total = np.sum([covers[r.name] for r in live], axis=0) if live else np.zeros(len(held))
    rows = []
    for run in runs:
        part = np.where(covers[run.name] > 0, covers[run.name] / np.maximum(wall, np.maximum(total, 1)), 0.0)
        start, end = windows[run.name]
        rows.append(
            {
                "run_name": run.name,
                "experiment": run.experiment,
                "namespace": run.namespace,
                "pod": run.pod,
                "status": run.status,
                "deleted": run.deleted,
                "start": start,
                "end": end,
                "allocated_usd": float((held["allocated_usd"].to_numpy() * part).sum()),
                "idle_usd": float((held["idle_usd"].to_numpy() * part).sum()),
            }
        )
    return pd.DataFrame(
        rows,
        columns="run_name experiment namespace pod status deleted start end allocated_usd idle_usd".split(),
    )
