"""NvmlBackend over a stand-in pynvml: unit conversions, error translation, batched NVLink fields, XIDs.

Runs everywhere (no GPU needed): each pynvml function the backend calls is replaced with one that answers
like NVML does, so a renamed function, a wrong unit or a missed per-field return code shows up here.
"""

from __future__ import annotations

import ctypes
import inspect
import threading
import time
from types import SimpleNamespace

import pynvml
import pytest
from foxhunt_gpu_exporter import nvml_backend
from foxhunt_gpu_exporter.app import Exporter
from foxhunt_gpu_exporter.backend import ErrorCode, NvmlError
from foxhunt_gpu_exporter.nvml_backend import ALL_LINKS, NvmlBackend
from foxhunt_gpu_exporter.poller import Poller


def handle(i: int):
    return ctypes.cast(ctypes.c_void_p(0x1000 + i), pynvml.c_nvmlDevice_t)


def address(pointer) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value


def field(field_id: int, value: int, ret: int = pynvml.NVML_SUCCESS, kind: int = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG):
    f = pynvml.c_nvmlFieldValue_t()
    f.fieldId, f.scopeId, f.nvmlReturn, f.valueType = field_id, ALL_LINKS, ret, kind
    if kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        f.value.ullVal = value
    elif kind == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        f.value.uiVal = value
    else:
        f.value.ullVal = 0xDEAD_0000_0000_0000 | value  # junk above a 16-bit member: read as usVal it is `value`
    return f


def xid_event(device, xid: int, event_type: int = pynvml.nvmlEventTypeXidCriticalError):
    data = pynvml.c_nvmlEventData_t()  # what nvmlEventSetWait_v2 returns (pynvml.py: c_nvmlEventData_t)
    data.device, data.eventType, data.eventData = device, event_type, xid
    return data


@pytest.fixture
def fake_nvml(monkeypatch):
    calls: dict[str, list] = {}
    nvlink = {"ret": pynvml.NVML_SUCCESS, "kind": pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG}

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
        return [field(ids[0][0], 1000, nvlink["ret"], nvlink["kind"]), field(ids[1][0], 2000, nvlink["ret"], nvlink["kind"])]

    def wait(event_set, timeout_ms):  # one XID 79 on GPU 1, then timeouts
        waits = calls.setdefault("waits", [])
        waits.append(timeout_ms)
        if len(waits) > 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return xid_event(handle(1), 79)

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
    patch("nvmlEventSetFree", lambda es: None)
    patch("nvmlDeviceGetIndex", lambda h: ctypes.cast(h, ctypes.c_void_p).value - 0x1000)
    # An A100: no GPM (the fake_gpm fixture makes it a Hopper board).
    patch("nvmlGpmQueryDeviceSupport", lambda h: SimpleNamespace(version=1, isSupportedDevice=0))
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


def test_nvlink_reads_the_union_member_its_value_type_names(fake_nvml):
    nvml, _, nvlink = fake_nvml
    nvlink["kind"] = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert nvml.nvlink(0).rx_bytes == 1000 * 1024
    nvlink["kind"] = 6  # NVML_VALUE_TYPE_UNSIGNED_SHORT: `usVal`, not the 8-byte `ullVal` around it
    assert nvml.nvlink(0).tx_bytes == 2000 * 1024
    nvlink["kind"] = 99  # a type this code does not know: not a number to guess at, and not "GPU down"
    with pytest.raises(NvmlError) as e:
        nvml.nvlink(0)
    assert e.value.code == ErrorCode.NOT_SUPPORTED


def test_temperature_falls_back_to_the_versioned_call_once_the_old_one_is_gone(fake_nvml, monkeypatch):
    nvml, _, _ = fake_nvml

    def missing(h, sensor):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", missing)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperatureV", lambda h, sensor: 58)
    assert nvml.temperature(0) == 58


def test_a_refused_device_handle_marks_that_gpu_down_not_nvml(fake_nvml, monkeypatch):
    _, calls, _ = fake_nvml
    refuse = {1: pynvml.NVML_ERROR_GPU_IS_LOST}

    def get_handle(i):
        if i in refuse:
            raise pynvml.NVMLError(refuse[i])
        return handle(i)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", get_handle)
    poller = Poller(NvmlBackend(), hostname="node")
    snap = poller.poll_once()
    assert snap.nvml_up and [g.up for g in snap.gpus] == [True, False]
    registered = len(calls["nvmlDeviceRegisterEvents"])
    del refuse[1]  # the GPU answers again: its handle is fetched, it is up and registered for XIDs
    snap = poller.poll_once()
    assert [g.up for g in snap.gpus] == [True, True] and snap.gpus[1].identity.uuid == "GPU-abc"
    assert len(calls["nvmlDeviceRegisterEvents"]) == registered + 1
    assert poller.backend._event_gpu(handle(1)) == 1


