"""The code location: every module under foxhunt_obs/defs, loaded once, plus the global policies applied
here and nowhere else (the freshness policy: foxhunt_obs/freshness.py)."""

from pathlib import Path

import dagster as dg

from foxhunt_obs.freshness import with_freshness


@dg.definitions
def defs() -> dg.Definitions:
    return with_freshness(dg.load_from_defs_folder(path_within_project=Path(__file__).resolve().parent))
