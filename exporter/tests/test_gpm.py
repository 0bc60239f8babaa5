"""SM, tensor and graphics-engine activity from NVML GPM: two samples per value, NOT_SUPPORTED remembered,
every sample freed. On the fake backend (H100/H200 have GPM, the A100s and the L4 do not)."""

from __future__ import annotations

import logging

import pytest
from exporter_helpers import OPENMETRICS, by_gpu, families, render
from foxhunt_gpu_exporter.backend import ErrorCode, NvmlError
from foxhunt_gpu_exporter.fake_backend import FakeBackend

H100 = "NVIDIA H100 80GB HBM3"
GPM_FAMILIES = (
    "foxhunt_gpu_sm_active_ratio",
    "foxhunt_gpu_tensor_active_ratio",
    "foxhunt_gpu_gr_engine_active_ratio",
)


def test_fake_gpm_follows_utilization(clock):
    fake = FakeBackend({"gpus": 2, "model": H100, "load_per_gpu": {"1": {"base": 0, "amplitude": 0, "noise": 0}}},
                       clock=clock)  # fmt: skip
    fake.init()
    for gpu in range(2):
        earlier = fake.gpm_sample(gpu)
        for _ in range(20):
            clock.advance(7)
            later = fake.gpm_sample(gpu)
            activity = fake.gpm_activity(gpu, earlier, later)
            assert activity.graphics == fake.utilization(gpu).gpu / 100  # the graphics engine is utilization
            assert 0 <= activity.tensor <= activity.sm <= activity.graphics <= 1
            fake.gpm_free(earlier)
            earlier = later
        fake.gpm_free(earlier)
    assert activity.graphics == 0 and fake.gpm_live == set()  # GPU 1 idles


def test_fake_gpm_refuses_freed_samples_and_boards_without_it(clock):
    fake = FakeBackend({"gpus": 1, "model": "NVIDIA H200"}, clock=clock)
    fake.init()
    earlier, later = fake.gpm_sample(0), fake.gpm_sample(0)
    fake.gpm_free(earlier)
    with pytest.raises(NvmlError) as e:
        fake.gpm_activity(0, earlier, later)  # use after free
    assert e.value.code == ErrorCode.INVALID_ARGUMENT
    with pytest.raises(NvmlError):
        fake.gpm_free(earlier)  # double free
    for model in ("NVIDIA A100-SXM4-80GB", "NVIDIA L4"):
        pre_hopper = FakeBackend({"gpus": 1, "model": model}, clock=clock)
        pre_hopper.init()
        with pytest.raises(NvmlError) as e:
            pre_hopper.gpm_sample(0)
        assert e.value.code == ErrorCode.NOT_SUPPORTED and pre_hopper.gpm_live == set()


def test_first_poll_has_no_gpm_series_the_second_has(make_exporter, clock):
    exporter, _ = make_exporter({"gpus": 2, "model": H100}, clock=clock)
    exporter.poller.poll_once()
    text = render(exporter)
    assert not any(
        f"# TYPE {name}" in text for name in GPM_FAMILIES
    )  # one sample: nothing to compare with yet
    clock.advance(5)
    exporter.poller.poll_once()
    text = render(exporter)
    util = by_gpu(text, "foxhunt_gpu_utilization_percent")
    sm, tensor, graphics = (by_gpu(text, name) for name in GPM_FAMILIES)
    assert set(sm) == set(tensor) == set(graphics) == {"0", "1"}
    for gpu in util:
        assert graphics[gpu] == util[gpu] / 100 and 0 <= tensor[gpu] <= sm[gpu] <= graphics[gpu]  # ratios
    fams = families(render(exporter, OPENMETRICS), openmetrics=True)
    for name in GPM_FAMILIES:
        assert (fams[name].type, fams[name].unit) == ("gauge", "ratio"), name


def test_gpm_not_supported_is_remembered_per_gpu(make_exporter, clock, caplog):
    scenario = {"gpus": 2, "model": H100, "faults": [{"kind": "not_supported", "gpu": 1, "metric": "gpm"}]}
    exporter, fake = make_exporter(scenario, clock=clock)
    with caplog.at_level(logging.INFO, "foxhunt_gpu_exporter"):
        for _ in range(5):
            exporter.poller.poll_once()
            clock.advance(5)
    assert fake.calls["gpm_sample"] == 5 + 1  # GPU 0 every poll, GPU 1 once: no retry storm
    text = render(exporter)
    assert all(set(by_gpu(text, name)) == {"0"} for name in GPM_FAMILIES)  # no series for GPU 1
    assert by_gpu(text, "foxhunt_gpu_up") == {"0": 1, "1": 1}  # unsupported is not down
    assert exporter.errors["metric"] == 0
    assert [r.getMessage() for r in caplog.records if "gpm" in r.getMessage()] == [
        "GPU 1: gpm not supported (NOT_SUPPORTED); not asking again"
    ]
    assert len(fake.gpm_live) == 1  # GPU 0's last sample, kept for the next poll


def test_a_board_without_gpm_is_asked_once(make_exporter):
    exporter, fake = make_exporter()  # 8 x A100: no GPM
    for _ in range(3):
        exporter.poller.poll_once()
    assert fake.calls["gpm_sample"] == 8 and fake.gpm_live == set()
    assert not any(f"# TYPE {name}" in render(exporter) for name in GPM_FAMILIES)


def test_gpm_samples_are_freed_when_a_pair_breaks(make_exporter, clock):
    exporter, fake = make_exporter({"gpus": 2, "model": H100}, clock=clock)
    exporter.poller.monotonic = clock  # re-init backoff on the fake's time line
    poll = exporter.poller.poll_once
    sm = lambda: by_gpu(render(exporter), "foxhunt_gpu_sm_active_ratio")  # noqa: E731
    for _ in range(10):
        poll()
        clock.advance(5)
    assert set(sm()) == {"0", "1"} and len(fake.gpm_live) == 2  # one kept per GPU, every other one freed

    glitch = fake.inject_fault("not_supported", gpu=0, metric="gpm", code="NO_DATA")  # a transient error
    poll()
    assert set(sm()) == {"1"} and len(fake.gpm_live) == 1 and exporter.errors["metric"] == 1
    fake.clear_fault(glitch)
    poll()
    assert set(sm()) == {"1"}  # a new pair starts: the first sample of it has no value
    poll()
    assert set(sm()) == {"0", "1"}

    lost = fake.inject_fault("gpu_lost", gpu=1)  # down: its sample (from before a reset, maybe) is dropped
    poll()
    assert len(fake.gpm_live) == 1
    fake.clear_fault(lost)
    poll()
    poll()
    assert set(sm()) == {"0", "1"} and len(fake.gpm_live) == 2

    gone = fake.inject_fault("gpu_lost", gpu=0, code="DRIVER_NOT_LOADED")  # NVML goes away: free all first
    poll()
    assert not exporter.poller.snapshot.nvml_up and fake.gpm_live == set() and fake.calls["shutdown"] == 1
    fake.clear_fault(gone)
    clock.advance(5)  # past the re-init backoff
    poll()
    poll()
    assert exporter.poller.snapshot.nvml_up and set(sm()) == {"0", "1"} and len(fake.gpm_live) == 2
