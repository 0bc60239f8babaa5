"""MIG slices: a slice's share of its GPU, from `foxhunt_obs/data/mig_profiles.yaml`.

A MIG GPU's cost, GPU-hours and energy are split over its slices by this share (docs/cost-model.md), so they
are never counted once per slice.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.yaml_text import load_yaml

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "mig_profiles.yaml"
_PROFILE = re.compile(r"^(\d+)g\.")  # "3g.40gb", "1g.10gb+me"


class MigError(InputError, ValueError):
    """A MIG profile or GPU model whose share cannot be known: the message names both and the data file."""


@cache
def _gpus(path: str) -> tuple[tuple[re.Pattern, int], ...]:
    raw = load_yaml(Path(path).read_text())
    return tuple((re.compile(g["model"]), int(g["compute_slices"])) for g in raw["gpus"])


def model_slices(path: str | Path = DEFAULT_PATH) -> list[tuple[str, int]]:
    """(model pattern, compute slices) in file order: the first pattern found in a model name wins."""
    return [(pattern.pattern, slices) for pattern, slices in _gpus(str(path))]


def slice_share(profile: str, model: str, path: str | Path = DEFAULT_PATH) -> float:
    """The share of its GPU a MIG slice of `profile` on a `model` GPU is: 3g.40gb on an H100 is 3/7."""
    m = _PROFILE.match(re.sub(r"^\d+c\.", "", profile))  # a compute instance's "2c." prefix: its GI's share
    if not m:
        raise MigError(f"MIG profile {profile!r} on {model!r}: not a '<n>g.<memory>' profile name")
    for pattern, slices in _gpus(str(path)):
        if pattern.search(model):
            n = int(m.group(1))
            if not 0 < n <= slices:
                raise MigError(f"MIG profile {profile!r}: {n} compute slices, but {model!r} has {slices}")
            return n / slices
    raise MigError(
        f"MIG profile {profile!r} on GPU model {model!r}: the model's compute slices are unknown; "
        f"add it to {path}"
    )
