"""load_yaml (lib/yaml_text.py): the same documents as yaml.safe_load, and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from foxhunt_obs.lib.yaml_text import load_yaml

DATA = Path(__file__).resolve().parents[2] / "foxhunt_obs" / "data"


@pytest.mark.parametrize("path", sorted(DATA.glob("*.yaml")), ids=lambda p: p.name)
def test_every_data_file_reads_as_safe_load_reads_it(path):
    text = path.read_text()
    assert load_yaml(text) == yaml.safe_load(text)


def test_a_broken_document_raises_safe_loads_error_with_the_line_shown():
    text = "rules:\n  gpu_idle: {for: 10m\n  nan_loss: {}\n"
    with pytest.raises(yaml.YAMLError) as got:
        load_yaml(text)
    with pytest.raises(yaml.YAMLError) as want:
        yaml.safe_load(text)
    assert str(got.value) == str(want.value) and "^" in str(got.value)
