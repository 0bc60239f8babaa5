"""The in-process GPU poller: the exporter's Poller on a thread of its own inside the trainer, its figures on
the training endpoint; without NVML one warning and no thread."""

from __future__ import annotations

import logging
import threading

import pytest
from exporter_helpers import by_gpu, wait_for
from foxhunt_gpu_exporter import training
from foxhunt_gpu_exporter.fake_backend import FakeBackend
from foxhunt_gpu_exporter.nvml_backend import NvmlBackend
from foxhunt_gpu_exporter.training.gpu import DEFAULT_INTERVAL_S

GPU_LOG = "foxhunt_gpu_exporter.training.gpu"


@pytest.fixture(autouse=True)
def outside_kubernetes(monkeypatch):
    """Tests run as on a workstation unless they say otherwise (CI may itself run in a pod)."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("NODE_NAME", raising=False)


@pytest.fixture
def made():
    """Telemetry objects built by a test, stopped afterwards (their poller threads with them)."""
    built: list[training.Telemetry] = []

    def make() -> training.Telemetry:
        built.append(training.Telemetry(mlflow=None, tracer=None))
        return built[-1]

    yield make
    for t in built:
        t.stop()


def pollers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "foxhunt-poller" and t.is_alive()]


def test_default_interval_is_seed_003s_five_seconds():
    assert DEFAULT_INTERVAL_S == 5.0


def test_the_poller_thread_polls_and_its_gpu_figures_share_the_training_endpoint(made):
    fake = FakeBackend({"gpus": 2, "model": "NVIDIA H100 80GB HBM3", "hostname": "node-t",
                        "load": {"base": 40, "amplitude": 0, "noise": 0}})  # fmt: skip
    t = made()
    poller = t.start_gpu_poller(0.05, fake)
    assert poller is not None and t.gpu_poller is poller
    t.fold("ppo-policy", 0, epochs=1).start()
    wait_for(lambda: fake.calls["utilization"] >= 6, what="three polls of two GPUs")
    assert fake.call_threads["utilization"] == {"foxhunt-poller"}  # polled on the poller thread only
    text = t.metrics.render()[0].decode()
    assert by_gpu(text, "foxhunt_gpu_utilization_percent", hostname="node-t") == {"0": 40.0, "1": 40.0}
    assert by_gpu(text, "foxhunt_gpu_memory_total_bytes") == dict.fromkeys(
        ("0", "1"), float(fake.memory_total)
    )
    assert by_gpu(text, "foxhunt_gpu_up") == {"0": 1.0, "1": 1.0}
    assert "foxhunt_training_active_workers" in text  # one endpoint for both
    assert (
        "foxhunt_exporter_" not in text and "foxhunt_gpu_xid_errors" not in text
    )  # no exporter self-metrics
    assert t.start_gpu_poller(0.05, fake) is poller  # asked again: the same thread, not a second one


def test_without_nvml_one_warning_and_no_thread(made, caplog):
    fake = FakeBackend({"gpus": 2, "faults": [{"kind": "nvml_init_failure", "code": "LIBRARY_NOT_FOUND"}]})
    before = len(pollers())
    t = made()
    with caplog.at_level(logging.INFO, logger=GPU_LOG):
        assert t.start_gpu_poller(0.05, fake) is None
        assert t.start_gpu_poller(0.05, fake) is None  # asked twice, said once
    warnings = [r for r in caplog.records if r.name == GPU_LOG and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "LIBRARY_NOT_FOUND" in warnings[0].getMessage()
    assert len(pollers()) == before
    assert fake.calls["init"] == 1  # tried once, not retried in the background
    assert "foxhunt_gpu_" not in t.metrics.render()[0].decode()


def test_the_real_nvml_backend_on_a_machine_without_nvml(made, caplog):
    try:
        probe = NvmlBackend()
        probe.init()
    except Exception as e:  # noqa: BLE001 - what this machine says is the point
        why = e
    else:
        probe.shutdown()
        pytest.skip("NVML answers here: test_nvml_real.py covers real GPUs")
    before = len(pollers())
    t = made()
    with caplog.at_level(logging.WARNING, logger=GPU_LOG):
        assert t.start_gpu_poller() is None
    (warning,) = [r for r in caplog.records if r.name == GPU_LOG]
    assert str(why).split(":")[0] in warning.getMessage()
    assert len(pollers()) == before


def test_in_kubernetes_without_node_name_one_warning_and_no_poller(made, caplog, monkeypatch):
    """Inside a pod the host name is the pod's: GPUs labelled with it would land on a "node" named after the
    pod (no price, and the same UUID under two nodes beside dcgm-exporter)."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.delenv("NODE_NAME", raising=False)
    fake = FakeBackend({"gpus": 2})  # names no node, as NVML does not
    before = len(pollers())
    t = made()
    with caplog.at_level(logging.INFO, logger=GPU_LOG):
        assert t.start_gpu_poller(0.05, fake) is None
        assert t.start_gpu_poller(0.05, fake) is None  # asked twice, said once
    warnings = [r.getMessage() for r in caplog.records if r.name == GPU_LOG and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "NODE_NAME" in warnings[0] and "spec.nodeName" in warnings[0], warnings
    assert fake.calls["init"] == 0 and len(pollers()) == before  # NVML not even tried
    t.fold("ppo-policy", 0, epochs=1).start()
    text = t.metrics.render()[0].decode()
    assert "foxhunt_training_active_workers" in text and "foxhunt_gpu_" not in text


def test_in_kubernetes_with_node_name_the_gpus_are_the_node_s(made, monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("NODE_NAME", "ip-10-0-3-17.ec2.internal")
    fake = FakeBackend({"gpus": 1, "load": {"base": 30, "amplitude": 0, "noise": 0}})
    t = made()
    assert t.start_gpu_poller(0.05, fake) is not None
    wait_for(lambda: fake.calls["utilization"] >= 2, what="two polls")  # the first one's snapshot is out
    text = t.metrics.render()[0].decode()
    node = "ip-10-0-3-17.ec2.internal"
    assert by_gpu(text, "foxhunt_gpu_utilization_percent", hostname=node) == {"0": 30.0}