def test_a_failed_init_releases_its_nvml_reference(fake_nvml, monkeypatch):
    _, calls, _ = fake_nvml
    shutdowns = len(calls.get("nvmlShutdown", []))

    def no_handle(i):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", no_handle)  # library-wide: init fails
    backend = NvmlBackend()
    with pytest.raises(NvmlError) as e:
        backend.init()
    assert e.value.code == ErrorCode.LIB_RM_VERSION_MISMATCH and backend.device_count() == 0
    assert len(calls["nvmlShutdown"]) == shutdowns + 1  # nvmlInit counts references


def test_xid_event_type_unknown_device_and_timeout_floor(fake_nvml, monkeypatch):
    nvml, _, _ = fake_nvml
    nvml.register_xid_events()
    answers = [
        xid_event(handle(1), 0, event_type=pynvml.nvmlEventTypePState),  # not an XID: eventData is 0
        xid_event(handle(7), 48),  # an address not seen at init: NVML is asked for its index
        xid_event(ctypes.cast(None, pynvml.c_nvmlDevice_t), 79),  # no device
    ]
    timeouts = []
    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", lambda es, ms: timeouts.append(ms) or answers.pop(0))
    assert nvml.wait_xid_event(0.0001) is None and timeouts == [1]  # 0 ms need not mean "return at once"
    event = nvml.wait_xid_event(1)
    assert (event.gpu, event.xid) == (7, 48)
    event = nvml.wait_xid_event(1)
    assert (event.gpu, event.xid) == (-1, 79)


def test_shutdown_waits_for_the_event_wait_then_frees_the_set_before_nvml(fake_nvml, monkeypatch):
    nvml, calls, _ = fake_nvml
    nvml.register_xid_events()
    order, entered, release = [], threading.Event(), threading.Event()

    def wait(event_set, timeout_ms):
        entered.set()
        release.wait(5)
        order.append("wait returned")
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", wait)
    monkeypatch.setattr(pynvml, "nvmlEventSetFree", lambda es: order.append("free"))
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: order.append("shutdown"))
    waiter = threading.Thread(target=nvml.wait_xid_event, args=(1.0,))
    waiter.start()
    assert entered.wait(5)
    closer = threading.Thread(target=nvml.shutdown)
    closer.start()
    closer.join(0.2)
    assert order == []  # NVML is not shut down under a wait in progress
    release.set()
    waiter.join(5)
    closer.join(5)
    assert order == ["wait returned", "free", "shutdown"]
    with pytest.raises(NvmlError) as e:
        nvml.wait_xid_event(0.01)
    assert e.value.code == ErrorCode.UNINITIALIZED  # the XID thread's "mid re-init: wait" answer


def test_field_values_are_read_on_the_poller_thread_only(fake_nvml, monkeypatch):
    _, _, _ = fake_nvml
    threads = set()
    fields = pynvml.nvmlDeviceGetFieldValues

    def recorded(h, ids):
        threads.add(threading.current_thread().name)
        return fields(h, ids)

    def wait(event_set, timeout_ms):
        time.sleep(timeout_ms / 1000)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", recorded)
    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", wait)
    exporter = Exporter(NvmlBackend(), interval=0.02, xid_timeout_s=0.02, stuck_after=60, on_stuck=lambda: None)
    exporter.start()
    try:
        deadline = time.monotonic() + 5
        while exporter.poller.version < 3 and time.monotonic() < deadline:
            exporter.exposition.render("")  # scrapes, on this thread, meanwhile
            time.sleep(0.01)
    finally:
        exporter.stop()
    assert exporter.poller.version >= 3 and threads == {"foxhunt-poller"}


GPM_PERCENT = {pynvml.NVML_GPM_METRIC_SM_UTIL: 42.0, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 17.5,
               pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 88.0}  # fmt: skip


