"""Faults: a lost GPU, NVML init failure with backoff, no GPUs, a hung poll, NOT_SUPPORTED, memory v2 fallback."""

from __future__ import annotations

import logging
import threading

import pytest
from exporter_helpers import ManualClock, by_gpu, families, render, samples, wait_for
from foxhunt_gpu_exporter.backend import ErrorCode
from foxhunt_gpu_exporter.poller import Poller


def value(text: str, name: str) -> float:
    return samples(text, name)[0].value


def test_lost_gpu_goes_down_alone_and_comes_back(make_exporter, clock):
    exporter, fake = make_exporter({"faults": [{"kind": "gpu_lost", "gpu": 3, "at": 10, "until": 20}]}, clock=clock)
    exporter.poller.poll_once()
    assert set(by_gpu(render(exporter), "foxhunt_gpu_up").values()) == {1}

    clock.advance(12)
    exporter.poller.poll_once()
    text = render(exporter)
    up = by_gpu(text, "foxhunt_gpu_up")
    assert up["3"] == 0 and all(v == 1 for g, v in up.items() if g != "3")
    assert "3" not in by_gpu(text, "foxhunt_gpu_utilization_percent")  # its other series are dropped
    assert len(by_gpu(text, "foxhunt_gpu_utilization_percent")) == 7  # the others keep reporting
    down = [s for s in samples(text, "foxhunt_gpu_up") if s.labels["gpu"] == "3"][0]
    assert down.labels["uuid"].startswith("GPU-")  # identity kept: it says which board is missing
    assert value(text, "foxhunt_exporter_nvml_up") == 1
    errors = {s.labels["kind"]: s.value for s in samples(text, "foxhunt_exporter_poll_errors_total")}
    assert errors["device"] == 1

    exporter.poller.poll_once()  # retried every cycle while lost
    assert exporter.errors["device"] == 2 and fake.calls["identity"] == 8  # identity is asked once per GPU
    clock.advance(10)
    exporter.poller.poll_once()
    assert set(by_gpu(render(exporter), "foxhunt_gpu_up").values()) == {1}
    assert "3" in by_gpu(render(exporter), "foxhunt_gpu_utilization_percent")


def test_gpu_lost_before_it_was_ever_identified(make_exporter, clock):
    exporter, fake = make_exporter({"gpus": 2, "faults": [{"kind": "gpu_lost", "gpu": 1}]}, clock=clock)
    exporter.poller.poll_once()
    up = {s.labels["gpu"]: (s.labels["uuid"], s.value) for s in samples(render(exporter), "foxhunt_gpu_up")}
    assert up["1"] == ("", 0) and up["0"][1] == 1
    assert len(samples(render(exporter), "foxhunt_gpu_info")) == 1


def test_init_failure_serves_self_metrics_and_recovers_with_backoff(make_exporter, clock, caplog):
    fail = {"faults": [{"kind": "nvml_init_failure", "until": 30, "code": "DRIVER_NOT_LOADED"}]}
    exporter, fake = make_exporter(fail, clock=clock)
    exporter.poller = poller = Poller(fake, hostname="node-a", errors=exporter.errors, monotonic=clock,
                                      backoff_initial=1, backoff_max=8)  # fmt: skip
    attempts = []
    with caplog.at_level(logging.WARNING, "foxhunt_gpu_exporter"):
        for _ in range(40):  # one poll per second of the fake's time line
            before = fake.calls["init"]
            poller.poll_once()
            if fake.calls["init"] > before:
                attempts.append(clock.t)
            if clock.t == 5:
                text = render(exporter)
                assert value(text, "foxhunt_exporter_nvml_up") == 0
                assert value(text, "foxhunt_exporter_nvml_init_error_code") == ErrorCode.DRIVER_NOT_LOADED
                assert value(text, "foxhunt_exporter_gpus") == 0
                assert not samples(text, "foxhunt_gpu_up")
                assert value(text, "foxhunt_exporter_poll_duration_seconds_count") == 6
            clock.advance(1)
    # exponential backoff 1, 2, 4, 8, 8, ... (capped), then success at the first attempt after t=30
    assert attempts[:6] == [0, 1, 3, 7, 15, 23]
    assert attempts[6] == 31 and len(attempts) == 7
    text = render(exporter)
    assert value(text, "foxhunt_exporter_nvml_up") == 1 and value(text, "foxhunt_exporter_gpus") == 8
    assert value(text, "foxhunt_exporter_nvml_init_error_code") == 0
    assert set(by_gpu(text, "foxhunt_gpu_up").values()) == {1}
    assert exporter.errors["init"] == 6
    failures = [r for r in caplog.records if "NVML init failed" in r.getMessage()]
    assert len(failures) == 6 and "DRIVER_NOT_LOADED" in failures[0].getMessage()


