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

A MIG GPU (``node.mig``) is reported per slice, as dcgm-exporter does, with no whole-GPU unit
(``gpu_units``): each slice has its own ``holder``, its own activity ``gr_active`` (the holder's util
profile / 100 to 4 decimals, 0 while no pod holds it; no util_pct: GPU_UTIL is not reported on slices)
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
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from foxhunt_obs.sandbox import bills
from foxhunt_obs.sandbox.scenario import MigSlice, Node, Pod, Scenario

UNATTRIBUTED = "unattributed"
MEM_CLOCK_MHZ = 1593  # A100 80GB HBM2e
SM_CLOCK_BUSY_MHZ, SM_CLOCK_IDLE_MHZ = 1410, 210
GR_OF_UTIL = 0.95  # a whole GPU's GR_ENGINE_ACTIVE, as a share of its GPU_UTIL
UTIL_SOURCE, GR_SOURCE = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # util_basis values
# the columns of a MIG GPU's device that every one of its slices repeats (dcgm-exporter's MIG pages)
DEVICE_COLUMNS = ("temp_c", "power_w", "sm_clock_mhz", "mem_clock_mhz", "energy_mj", "xid")
# what an exporter's counters list leaves out (the Helm chart's has no ECC fields)
EXPORTER_LACKS = {"gpu-operator": (), "helm-chart": ("ecc_sbe", "ecc_dbe")}


