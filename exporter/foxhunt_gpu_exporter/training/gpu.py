"""The in-process GPU poller: the exporter's own Poller thread inside the trainer, every 5 s by
default, its foxhunt_gpu_* figures on the trainer's endpoint.

A trainer wants GPU figures from its own process and, on a machine without a GPU, a warning once and
no poller. So NVML is tried once when the poller is asked for: if it does not initialise (no library,
no driver) or `pynvml` cannot be imported, one warning and no thread; otherwise the exporter's Poller runs
with its usual fault handling (a GPU lost, NVML going away and coming back). No watchdog here: the
exporter's ends the process when a poll is stuck, which must never happen to a trainer.

Who holds these GPUs: the series carry no pod label, so their holder is the pod Prometheus attaches to the
scrape target (a PodMonitor's namespace/pod, whatever its honorLabels): keep those target labels on the
training endpoint. That pod is the target's own, which foxhunt_obs otherwise reads as an exporter holding
nothing; it counts it as the holder because kube-state-metrics lists the pod's GPU limit
(kube_pod_container_resource_limits, foxhunt_obs metric_catalog.yaml kube.gpu_limits). Without
kube-state-metrics these GPUs count as held by no pod.

Which node: the `hostname` label is the node's name, where foxhunt_obs looks up the node's price and where
dcgm-exporter reports the same GPUs. Inside a pod the host name is the pod's name, so in Kubernetes the
poller needs NODE_NAME from the Downward API (`fieldRef: {fieldPath: spec.nodeName}`); without it, one
warning and no poller, rather than GPUs on a "node" named after the pod. The training metrics are served
either way. In Kubernetes means KUBERNETES_SERVICE_HOST is set: the kubelet puts the API server's service
in every container's environment, even with enableServiceLinks false (kubernetes/kubernetes
pkg/kubelet/kubelet_pods.go; kubernetes/kubernetes#120953), and in-cluster clients test it (kubernetes-client/python,
kubernetes/base/config/incluster_config.py).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from ..backend import Backend, NvmlError
from ..collector import SnapshotCollector
from ..events import XidCounters
from ..poller import ErrorCounts, Poller

log = logging.getLogger(__name__)
DEFAULT_INTERVAL_S = 5.0  # every 5 s (~50 ms an nvidia-smi call, about 1 % of the window)


class GpuFamilies(Collector):
    """The exporter's per-GPU families (foxhunt_gpu_*) from the latest snapshot; not its self-metrics,
    nor the XID counter (no XID thread runs in a trainer)."""

    def __init__(self, poller: Poller):
        self._inner = SnapshotCollector(lambda: poller.snapshot, XidCounters(), ErrorCounts())

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for family in self._inner.collect():
            if family.name.startswith("foxhunt_gpu_") and family.name != "foxhunt_gpu_xid_errors":
                yield family


def _nvml_backend() -> Backend:
    from ..nvml_backend import NvmlBackend  # imports pynvml

    return NvmlBackend()


def start_gpu_poller(
    registry: CollectorRegistry,
    interval: float = DEFAULT_INTERVAL_S,
    backend: Backend | None = None,
    hostname: str | None = None,
) -> Poller | None:
    """Start polling every `interval` s and expose the GPUs in `registry`; None (one warning) without NVML,
    or in Kubernetes without the node's name."""
    node = hostname or (backend.hostname() if backend is not None else None) or os.environ.get("NODE_NAME")
    if not node and os.environ.get("KUBERNETES_SERVICE_HOST"):
        log.warning(
            "no GPU figures on the training endpoint: in Kubernetes the GPU poller needs NODE_NAME (the "
            "Downward API's spec.nodeName), since the host name is the pod's; GPU poller not started"
        )
        return None
    try:
        backend = backend or _nvml_backend()
        backend.init()  # a probe: the Poller initialises NVML itself (init is reference-counted)
        backend.shutdown()
    except (ImportError, OSError, NvmlError) as e:
        log.warning(
            "no GPU figures on the training endpoint: NVML unavailable (%s); GPU poller not started", e
        )
        return None
    hostname = node or backend.hostname() or socket.gethostname()
    poller = Poller(backend, interval=interval, hostname=hostname)
    registry.register(GpuFamilies(poller))
    poller.start()
    log.info("GPU poller: every %gs, %s", interval, hostname)
    return poller
