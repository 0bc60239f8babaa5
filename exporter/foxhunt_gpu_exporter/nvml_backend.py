"""The real Backend, over pynvml (from the `nvidia-ml-py` distribution, not the deprecated `pynvml` one).

Deliberately absent: nvmlDeviceGetPcieThroughput, which samples for ~20 ms per direction and would make
every poll slow. Every pynvml error is translated into backend.NvmlError with the same code.
A GPU whose handle NVML refuses at init (GPU_IS_LOST, NO_PERMISSION, ...) keeps its index and reads as down
until its handle can be had; only library-wide codes fail init.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from .backend import (
    LIBRARY_CODES,
    Clocks,
    Ecc,
    ErrorCode,
    GpmActivity,
    GpmSample,
    GpuIdentity,
    Memory,
    Nvlink,
    NvmlError,
    RemappedRows,
    Utilization,
    XidEvent,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
ALL_LINKS = 0xFFFFFFFF  # scopeId UINT_MAX: the NVLink throughput counter summed over every link
NVLINK_FIELDS = (
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
)

# GpmActivity field -> the GPM metric read for it (each 0.0-100.0 percent, pynvml.py's comments).
GPM_METRICS = (
    ("sm", pynvml.NVML_GPM_METRIC_SM_UTIL),
    ("tensor", pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL),
    ("graphics", pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL),
)
PERCENT = 100.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# nvmlValueType_t -> the c_nvmlValue_t union member that holds it. UNSIGNED_SHORT (6, `usVal`) is newer than
# some nvidia-ml-py releases the pin allows, hence the literal.
_VALUE_MEMBERS = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    6: "usVal",
}


def _field_value(f: Any) -> float:
    """One nvmlFieldValue_t's value by its valueType (a C union: reading the wrong member reads garbage)."""
    member = _VALUE_MEMBERS.get(f.valueType)
    if member is None or not hasattr(f.value, member):  # not UNKNOWN: that would mark the whole GPU down
        raise NvmlError(ErrorCode.NOT_SUPPORTED, f"nvmlDeviceGetFieldValues: field {f.fieldId}: type {f.valueType}")
    return getattr(f.value, member)


