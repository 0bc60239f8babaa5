"""Write a scenario's truth as OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics``.

What a real cluster's Prometheus would hold, scrape by scrape:

* dcgm-exporter, its stock (legacy) field names and units, labelled as dcgm-exporter does (``gpu``,
  ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``) and
  scraped as its deployment's ServiceMonitor does (honor_labels off): the target's ``job``/``instance``
  and the exporter pod's own ``namespace``/``pod``/``container`` on every series, and the holder as
  ``exported_namespace``/``exported_pod``/``exported_container`` only while a pod holds the GPU, so a
  GPU's series changes identity when its pod changes, as it does in production. A node's ``exporter``
  (EXPORTERS) is the deployment: the GPU Operator's (gpu-operator, nvidia-dcgm-exporter-xxxxx,
  nvidia-dcgm-exporter) or NVIDIA's dcgm-exporter Helm chart's (its namespace, dcgm-exporter-xxxxx,
  container ``exporter``, Service ``dcgm-exporter`` and endpoint ``metrics`` as prometheus-operator
  labels the target; its counters list has no ECC fields and no DCGM_FI_DRIVER_VERSION, so neither is
  written there). DCGM_FI_PROF_GR_ENGINE_ACTIVE is written for every GPU (on by default in every stock
  counters list); DCGM_FI_PROF_SM_ACTIVE and DCGM_FI_PROF_PIPE_TENSOR_ACTIVE for the whole GPUs of the
  GPU Operator's nodes (their counters file uncomments SM_ACTIVE; the chart's built-in list has neither
  in the sandbox).
* Time-sliced GPUs (``node.time_sliced``): that node's dcgm-exporter runs with
  ``--kubernetes-virtual-gpus`` (NVIDIA/dcgm-exporter internal/pkg/transformation/kubernetes.go,
  ``PodMapper.Process`` at d5e5f51): while pods hold the GPU every device metric is written once per
  pod, each copy with the device's value, that pod's ``pod``/``namespace``/``container`` (here
  exported_*, scraped with honor_labels off) and ``vgpu="<replica>"`` (the device id's suffix after
  ``::``); while no pod holds it, the one device-level series without pod labels (the "preserve the
  original metric for GPUs not used by any pod" branch of d5e5f51; 4.5.2-4.8.1 dropped it as soon as
  any GPU of the node had a pod). ``pod_uid`` is written only with --kubernetes-enable-pod-uid (off
  here). Not modelled: from 4.5.3-4.8.2 (#594, fb5e3dc) DCGM_FI_DEV_GPU_UTIL and DCGM_FI_DEV_FB_USED are
  per-process there: each pod's copy carries its own processes' SM utilization and memory (from NVML,
  with ``pod_uid``), and the device-level series is kept beside them.
* MIG: each GPU instance of a MIG GPU is a unit of its own (truth.gpu_units), labelled with the
  parent's ``gpu``/``UUID``/``device`` plus ``GPU_I_PROFILE``/``GPU_I_ID`` (in that order, before
  ``Hostname``) and its own holder; there is no whole-GPU series, and no GPU_UTIL, ECC or NVLink series
  on a slice (foxhunt_obs_tests/fixtures/real/dcgm/dcgm-exporter-mig-*.prom).
* node_exporter (cpu, memory, network) with ``instance="<node IP>:9100"`` and no node label, as
  kube-prometheus-stack scrapes it (hostNetwork): kube_node_info's internal_ip names the node.
* kube-state-metrics ``kube_pod_labels`` (while the pod exists), ``kube_node_labels`` and
  ``kube_node_info`` (``provider_id="aws:///<az>/<instance id>"``, ``internal_ip`` where the node's name
  is an EC2 private DNS name): one series per EC2 instance of the node, while that instance exists;
  ``kube_pod_container_status_restarts_total`` per pod while it exists (rising in oom_loop incidents)
  (``truth.node_instances``), so a ``node_lost`` outage has none and the replacement is a new series.
* Ray (the scenario's ``ray:`` clusters, truth.ray_track): each Ray node (a KubeRay pod) is a target of
  its own, scraped as the Ray docs' ServiceMonitor (head) and PodMonitor (workers) do it
  (ray-project/ray doc/source/cluster/kubernetes/k8s-ecosystem/prometheus-grafana.md): the pod's
  ``namespace``/``pod``/``container`` and its RayCluster as ``ray_io_cluster`` on every series. Its series
  carry Ray 2.6.1's own labels (Component, NodeAddress, SessionName, Version, WorkerId; a real page in
  foxhunt_obs_tests/fixtures/real/ray/): ``ray_resources`` (GPU and object_store_memory, USED and
  AVAILABLE), ``ray_object_store_memory`` (MMAP_SHM), ``ray_tasks`` (RUNNING from each node's executor;
  PENDING_NODE_ASSIGNMENT and FAILED from the driver on the head) and ``ray_actors`` (Source gcs, on the
  head). A lost worker writes nothing and its ``up`` is 0. kube_pod_labels of a Ray pod also carry
  ``label_ray_io_cluster`` and ``label_ray_io_node_type`` (KubeRay's pod labels, allow-listed).
* ``up`` for the dcgm-exporter, node-exporter and Ray targets, with each target's labels (dcgm-exporter's
  pod, namespace and container, as Kubernetes service discovery gives them): 0 while the node is lost,
  as Prometheus records a failed scrape (the other series simply have no samples then).

Every family is declared ``gauge``: OpenMetrics counters need a ``_total`` sample suffix that dcgm names
lack, and PromQL does not look at types. One file per aligned 2-hour window, because promtool re-reads
its whole input once per 2-hour block it cuts: one big file would cost quadratic time.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from foxhunt_obs.sandbox.story import truth
from foxhunt_obs.sandbox.story.scenario import Node, Scenario

log = logging.getLogger(__name__)  # the history build's progress (cli/__init__.py shows it on stderr)
PROGRESS_EVERY_S = 5.0  # a progress line at most this often

BLOCK_S = 2 * 3600  # Prometheus TSDB block range; blocks are aligned to multiples of it since the epoch
DRIVER_VERSION = "535.183.01"
DCGM_NAMESPACE, DCGM_CONTAINER = "gpu-operator", "nvidia-dcgm-exporter"  # the GPU Operator's DaemonSet


@dataclass(frozen=True)
class Exporter:
    """How a dcgm-exporter deployment's series look: the target's labels (Kubernetes service discovery
    through its ServiceMonitor) and whether its counters list carries DCGM_FI_DRIVER_VERSION."""

    namespace: str
    pod_prefix: str  # DaemonSet pods: <prefix>-<5 characters>
    container: str
    target: dict[str, str]  # more target labels (prometheus-operator's service, endpoint)
    driver_label: bool


EXPORTERS = {
    # NVIDIA GPU Operator: DaemonSet nvidia-dcgm-exporter in gpu-operator (what the sandbox always wrote)
    "gpu-operator": Exporter(DCGM_NAMESPACE, DCGM_CONTAINER, DCGM_CONTAINER, {}, True),
    # NVIDIA's dcgm-exporter Helm chart: container `exporter`, Service and ServiceMonitor dcgm-exporter
    # (port `metrics`, honorLabels false); its built-in counters list (the chart's metrics-configmap,
    # fixtures/real/dcgm/counters/helm-chart-default-metrics.csv) lacks DCGM_FI_DRIVER_VERSION and ECC
    "helm-chart": Exporter(
        "gpu-monitoring",
        "dcgm-exporter",
        "exporter",
        {"service": "dcgm-exporter", "endpoint": "metrics"},
        False,
    ),
}


def dcgm_exporter_pod(node: str, exporter: str = "gpu-operator") -> str:
    """The node's dcgm-exporter pod, named as a DaemonSet names its pods (a 5-character suffix)."""
    return f"{EXPORTERS[exporter].pod_prefix}-{hashlib.sha256(node.encode()).hexdigest()[:5]}"


