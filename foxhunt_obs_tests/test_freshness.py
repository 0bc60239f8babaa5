"""The freshness policy is applied once at the root (foxhunt_obs/freshness.py, data/freshness.yaml): every
materializable asset has one, no entry names an asset or group that does not exist, and no window is
shorter than the schedule that refreshes the asset (a policy that fails between two healthy runs lies)."""

from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest

from foxhunt_obs.definitions import defs
from foxhunt_obs.freshness import windows

TIME_WINDOW = type(dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=1)))
# the period of the schedule that refreshes each group or asset (defs/*/schedules.py)
PERIODS = {
    "gpu": timedelta(hours=1),
    "storage": timedelta(hours=1),
    "training": timedelta(minutes=10),
    "costs": timedelta(days=1),
    "reports": timedelta(days=1),
    "gpu_hourly": timedelta(days=1),
    "weekly_cost_report": timedelta(days=7),
}


@pytest.fixture(scope="module")
def graph():
    return defs().resolve_asset_graph()


def test_every_asset_has_the_policy_of_its_entry(graph):
    w = windows()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        policy = node.freshness_policy
        assert isinstance(policy, TIME_WINDOW), key
        warn, fail = w["assets"].get(key.to_user_string()) or w["groups"][node.group_name]
        assert (policy.warn_window.to_timedelta(), policy.fail_window.to_timedelta()) == (warn, fail)


def test_the_file_names_only_real_assets_and_groups_and_windows_outlast_a_period(graph):
    w = windows()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    groups = {graph.get(k).group_name for k in graph.get_all_asset_keys()}
    assert set(w["assets"]) <= keys and set(w["groups"]) == groups
    for name, (warn, _fail) in {**w["groups"], **w["assets"]}.items():
        assert warn > PERIODS[name], name


def test_only_the_policy_changes():
    """The code location with and without the policy: the same assets, checks, schedules and sensors."""
    import foxhunt_obs.definitions as root

    raw = dg.load_from_defs_folder(path_within_project=Path(root.__file__).resolve().parent)
    with_policy = defs()

    def shape(d: dg.Definitions) -> tuple:
        repo = d.get_repository_def()
        graph = d.resolve_asset_graph()
        return (
            sorted(k.to_user_string() for k in graph.get_all_asset_keys()),
            sorted(str(c) for c in graph.asset_check_keys),
            sorted((s.name, s.cron_schedule) for s in repo.schedule_defs),
            sorted(s.name for s in repo.sensor_defs),
            sorted(d.resources),
        )

    assert shape(raw) == shape(with_policy)
    assert all(
        raw.resolve_asset_graph().get(k).freshness_policy is None for k in raw.resolve_all_asset_keys()
    )