def gpu_uuid(scenario: Scenario, node: str, gpu: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{scenario.name}/{node}/{gpu}"))


def pod_restarts(scenario: Scenario, pod: str) -> np.ndarray:
    """kube_pod_container_status_restarts_total of the pod's container at every scrape: 0, then one step
    up per restart of its oom_loop incidents, spread evenly over each window (a crash-looping trainer)."""
    step, n = scenario.step_s, scenario.steps
    bumps = np.zeros(n, dtype=np.int64)
    for inc in scenario.incidents:
        if inc.kind == "oom_loop" and inc.pod == pod:
            a, b = inc.start_s // step, inc.end_s // step
            np.add.at(bumps, a + (np.arange(inc.count) * (b - a)) // inc.count, 1)
    return np.cumsum(bumps)


def pod_uid(scenario: Scenario, pod: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{scenario.name}/pod/{pod}"))


def grid_seconds(scenario: Scenario) -> np.ndarray:
    """Unix seconds of every scrape: start + k * step for k in range(steps), i.e. [start, end)."""
    return int(scenario.start.timestamp()) + np.arange(scenario.steps, dtype=np.int64) * scenario.step_s


def _steps(scenario: Scenario, start_s: int, end_s: int) -> slice:
    return slice(start_s // scenario.step_s, end_s // scenario.step_s)


def _pod(scenario: Scenario, name: str):
    return next(p for p in scenario.pods if p.name == name)


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
    """A MIG slice's own values over the full grid: ``holder`` (index in scenario.pods, -1 when none),
    ``gr_active`` (ratio), ``fb_used_mib``, ``fb_free_mib``."""
    n = scenario.steps
    rng = np.random.default_rng((scenario.seed, node.index, mig.gpu, 1000 + mig.instance))
    noise = rng.standard_normal(n)
    low, high = int(mig.mem_mib * 0.70), int(mig.mem_mib * 0.86)
    mem_level = rng.integers(low, high, len(scenario.pods))  # MiB a pod keeps allocated, per pod
    mem_jitter = rng.integers(-128, 129, n)
    mem_idle = rng.integers(8, 33, n)
    holder = np.full(n, -1, dtype=np.int64)
    util = np.zeros(n)
    for i, p in enumerate(scenario.pods):
        if p.node == node.name and (mig.gpu, mig.instance) in p.slices:
            s = _steps(scenario, p.start_s, p.end_s)
            holder[s] = i
            util[s] = _util_of(scenario, p, s, noise)
    fb_used = np.where(holder >= 0, mem_level[holder] + mem_jitter, mem_idle).astype(np.int64)
    return {
        "holder": holder,
        "gr_active": np.round(np.clip(util, 0, 100) / 100, 4),
        "fb_used_mib": fb_used,
        "fb_free_mib": mig.mem_mib - fb_used,
    }


def gpu_track(scenario: Scenario, node: Node, gpu: int) -> dict[str, np.ndarray]:
    """Every dcgm value of one GPU over the full grid (lost scrapes included), plus ``holder``: the index
    in scenario.pods of the pod holding the GPU, -1 when none. A MIG GPU's track is its device (no pod
    holds it whole, util_pct is its slices' activity weighed by their shares) with its slices' tracks
    under ``slices`` (GPU instance id -> slice_track): what it reports is ``gpu_units``."""
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

    holder = np.full(n, -1, dtype=np.int64)
    util = idle_util.astype(float)
    multi = np.zeros(n, dtype=bool)  # held by a multi-GPU pod: NVLink traffic
    for i, p in enumerate(scenario.pods):
        if p.node != node.name or gpu not in p.gpus:
            continue
        s = _steps(scenario, p.start_s, p.end_s)
        holder[s] = i
        multi[s] = len(p.gpus) > 1
        util[s] = _util_of(scenario, p, s, noise)
    slices = {m.instance: slice_track(scenario, node, m) for m in node.slices(gpu)}
    if slices:  # the device is as busy as its slices together
        util = 100 * sum(m.share * slices[m.instance]["gr_active"] for m in node.slices(gpu))
    ecc = {"ecc_sbe": np.zeros(n, dtype=np.int64), "ecc_dbe": np.zeros(n, dtype=np.int64)}
    for inc in scenario.incidents:
        if inc.kind == "stall" and inc.node == node.name and gpu in _pod(scenario, inc.pod).gpus:
            util[_steps(scenario, inc.start_s, inc.end_s)] = 0.0
        elif inc.kind in ("ecc_sbe", "ecc_dbe") and inc.node == node.name and inc.gpu == gpu:
            a, b = inc.start_s // step, inc.end_s // step
            # `count` errors spread evenly over the window's scrapes (several per scrape if needed)
            np.add.at(ecc[inc.kind], a + (np.arange(inc.count) * (b - a)) // inc.count, 1)

    util_pct = np.clip(np.rint(util), 0, 100).astype(np.int64)
    held = holder >= 0
    fb_used = np.where(held, mem_level[holder] + mem_jitter, mem_idle).astype(np.int64)
    power_mw = np.clip(np.rint((60 + 3.3 * util_pct + power_noise) * 1000), 50_000, 399_000).astype(np.int64)
    track = {
        "holder": holder,
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
    }
    if slices:
        track["slices"] = slices
    return track


def gpu_units(
    scenario: Scenario, node: Node, gpu: int, track: dict | None = None
) -> list[tuple[MigSlice | None, dict[str, np.ndarray]]]:
    """What dcgm-exporter reports for one GPU: ``(None, track)`` for a whole GPU, else one
    ``(slice, track)`` per MIG slice (the slice's own values plus its GPU's DEVICE_COLUMNS). A track holds
    exactly the truth columns the unit reports (plus ``holder``): no util_pct, ECC or NVLink on a slice,
    no ECC on a node whose exporter's counters list lacks it (EXPORTER_LACKS). ``track``: gpu_track's,
    when already computed."""
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
            gpus = len(p.gpus) + sum(share[u] for u in p.slices)
            held[_steps(scenario, p.start_s, p.end_s)] += gpus / node.gpus
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
    "energy_mj ecc_sbe ecc_dbe xid nvlink_total gr_active"
).split()


def gpu_samples(scenario: Scenario) -> pd.DataFrame:
    """One row per GPU (or MIG slice) per scrape on [start, end), lost nodes' scrapes excluded, sorted by
    ts, node, gpu, gpu_instance.

    dcgm units (util_pct, fb_*_mib, temp_c, power_w, *_mhz, energy_mj, ecc_*, xid, nvlink_total,
    gr_active; NaN where the unit does not report the field: see gpu_units) and the lake's canonical units
    (util 0-1, mem_*_bytes, temp_celsius, power_watts, *_hz, energy_joules, gr_engine_active, ...). A MIG
    slice's row has ``gpu_instance`` (GPU_I_ID; <NA> on a whole GPU), ``gpu_profile`` ('' on a whole
    GPU), ``gpu_share`` (its share of the GPU; 1 on a whole GPU), its GPU's ``uuid``, and util from
    GR_ENGINE_ACTIVE: ``util_basis`` names the source each row's util came from.
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
        nan = np.full(int(up.sum()), np.nan)
        for g in range(node.gpus):
            for mig, t in gpu_units(scenario, node, g):
                h = t["holder"][up] + 1
                part = {
                    "ts": ts[up],
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
                    **{c: t[c][up] if c in t else nan for c in GPU_COLUMNS},
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
    return df.sort_values(["ts", "node", "gpu", "gpu_instance"], ignore_index=True, na_position="first")


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
        if inc.kind == "node_lost":
            gpus = tuple(range(node.gpus))
        elif inc.kind == "stall":
            gpus = _pod(scenario, inc.pod).gpus
        else:
            gpus = (inc.gpu,)
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


def pod_labels(scenario: Scenario) -> list[tuple[str, str, str]]:
    """(namespace, pod, experiment) of every pod, as kube_pod_labels tells them."""
    return [(p.namespace, p.name, p.experiment) for p in scenario.pods]


def gpu_allocations(scenario: Scenario, items: list[bills.LineItem] | None = None) -> pd.DataFrame:
    """What cost_allocation must charge per GPU-hour (kind ``gpu``: a whole GPU or a MIG slice) and what
    no MIG slice covers (kind ``mig_unsliced``), from the bill (DESIGN §5): a GPU's cost for an hour is
    its node's EC2 cost for that hour (the node's instances' line items) ÷ the GPUs reporting on the node
    then; a slice's is that × its gpu_share; the part of a MIG GPU no slice covers (1 − Σ shares) is
    cluster idle. ``allocated_usd`` = cost × the share of the hour's reported scrapes a pod held it,
    charged to ``pod`` (the pod seen most in the hour; ties: the first by name) and its experiment ('' when
    none held it); ``unallocated_usd`` the rest. One row per unit-hour with at least one scrape reported.

    Columns: hour, node, gpu, gpu_instance (<NA> whole), gpu_profile ('' whole, 'unsliced'), gpu_share,
    kind, pod, namespace, experiment, seconds_with_data, held_seconds, cost_usd, allocated_usd,
    unallocated_usd (float $)."""
    items = items if items is not None else bills.line_items(scenario)
    node_of = {i.instance_id: i.node for i in bills.instances(scenario)}
    per_hour = scenario.steps // scenario.hours
    rows = []
    for node in scenario.nodes:
        cost = np.zeros(scenario.hours)
        for i in items:
            if i.service == bills.EC2 and node_of.get(i.resource_id) == node.name:
                cost[int((i.hour - scenario.start).total_seconds()) // 3600] += float(i.cost)
        seen = observed(scenario, node.name).reshape(scenario.hours, per_hour)
        reporting = seen.any(axis=1)
        for g in range(node.gpus):
            gpu_cost = np.where(reporting, cost / node.gpus, 0.0)  # every GPU of a node reports when it does
            units = gpu_units(scenario, node, g)
            for mig, t in units:
                holder = t["holder"].reshape(scenario.hours, per_hour)
                for h in np.flatnonzero(reporting):
                    pods = holder[h][seen[h] & (holder[h] >= 0)]
                    best = ""
                    if len(pods):
                        names, counts = np.unique([scenario.pods[k].name for k in pods], return_counts=True)
                        best = sorted(zip(-counts, names))[0][1]
                    p = next((x for x in scenario.pods if x.name == best), None)
                    share = mig.share if mig else 1.0
                    usd = gpu_cost[h] * share
                    held = len(pods) / seen[h].sum()
                    rows.append(
                        {
                            "hour": scenario.start + timedelta(hours=int(h)),
                            "node": node.name,
                            "gpu": g,
                            "gpu_instance": mig.instance if mig else pd.NA,
                            "gpu_profile": mig.profile if mig else "",
                            "gpu_share": share,
                            "kind": "gpu",
                            "pod": best,
                            "namespace": p.namespace if p else "",
                            "experiment": p.experiment if p else "",
                            "seconds_with_data": float(seen[h].sum() * scenario.step_s),
                            "held_seconds": float(len(pods) * scenario.step_s),
                            "cost_usd": usd,
                            "allocated_usd": usd * held,
                            "unallocated_usd": usd * (1 - held),
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
                            "seconds_with_data": float(seen[h].sum() * scenario.step_s),
                            "held_seconds": 0.0,
                            "cost_usd": gpu_cost[h] * rest,
                            "allocated_usd": 0.0,
                            "unallocated_usd": gpu_cost[h] * rest,
                        }
                    )
    df = pd.DataFrame(rows)
    df["hour"] = pd.to_datetime(df["hour"], utc=True)
    df["gpu_instance"] = df["gpu_instance"].astype("Int32")
    return df.sort_values(
        ["hour", "kind", "node", "gpu", "gpu_instance"], ignore_index=True, na_position="first"
    )
