"""The real Backend, over pynvml (from the `nvidia-ml-py` distribution, not the deprecated `pynvml` one).

Deliberately absent: nvmlDeviceGetPcieThroughput, which samples for ~20 ms per direction and would make
every poll slow. Every pynvml error is translated into backend.NvmlError with the same code.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from .backend import (
    Clocks,
    Ecc,
    ErrorCode,
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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _field_value(f: Any) -> float:
    """One nvmlFieldValue_t's value by its valueType (a C union)."""
    kind = f.valueType
    if kind == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return f.value.dVal
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return f.value.uiVal
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return f.value.ulVal
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return f.value.sllVal
    if kind == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return f.value.siVal
    return f.value.ullVal


class NvmlBackend:
    def __init__(self) -> None:
        self._handles: list[Any] = []
        self._by_address: dict[int, int] = {}  # device handle address -> index, for XID events
        self._event_set: Any = None

    def _call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except pynvml.NVMLError as e:
            raise NvmlError(e.value, f"{what}: {e}") from None

    def _h(self, gpu: int) -> Any:
        if not 0 <= gpu < len(self._handles):
            raise NvmlError(ErrorCode.INVALID_ARGUMENT, f"no handle for GPU {gpu}")
        return self._handles[gpu]

    def init(self) -> None:
        self._call("nvmlInit", pynvml.nvmlInit)
        count = self._call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
        handles = [self._call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)]
        self._handles = handles
        self._by_address = {ctypes.cast(h, ctypes.c_void_p).value or 0: i for i, h in enumerate(handles)}

    def shutdown(self) -> None:
        self._handles, self._by_address = [], {}
        self._event_set = None  # not freed: the XID thread may still be waiting on it
        self._call("nvmlShutdown", pynvml.nvmlShutdown)

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
        return float(self._call("nvmlDeviceGetTemperature", pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU))

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

    def register_xid_events(self) -> None:
        event_set = self._call("nvmlEventSetCreate", pynvml.nvmlEventSetCreate)
        registered = 0
        for i, h in enumerate(self._handles):
            try:
                self._call("nvmlDeviceRegisterEvents", pynvml.nvmlDeviceRegisterEvents, h,
                           pynvml.nvmlEventTypeXidCriticalError, event_set)  # fmt: skip
                registered += 1
            except NvmlError as e:  # e.g. NOT_SUPPORTED on some boards: that GPU has no XID events
                log.warning("XID events not available for GPU %d: %s", i, e)
        self._event_set = event_set if registered else None

    def wait_xid_event(self, timeout_s: float) -> XidEvent | None:
        event_set = self._event_set
        if event_set is None:
            raise NvmlError(ErrorCode.UNINITIALIZED, "nvmlEventSetWait_v2: no event set registered")
        try:
            data = pynvml.nvmlEventSetWait_v2(event_set, int(timeout_s * 1000))
        except pynvml.NVMLError as e:
            if e.value == pynvml.NVML_ERROR_TIMEOUT:
                return None
            raise NvmlError(e.value, f"nvmlEventSetWait_v2: {e}") from None
        gpu = self._by_address.get(ctypes.cast(data.device, ctypes.c_void_p).value or 0, -1)
        return XidEvent(gpu=gpu, xid=int(data.eventData))
