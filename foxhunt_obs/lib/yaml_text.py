"""YAML for the project's data files and users' rule files: PyYAML's safe loader, on libyaml when the
installed PyYAML has it (the same documents, ~8x faster: the price table took ~45 ms to parse in pure
Python, paid by every cost run and code-location load)."""

from __future__ import annotations

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str):
    """yaml.safe_load(text), faster; raises yaml.YAMLError alike."""
    return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader (C or Python)