def test_library_error_mid_run_reinitialises(make_exporter, clock):
    exporter, fake = make_exporter({"gpus": 2}, clock=clock, backoff_initial=0.05)
    exporter.poller.poll_once()
    fault = fake.inject_fault("gpu_lost", gpu=0, code="DRIVER_NOT_LOADED")  # NVML itself went away
    exporter.poller.poll_once()
    text = render(exporter)
    assert value(text, "foxhunt_exporter_nvml_up") == 0 and set(by_gpu(text, "foxhunt_gpu_up").values()) == {0}
    assert exporter.errors["library"] == 1 and fake.calls["shutdown"] == 1
    fake.clear_fault(fault)
    wait_for(lambda: exporter.poller.poll_once().nvml_up, what="re-init after the backoff")
    assert fake.calls["init"] == 2


def test_no_gpus_serves_self_metrics_and_says_so_once(make_exporter, caplog):
    exporter, _ = make_exporter({"gpus": 0})
    with caplog.at_level(logging.INFO, "foxhunt_gpu_exporter"):
        for _ in range(3):
            exporter.poller.poll_once()
    text = render(exporter)
    assert value(text, "foxhunt_exporter_nvml_up") == 1 and value(text, "foxhunt_exporter_gpus") == 0
    assert not samples(text, "foxhunt_gpu_up") and not samples(text, "foxhunt_gpu_info")
    assert len([r for r in caplog.records if "no GPUs" in r.getMessage()]) == 1


def test_hung_poll_fires_the_watchdog_and_reports_every_gpu_down(make_exporter):
    stuck = threading.Event()
    exporter, fake = make_exporter({"gpus": 4}, interval=0.05, stuck_after=0.3, on_stuck=stuck.set)
    exporter.start()
    wait_for(lambda: exporter.poller.snapshot.nvml_up, what="first poll")
    assert exporter.health()[0]
    fake.inject_fault("hang")
    assert stuck.wait(5), "watchdog did not fire"
    text = render(exporter)
    assert set(by_gpu(text, "foxhunt_gpu_up").values()) == {0}
    assert not samples(text, "foxhunt_gpu_utilization_percent")
    assert value(text, "foxhunt_exporter_nvml_up") == 0
    assert exporter.errors["stuck"] == 1
    assert exporter.health() == (False, "poll stuck in the driver")
    fake.release_hang()  # the late poll must not bring the GPUs back
    wait_for(lambda: exporter.poller.busy_since is None, what="released poll")
    assert set(by_gpu(render(exporter), "foxhunt_gpu_up").values()) == {0}


