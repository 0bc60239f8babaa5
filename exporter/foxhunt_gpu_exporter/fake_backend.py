"""A Backend with no GPU: values from load curves, faults on a time line, both from a JSON scenario.

Used by the tests, the sandbox (docs/design.md#the-sandbox) and the benchmark. JSON rather than YAML on purpose: the
exporter's runtime dependencies are nvidia-ml-py and prometheus-client only. See the README for the
scenario format; `DEFAULT_SCENARIO` (8 x A100-SXM4-80GB, no faults) applies when none is given.

Times (`at`, `until`) are seconds since the backend was created (or since `clock`'s zero in tests).
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .backend import (
    GPM,
    MEMORY_V2,
    METRICS,
    Clocks,
    Ecc,
    ErrorCode,
    GpmActivity,
    GpuIdentity,
    Memory,
    Nvlink,
    NvmlError,
    RemappedRows,
    Utilization,
    XidEvent,
)

GIB = 1 << 30
MHZ = 1_000_000
# model -> (memory bytes, power limit W, max SM MHz, memory MHz, has NVLink, has GPM (Hopper and later))
MODELS = {
    "NVIDIA A100-SXM4-80GB": (80 * GIB, 400.0, 1410, 1593, True, False),
    "NVIDIA A100-SXM4-40GB": (40 * GIB, 400.0, 1410, 1215, True, False),
    "NVIDIA A100 80GB PCIe": (80 * GIB, 300.0, 1410, 1512, False, False),
    "NVIDIA H100 80GB HBM3": (80 * GIB, 700.0, 1980, 2619, True, True),
    "NVIDIA H200": (143_771 * (1 << 20), 700.0, 1980, 3201, True, True),
    "NVIDIA L4": (23_034 * (1 << 20), 72.0, 2040, 6251, False, False),
}
# GPM activity as shares of the graphics engine's (= utilization): a kernel running does not keep every SM
# busy, and a busy SM does not always run tensor instructions. So tensor <= SM <= utilization.
GPM_SM_SHARE, GPM_TENSOR_SHARE = 0.85, 0.6
DEFAULT_SCENARIO: dict[str, Any] = {
    "gpus": 8,
    "model": "NVIDIA A100-SXM4-80GB",
    "driver": "550.90.07",
    "load": {"base": 65, "amplitude": 25, "period_s": 600, "noise": 5},
    "faults": [],
}
FAULT_KINDS = ("gpu_lost", "xid", "ecc_sbe", "ecc_dbe", "nvml_init_failure", "hang", "not_supported")
FAULT_DEFAULT_CODES = {
    "gpu_lost": ErrorCode.GPU_IS_LOST,
    "nvml_init_failure": ErrorCode.DRIVER_NOT_LOADED,
    "not_supported": ErrorCode.NOT_SUPPORTED,
}
SCENARIO_KEYS = {
    "gpus", "model", "driver", "hostname", "memory_total_bytes", "power_limit_watts", "load",
    "load_per_gpu", "faults", "name", "description",
}  # fmt: skip
LOAD_KEYS = {"base", "amplitude", "period_s", "noise"}


@dataclass(frozen=True)
class FakeGpmSample:
    gpu: int
    t: float  # scenario time it was taken
    serial: int  # identifies it among the live samples (freed ones are refused, like a dangling pointer)


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float = 0.0
    until: float | None = None  # None: for good
    gpu: int | None = None  # None: every GPU
    xid: int = 0
    count: int = 1
    metric: str = ""
    code: ErrorCode = ErrorCode.UNKNOWN

    def active(self, t: float, gpu: int | None = None) -> bool:
        in_time = self.at <= t and (self.until is None or t < self.until)
        return in_time and (gpu is None or self.gpu is None or self.gpu == gpu)

    @classmethod
    def parse(cls, raw: dict[str, Any], default_at: float = 0.0) -> Fault:
        raw = dict(raw)
        kind = raw.pop("kind", None)
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault {raw}: kind must be one of {', '.join(FAULT_KINDS)}, not {kind!r}")
        gpu, code, until = raw.pop("gpu", None), raw.pop("code", None), raw.pop("until", None)
        if code is not None and code not in ErrorCode.__members__:
            raise ValueError(f"fault {kind}: code must be an NVML error name like GPU_IS_LOST, not {code!r}")
        fault = cls(
            kind=kind,
            at=float(raw.pop("at", default_at)),
            until=None if until is None else float(until),
            gpu=None if gpu in (None, "all") else int(gpu),
            xid=int(raw.pop("xid", 0)),
            count=int(raw.pop("count", 1)),
            metric=str(raw.pop("metric", "")),
            code=ErrorCode[code] if code else FAULT_DEFAULT_CODES.get(kind, ErrorCode.UNKNOWN),
        )
        if raw:
            raise ValueError(f"fault {kind}: unknown keys {sorted(raw)}")
        if kind == "xid" and (fault.gpu is None or not fault.xid):
            raise ValueError("fault xid: needs `gpu` and `xid`")
        if kind == "not_supported" and fault.metric not in (*METRICS, MEMORY_V2):
            raise ValueError(f"fault not_supported: metric must be one of {(*METRICS, MEMORY_V2)}")
        return fault


def load_scenario(source: str | Path | dict | None) -> dict[str, Any]:
    """A scenario dict from a path, a dict, or None (the default), checked for unknown keys."""
    if source is None:
        return json.loads(json.dumps(DEFAULT_SCENARIO))
    if isinstance(source, dict):
        scenario, where = dict(source), "scenario"
    else:
        where = str(source)
        try:
            scenario = json.loads(Path(source).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"fake scenario {where}: {e}") from e
    unknown = set(scenario) - SCENARIO_KEYS
    if unknown:
        raise ValueError(
            f"fake scenario {where}: unknown keys {sorted(unknown)} (known: {sorted(SCENARIO_KEYS)})"
        )
    return {**DEFAULT_SCENARIO, **scenario}


MAX_GPUS = 64  # more than any node has: a typo (800 for 8) would otherwise spin up 800 fake GPUs


class FakeBackend:
    """Scenario-driven Backend. Thread-safe enough for the poller + XID threads; counts every call."""

    def __init__(self, scenario: str | Path | dict | None = None, clock: Callable[[], float] | None = None):
        sc = load_scenario(scenario)
        self.scenario = sc
        if clock is None:
            t0 = time.monotonic()
            clock = lambda: time.monotonic() - t0  # noqa: E731
        self.clock = clock
        gpus = sc["gpus"]
        if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= MAX_GPUS:
            raise ValueError(f"fake scenario: gpus must be a whole number from 0 to {MAX_GPUS}, got {gpus!r}")
        self.gpus = gpus
        self.model = str(sc["model"])
        mem, limit, sm_mhz, mem_mhz, nvlink, gpm = MODELS.get(self.model, MODELS["NVIDIA A100-SXM4-80GB"])
        self.memory_total = int(sc.get("memory_total_bytes") or mem)
        self.power_limit = float(sc.get("power_limit_watts") or limit)
        self._sm_hz, self._mem_hz, self._has_nvlink, self._has_gpm = sm_mhz * MHZ, mem_mhz * MHZ, nvlink, gpm
        self._driver = str(sc["driver"])
        self._hostname = sc.get("hostname")
        base_load = {**DEFAULT_SCENARIO["load"], **sc.get("load", {})}
        per_gpu = {int(k): v for k, v in sc.get("load_per_gpu", {}).items()}
        if outside := sorted(k for k in per_gpu if not 0 <= k < gpus):
            raise ValueError(
                f"fake scenario: load_per_gpu names GPUs {outside}, but there are {gpus} (0..{gpus - 1})"
            )
        for spec in (base_load, *per_gpu.values()):
            if set(spec) - LOAD_KEYS:
                raise ValueError(f"fake scenario: load keys are {sorted(LOAD_KEYS)}, got {sorted(spec)}")
        self._loads = [{**base_load, **per_gpu.get(i, {})} for i in range(self.gpus)]
        self._lock = threading.Condition()
        self.faults: list[Fault] = [Fault.parse(f) for f in sc.get("faults", [])]
        self._delivered: list[Fault] = []  # xid faults already handed out (compared by identity)
        self._hang_released = threading.Event()
        self._initialized = False
        self._xid_registered = False
        # integrated counters: gpu -> (t, value)
        self._energy = {i: (None, 1.0e6 * (i + 1)) for i in range(self.gpus)}
        self._nvlink = {i: (None, 0.0) for i in range(self.gpus)}
        self._gpm_serials = itertools.count(1)
        self.gpm_live: set[int] = set()  # serials of GPM samples handed out, not freed yet (leak tests)
        self.calls: Counter[str] = Counter()
        self.call_threads: dict[str, set[str]] = defaultdict(set)

    # -- faults -------------------------------------------------------------------------------------------

    def inject_fault(self, kind: str, **fields: Any) -> Fault:
        """Add a fault at runtime; `at` defaults to now. Returns it (pass it to `clear_fault`)."""
        fault = Fault.parse({"kind": kind, **fields}, default_at=self.clock())
        with self._lock:
            self.faults.append(fault)
            self._lock.notify_all()  # wake a waiting XID reader
        return fault

    def clear_fault(self, fault: Fault | None = None) -> None:
        """Remove one fault (or all): a lost GPU comes back, init succeeds, and so on."""
        with self._lock:
            self.faults = [] if fault is None else [f for f in self.faults if f is not fault]

    def release_hang(self) -> None:
        """Unblock calls stuck in a `hang` fault (test clean-up); hangs stay off afterwards."""
        self._hang_released.set()

    def _active(self, kind: str, t: float, gpu: int | None = None) -> list[Fault]:
        return [f for f in self.faults if f.kind == kind and f.active(t, gpu)]

    def _enter(self, name: str, gpu: int | None = None, metric: str = "") -> float:
        thread = threading.current_thread().name
        with self._lock:
            self.calls[name] += 1
            self.call_threads[name].add(thread)
        t = self.clock()
        if name != "init" and not self._initialized:
            raise NvmlError(ErrorCode.UNINITIALIZED, f"{name}: NVML not initialised")
        if gpu is not None and not 0 <= gpu < self.gpus:
            raise NvmlError(ErrorCode.INVALID_ARGUMENT, f"{name}: no GPU {gpu}")
        if not self.faults:  # the common case, and the benchmark's: no fault bookkeeping
            return t
        if name != "wait_xid_event" and self._active("hang", t) and not self._hang_released.is_set():
            self._hang_released.wait()  # a thread stuck in the driver: only release_hang() frees it
        if gpu is not None:
            for f in self._active("gpu_lost", t, gpu):
                raise NvmlError(f.code, f"{name}: GPU {gpu} lost (fake)")
            for f in self._active("not_supported", t, gpu):
                if f.metric == metric:
                    raise NvmlError(f.code, f"{name}: {metric} on GPU {gpu} (fake)")
        return t

    # -- synthetic load -----------------------------------------------------------------------------------

    def _util(self, gpu: int, t: float) -> float:
        spec = self._loads[gpu]
        period = float(spec["period_s"]) or 1.0
        wave = float(spec["amplitude"]) * math.sin(2 * math.pi * t / period + gpu * 0.7)
        # Deterministic noise in [-1, 1] that changes every half second (int hashes are not salted).
        noise = float(spec["noise"]) * ((hash((gpu, int(t * 2))) % 2001) / 1000.0 - 1.0)
        return min(100.0, max(0.0, float(spec["base"]) + wave + noise))

    def _power(self, gpu: int, t: float) -> float:
        return round(55.0 + (self.power_limit - 55.0) * self._util(gpu, t) / 100.0, 3)

    def _integrate(self, store: dict, gpu: int, t: float, rate: float) -> float:
        with self._lock:
            last_t, value = store[gpu]
            if last_t is not None and t > last_t:
                value += rate * (t - last_t)
            store[gpu] = (t if last_t is None or t > last_t else last_t, value)
            return value

    def _bursts(self, kind: str, gpu: int, t: float) -> int:
        return sum(f.count for f in self.faults if f.kind == kind and f.gpu in (None, gpu) and f.at <= t)

    # -- Backend ------------------------------------------------------------------------------------------

    def init(self) -> None:
        t = self._enter("init")
        for f in self._active("nvml_init_failure", t):
            raise NvmlError(f.code, "nvmlInit (fake)")
        self._initialized = True

    def shutdown(self) -> None:
        self._enter("shutdown")
        self._initialized = False
        self._xid_registered = False

    def driver_version(self) -> str:
        self._enter("driver_version")
        return self._driver

    def hostname(self) -> str | None:
        return self._hostname

    def device_count(self) -> int:
        self._enter("device_count")
        return self.gpus

    def identity(self, gpu: int) -> GpuIdentity:
        self._enter("identity", gpu)
        node = self._hostname or "fake"
        return GpuIdentity(
            uuid=f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{gpu}.foxhunt')}",
            model=self.model,
            pci_bus_id=f"00000000:{0x10 + gpu:02X}:00.0",
        )

    def memory(self, gpu: int, v2: bool = True) -> Memory:
        t = self._enter("memory", gpu, MEMORY_V2 if v2 else "memory")
        total = self.memory_total
        reserved = int(total * 0.006)  # what the driver keeps for itself (~500 MiB on 80 GB)
        used = int(total * (0.05 + 0.85 * self._util(gpu, t) / 100.0))
        free = total - reserved - used
        if v2:
            return Memory(total=total, used=used, free=free, reserved=reserved)
        return Memory(total=total, used=used + reserved, free=free, reserved=None)  # v1: reserved is "used"

    def utilization(self, gpu: int) -> Utilization:
        t = self._enter("utilization", gpu, "utilization")
        u = round(self._util(gpu, t))
        return Utilization(gpu=float(u), memory=float(round(u * 0.55)))

    def temperature(self, gpu: int) -> float:
        t = self._enter("temperature", gpu, "temperature")
        return float(round(32 + 0.45 * self._util(gpu, t)))

    def power(self, gpu: int) -> float:
        t = self._enter("power", gpu, "power")
        return self._power(gpu, t)

    def energy(self, gpu: int) -> float:
        t = self._enter("energy", gpu, "energy")
        return round(self._integrate(self._energy, gpu, t, self._power(gpu, t)), 3)

    def clocks(self, gpu: int) -> Clocks:
        t = self._enter("clocks", gpu, "clocks")
        idle = self._util(gpu, t) < 5
        capped = self._power(gpu, t) >= 0.95 * self.power_limit
        sm = 210 * MHZ if idle else self._sm_hz * (0.9 if capped else 1.0)
        return Clocks(sm_hz=float(sm), memory_hz=float(self._mem_hz))

    def clock_events(self, gpu: int) -> int:
        t = self._enter("clock_events", gpu, "clock_events")
        bits = 0x1 if self._util(gpu, t) < 5 else 0
        if self._power(gpu, t) >= 0.95 * self.power_limit:
            bits |= 0x4
        return bits

    def ecc(self, gpu: int) -> Ecc:
        t = self._enter("ecc", gpu, "ecc")
        sbe, dbe = self._bursts("ecc_sbe", gpu, t), self._bursts("ecc_dbe", gpu, t)
        return Ecc(
            corrected_volatile=sbe,
            uncorrected_volatile=dbe,
            corrected_aggregate=sbe,
            uncorrected_aggregate=dbe,
        )

    def pcie_replays(self, gpu: int) -> int:
        self._enter("pcie_replays", gpu, "pcie_replays")
        return 0

    def nvlink(self, gpu: int) -> Nvlink:
        t = self._enter("nvlink", gpu, "nvlink")
        if not self._has_nvlink:
            raise NvmlError(ErrorCode.NOT_SUPPORTED, f"nvlink: {self.model} has no NVLink (fake)")
        rx = self._integrate(
            self._nvlink, gpu, t, self._util(gpu, t) / 100.0 * 100e9
        )  # ~100 GB/s at full load
        return Nvlink(rx_bytes=int(rx), tx_bytes=int(rx * 0.98))

    def remapped_rows(self, gpu: int) -> RemappedRows:
        t = self._enter("remapped_rows", gpu, "remapped_rows")
        dbe = self._bursts("ecc_dbe", gpu, t)  # an uncorrectable error remaps a row; pending until reset
        return RemappedRows(correctable=0, uncorrectable=dbe, pending=dbe > 0, failed=False)

    def gpm_sample(self, gpu: int) -> FakeGpmSample:
        t = self._enter("gpm_sample", gpu, GPM)
        if not self._has_gpm:
            raise NvmlError(ErrorCode.NOT_SUPPORTED, f"gpm_sample: {self.model} has no GPM (fake)")
        sample = FakeGpmSample(gpu=gpu, t=t, serial=next(self._gpm_serials))
        with self._lock:
            self.gpm_live.add(sample.serial)
        return sample

    def gpm_activity(self, gpu: int, earlier: FakeGpmSample, later: FakeGpmSample) -> GpmActivity:
        self._enter("gpm_activity", gpu, GPM)
        for s in (earlier, later):
            if s.serial not in self.gpm_live or s.gpu != gpu:
                raise NvmlError(
                    ErrorCode.INVALID_ARGUMENT, f"gpm_activity: {s} is not a live sample of GPU {gpu}"
                )
        graphics = round(self._util(gpu, later.t)) / 100.0  # what utilization() reports at that time
        return GpmActivity(sm=graphics * GPM_SM_SHARE, tensor=graphics * GPM_TENSOR_SHARE, graphics=graphics)

    def gpm_free(self, sample: FakeGpmSample) -> None:
        self._enter("gpm_free")
        with self._lock:
            if sample.serial not in self.gpm_live:
                raise NvmlError(ErrorCode.INVALID_ARGUMENT, f"gpm_free: sample {sample} freed twice")
            self.gpm_live.discard(sample.serial)

    def register_xid_events(self) -> None:
        self._enter("register_xid_events")
        self._xid_registered = True

    def wait_xid_event(self, timeout_s: float) -> XidEvent | None:
        self._enter("wait_xid_event")
        if not self._xid_registered:
            raise NvmlError(ErrorCode.UNINITIALIZED, "wait_xid_event: no event set registered")
        deadline = (
            time.monotonic() + timeout_s
        )  # the timeout is real time; the fault schedule is scenario time
        with self._lock:
            while True:
                t = self.clock()
                waiting = [
                    f for f in self.faults if f.kind == "xid" and not any(f is d for d in self._delivered)
                ]
                for f in waiting:
                    if f.at <= t:
                        self._delivered.append(f)
                        return XidEvent(gpu=f.gpu, xid=f.xid)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(min([left, *(f.at - t for f in waiting), 0.25]))
