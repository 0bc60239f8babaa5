"""The real NVML backend on real hardware. Skips cleanly (with NVML's own reason) where NVML cannot init.

Where a GPU exists: every metric the backend reads is sane, and one poll cycle of every GPU is timed.
Where none exists, the one test that runs checks the no-driver path: NvmlBackend fails init with an NVML
code and the exporter still serves self-metrics with foxhunt_exporter_nvml_up 0.
"""

from __future__ import annotations

import re
import time

import pytest
from exporter_helpers import render, samples
from foxhunt_gpu_exporter.app import Exporter
from foxhunt_gpu_exporter.backend import (
    CLOCK_EVENT_REASONS,
    LIBRARY_CODES,
    UNSUPPORTED_CODES,
    ErrorCode,
    NvmlError,
)
from foxhunt_gpu_exporter.nvml_backend import NvmlBackend
from foxhunt_gpu_exporter.poller import Poller


def _probe() -> tuple[NvmlError | None, int]:
    """(the init error, or None; GPU count) of this machine."""
    backend = NvmlBackend()
    try:
        backend.init()
    except NvmlError as e:
        return e, 0
    count = backend.device_count()
    backend.shutdown()
    return None, count


INIT_ERROR, GPU_COUNT = _probe()
needs_gpu = pytest.mark.skipif(
    INIT_ERROR is not None or GPU_COUNT == 0,
    reason=f"NVML cannot init here: {INIT_ERROR}" if INIT_ERROR else "NVML initialised but reports no GPUs",
)


@pytest.fixture(scope="module")
def nvml():
    backend = NvmlBackend()
    backend.init()
    yield backend
    backend.shutdown()


def optional(read, gpu):
    """A reading some boards do not have (ECC on GeForce, NVLink on PCIe cards): None when unsupported."""
    try:
        return read(gpu)
    except NvmlError as e:
        if e.code in UNSUPPORTED_CODES or e.code == ErrorCode.NO_PERMISSION:
            return None
        raise


@needs_gpu
def test_identity_and_driver(nvml):
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", nvml.driver_version())
    for gpu in range(nvml.device_count()):
        ident = nvml.identity(gpu)
        assert ident.uuid.startswith(("GPU-", "MIG-")) and ident.model
        assert re.fullmatch(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]", ident.pci_bus_id), ident


@needs_gpu
def test_every_metric_is_sane(nvml):
    for gpu in range(nvml.device_count()):
        mem = optional(nvml.memory, gpu) or nvml.memory(gpu, v2=False)
        assert mem.total > 2**30 and 0 <= mem.used <= mem.total and 0 <= mem.free <= mem.total
        v1 = nvml.memory(gpu, v2=False)
        assert v1.total == mem.total and v1.reserved is None
        if mem.reserved is not None:  # v1 counts driver-reserved memory as used
            assert v1.used >= mem.used
        util = nvml.utilization(gpu)
        assert 0 <= util.gpu <= 100 and 0 <= util.memory <= 100
        assert 0 < nvml.temperature(gpu) < 120
        assert 0 < nvml.power(gpu) < 2000  # W, not mW
        energy = optional(nvml.energy, gpu)
        assert energy is None or energy >= 0
        clocks = nvml.clocks(gpu)
        assert 1e7 < clocks.sm_hz < 5e9 and 1e7 < clocks.memory_hz < 2e10  # Hz, not MHz
        events = optional(nvml.clock_events, gpu)
        all_bits = sum(bit for _, bit in CLOCK_EVENT_REASONS) | 0x200 | 0x400  # + board limit, reliability
        assert events is None or events & ~all_bits == 0
        ecc = optional(nvml.ecc, gpu)
        assert ecc is None or min(ecc.corrected_volatile, ecc.uncorrected_aggregate) >= 0
        replays = optional(nvml.pcie_replays, gpu)
        assert replays is None or replays >= 0
        link = optional(nvml.nvlink, gpu)
        assert link is None or (link.rx_bytes >= 0 and link.tx_bytes >= 0)
        rows = optional(nvml.remapped_rows, gpu)
        assert rows is None or (rows.correctable >= 0 and rows.uncorrectable >= 0)


@needs_gpu
def test_energy_counter_grows(nvml):
    first = optional(nvml.energy, 0)
    if first is None:
        pytest.skip("this GPU has no energy counter")
    time.sleep(0.3)
    assert nvml.energy(0) >= first


@needs_gpu
def test_xid_events_register_and_wait_times_out(nvml):
    try:
        nvml.register_xid_events()
        event = nvml.wait_xid_event(0.2)
    except NvmlError as e:
        pytest.skip(f"XID events not available: {e}")
    assert event is None or event.xid > 0  # no XID is expected on a healthy GPU


