"""The freshness policy, applied once at the root (docs/design.md#layout): every materializable asset gets a time-window
freshness policy from data/freshness.yaml (its own entry, else its group's), so the UI shows an asset whose
schedule stopped or whose runs keep failing as late, then failing. Schedules are not changed by it."""

from __future__ import annotations

from datetime import timedelta
from functools import cache
from pathlib import Path

import dagster as dg

from foxhunt_obs.lib.alerts.rules import parse_duration
from foxhunt_obs.lib.yaml_text import load_yaml

FRESHNESS_FILE = Path(__file__).resolve().parent / "data" / "freshness.yaml"


@cache
def windows() -> dict:
    """{"groups": {group: (warn, fail)}, "assets": {key: (warn, fail)}} as timedeltas."""
    raw = load_yaml(FRESHNESS_FILE.read_text())

    def pair(entry: dict, where: str) -> tuple[timedelta, timedelta]:
        warn, fail = (timedelta(seconds=parse_duration(entry[k])) for k in ("warn", "fail"))
        if not timedelta(0) < warn < fail:
            raise ValueError(f"{FRESHNESS_FILE} {where}: need 0 < warn < fail, got {entry}")
        return warn, fail

    return {
        part: {name: pair(entry, f"{part}.{name}") for name, entry in (raw.get(part) or {}).items()}
        for part in ("groups", "assets")
    }


def policy_for(spec: dg.AssetSpec) -> dg.FreshnessPolicy:
    w = windows()
    key = spec.key.to_user_string()
    chosen = w["assets"].get(key) or w["groups"].get(spec.group_name or "")
    if chosen is None:
        raise ValueError(f"{FRESHNESS_FILE}: no window for asset {key} (group {spec.group_name!r})")
    warn, fail = chosen
    return dg.FreshnessPolicy.time_window(fail_window=fail, warn_window=warn)


def with_freshness(defs: dg.Definitions) -> dg.Definitions:
    """`defs` with the policy on every asset spec (dg.map_asset_specs; Definitions.map_asset_specs is
    still a preview API)."""
    return dg.Definitions(
        assets=dg.map_asset_specs(
            lambda s: s.replace_attributes(freshness_policy=policy_for(s)), defs.assets or []
        ),
        asset_checks=defs.asset_checks,
        schedules=defs.schedules,
        sensors=defs.sensors,
        jobs=defs.jobs,
        resources=defs.resources,
        executor=defs.executor,
        loggers=defs.loggers,
        metadata=defs.metadata,
        component_tree=defs.component_tree,
    )
