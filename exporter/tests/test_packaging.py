"""The package's promises: two runtime dependencies, the extras, the console script, no module `example`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_runtime_dependencies_are_nvidia_ml_py_and_prometheus_client_only():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~ \[]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    assert names == {"nvidia-ml-py", "prometheus-client"}  # never the deprecated `pynvml` distribution
    assert all(re.search(r">=.*<", dep) for dep in project["dependencies"])  # compatible ranges, pinned both ways
    extras = project["optional-dependencies"]
    assert {re.split(r"[<>=]", d)[0] for d in extras["k8s"]} == {"grpcio", "protobuf"}
    assert any(d.startswith("pytest") for d in extras["dev"])
    assert project["name"] == "foxhunt-gpu-exporter"
    assert project["scripts"] == {"foxhunt-gpu-exporter": "foxhunt_gpu_exporter.cli:main"}


def test_nothing_of_ours_is_named_example():
    # nvidia-ml-py installs a top-level module `example`: a module of ours by that name would shadow or be shadowed
    ours = [p for p in ROOT.rglob("*") if p.name.startswith("example") and ".egg-info" not in str(p)]
    assert ours == []


def test_readme_documents_every_metric_and_its_scenario_example_loads():
    import json

    from foxhunt_gpu_exporter.collector import GPU_FAMILIES
    from foxhunt_gpu_exporter.fake_backend import FakeBackend

    readme = (ROOT / "README.md").read_text()
    names = [f.name for f in GPU_FAMILIES] + [
        "foxhunt_gpu_xid_errors_total", "foxhunt_gpu_info", "foxhunt_gpu_up",
        "foxhunt_exporter_poll_duration_seconds", "foxhunt_exporter_poll_errors_total",
        "foxhunt_exporter_last_poll_success_timestamp_seconds", "foxhunt_exporter_nvml_up",
        "foxhunt_exporter_nvml_init_error_code", "foxhunt_exporter_gpus",
    ]  # fmt: skip
    assert [n for n in names if f"`{n}`" not in readme] == []
    example = re.search(r"```json\n(.*?)```", readme, re.S).group(1)
    assert len(FakeBackend(json.loads(example)).faults) == 7
