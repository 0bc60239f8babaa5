"""Every metric family: name, type, unit, labels, and plausible values from the default fake scenario."""

from __future__ import annotations

import pytest
from exporter_helpers import OPENMETRICS, by_gpu, families, render, samples

GPU = {"gpu", "uuid", "hostname", "model"}
# exposed name (OpenMetrics family name) -> (type, unit, extra labels)
PER_GPU = {
    "foxhunt_gpu_utilization_percent": ("gauge", "percent", set()),
    "foxhunt_gpu_memory_utilization_percent": ("gauge", "percent", set()),
    "foxhunt_gpu_memory_used_bytes": ("gauge", "bytes", set()),
    "foxhunt_gpu_memory_total_bytes": ("gauge", "bytes", set()),
    "foxhunt_gpu_memory_reserved_bytes": ("gauge", "bytes", set()),
    "foxhunt_gpu_temperature_celsius": ("gauge", "celsius", set()),
    "foxhunt_gpu_power_draw_watts": ("gauge", "watts", set()),
    "foxhunt_gpu_sm_clock_hertz": ("gauge", "hertz", set()),
    "foxhunt_gpu_memory_clock_hertz": ("gauge", "hertz", set()),
    "foxhunt_gpu_clock_event_active": ("gauge", "", {"reason"}),
    "foxhunt_gpu_remapped_rows_pending": ("gauge", "", set()),
    "foxhunt_gpu_remapped_rows_failed": ("gauge", "", set()),
    "foxhunt_gpu_energy_joules": ("counter", "joules", set()),
    "foxhunt_gpu_ecc_errors": ("counter", "", {"error", "scope"}),
    "foxhunt_gpu_pcie_replays": ("counter", "", set()),
    "foxhunt_gpu_nvlink_bytes": ("counter", "bytes", {"direction"}),
    "foxhunt_gpu_remapped_rows": ("counter", "", {"cause"}),
    "foxhunt_gpu_up": ("gauge", "", set()),
}
SERIES_PER_GPU = {"foxhunt_gpu_clock_event_active": 9, "foxhunt_gpu_ecc_errors": 4}


@pytest.fixture
def polled(make_exporter):
    exporter, fake = make_exporter()
    exporter.poller.poll_once()
    return exporter, fake


def test_every_per_gpu_family_has_its_type_unit_and_labels(polled):
    exporter, _ = polled
    fams = families(render(exporter, OPENMETRICS), openmetrics=True)
    for name, (kind, unit, extra) in PER_GPU.items():
        fam = fams[name]
        assert (fam.type, fam.unit) == (kind, unit), name
        series = [s for s in fam.samples if not s.name.endswith("_created")]
        assert len(series) == 8 * SERIES_PER_GPU.get(name, 2 if extra else 1), name
        for s in series:
            assert set(s.labels) == GPU | extra, (name, s.labels)
            assert s.labels["hostname"] == "node-a" and s.labels["model"] == "NVIDIA A100-SXM4-80GB"
            assert s.labels["uuid"].startswith("GPU-")


def test_label_values_of_the_multi_series_families(polled):
    text = render(polled[0])
    labels = lambda name, key: {s.labels[key] for s in samples(text, name)}  # noqa: E731
    assert labels("foxhunt_gpu_clock_event_active", "reason") >= {
        "sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake", "sync_boost", "gpu_idle",
    }  # fmt: skip
    assert labels("foxhunt_gpu_ecc_errors_total", "error") == {"corrected", "uncorrected"}
    assert labels("foxhunt_gpu_ecc_errors_total", "scope") == {"volatile", "aggregate"}
    assert labels("foxhunt_gpu_nvlink_bytes_total", "direction") == {"rx", "tx"}
    assert labels("foxhunt_gpu_remapped_rows_total", "cause") == {"correctable", "uncorrectable"}


def test_counters_are_exposed_with_total_in_both_formats(polled):
    exporter, _ = polled
    for accept in ("", OPENMETRICS):
        text = render(exporter, accept)
        for name in ("energy_joules", "ecc_errors", "pcie_replays", "nvlink_bytes", "remapped_rows", "xid_errors"):
            assert f"# TYPE foxhunt_gpu_{name}" in text
        assert "foxhunt_gpu_energy_joules_total{" in text
        assert "foxhunt_exporter_poll_errors_total{" in text


