"""The fake backend itself: default scenario, scenario checks, load curves, runtime fault injection."""

from __future__ import annotations

import json

import pytest
from foxhunt_gpu_exporter.backend import Backend, ErrorCode, NvmlError
from foxhunt_gpu_exporter.fake_backend import DEFAULT_SCENARIO, FakeBackend, load_scenario


def test_default_scenario_is_eight_a100_80gb(clock):
    fake = FakeBackend(clock=clock)
    assert isinstance(fake, Backend)
    fake.init()
    assert fake.device_count() == 8 and fake.driver_version() == DEFAULT_SCENARIO["driver"]
    ids = [fake.identity(i) for i in range(8)]
    assert {i.model for i in ids} == {"NVIDIA A100-SXM4-80GB"} and len({i.uuid for i in ids}) == 8
    assert fake.memory(0).total == 80 * 2**30
    assert fake.hostname() is None


def test_calls_before_init_are_uninitialized():
    with pytest.raises(NvmlError) as e:
        FakeBackend({"gpus": 1}).utilization(0)
    assert e.value.code == ErrorCode.UNINITIALIZED


def test_scenario_file_and_checks(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"gpus": 3, "model": "NVIDIA H200", "hostname": "h", "faults": []}))
    assert load_scenario(path)["gpus"] == 3
    with pytest.raises(ValueError, match="unknown keys"):
        load_scenario({"gpus": 1, "gpu": 2})
    with pytest.raises(ValueError, match="kind must be one of"):
        FakeBackend({"faults": [{"kind": "meteor"}]})
    with pytest.raises(ValueError, match="metric must be one of"):
        FakeBackend({"faults": [{"kind": "not_supported", "metric": "fan"}]})
    with pytest.raises(ValueError, match="needs `gpu` and `xid`"):
        FakeBackend({"faults": [{"kind": "xid", "gpu": 1}]})
    with pytest.raises(ValueError, match="code must be an NVML error name"):
        FakeBackend({"faults": [{"kind": "gpu_lost", "code": "ON_FIRE"}]})
    with pytest.raises(ValueError, match="load keys"):
        FakeBackend({"load": {"base": 1, "peak": 2}})
    with pytest.raises(ValueError, match="s.json|nope.json"):
        load_scenario(tmp_path / "nope.json")


def test_load_curves_per_gpu_and_for_all(clock):
    fake = FakeBackend({"gpus": 3, "load": {"base": 50, "amplitude": 0, "noise": 0},
                        "load_per_gpu": {"2": {"base": 10}}}, clock=clock)  # fmt: skip
    fake.init()
    assert [fake.utilization(i).gpu for i in range(3)] == [50, 50, 10]
    wave = FakeBackend({"gpus": 1, "load": {"base": 50, "amplitude": 40, "period_s": 100, "noise": 0}}, clock=clock)
    wave.init()
    values = []
    for _ in range(100):
        values.append(wave.utilization(0).gpu)
        clock.advance(1)
    assert 88 <= max(values) <= 90 and 10 <= min(values) <= 12


def test_inject_and_clear_faults_at_runtime(clock):
    fake = FakeBackend({"gpus": 2}, clock=clock)
    fake.init()
    clock.advance(3)
    lost = fake.inject_fault("gpu_lost", gpu=1)
    assert lost.at == 3
    with pytest.raises(NvmlError) as e:
        fake.temperature(1)
    assert e.value.code == ErrorCode.GPU_IS_LOST
    fake.temperature(0)
    fake.clear_fault(lost)
    fake.temperature(1)
    fake.inject_fault("not_supported", metric="nvlink", gpu="all")
    with pytest.raises(NvmlError):
        fake.nvlink(0)


def test_nvml_init_failure_until(clock):
    fake = FakeBackend({"faults": [{"kind": "nvml_init_failure", "until": 5, "code": "LIBRARY_NOT_FOUND"}]},
                       clock=clock)  # fmt: skip
    with pytest.raises(NvmlError) as e:
        fake.init()
    assert e.value.code == ErrorCode.LIBRARY_NOT_FOUND and "LIBRARY_NOT_FOUND" in str(e.value)
    clock.advance(5)
    fake.init()


def test_pcie_only_models_have_no_nvlink(clock):
    fake = FakeBackend({"gpus": 1, "model": "NVIDIA L4"}, clock=clock)
    fake.init()
    with pytest.raises(NvmlError) as e:
        fake.nvlink(0)
    assert e.value.code == ErrorCode.NOT_SUPPORTED


def test_shipped_incident_scenario_loads():
    from importlib.resources import files

    scenario = json.loads(files("foxhunt_gpu_exporter").joinpath("scenarios/incidents.json").read_text())
    fake = FakeBackend(scenario)
    assert {f.kind for f in fake.faults} == {"gpu_lost", "xid", "ecc_sbe", "ecc_dbe", "not_supported"}


@pytest.mark.parametrize("gpus", [-1, 800, 2.5, "8", True])  # 0 is a node without GPUs: allowed
def test_gpus_must_be_a_sensible_whole_number(gpus):
    with pytest.raises(ValueError, match="gpus must be a whole number from 0 to 64"):
        FakeBackend({"gpus": gpus})


def test_load_per_gpu_names_existing_gpus():
    with pytest.raises(ValueError, match=r"load_per_gpu names GPUs \[4\], but there are 2"):
        FakeBackend({"gpus": 2, "load_per_gpu": {4: {"base": 10}}})