GPM_BOARDS = ("H100", "H200", "H800", "H20", "GH200", "B200", "GB200")  # Hopper and later: NVML GPM


@needs_gpu
def test_gpm_activity_between_two_samples(nvml):
    """GPM on every board that has it: ratios in 0..1, both samples freed; pre-Hopper boards say NOT_SUPPORTED."""
    read = 0
    for gpu in range(nvml.device_count()):
        model = nvml.identity(gpu).model
        try:
            earlier = nvml.gpm_sample(gpu)
        except NvmlError as e:
            if e.code == ErrorCode.NO_PERMISSION:
                pytest.skip(f"GPM refused here: {e}")
            assert e.code in UNSUPPORTED_CODES, e
            assert not any(board in model for board in GPM_BOARDS), f"{model} should have GPM: {e}"
            continue
        time.sleep(0.5)
        later = nvml.gpm_sample(gpu)
        try:
            activity = nvml.gpm_activity(gpu, earlier, later)
        finally:
            nvml.gpm_free(earlier)
            nvml.gpm_free(later)
        values = (activity.sm, activity.tensor, activity.graphics)
        assert any(v is not None for v in values) and all(v is None or 0 <= v <= 1 for v in values), (
            model,
            values,
        )
        read += 1
    assert not nvml._gpm_samples  # every buffer freed
    if not read:
        pytest.skip("no GPU here has NVML GPM (Hopper and later)")


@needs_gpu
def test_poller_reports_gpm_from_its_second_poll():
    poller = Poller(NvmlBackend(), hostname="test")
    first = poller.poll_once()
    time.sleep(0.5)
    second = poller.poll_once()
    assert all(g.gpm is None for g in first.gpus)
    with_gpm = [g for g in second.gpus if any(board in g.identity.model for board in GPM_BOARDS)]
    if not with_gpm:
        pytest.skip("no GPU here has NVML GPM (Hopper and later)")
    assert all(g.gpm is not None for g in with_gpm), with_gpm
    assert all(v is None or 0 <= v <= 1 for g in with_gpm for v in (g.gpm.sm, g.gpm.tensor, g.gpm.graphics))
    assert (
        len(poller.backend._gpm_samples) == len(poller._gpm_samples) <= len(second.gpus)
    )  # one kept per GPU
    poller.backend.shutdown()
    assert not poller.backend._gpm_samples


@needs_gpu
def test_one_poll_cycle_is_fast_and_complete(capsys):
    poller = Poller(NvmlBackend(), hostname="test")
    poller.poll_once()  # init + first reads (and NOT_SUPPORTED bookkeeping)
    start = time.perf_counter()
    snap = poller.poll_once()
    seconds = time.perf_counter() - start
    with capsys.disabled():
        print(f"\nreal NVML poll of {len(snap.gpus)} GPU(s): {seconds * 1000:.2f} ms")
    assert snap.nvml_up and snap.gpus and all(g.up for g in snap.gpus)
    assert all(g.memory and g.utilization and g.temperature is not None for g in snap.gpus)
    assert seconds < 0.5 * max(1, len(snap.gpus) / 8)  # no 20 ms PCIe-throughput sampling in the loop
    poller.backend.shutdown()


@needs_gpu
def test_exporter_over_real_nvml_serves_every_core_family():
    exporter = Exporter(NvmlBackend(), hostname="test")
    exporter.poller.poll_once()
    text = render(exporter)
    for name in ("foxhunt_gpu_utilization_percent", "foxhunt_gpu_memory_used_bytes", "foxhunt_gpu_memory_total_bytes",
                 "foxhunt_gpu_temperature_celsius", "foxhunt_gpu_power_draw_watts", "foxhunt_gpu_info"):  # fmt: skip
        assert samples(text, name), name
    assert samples(text, "foxhunt_exporter_nvml_up")[0].value == 1
    exporter.backend.shutdown()


@pytest.mark.skipif(INIT_ERROR is None, reason="NVML initialises here: the no-driver path is not reachable")
def test_without_a_driver_init_fails_with_an_nvml_code_and_the_exporter_still_serves():
    assert INIT_ERROR.code in LIBRARY_CODES | {ErrorCode.UNKNOWN}, INIT_ERROR
    exporter = Exporter(NvmlBackend(), hostname="test")
    exporter.poller.poll_once()
    text = render(exporter)
    assert samples(text, "foxhunt_exporter_nvml_up")[0].value == 0
    assert samples(text, "foxhunt_exporter_nvml_init_error_code")[0].value == INIT_ERROR.code
    assert not samples(text, "foxhunt_gpu_up")