@pytest.fixture
def fake_gpm(fake_nvml, monkeypatch):
    """fake_nvml on a Hopper board: GPM answers, and every sample buffer is tracked from alloc to free."""
    nvml, calls, _ = fake_nvml
    gpm = SimpleNamespace(supported=1, allocated=0, live=set(), returns={}, requests=[])

    def query(h):
        calls.setdefault("query", []).append(h)
        return SimpleNamespace(version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=gpm.supported)

    def alloc():
        gpm.allocated += 1
        sample = ctypes.cast(ctypes.c_void_p(0x9000 + gpm.allocated), pynvml.c_nvmlGpmSample_t)
        gpm.live.add(address(sample))
        return sample

    def free(sample):
        assert address(sample) in gpm.live, "freed twice, or never allocated"
        gpm.live.discard(address(sample))

    def metrics_get(request):  # what NVML fills in: a return code and a percent value per metric asked for
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        assert {address(request.sample1), address(request.sample2)} <= gpm.live  # no use after free
        asked = request.metrics[: request.numMetrics]
        gpm.requests.append([m.metricId for m in asked])
        for m in asked:
            m.nvmlReturn = gpm.returns.get(m.metricId, pynvml.NVML_SUCCESS)
            m.value = GPM_PERCENT[m.metricId]
        return request

    monkeypatch.setattr(pynvml, "nvmlGpmQueryDeviceSupport", query)
    monkeypatch.setattr(pynvml, "nvmlGpmSampleAlloc", alloc)
    monkeypatch.setattr(pynvml, "nvmlGpmSampleGet", lambda h, sample: sample)
    monkeypatch.setattr(pynvml, "nvmlGpmMetricsGet", metrics_get)
    monkeypatch.setattr(pynvml, "nvmlGpmSampleFree", free)
    return nvml, calls, gpm


def test_gpm_metrics_from_two_samples_in_ratios(fake_gpm):
    nvml, calls, gpm = fake_gpm
    earlier, later = nvml.gpm_sample(0), nvml.gpm_sample(0)
    activity = nvml.gpm_activity(0, earlier, later)
    ratios = (activity.sm, activity.tensor, activity.graphics)
    assert ratios == pytest.approx((0.42, 0.175, 0.88))  # NVML's percent as 0..1
    assert gpm.requests == [[pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
                             pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL]]  # fmt: skip
    assert len(calls["query"]) == 1  # support is asked once, not per sample
    nvml.gpm_free(earlier)
    nvml.gpm_free(later)
    assert gpm.live == set()


def test_gpm_on_a_board_without_it_is_not_supported_and_allocates_nothing(fake_gpm):
    nvml, _, gpm = fake_gpm
    gpm.supported = 0  # the query itself succeeds before Hopper, saying no
    with pytest.raises(NvmlError) as e:
        nvml.gpm_sample(0)
    assert e.value.code == ErrorCode.NOT_SUPPORTED and gpm.allocated == 0


def test_gpm_a_failed_sample_frees_its_buffer(fake_gpm, monkeypatch):
    nvml, _, gpm = fake_gpm

    def refused(h, sample):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlGpmSampleGet", refused)
    with pytest.raises(NvmlError) as e:
        nvml.gpm_sample(0)
    assert e.value.code == ErrorCode.NOT_SUPPORTED and gpm.allocated == 1 and gpm.live == set()


def test_gpm_per_metric_return_codes(fake_gpm):
    nvml, _, gpm = fake_gpm
    earlier, later = nvml.gpm_sample(0), nvml.gpm_sample(0)
    gpm.returns = {pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: pynvml.NVML_ERROR_NOT_SUPPORTED}
    activity = nvml.gpm_activity(0, earlier, later)  # one metric refused: the others still count
    assert activity.tensor is None and activity.sm == pytest.approx(0.42)
    gpm.returns = dict.fromkeys(GPM_PERCENT, pynvml.NVML_ERROR_NOT_SUPPORTED)
    with pytest.raises(NvmlError) as e:  # all refused: the GPU has no GPM after all
        nvml.gpm_activity(0, earlier, later)
    assert e.value.code == ErrorCode.NOT_SUPPORTED


def test_shutdown_frees_the_gpm_samples_left_and_a_late_free_is_not_a_double_free(fake_gpm):
    nvml, _, gpm = fake_gpm
    kept = nvml.gpm_sample(1)
    nvml.gpm_sample(0)
    nvml.shutdown()
    assert gpm.live == set()
    nvml.gpm_free(kept)  # its owner frees it after shutdown: a no-op (the fake asserts on a second free)


def test_poller_over_nvml_keeps_one_gpm_sample_per_gpu_and_reads_from_the_second_poll(fake_gpm):
    _, _, gpm = fake_gpm
    poller = Poller(NvmlBackend(), hostname="node")
    first = poller.poll_once()
    assert first.nvml_up and [g.gpm for g in first.gpus] == [None, None]
    second = poller.poll_once()
    assert [g.gpm.sm for g in second.gpus] == pytest.approx([0.42, 0.42])
    assert len(gpm.live) == 2  # this poll's sample of each GPU, kept for the next one; the rest freed
    poller.backend.shutdown()
    assert gpm.live == set()