def test_identity_up_and_self_metrics(polled):
    exporter, fake = polled
    text = render(exporter, OPENMETRICS)
    fams = families(text, openmetrics=True)
    info = fams["foxhunt_gpu_info"].samples
    assert len(info) == 8 and all(s.value == 1 for s in info)
    assert set(info[0].labels) == {"driver", "model", "uuid", "pci_bus_id", "gpu", "hostname"}
    assert info[0].labels["driver"] == "550.90.07"
    assert len({s.labels["uuid"] for s in info}) == 8 and len({s.labels["pci_bus_id"] for s in info}) == 8
    assert all(s.value == 1 for s in fams["foxhunt_gpu_up"].samples)

    hist = fams["foxhunt_exporter_poll_duration_seconds"]
    assert (hist.type, hist.unit) == ("histogram", "seconds")
    count = [s.value for s in hist.samples if s.name.endswith("_count")]
    assert count == [1]
    errors = fams["foxhunt_exporter_poll_errors"]
    assert errors.type == "counter" and {s.labels["kind"] for s in errors.samples} >= {"init", "device", "metric"}
    stamp = fams["foxhunt_exporter_last_poll_success_timestamp_seconds"]
    assert stamp.unit == "seconds" and stamp.samples[0].value > 1.7e9
    for name, value in (("foxhunt_exporter_nvml_up", 1), ("foxhunt_exporter_gpus", 8),
                        ("foxhunt_exporter_nvml_init_error_code", 0)):  # fmt: skip
        assert fams[name].type == "gauge" and fams[name].samples[0].value == value
        assert fams[name].samples[0].labels == {}
    assert fams["foxhunt_gpu_xid_errors"].type == "counter"


def test_values_are_plausible(polled, clock):
    exporter, _ = polled
    text = render(exporter)
    util = by_gpu(text, "foxhunt_gpu_utilization_percent")
    used, total = by_gpu(text, "foxhunt_gpu_memory_used_bytes"), by_gpu(text, "foxhunt_gpu_memory_total_bytes")
    reserved = by_gpu(text, "foxhunt_gpu_memory_reserved_bytes")
    for gpu in util:
        assert 0 <= util[gpu] <= 100
        assert total[gpu] == 80 * 2**30 and 0 < used[gpu] + reserved[gpu] <= total[gpu]
        assert 20 < by_gpu(text, "foxhunt_gpu_temperature_celsius")[gpu] < 95
        assert 50 < by_gpu(text, "foxhunt_gpu_power_draw_watts")[gpu] <= 400
        assert 2e8 <= by_gpu(text, "foxhunt_gpu_sm_clock_hertz")[gpu] <= 2e9  # Hz, not MHz
        assert by_gpu(text, "foxhunt_gpu_memory_clock_hertz")[gpu] == 1593e6


def test_counters_grow_between_polls(make_exporter, clock):
    exporter, _ = make_exporter(clock=clock)
    exporter.poller.poll_once()
    before = render(exporter)
    clock.advance(10)
    exporter.poller.poll_once()
    after = render(exporter)
    for name, match in (("foxhunt_gpu_energy_joules_total", {}), ("foxhunt_gpu_nvlink_bytes_total", {"direction": "rx"})):
        old, new = by_gpu(before, name, **match), by_gpu(after, name, **match)
        assert all(new[g] > old[g] for g in old), name
    # ~10 s at 55-400 W
    assert all(500 < by_gpu(after, "foxhunt_gpu_energy_joules_total")[g] - v < 4100
               for g, v in by_gpu(before, "foxhunt_gpu_energy_joules_total").items())  # fmt: skip


def test_ecc_bursts_and_remapped_rows(make_exporter, clock):
    scenario = {"faults": [{"kind": "ecc_sbe", "gpu": 2, "at": 5, "count": 7},
                           {"kind": "ecc_dbe", "gpu": 2, "at": 8, "count": 1}]}  # fmt: skip
    exporter, _ = make_exporter(scenario, clock=clock)
    exporter.poller.poll_once()
    ecc = lambda **m: by_gpu(render(exporter), "foxhunt_gpu_ecc_errors_total", **m)  # noqa: E731
    assert ecc(error="corrected", scope="volatile")["2"] == 0
    clock.advance(6)
    exporter.poller.poll_once()
    assert ecc(error="corrected", scope="volatile")["2"] == 7 and ecc(error="corrected", scope="aggregate")["2"] == 7
    assert ecc(error="corrected", scope="volatile")["1"] == 0
    clock.advance(3)
    exporter.poller.poll_once()
    text = render(exporter)
    assert ecc(error="uncorrected", scope="volatile")["2"] == 1
    assert by_gpu(text, "foxhunt_gpu_remapped_rows_total", cause="uncorrectable")["2"] == 1
    assert by_gpu(text, "foxhunt_gpu_remapped_rows_pending")["2"] == 1


def test_clock_event_reasons_follow_the_load(make_exporter):
    # GPU 0 idle, GPU 1 pinned at its power limit
    scenario = {"gpus": 2, "load_per_gpu": {"0": {"base": 0, "amplitude": 0, "noise": 0},
                                            "1": {"base": 100, "amplitude": 0, "noise": 0}}}  # fmt: skip
    exporter, _ = make_exporter(scenario)
    exporter.poller.poll_once()
    text = render(exporter)
    assert by_gpu(text, "foxhunt_gpu_clock_event_active", reason="gpu_idle") == {"0": 1, "1": 0}
    assert by_gpu(text, "foxhunt_gpu_clock_event_active", reason="sw_power_cap") == {"0": 0, "1": 1}
    assert by_gpu(text, "foxhunt_gpu_sm_clock_hertz") == {"0": 210e6, "1": 1410e6 * 0.9}