def dcgm_target(node: Node) -> dict[str, str]:
    """The labels of the node's dcgm-exporter target: on its ``up`` and on every series it yields."""
    e = EXPORTERS[node.exporter]
    return {
        "job": "dcgm-exporter",
        "instance": f"{node.name}:9400",
        "namespace": e.namespace,
        "pod": dcgm_exporter_pod(node.name, node.exporter),
        "container": e.container,
        **e.target,
    }


DCGM_METRICS = {  # dcgm-exporter name (stock counters) -> truth column, in the exporter's units
    "DCGM_FI_DEV_GPU_UTIL": "util_pct",
    "DCGM_FI_DEV_FB_USED": "fb_used_mib",
    "DCGM_FI_DEV_FB_FREE": "fb_free_mib",
    "DCGM_FI_DEV_GPU_TEMP": "temp_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_MEM_CLOCK": "mem_clock_mhz",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "energy_mj",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_sbe",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe",
    "DCGM_FI_DEV_XID_ERRORS": "xid",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "nvlink_total",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_active",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
}
NODE_METRICS = (
    "node_cpu_seconds_total",
    "node_memory_MemTotal_bytes",
    "node_memory_MemAvailable_bytes",
    "node_network_transmit_bytes_total",
    "node_network_receive_bytes_total",
)
KSM_METRICS = (
    "kube_pod_labels",
    "kube_node_labels",
    "kube_node_info",
    "kube_pod_container_status_restarts_total",
)
RAY_METRICS = ("ray_resources", "ray_object_store_memory", "ray_tasks", "ray_actors")
ALL_METRICS = (*DCGM_METRICS, "up", *NODE_METRICS, *KSM_METRICS, *RAY_METRICS)


