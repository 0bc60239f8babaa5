"""The code location loads, validates, and keeps its shape: a refactor that drops an asset fails here."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from foxhunt_obs.definitions import defs

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = Path(__file__).parent / "snapshots" / "definitions.json"


def _shape() -> dict:
    d = defs()
    graph = d.resolve_asset_graph()
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        pd = node.partitions_def
        assets[key.to_user_string()] = {
            "group": node.group_name,
            "partitions": type(pd).__name__ if pd else None,
            "deps": sorted(p.to_user_string() for p in node.parent_keys),
            "checks": sorted(c.name for c in node.check_keys),
            "backfill_policy": str(node.backfill_policy) if node.backfill_policy else None,
            "pools": sorted(node.pools or ()),
        }
    repo = d.get_repository_def()
    schedules = {s.name: {"cron": s.cron_schedule, "job": s.job_name} for s in repo.schedule_defs}
    jobs = sorted(j.name for j in d.resolve_all_job_defs() if not j.name.startswith("__"))
    return {"assets": assets, "schedules": schedules, "jobs": jobs}


def test_definitions_match_snapshot():
    shape = _shape()
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(json.dumps(shape, indent=2, sort_keys=True) + "\n")
    assert shape == json.loads(SNAPSHOT.read_text()), (
        "definitions changed: rerun with UPDATE_SNAPSHOTS=1 and review"
    )


@pytest.mark.servers
def test_dagster_definitions_validate(tmp_path):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    out = subprocess.run(
        [Path(sys.executable).parent / "dagster", "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Validation successful for code location foxhunt_obs" in out.stdout + out.stderr


def test_workspace_location_is_the_dg_code_location_name():
    import tomllib
    import yaml

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    name = project["tool"]["dg"]["project"]["code_location_name"]
    workspace = yaml.safe_load((ROOT / "workspace.yaml").read_text())
    assert [e["python_module"]["location_name"] for e in workspace["load_from"]] == [name]
