"""NvmlBackend over a stand-in pynvml: unit conversions, error translation, batched NVLink fields, XIDs.

Runs everywhere (no GPU needed): each pynvml function the backend calls is replaced with one that answers
like NVML does, so a renamed function, a wrong unit or a missed per-field return code shows up here.
"""

from __future__ import annotations

import ctypes
import inspect
from types import SimpleNamespace

import pynvml
import pytest
from foxhunt_gpu_exporter import nvml_backend
from foxhunt_gpu_exporter.backend import ErrorCode, NvmlError
from foxhunt_gpu_exporter.nvml_backend import ALL_LINKS, NvmlBackend


def handle(i: int):
    return ctypes.cast(ctypes.c_void_p(0x1000 + i), pynvml.c_nvmlDevice_t)


def field(field_id: int, value: int, ret: int = pynvml.NVML_SUCCESS):
    f = pynvml.c_nvmlFieldValue_t()
    f.fieldId, f.scopeId, f.nvmlReturn = field_id, ALL_LINKS, ret
    f.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    f.value.ullVal = value
    return f


@pytest.fixture
def fake_nvml(monkeypatch):
    calls: dict[str, list] = {}
    nvlink = {"ret": pynvml.NVML_SUCCESS}

    def patch(name, fn):
        def recorded(*args, **kwargs):
            calls.setdefault(name, []).append((args, kwargs))
            return fn(*args, **kwargs)

        monkeypatch.setattr(pynvml, name, recorded)

    def memory(h, version=None):
        if version:
            return SimpleNamespace(total=80 << 30, used=10 << 30, free=(70 << 30) - (512 << 20), reserved=512 << 20)
        return SimpleNamespace(total=80 << 30, used=(10 << 30) + (512 << 20), free=(70 << 30) - (512 << 20))

    def ecc(h, error_type, counter_type):
        return {(0, 0): 3, (1, 0): 1, (0, 1): 30, (1, 1): 2}[(error_type, counter_type)]

    def fields(h, ids):
        assert [tuple(i) for i in ids] == [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
                                           (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS)]  # fmt: skip
        return [field(ids[0][0], 1000, nvlink["ret"]), field(ids[1][0], 2000, nvlink["ret"])]

    def wait(event_set, timeout_ms):  # one XID 79 on GPU 1, then timeouts
        waits = calls.setdefault("waits", [])
        waits.append(timeout_ms)
        if len(waits) > 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return SimpleNamespace(device=handle(1), eventData=79)

    patch("nvmlInit", lambda: None)
    patch("nvmlShutdown", lambda: None)
    patch("nvmlDeviceGetCount", lambda: 2)
    patch("nvmlDeviceGetHandleByIndex", handle)
    patch("nvmlSystemGetDriverVersion", lambda: "550.90.07")
    patch("nvmlDeviceGetUUID", lambda h: "GPU-abc")
    patch("nvmlDeviceGetName", lambda h: "NVIDIA A100-SXM4-80GB")
    patch("nvmlDeviceGetPciInfo", lambda h: SimpleNamespace(busId=b"00000000:10:1C.0"))
    patch("nvmlDeviceGetMemoryInfo", memory)
    patch("nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=87, memory=40))
    patch("nvmlDeviceGetTemperature", lambda h, sensor: 61)
    patch("nvmlDeviceGetPowerUsage", lambda h: 312_456)  # mW
    patch("nvmlDeviceGetTotalEnergyConsumption", lambda h: 9_876_543_210)  # mJ
    patch("nvmlDeviceGetClockInfo", lambda h, kind: {pynvml.NVML_CLOCK_SM: 1410, pynvml.NVML_CLOCK_MEM: 1593}[kind])
    patch("nvmlDeviceGetCurrentClocksEventReasons", lambda h: 0x4 | 0x40)
    patch("nvmlDeviceGetTotalEccErrors", ecc)
    patch("nvmlDeviceGetPcieReplayCounter", lambda h: 5)
    patch("nvmlDeviceGetFieldValues", fields)
    patch("nvmlDeviceGetRemappedRows", lambda h: (2, 1, 1, 0))
    patch("nvmlEventSetCreate", lambda: object())
    patch("nvmlDeviceRegisterEvents", lambda h, types, es: None)
    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", wait)
    backend = NvmlBackend()
    backend.init()
    return backend, calls, nvlink


def test_readings_in_si_units(fake_nvml):
    nvml, calls, _ = fake_nvml
    assert nvml.device_count() == 2 and nvml.driver_version() == "550.90.07"
    ident = nvml.identity(1)
    assert (ident.uuid, ident.model, ident.pci_bus_id) == ("GPU-abc", "NVIDIA A100-SXM4-80GB", "00000000:10:1C.0")
    mem = nvml.memory(0)
    assert (mem.used, mem.reserved) == (10 << 30, 512 << 20)
    assert calls["nvmlDeviceGetMemoryInfo"][0][1] == {"version": pynvml.nvmlMemory_v2}
    assert nvml.memory(0, v2=False).reserved is None
    assert nvml.utilization(0).gpu == 87 and nvml.temperature(0) == 61
    assert nvml.power(0) == pytest.approx(312.456)  # mW -> W
    assert nvml.energy(0) == pytest.approx(9_876_543.21)  # mJ -> J
    assert (nvml.clocks(0).sm_hz, nvml.clocks(0).memory_hz) == (1410e6, 1593e6)  # MHz -> Hz
    assert nvml.clock_events(0) == 0x44
    ecc = nvml.ecc(0)
    assert (ecc.corrected_volatile, ecc.uncorrected_volatile, ecc.corrected_aggregate, ecc.uncorrected_aggregate) == (
        3, 1, 30, 2)  # fmt: skip
    assert nvml.pcie_replays(0) == 5
    link = nvml.nvlink(0)
    assert (link.rx_bytes, link.tx_bytes) == (1000 * 1024, 2000 * 1024)  # KiB -> bytes
    assert len(calls["nvmlDeviceGetFieldValues"]) == 1  # both directions in one batched call
    rows = nvml.remapped_rows(0)
    assert (rows.correctable, rows.uncorrectable, rows.pending, rows.failed) == (2, 1, True, False)
    # ~20 ms of sampling per direction: never in the poll loop
    assert "nvmlDeviceGetPcieThroughput(" not in inspect.getsource(nvml_backend)


def test_nvlink_per_field_return_code_is_an_error(fake_nvml):
    nvml, _, nvlink = fake_nvml
    nvlink["ret"] = pynvml.NVML_ERROR_NOT_SUPPORTED  # a PCIe board: the call succeeds, each field refuses
    with pytest.raises(NvmlError) as e:
        nvml.nvlink(0)
    assert e.value.code == ErrorCode.NOT_SUPPORTED


def test_pynvml_errors_become_backend_errors_with_the_same_code(fake_nvml, monkeypatch):
    nvml, _, _ = fake_nvml

    def lost(h):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", lambda h, s: lost(h))
    with pytest.raises(NvmlError) as e:
        nvml.temperature(0)
    assert e.value.code == ErrorCode.GPU_IS_LOST and "nvmlDeviceGetTemperature" in str(e.value)
    with pytest.raises(NvmlError) as e:
        nvml.utilization(7)
    assert e.value.code == ErrorCode.INVALID_ARGUMENT


def test_clock_events_fall_back_to_the_old_name_on_old_drivers(fake_nvml, monkeypatch):
    nvml, _, _ = fake_nvml

    def missing(h):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", missing)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", lambda h: 0x4)
    assert nvml.clock_events(0) == 0x4


def test_xid_event_maps_the_device_handle_to_its_index(fake_nvml):
    nvml, calls, _ = fake_nvml
    with pytest.raises(NvmlError):
        NvmlBackend().wait_xid_event(0.01)  # nothing registered yet
    nvml.register_xid_events()
    assert len(calls["nvmlDeviceRegisterEvents"]) == 2
    event = nvml.wait_xid_event(0.5)
    assert (event.gpu, event.xid) == (1, 79) and calls["waits"] == [500]
    assert nvml.wait_xid_event(0.5) is None  # NVML_ERROR_TIMEOUT is "no event", not an error
