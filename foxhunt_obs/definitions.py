"""The code location: every module under foxhunt_obs/defs, loaded once, plus global policies."""

from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    return dg.load_from_defs_folder(path_within_project=Path(__file__).resolve().parent)
