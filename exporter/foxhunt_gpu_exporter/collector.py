"""The prometheus_client Collector: turns the latest Snapshot into metric families, and nothing else.

`collect()` reads the current Snapshot, the XID and error counters and the pod mapping: all in memory,
never the backend and never the kubelet, so a scrape cannot hang on the device. What each per-GPU
family is and where its value comes from is the table GPU_FAMILIES (data, like dcgm-exporter's CSV).

A GPU shared by several pods (time-slicing replicas) gets every per-GPU series once per pod holding it,
each with that pod's labels and `vgpu` = its replica, as dcgm-exporter's --kubernetes-virtual-gpus does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .backend import CLOCK_EVENT_REASONS
from .events import XidCounters
from .podresources import PodSource
from .poller import ErrorCounts
from .snapshot import POLL_BUCKETS, GpuReading, Snapshot

GPU_LABELS = ("gpu", "uuid", "hostname", "model")
POD_LABELS = ("pod", "namespace", "container", "vgpu")  # vgpu: time-slicing replica, "" on an unshared GPU
NO_POD = ("",) * len(POD_LABELS)  # a GPU no pod holds: one series, empty pod labels
Values = Callable[[GpuReading], Iterable[tuple[tuple[str, ...], float]]]


@dataclass(frozen=True)
class GpuFamily:
    name: str  # as exposed; counters end in _total
    kind: str  # "gauge" | "counter"
    unit: str
    help: str
    values: Values  # (extra label values, value) pairs of one GPU; empty when not read
    extra_labels: tuple[str, ...] = ()


def one(get: Callable[[GpuReading], float | None]) -> Values:
    def values(g: GpuReading) -> Iterable[tuple[tuple[str, ...], float]]:
        v = get(g)
        return () if v is None else (((), float(v)),)

    return values


def _clock_events(g: GpuReading):
    if g.clock_events is None:
        return ()
    return (((reason,), float(bool(g.clock_events & bit))) for reason, bit in CLOCK_EVENT_REASONS)


def _ecc(g: GpuReading):
    e = g.ecc
    if e is None:
        return ()
    return (
        (("corrected", "volatile"), e.corrected_volatile),
        (("uncorrected", "volatile"), e.uncorrected_volatile),
        (("corrected", "aggregate"), e.corrected_aggregate),
        (("uncorrected", "aggregate"), e.uncorrected_aggregate),
    )


def _nvlink(g: GpuReading):
    return () if g.nvlink is None else ((("rx",), g.nvlink.rx_bytes), (("tx",), g.nvlink.tx_bytes))


def _remapped(g: GpuReading):
    r = g.remapped_rows
    return () if r is None else ((("correctable",), r.correctable), (("uncorrectable",), r.uncorrectable))


GPU_FAMILIES = (
    GpuFamily("foxhunt_gpu_utilization_percent", "gauge", "percent",
              "Percent of the last sample period (1/6 s to 1 s) during which a kernel ran (0-100).",
              one(lambda g: g.utilization and g.utilization.gpu)),
    GpuFamily("foxhunt_gpu_memory_utilization_percent", "gauge", "percent",
              "Percent of the last sample period during which device memory was read or written (0-100).",
              one(lambda g: g.utilization and g.utilization.memory)),
    GpuFamily("foxhunt_gpu_memory_used_bytes", "gauge", "bytes",
              "Device memory in use by contexts (NVML memory info v2: driver-reserved memory excluded).",
              one(lambda g: g.memory and g.memory.used)),
    GpuFamily("foxhunt_gpu_memory_total_bytes", "gauge", "bytes", "Device memory installed.",
              one(lambda g: g.memory and g.memory.total)),
    GpuFamily("foxhunt_gpu_memory_reserved_bytes", "gauge", "bytes",
              "Device memory reserved by the driver (NVML memory info v2 only).",
              one(lambda g: g.memory and g.memory.reserved)),
    GpuFamily("foxhunt_gpu_temperature_celsius", "gauge", "celsius", "GPU core temperature.",
              one(lambda g: g.temperature)),
    GpuFamily("foxhunt_gpu_power_draw_watts", "gauge", "watts", "Board power draw.", one(lambda g: g.power)),
    GpuFamily("foxhunt_gpu_sm_clock_hertz", "gauge", "hertz", "Current SM clock.",
              one(lambda g: g.clocks and g.clocks.sm_hz)),
    GpuFamily("foxhunt_gpu_memory_clock_hertz", "gauge", "hertz", "Current memory clock.",
              one(lambda g: g.clocks and g.clocks.memory_hz)),
    GpuFamily("foxhunt_gpu_clock_event_active", "gauge", "",
              "1 while this reason holds the clocks down (NVML clocks event reasons), else 0.",
              _clock_events, ("reason",)),
    GpuFamily("foxhunt_gpu_remapped_rows_pending", "gauge", "",
              "1 when a row remap is pending (the GPU needs a reset), else 0.",
              one(lambda g: g.remapped_rows and g.remapped_rows.pending)),
    GpuFamily("foxhunt_gpu_remapped_rows_failed", "gauge", "",
              "1 when a row remap failed (the GPU needs service), else 0.",
              one(lambda g: g.remapped_rows and g.remapped_rows.failed)),
    GpuFamily("foxhunt_gpu_energy_joules_total", "counter", "joules", "Energy used since the driver loaded.",
              one(lambda g: g.energy)),
    GpuFamily("foxhunt_gpu_ecc_errors_total", "counter", "",
              "ECC memory errors; scope volatile = since the driver loaded, aggregate = lifetime.",
              _ecc, ("error", "scope")),
    GpuFamily("foxhunt_gpu_pcie_replays_total", "counter", "", "PCIe replays (link-level retransmissions).",
              one(lambda g: g.pcie_replays)),
    GpuFamily("foxhunt_gpu_nvlink_bytes_total", "counter", "bytes",
              "NVLink data bytes over all links since the driver loaded.", _nvlink, ("direction",)),
    GpuFamily("foxhunt_gpu_remapped_rows_total", "counter", "",
              "Memory rows remapped, by the kind of error that caused it.", _remapped, ("cause",)),
    # NVML GPM (Hopper and later): averages over the interval between two polls, so none on the first poll.
    GpuFamily("foxhunt_gpu_sm_active_ratio", "gauge", "ratio",
              "Share of SMs that were busy between the last two polls (NVML GPM SM_UTIL, 0-1).",
              one(lambda g: g.gpm and g.gpm.sm)),
    GpuFamily("foxhunt_gpu_tensor_active_ratio", "gauge", "ratio",
              "Share of time the SMs ran any tensor operation between the last two polls (NVML GPM "
              "ANY_TENSOR_UTIL, 0-1).", one(lambda g: g.gpm and g.gpm.tensor)),
    GpuFamily("foxhunt_gpu_gr_engine_active_ratio", "gauge", "ratio",
              "Share of time any compute/graphics context was active between the last two polls (NVML GPM "
              "GRAPHICS_UTIL, 0-1).", one(lambda g: g.gpm and g.gpm.graphics)),
)  # fmt: skip


def _family(name: str, kind: str, help_: str, labels: Iterable[str], unit: str = "") -> Metric:
    if kind == "counter":
        return CounterMetricFamily(name, help_, labels=labels, unit=unit)
    return GaugeMetricFamily(name, help_, labels=labels, unit=unit)


class SnapshotCollector(Collector):
    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        xids: XidCounters,
        errors: ErrorCounts,
        pods: PodSource | None = None,
    ):
        self._snapshot, self._xids, self._errors, self._pods = snapshot, xids, errors, pods

    def describe(self) -> list[Metric]:
        return []  # registering must not collect; our names never clash inside a private registry

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        names = GPU_LABELS + (POD_LABELS if self._pods is not None else ())
        holders = {g.index: self._holders(snap, g) for g in snap.gpus}
        up = [g for g in snap.gpus if g.up]

        info = GaugeMetricFamily("foxhunt_gpu_info", "GPU identity; always 1.",
                                 labels=("driver", "model", "uuid", "pci_bus_id", "gpu", "hostname"))  # fmt: skip
        for g in snap.gpus:
            if g.identity is not None:  # kept for a GPU that is down: says which board is missing
                i = g.identity
                info.add_metric((snap.driver, i.model, i.uuid, i.pci_bus_id, str(g.index), snap.hostname), 1.0)
        yield info
        up_family = GaugeMetricFamily("foxhunt_gpu_up", "1 if the GPU answered the last poll, else 0.", labels=names)
        for g in snap.gpus:
            for base in holders[g.index]:
                up_family.add_metric(base, 1.0 if g.up else 0.0)
        yield up_family

        for spec in GPU_FAMILIES:
            family = _family(spec.name, spec.kind, spec.help, names + spec.extra_labels, spec.unit)
            for g in up:
                values = tuple(spec.values(g))  # read once: the same device values go to every holder
                for base in holders[g.index]:
                    for extra, value in values:
                        family.add_metric(base + extra, value)
            if family.samples:
                yield family

        xid = CounterMetricFamily("foxhunt_gpu_xid_errors", "XID critical errors reported by the driver.",
                                  labels=names + ("xid",))  # fmt: skip
        for (gpu, code), count in self._xids.items():
            unknown = ((str(gpu), "", snap.hostname, "") + ("",) * (len(names) - 4),)
            for base in holders.get(gpu) or unknown:
                xid.add_metric(base + (str(code),), count)
        yield xid
        yield from self._self_metrics(snap)

    def _holders(self, snap: Snapshot, g: GpuReading) -> tuple[tuple[str, ...], ...]:
        """The label values of each series of one GPU: one per pod holding it, or one with no pod."""
        uuid, model = (g.identity.uuid, g.identity.model) if g.identity else ("", "")
        labels = (str(g.index), uuid, snap.hostname, model)
        if self._pods is None:
            return (labels,)
        refs = self._pods.pods_for(uuid, g.index)
        if not refs:
            return (labels + NO_POD,)
        return tuple(labels + (r.pod, r.namespace, r.container, r.vgpu) for r in refs)

    def _self_metrics(self, snap: Snapshot) -> Iterator[Metric]:
        polls = snap.polls
        cumulative, buckets = 0, []
        for bound, count in zip((*map(str, POLL_BUCKETS), "+Inf"), polls.bucket_counts):
            cumulative += count
            buckets.append((bound, cumulative))
        yield HistogramMetricFamily("foxhunt_exporter_poll_duration_seconds",
                                    "Time one poll cycle of every GPU took; _count is the number of polls.",
                                    buckets=buckets, sum_value=polls.total_seconds, unit="seconds")  # fmt: skip
        errors = CounterMetricFamily("foxhunt_exporter_poll_errors", "Poll errors by kind.", labels=("kind",))
        for kind, count in self._errors.items():
            errors.add_metric((kind,), count)
        yield errors
        yield GaugeMetricFamily("foxhunt_exporter_last_poll_success_timestamp_seconds",
                                "Unix time of the last poll in which NVML answered (0: never).",
                                value=snap.last_success, unit="seconds")  # fmt: skip
        yield GaugeMetricFamily("foxhunt_exporter_nvml_up", "1 if NVML is initialised and answering, else 0.",
                                value=1.0 if snap.nvml_up else 0.0)  # fmt: skip
        yield GaugeMetricFamily("foxhunt_exporter_nvml_init_error_code",
                                "NVML return code of the last failed init attempt (e.g. 9 DRIVER_NOT_LOADED, "
                                "12 LIBRARY_NOT_FOUND); 0 once init succeeded.",
                                value=snap.init_error_code)  # fmt: skip
        yield GaugeMetricFamily("foxhunt_exporter_gpus", "GPUs NVML reported at the last successful init.",
                                value=len(snap.gpus))  # fmt: skip