def _address(handle: Any) -> int:
    """A device handle's pointer value (expected to be the same in event data as from GetHandleByIndex)."""
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class NvmlBackend:
    def __init__(self) -> None:
        self._handles: list[Any] = []  # by NVML index; None where the handle could not be had (yet)
        self._by_address: dict[int, int] = {}  # device handle address -> index, for XID events
        self._gpm_supported: set[int] = set()  # GPUs whose nvmlGpmQueryDeviceSupport said yes
        self._gpm_samples: dict[int, Any] = {}  # address -> GPM sample buffer not freed yet (shutdown frees)
        self._event_set: Any = None
        # Held for the whole nvmlEventSetWait_v2, so shutdown never frees the set (or shuts NVML down) under it.
        self._wait_lock = threading.Lock()
        self._wait_timeout_s = 1.0

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except pynvml.NVMLError as e:
            raise NvmlError(e.value, f"{what}: {e}") from None

    def _acquire(self, i: int) -> Any:
        h = self._call(f"nvmlDeviceGetHandleByIndex({i})", pynvml.nvmlDeviceGetHandleByIndex, i)
        self._handles[i] = h
        self._by_address = {**self._by_address, _address(h): i}  # replaced whole: the XID thread reads it
        return h

    def _h(self, gpu: int) -> Any:
        if not 0 <= gpu < len(self._handles):
            raise NvmlError(ErrorCode.INVALID_ARGUMENT, f"no handle for GPU {gpu}")
        h = self._handles[gpu]
        if h is None:  # refused at init (lost, no permission, ...): ask again; the error marks this GPU down
            h = self._acquire(gpu)
            log.info("GPU %d: device handle acquired", gpu)
            if self._event_set is not None:
                self._register_xid(gpu, h, self._event_set)
        return h

    def init(self) -> None:
        self._call("nvmlInit", pynvml.nvmlInit)
        try:
            count = self._call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
            self._handles, self._by_address = [None] * count, {}
            self._gpm_supported = set()
            for i in range(count):
                # nvmlDeviceGetCount_v2 counts every GPU, also those whose handle is then refused (NO_PERMISSION,
                # GPU_IS_LOST, ...). One such GPU must not take the others down: it is reported down instead.
                try:
                    self._acquire(i)
                except NvmlError as e:
                    if e.code in LIBRARY_CODES:
                        raise
                    log.warning("GPU %d: no device handle (%s); reporting it down, asking again each poll", i, e)
        except BaseException:
            self._handles, self._by_address = [], {}
            try:  # nvmlInit is reference-counted: a failed init must not leave one count behind
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass
            raise

    def shutdown(self) -> None:
        self._free_gpm_samples()  # before nvmlShutdown: a buffer left over would leak for good
        self._handles, self._by_address = [], {}
        event_set, self._event_set = self._event_set, None  # no new wait starts on it
        # Let a wait in progress return (it is bounded by its own timeout) before the set is freed.
        waited = self._wait_lock.acquire(timeout=self._wait_timeout_s + 1.0)
        try:
            if event_set is not None and waited:
                try:
                    pynvml.nvmlEventSetFree(event_set)
                except pynvml.NVMLError as e:
                    log.debug("nvmlEventSetFree: %s", e)
            self._call("nvmlShutdown", pynvml.nvmlShutdown)
        finally:
            if waited:
                self._wait_lock.release()

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion))

    def hostname(self) -> str | None:
        return None

    def device_count(self) -> int:
        return len(self._handles)

    def identity(self, gpu: int) -> GpuIdentity:
        h = self._h(gpu)
        pci = self._call("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, h)
        return GpuIdentity(
            uuid=_text(self._call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, h)),
            model=_text(self._call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, h)),
            pci_bus_id=_text(pci.busId),
        )

    def memory(self, gpu: int, v2: bool = True) -> Memory:
        h = self._h(gpu)
        if v2:  # v2 reports driver-reserved memory apart; v1 counts it as used
            m = self._call("nvmlDeviceGetMemoryInfo_v2", pynvml.nvmlDeviceGetMemoryInfo, h, version=pynvml.nvmlMemory_v2)
            return Memory(total=m.total, used=m.used, free=m.free, reserved=m.reserved)
        m = self._call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, h)
        return Memory(total=m.total, used=m.used, free=m.free, reserved=None)

    def utilization(self, gpu: int) -> Utilization:
        u = self._call("nvmlDeviceGetUtilizationRates", pynvml.nvmlDeviceGetUtilizationRates, self._h(gpu))
        return Utilization(gpu=float(u.gpu), memory=float(u.memory))

    def temperature(self, gpu: int) -> float:
        h = self._h(gpu)
        try:
            fn = pynvml.nvmlDeviceGetTemperature
            return float(self._call("nvmlDeviceGetTemperature", fn, h, pynvml.NVML_TEMPERATURE_GPU))
        except NvmlError as e:
            fn = getattr(pynvml, "nvmlDeviceGetTemperatureV", None)
            if e.code != ErrorCode.FUNCTION_NOT_FOUND or fn is None:
                raise
        # nvmlDeviceGetTemperature is deprecated, to be removed from the library in CUDA 14; this is its successor.
        return float(self._call("nvmlDeviceGetTemperatureV", fn, h, pynvml.NVML_TEMPERATURE_GPU))

    def power(self, gpu: int) -> float:
        return self._call("nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, self._h(gpu)) / 1000.0  # mW

    def energy(self, gpu: int) -> float:
        h = self._h(gpu)
        return self._call("nvmlDeviceGetTotalEnergyConsumption", pynvml.nvmlDeviceGetTotalEnergyConsumption, h) / 1000.0

    def clocks(self, gpu: int) -> Clocks:
        h = self._h(gpu)
        sm = self._call("nvmlDeviceGetClockInfo(SM)", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
        mem = self._call("nvmlDeviceGetClockInfo(MEM)", pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
        return Clocks(sm_hz=sm * 1e6, memory_hz=mem * 1e6)  # MHz

    def clock_events(self, gpu: int) -> int:
        h = self._h(gpu)
        try:
            fn = pynvml.nvmlDeviceGetCurrentClocksEventReasons
            return int(self._call("nvmlDeviceGetCurrentClocksEventReasons", fn, h))
        except NvmlError as e:
            if e.code != ErrorCode.FUNCTION_NOT_FOUND:
                raise
        # Drivers before 535 only have the older name for the same bits.
        fn = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return int(self._call("nvmlDeviceGetCurrentClocksThrottleReasons", fn, h))

    def ecc(self, gpu: int) -> Ecc:
        h, fn = self._h(gpu), pynvml.nvmlDeviceGetTotalEccErrors
        corrected, uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        volatile, aggregate = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
        what = "nvmlDeviceGetTotalEccErrors"
        return Ecc(
            corrected_volatile=self._call(what, fn, h, corrected, volatile),
            uncorrected_volatile=self._call(what, fn, h, uncorrected, volatile),
            corrected_aggregate=self._call(what, fn, h, corrected, aggregate),
            uncorrected_aggregate=self._call(what, fn, h, uncorrected, aggregate),
        )

    def pcie_replays(self, gpu: int) -> int:
        return int(self._call("nvmlDeviceGetPcieReplayCounter", pynvml.nvmlDeviceGetPcieReplayCounter, self._h(gpu)))

    def nvlink(self, gpu: int) -> Nvlink:
        # One batched call for both directions. Each field carries its own return code: a GPU without
        # NVLink answers NOT_SUPPORTED there while the call itself succeeds.
        fields = self._call("nvmlDeviceGetFieldValues", pynvml.nvmlDeviceGetFieldValues, self._h(gpu), list(NVLINK_FIELDS))
        for f in fields:
            if f.nvmlReturn != pynvml.NVML_SUCCESS:
                raise NvmlError(f.nvmlReturn, f"nvmlDeviceGetFieldValues(NVLink throughput field {f.fieldId})")
        rx_kib, tx_kib = (_field_value(f) for f in fields)
        return Nvlink(rx_bytes=int(rx_kib) * 1024, tx_bytes=int(tx_kib) * 1024)  # KiB

    def remapped_rows(self, gpu: int) -> RemappedRows:
        corr, unc, pending, failed = self._call("nvmlDeviceGetRemappedRows", pynvml.nvmlDeviceGetRemappedRows, self._h(gpu))
        return RemappedRows(correctable=int(corr), uncorrectable=int(unc), pending=bool(pending), failed=bool(failed))

    def gpm_sample(self, gpu: int) -> GpmSample:
        h = self._h(gpu)
        if gpu not in self._gpm_supported:  # asked once per init: support does not change under a driver
            support = self._call("nvmlGpmQueryDeviceSupport", pynvml.nvmlGpmQueryDeviceSupport, h)
            if not support.isSupportedDevice:  # the query succeeds on pre-Hopper boards, with a "no"
                raise NvmlError(ErrorCode.NOT_SUPPORTED, f"nvmlGpmQueryDeviceSupport: GPU {gpu} has no GPM")
            self._gpm_supported.add(gpu)
        sample = self._call("nvmlGpmSampleAlloc", pynvml.nvmlGpmSampleAlloc)
        self._gpm_samples[_address(sample)] = sample
        try:
            self._call("nvmlGpmSampleGet", pynvml.nvmlGpmSampleGet, h, sample)
        except NvmlError:
            self.gpm_free(sample)
            raise
        return sample

    def gpm_activity(self, gpu: int, earlier: GpmSample, later: GpmSample) -> GpmActivity:
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = earlier, later
        for slot, (_, metric_id) in zip(request.metrics, GPM_METRICS):
            slot.metricId = metric_id
        self._call("nvmlGpmMetricsGet", pynvml.nvmlGpmMetricsGet, request)
        # Each metric carries its own return code: one a board lacks must not hide the others.
        results = request.metrics[: len(GPM_METRICS)]
        if all(m.nvmlReturn != pynvml.NVML_SUCCESS for m in results):
            first = results[0]
            raise NvmlError(first.nvmlReturn, f"nvmlGpmMetricsGet(metric {first.metricId}) on GPU {gpu}")
        values = {
            name: m.value / PERCENT if m.nvmlReturn == pynvml.NVML_SUCCESS else None
            for (name, _), m in zip(GPM_METRICS, results)
        }
        return GpmActivity(**values)

    def gpm_free(self, sample: GpmSample) -> None:
        if self._gpm_samples.pop(_address(sample), None) is None:
            return  # freed already (by shutdown): freeing twice would be a double free in C
        self._call("nvmlGpmSampleFree", pynvml.nvmlGpmSampleFree, sample)

    def _free_gpm_samples(self) -> None:
        for sample in list(self._gpm_samples.values()):
            try:
                self.gpm_free(sample)
            except NvmlError as e:
                log.debug("nvmlGpmSampleFree: %s", e)

    def _register_xid(self, i: int, h: Any, event_set: Any) -> bool:
        try:
            self._call("nvmlDeviceRegisterEvents", pynvml.nvmlDeviceRegisterEvents, h,
                       pynvml.nvmlEventTypeXidCriticalError, event_set)  # fmt: skip
            return True
        except NvmlError as e:  # e.g. NOT_SUPPORTED on some boards: that GPU has no XID events
            log.warning("XID events not available for GPU %d: %s", i, e)
            return False

    def register_xid_events(self) -> None:
        event_set = self._call("nvmlEventSetCreate", pynvml.nvmlEventSetCreate)
        registered = 0
        for i, h in enumerate(self._handles):
            if h is not None:  # a GPU without a handle yet is registered when its handle is acquired
                registered += self._register_xid(i, h, event_set)
        if registered or any(h is None for h in self._handles):
            self._event_set = event_set
            return
        try:
            pynvml.nvmlEventSetFree(event_set)
        except pynvml.NVMLError:
            pass
        self._event_set = None

    def wait_xid_event(self, timeout_s: float) -> XidEvent | None:
        self._wait_timeout_s = timeout_s
        with self._wait_lock:
            event_set = self._event_set
            if event_set is None:
                raise NvmlError(ErrorCode.UNINITIALIZED, "nvmlEventSetWait_v2: no event set registered")
            try:  # timeout in ms; at least 1, as 0 need not mean "do not wait"
                data = pynvml.nvmlEventSetWait_v2(event_set, max(1, int(timeout_s * 1000)))
            except pynvml.NVMLError as e:
                if e.value == pynvml.NVML_ERROR_TIMEOUT:
                    return None
                raise NvmlError(e.value, f"nvmlEventSetWait_v2: {e}") from None
        if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return None  # only XIDs are registered; any other event's eventData is 0, not an XID
        return XidEvent(gpu=self._event_gpu(data.device), xid=int(data.eventData))

    def _event_gpu(self, device: Any) -> int:
        """The index of an event's device: by handle address, else (address not seen) by asking NVML."""
        address = _address(device)
        gpu = self._by_address.get(address)
        if gpu is not None:
            return gpu
        if not address:
            return -1
        try:
            return int(pynvml.nvmlDeviceGetIndex(device))
        except pynvml.NVMLError:
            return -1
