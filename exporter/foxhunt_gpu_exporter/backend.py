"""The device interface the poller talks to, and the backend-neutral readings and errors.

Two backends implement it: `nvml_backend.NvmlBackend` (the real one, over pynvml) and
`fake_backend.FakeBackend` (scenario-driven, for tests, the sandbox and benchmarks). Everything above this
module sees only these types, never pynvml's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


class ErrorCode(enum.IntEnum):
    """NVML return codes (same numbers as nvml.h), so both backends speak one language."""

    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    ALREADY_INITIALIZED = 5
    NOT_FOUND = 6
    INSUFFICIENT_SIZE = 7
    INSUFFICIENT_POWER = 8
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    IRQ_ISSUE = 11
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    CORRUPTED_INFOROM = 14
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    OPERATING_SYSTEM = 17
    LIB_RM_VERSION_MISMATCH = 18
    IN_USE = 19
    MEMORY = 20
    NO_DATA = 21
    INSUFFICIENT_RESOURCES = 23
    ARGUMENT_VERSION_MISMATCH = 25
    DEPRECATED = 26
    NOT_READY = 27
    GPU_NOT_FOUND = 28
    INVALID_STATE = 29
    UNKNOWN = 999

    @classmethod
    def of(cls, value: int) -> ErrorCode:
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


# What the poller does with an error depends only on its code:
#   unsupported -> remember per GPU and metric, never ask again (until NVML is re-initialised)
#   device      -> that GPU is down this cycle (`foxhunt_gpu_up 0`), retried next cycle
#   library     -> NVML itself is gone: shut down, re-initialise with backoff
#   anything else -> that one metric is skipped this cycle and counted
UNSUPPORTED_CODES = frozenset({ErrorCode.NOT_SUPPORTED, ErrorCode.FUNCTION_NOT_FOUND})
DEVICE_CODES = frozenset(
    {
        ErrorCode.GPU_IS_LOST,
        ErrorCode.RESET_REQUIRED,
        ErrorCode.GPU_NOT_FOUND,
        ErrorCode.IRQ_ISSUE,
        ErrorCode.CORRUPTED_INFOROM,
        ErrorCode.TIMEOUT,
        ErrorCode.UNKNOWN,
    }
)
LIBRARY_CODES = frozenset(
    {
        ErrorCode.UNINITIALIZED,
        ErrorCode.DRIVER_NOT_LOADED,
        ErrorCode.LIBRARY_NOT_FOUND,
        ErrorCode.LIB_RM_VERSION_MISMATCH,
    }
)


class NvmlError(Exception):
    """A device call failed. `code` is an ErrorCode; str() says what was being done."""

    def __init__(self, code: int, message: str = ""):
        self.code = ErrorCode.of(code)
        super().__init__(message or self.code.name)

    def __str__(self) -> str:
        base = super().__str__()
        return f"{self.code.name}: {base}" if base != self.code.name else base


# Metric groups the poller reads per GPU: each is one backend method of the same name (`gpm`: the three
# gpm_* methods), and the unit of "not supported" bookkeeping. `memory_v2` is the v2 memory call,
# remembered separately from v1.
METRICS = (
    "memory",
    "utilization",
    "temperature",
    "power",
    "energy",
    "clocks",
    "clock_events",
    "ecc",
    "pcie_replays",
    "nvlink",
    "remapped_rows",
    "gpm",
)
MEMORY_V2 = "memory_v2"
GPM = "gpm"

# nvmlClocksEventReason* bits (nvml.h) -> the `reason` label of foxhunt_gpu_clock_event_active.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("sync_boost", 0x10),
    ("sw_thermal", 0x20),
    ("hw_thermal", 0x40),
    ("hw_power_brake", 0x80),
    ("display_clock_setting", 0x100),
)


@dataclass(frozen=True)
class GpuIdentity:
    uuid: str
    model: str
    pci_bus_id: str


@dataclass(frozen=True)
class Memory:
    total: int  # bytes
    used: int  # bytes; v2 excludes driver-reserved memory, v1 counts it as used
    free: int
    reserved: int | None  # bytes; None when only the v1 call answered


@dataclass(frozen=True)
class Utilization:
    gpu: float  # percent of the last sample period a kernel ran
    memory: float  # percent of the period device memory was read or written


@dataclass(frozen=True)
class Clocks:
    sm_hz: float
    memory_hz: float


@dataclass(frozen=True)
class Ecc:
    corrected_volatile: int
    uncorrected_volatile: int
    corrected_aggregate: int
    uncorrected_aggregate: int


@dataclass(frozen=True)
class Nvlink:
    rx_bytes: int
    tx_bytes: int


@dataclass(frozen=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failed: bool


@dataclass(frozen=True)
class GpmActivity:
    """NVML GPM metrics between two samples (Hopper and later), as 0..1 ratios; None: that metric refused."""

    sm: float | None  # NVML_GPM_METRIC_SM_UTIL: share of SMs that were busy
    tensor: float | None  # NVML_GPM_METRIC_ANY_TENSOR_UTIL: share of time SMs ran any tensor operation
    graphics: float | None  # NVML_GPM_METRIC_GRAPHICS_UTIL: share of time any compute/graphics app was active


GpmSample = Any  # opaque: a backend's sample buffer, handed back to that backend only


@dataclass(frozen=True)
class XidEvent:
    gpu: int  # index
    xid: int


@runtime_checkable
class Backend(Protocol):
    """The NVML calls we need. Every method may raise NvmlError.

    Thread rules: every method except `wait_xid_event` is called from the poller thread only
    (nvmlDeviceGetFieldValues is not thread-safe); `wait_xid_event` runs on the XID event thread.
    """

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def hostname(self) -> str | None: ...  # a fake scenario may name its node; real: None
    def device_count(self) -> int: ...
    def identity(self, gpu: int) -> GpuIdentity: ...
    def memory(self, gpu: int, v2: bool = True) -> Memory: ...
    def utilization(self, gpu: int) -> Utilization: ...
    def temperature(self, gpu: int) -> float: ...  # celsius
    def power(self, gpu: int) -> float: ...  # watts
    def energy(self, gpu: int) -> float: ...  # joules since driver load
    def clocks(self, gpu: int) -> Clocks: ...
    def clock_events(self, gpu: int) -> int: ...  # CLOCK_EVENT_REASONS bitmask
    def ecc(self, gpu: int) -> Ecc: ...
    def pcie_replays(self, gpu: int) -> int: ...
    def nvlink(self, gpu: int) -> Nvlink: ...
    def remapped_rows(self, gpu: int) -> RemappedRows: ...
    # GPM metrics are rates between two samples: the caller keeps the previous sample, frees every one.
    def gpm_sample(self, gpu: int) -> GpmSample: ...  # NOT_SUPPORTED where the GPU has no GPM
    def gpm_activity(self, gpu: int, earlier: GpmSample, later: GpmSample) -> GpmActivity: ...
    def gpm_free(self, sample: GpmSample) -> None: ...
    def register_xid_events(self) -> None: ...
    def wait_xid_event(self, timeout_s: float) -> XidEvent | None: ...