def _labels(**labels: str) -> str:
    esc = (str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for v in labels.values())
    return ",".join(f'{k}="{v}"' for k, v in zip(labels, esc))


def _internal_ip(node: str) -> dict[str, str]:
    """``internal_ip`` from an EC2 private DNS name (ip-10-0-1-11 -> 10.0.1.11); none for other names."""
    m = re.fullmatch(r"ip-(\d+)-(\d+)-(\d+)-(\d+)(\..*)?", node)
    return {"internal_ip": ".".join(m.groups()[:4])} if m else {}


def _node_exporter_instance(node: str) -> str:
    """node_exporter's target as kube-prometheus-stack scrapes it: the node's IP (hostNetwork), no node
    label (prometheus-community/helm-charts prometheus-node-exporter); the name where it has no IP."""
    return f"{_internal_ip(node).get('internal_ip', node)}:9100"


def _pci_bus_id(gpu: int) -> str:
    # p4d/p4de place GPU pairs on buses 10, 20, 90, a0 (devices 1c/1d); a plausible id is enough here
    return f"00000000:{(0x10, 0x20, 0x90, 0xA0)[gpu // 2 % 4] + gpu // 8:02X}:{0x1C + gpu % 2:02X}.0"


class _Blocks:
    """One open file per 2-hour window. Families are appended to every file in the same order, so each
    family stays contiguous within a file; a series' samples go to each file in time order."""

    def __init__(self, scenario: Scenario, out_dir: Path, stack: ExitStack):
        self.ts = truth.grid_seconds(scenario)
        first = int(self.ts[0]) // BLOCK_S * BLOCK_S
        edges = np.arange(first, int(self.ts[-1]) + BLOCK_S + 1, BLOCK_S)
        bounds = np.searchsorted(self.ts, edges)
        self.windows = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        self.paths = [
            out_dir
            / f"{scenario.name}-{datetime.fromtimestamp(int(self.ts[w.start]), timezone.utc):%Y%m%dT%H%M}.om"
            for w in self.windows
        ]
        self.files = [stack.enter_context(p.open("w", buffering=1 << 18)) for p in self.paths]
        self.family = [""] * len(self.files)
        self.samples = [0] * len(self.files)

    def series(self, family: str, labels: str, values: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Write one series: ``values`` over the whole grid, kept where ``mask`` is True."""
        prefix = f"{family}{{{labels}}} "
        for i, w in enumerate(self.windows):
            v, t = values[w], self.ts[w]
            if mask is not None:
                keep = mask[w]
                v, t = v[keep], t[keep]
            if not len(t):
                continue
            if self.family[i] != family:
                self.files[i].write(f"# TYPE {family} gauge\n")
                self.family[i] = family
            # Python ints print as ints and floats as their shortest round-trip repr: the exact value.
            self.files[i].write("".join([f"{prefix}{a} {b}\n" for a, b in zip(v.tolist(), t.tolist())]))
            self.samples[i] += len(t)


def write_blocks(scenario: Scenario, out_dir: Path, metrics: set[str] | None = None) -> list[Path]:
    """Write the scenario as OpenMetrics, one file per aligned 2-hour window; returns the files with
    samples, in time order. ``metrics`` restricts the metric names written (default: ALL_METRICS)."""
    wanted = set(ALL_METRICS) if metrics is None else set(metrics)
    if unknown := wanted - set(ALL_METRICS):
        raise ValueError(f"unknown metric(s) {sorted(unknown)}; known: {', '.join(ALL_METRICS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        blocks = _Blocks(scenario, out_dir, stack)
        get = _trackers(scenario, wanted)
        families = [m for m in ALL_METRICS if m in wanted]
        said = time.monotonic()
        for n, family in enumerate(families, 1):
            for labels, values, mask in _series(scenario, family, get):
                blocks.series(family, labels, values, mask)
            if time.monotonic() - said >= PROGRESS_EVERY_S and n < len(families):
                log.info("  OpenMetrics history: %d of %d metric families written", n, len(families))
                said = time.monotonic()
        for f in blocks.files:
            f.write("# EOF\n")
    for p, n in zip(blocks.paths, blocks.samples):
        if not n:
            p.unlink()  # promtool rejects a file without samples
    return [p for p, n in zip(blocks.paths, blocks.samples) if n]


def _trackers(scenario: Scenario, wanted: set[str]) -> dict[str, Callable]:
    # Keep the per-GPU tracks only when several dcgm families reuse them: a benchmark cluster writing one
    # family has thousands of GPUs, and recomputing a track is cheaper than holding them all.
    cache: dict = {}

    def memo(fn: Callable, keep: bool) -> Callable:
        def get(node, *args):
            key = (fn.__name__, node.name, *args)
            if key in cache:
                return cache[key]
            value = fn(scenario, node, *args)
            if keep:
                cache[key] = value
            return value

        return get

    return {
        "gpu": memo(truth.gpu_units, len(wanted & set(DCGM_METRICS)) > 1),
        "node": memo(truth.node_track, True),
        "observed": memo(lambda sc, node: truth.observed(sc, node.name), True),
    }


def _series(
    scenario: Scenario, family: str, get: dict[str, Callable]
) -> Iterator[tuple[str, np.ndarray, np.ndarray | None]]:
    """(labels, values over the grid, mask) of every series of one family."""
    n = scenario.steps
    ones = np.ones(n, dtype=np.int64)
    if family in DCGM_METRICS:
        column = DCGM_METRICS[family]
        for node in scenario.nodes:
            up = get["observed"](node)
            target = dcgm_target(node)
            driver = (
                {"DCGM_FI_DRIVER_VERSION": DRIVER_VERSION} if EXPORTERS[node.exporter].driver_label else {}
            )
            for g in range(node.gpus):
                gpu = {
                    "gpu": str(g),
                    "UUID": truth.gpu_uuid(scenario, node.name, g),
                    "pci_bus_id": _pci_bus_id(g),
                    "device": f"nvidia{g}",
                    "modelName": node.model,
                }
                for mig, track in get["gpu"](node, g):
                    if column not in track:
                        continue  # not reported by this unit (a slice's GPU_UTIL, ECC on the Helm chart)
                    instance = {"GPU_I_PROFILE": mig.profile, "GPU_I_ID": str(mig.instance)} if mig else {}
                    labels = _labels(**gpu, **instance, Hostname=node.name, **driver, **target)
                    holders = track["holders"]  # a row per replica of a time-sliced GPU, else one
                    virtual = mig is None and node.is_time_sliced(g)
                    # one series per label set: a reused pod name back on the same unit continues its
                    # predecessor's series (dcgm-exporter's labels carry no uid), written in time order
                    series: dict[str, np.ndarray] = {}
                    for r, row in enumerate(holders):
                        for h in np.unique(row[up & (row >= 0)]):
                            p = scenario.pods[h]
                            held = (
                                labels
                                + ","
                                + _labels(
                                    exported_container=p.container,
                                    exported_namespace=p.namespace,
                                    exported_pod=p.name,
                                    **({"vgpu": str(r)} if virtual else {}),
                                )
                            )
                            series[held] = series.get(held, False) | (up & (row == h))
                    free = up & ~(holders >= 0).any(axis=0)
                    if free.any():
                        series[labels] = free
                    for held, mask in series.items():
                        yield held, track[column], mask
    elif family == "up":
        # A target's up carries the target's own labels: for dcgm-exporter, found by Kubernetes service
        # discovery, its pod's (which is how the ingest tells the exporter pod from a GPU's holder).
        for node in scenario.nodes:
            yield _labels(**dcgm_target(node)), get["observed"](node).astype(np.int64), None
        for node in scenario.nodes:
            target = _labels(job="node-exporter", instance=_node_exporter_instance(node.name))
            yield target, get["observed"](node).astype(np.int64), None
        for c, i in _ray_nodes(scenario):
            t = truth.ray_track(scenario, c, i)
            yield _labels(**ray_target(scenario, c, i)), t["alive"].astype(np.int64), t["exists"]
    elif family in RAY_METRICS:
        for c, i in _ray_nodes(scenario):
            yield from _ray_series(scenario, c, i, family)
    elif family in NODE_METRICS:
        for node in scenario.nodes:
            up, t = get["observed"](node), get["node"](node)
            scrape = {"job": "node-exporter", "instance": _node_exporter_instance(node.name)}
            if family == "node_cpu_seconds_total":
                for c in range(node.cpus):
                    for mode in ("idle", "system", "user"):
                        yield _labels(cpu=str(c), mode=mode, **scrape), t[f"cpu{c}_{mode}"], up
            elif family == "node_memory_MemTotal_bytes":
                yield _labels(**scrape), t["mem_total_bytes"], up
            elif family == "node_memory_MemAvailable_bytes":
                yield _labels(**scrape), t["mem_total_bytes"] - t["mem_used_bytes"], up
            else:
                col = "net_tx_bytes_total" if "transmit" in family else "net_rx_bytes_total"
                yield _labels(device="eth0", **scrape), t[col], up
    else:  # kube-state-metrics runs off the GPU nodes: its series go on while a node is lost
        ksm = {"job": "kube-state-metrics", "instance": "kube-state-metrics:8080"}
        if family == "kube_pod_labels":
            for p in scenario.pods:
                alive = np.zeros(n, dtype=bool)
                alive[p.start_s // scenario.step_s : p.end_s // scenario.step_s] = True
                uid = truth.pod_uid(scenario, p)
                ray = ray_pod_labels(scenario, p.index)
                yield (
                    _labels(
                        namespace=p.namespace,
                        pod=p.name,
                        uid=uid,
                        label_experiment=p.experiment,
                        **ray,
                        **ksm,
                    ),
                    ones,
                    alive,
                )
        elif family == "kube_pod_container_status_restarts_total":
            for p in scenario.pods:
                alive = np.zeros(n, dtype=bool)
                alive[p.start_s // scenario.step_s : p.end_s // scenario.step_s] = True
                labels = _labels(
                    namespace=p.namespace,
                    pod=p.name,
                    container=p.container,
                    uid=truth.pod_uid(scenario, p),
                    **ksm,
                )
                yield labels, truth.pod_restarts(scenario, p), alive
        elif family == "kube_node_labels":
            for node in scenario.nodes:
                it = node.instance_type
                yield _labels(node=node.name, label_node_kubernetes_io_instance_type=it, **ksm), ones, None
        else:  # kube_node_info: one series per instance, absent while the node has none
            for node in scenario.nodes:
                for iid, alive in truth.node_instances(scenario, node.name):
                    pid = truth.provider_id(scenario, iid)
                    labels = _labels(node=node.name, **_internal_ip(node.name), provider_id=pid, **ksm)
                    yield labels, ones, alive


def _ray_nodes(scenario: Scenario) -> Iterator[tuple[object, int]]:
    """(cluster, pod index) of every Ray node, clusters in file order, the head first."""
    for cluster in scenario.ray:
        for pod in cluster.pods:
            yield cluster, pod


def ray_pod_labels(scenario: Scenario, pod: int) -> dict[str, str]:
    """KubeRay's pod labels of a Ray pod as kube-state-metrics writes them; {} for other pods."""
    for c in scenario.ray:
        if pod in c.pods:
            kind = "head" if pod == c.head else "worker"
            return {"label_ray_io_cluster": c.name, "label_ray_io_node_type": kind}
    return {}


def ray_target(scenario: Scenario, cluster, pod: int) -> dict[str, str]:
    """A Ray node's target labels: on its ``up`` and on every series it yields."""
    p = scenario.pods[pod]
    head = pod == cluster.head
    return {
        "job": "ray-head" if head else "ray-workers",
        "instance": f"{truth.ray_node_ip(scenario, pod)}:8080",
        "namespace": p.namespace,
        "pod": p.name,
        "container": "ray-head" if head else "ray-worker",
        "endpoint": "metrics",
        "ray_io_cluster": cluster.name,
    }


def _ray_series(
    scenario: Scenario, cluster, pod: int, family: str
) -> Iterator[tuple[str, np.ndarray, np.ndarray | None]]:
    """One Ray node's series of one family, with Ray's own labels (as on a Ray 2.6.1 page)."""
    t = truth.ray_track(scenario, cluster, pod)
    alive, target = t["alive"], ray_target(scenario, cluster, pod)
    session = f"session_{scenario.start:%Y-%m-%d_%H-%M-%S}_000000_1"
    common = {
        "NodeAddress": truth.ray_node_ip(scenario, pod),
        "SessionName": session,
        "Version": truth.RAY_VERSION,
    }
    raylet = {"Component": "raylet", **common, "WorkerId": ""}
    worker_id = hashlib.sha256(f"{cluster.name}/{pod}".encode()).hexdigest()[:56]
    core = {"Component": "core_worker", "IsRetry": "0", "JobId": "02000000", **common, "WorkerId": worker_id}

    def series(labels: dict[str, str], values: np.ndarray):
        return _labels(**labels, **target), np.nan_to_num(values).astype(np.int64), alive

    if family == "ray_resources":
        cap = t["object_store_capacity_bytes"]
        for name, state, values in (
            ("GPU", "USED", t["gpus_used"]),
            ("GPU", "AVAILABLE", t["gpus_available"]),
            ("object_store_memory", "USED", cap * 0),  # the logical reservation: nothing reserved
            ("object_store_memory", "AVAILABLE", cap),
        ):
            yield series({**raylet, "Name": name, "State": state}, values)
    elif family == "ray_object_store_memory":
        labels = {**raylet, "Location": "MMAP_SHM", "ObjectState": "SEALED"}
        yield series(labels, t["object_store_used_bytes"])
    elif family == "ray_tasks":
        name = "PPOLearner.train" if pod == cluster.head else "RolloutWorker.sample"
        yield series({**core, "Name": name, "Source": "executor", "State": "RUNNING"}, t["tasks_running"])
        if pod == cluster.head:
            owner = {**core, "Name": "RolloutWorker.sample", "Source": "owner"}
            yield series({**owner, "State": "PENDING_NODE_ASSIGNMENT"}, t["tasks_pending"])
            yield series({**owner, "State": "FAILED"}, t["tasks_failed"])
    elif pod == cluster.head:  # ray_actors: the GCS's counts, from the head
        gcs = {"Component": "gcs_server", **common, "WorkerId": "", "Name": "RolloutWorker", "Source": "gcs"}
        for state, col in (
            ("ALIVE", "actors_alive"),
            ("RESTARTING", "actors_restarting"),
            ("DEAD", "actors_dead"),
        ):
            yield series({**gcs, "State": state}, t[col])
