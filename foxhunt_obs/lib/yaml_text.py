"""YAML for the project's data files and users' rule files: PyYAML's safe loader on libyaml when the
installed PyYAML has it (~8x faster: the price table took ~45 ms to parse in pure Python, paid by every
cost run and code-location load). A document that does not parse is parsed again by the pure-Python
loader, whose error names the line and shows it. libyaml accepts a few documents the pure-Python loader
refuses (a tab after `key:`), never the other way round."""

from __future__ import annotations

import yaml

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str):
    """yaml.safe_load(text), faster; raises yaml.YAMLError as yaml.safe_load does."""
    try:
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader (C or Python)
    except yaml.YAMLError:
        return yaml.safe_load(text)  # its error, with the line shown; a document libyaml refused