def test_not_supported_is_asked_once_not_every_cycle(make_exporter, caplog):
    scenario = {"gpus": 2, "faults": [{"kind": "not_supported", "gpu": 1, "metric": "ecc"},
                                      {"kind": "not_supported", "metric": "pcie_replays"}]}  # fmt: skip
    exporter, fake = make_exporter(scenario)
    with caplog.at_level(logging.INFO, "foxhunt_gpu_exporter"):
        for _ in range(5):
            exporter.poller.poll_once()
    assert fake.calls["ecc"] == 5 + 1  # GPU 0 every cycle, GPU 1 once
    assert fake.calls["pcie_replays"] == 2  # once per GPU
    assert fake.calls["utilization"] == 10
    text = render(exporter)
    assert set(by_gpu(text, "foxhunt_gpu_ecc_errors_total", error="corrected", scope="volatile")) == {"0"}
    assert not samples(text, "foxhunt_gpu_pcie_replays_total")
    assert set(by_gpu(text, "foxhunt_gpu_up").values()) == {1}  # unsupported is not down
    assert exporter.errors["metric"] == 0
    # one line per GPU and metric: ecc on GPU 1, pcie_replays on both, and GPM, which an A100 lacks, on both
    assert len([r for r in caplog.records if "not supported" in r.getMessage()]) == 1 + 2 + 2
    assert fake.calls["gpm_sample"] == 2  # asked once per GPU too


def test_other_metric_errors_skip_the_metric_and_are_retried(make_exporter):
    scenario = {"gpus": 1, "faults": [{"kind": "not_supported", "metric": "power", "code": "NO_PERMISSION"}]}
    exporter, fake = make_exporter(scenario)
    for _ in range(3):
        exporter.poller.poll_once()
    assert fake.calls["power"] == 3 and exporter.errors["metric"] == 3
    text = render(exporter)
    assert not samples(text, "foxhunt_gpu_power_draw_watts") and by_gpu(text, "foxhunt_gpu_up") == {"0": 1}


@pytest.mark.parametrize("code", ["NOT_SUPPORTED", "FUNCTION_NOT_FOUND"])
def test_memory_v2_falls_back_to_v1(make_exporter, code):
    scenario = {"gpus": 2, "faults": [{"kind": "not_supported", "metric": "memory_v2", "code": code}]}
    exporter, fake = make_exporter(scenario)
    for _ in range(3):
        exporter.poller.poll_once()
    assert fake.calls["memory"] == 2 + 3 * 2  # v2 refused once per GPU, then v1 every cycle
    text = render(exporter)
    fams = families(text)
    assert "foxhunt_gpu_memory_reserved_bytes" not in fams  # v1 knows nothing of reserved memory
    used = by_gpu(text, "foxhunt_gpu_memory_used_bytes")
    assert all(v > 0.006 * 80 * 2**30 for v in used.values())  # v1 counts reserved as used
    assert exporter.errors["metric"] == 0


def test_memory_v2_reports_reserved_apart_from_used(make_exporter, clock):
    exporter, fake = make_exporter({"gpus": 1}, clock=clock)
    exporter.poller.poll_once()
    v2 = exporter.poller.snapshot.gpus[0].memory
    v1 = fake.memory(0, v2=False)
    assert v2.reserved > 0 and v1.reserved is None
    assert v1.used == v2.used + v2.reserved and v1.total == v2.total


def test_poll_survives_an_unexpected_exception(make_exporter, caplog):
    exporter, fake = make_exporter({"gpus": 1})
    exporter.poller.poll_once()
    fake.temperature = lambda gpu: 1 / 0  # a bug, not an NVML error
    with caplog.at_level(logging.ERROR, "foxhunt_gpu_exporter"):
        exporter.poller.poll_once()
    assert exporter.errors["internal"] == 1 and "poll failed unexpectedly" in caplog.text
    assert exporter.poller.snapshot.polls.count == 2


def test_poller_publishes_a_new_immutable_snapshot_each_cycle(make_exporter):
    exporter, _ = make_exporter({"gpus": 1})
    first = exporter.poller.poll_once()
    second = exporter.poller.poll_once()
    assert first is not second and exporter.poller.snapshot is second
    with pytest.raises(AttributeError):
        second.gpus[0].up = False  # frozen
    assert isinstance(second.gpus, tuple)


def test_manual_clock_helper():
    c = ManualClock(2.0)
    c.advance(0.5)
    assert c() == 2.5
