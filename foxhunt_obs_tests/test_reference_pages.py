"""The docs site's generated reference pages (tools/reference_pages.py) match the code, and the README and
ARCHITECTURE.md say what they must. Nothing here starts a server: the generator loads registries and the
code location's definitions only."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

from foxhunt_obs.lib.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[1]
CONFIGURATION = ROOT / "docs" / "reference" / "configuration.md"


def _generator():
    spec = importlib.util.spec_from_file_location("reference_pages", ROOT / "tools" / "reference_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generator():
    return _generator()


def test_the_reference_pages_are_fresh(generator):
    pages = generator.render()
    assert sorted(p.name for p in pages) == sorted(generator.PAGES)
    stale = [str(p.relative_to(ROOT)) for p in generator.stale(pages)]
    assert not stale, f"stale reference pages {stale}: regenerate them with `{generator.COMMAND}`"


def test_stale_names_a_missing_or_changed_page(generator, tmp_path):
    same, changed, missing = tmp_path / "same.md", tmp_path / "changed.md", tmp_path / "missing.md"
    same.write_text("a\n")
    changed.write_text("old\n")
    pages = {same: "a\n", changed: "new\n", missing: "b\n"}
    assert generator.stale(pages) == [changed, missing]


def _configuration_rows() -> dict[str, list[str]]:
    """variable -> its row's cells, from the group tables (those with a Default column) of the page."""
    rows, in_group = {}, False
    for line in CONFIGURATION.read_text().splitlines():
        if line.startswith("| Variable |"):
            in_group = "| Default |" in line
        elif in_group and line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def test_every_setting_is_on_the_configuration_page():
    rows = _configuration_rows()
    missing = [s.env for s in SETTINGS if s.env not in rows]
    assert not missing, f"not on docs/reference/configuration.md: {missing}"
    for s in SETTINGS:
        default = f"`{s.default}`" if s.default else "(empty)"
        assert rows[s.env][1] == default, s.env
        assert ("**Secret**" in rows[s.env][-1]) == s.secret, s.env


def test_the_configuration_page_names_each_settings_resource_fields():
    from foxhunt_obs.defs.resources import RESOURCES, bound_settings

    fields: dict[str, set[str]] = {}
    for key, cls in RESOURCES.items():
        for field, name in bound_settings(cls).items():
            fields.setdefault(name, set()).add(f"`{key}.{field}`")
    rows = _configuration_rows()
    shown = {name: set(rows[name][2].split(", ")) for name in fields if name in rows}
    assert shown == fields
    unbound = [s.env for s in SETTINGS if s.env not in fields]
    assert all(rows[name][2] and not rows[name][2].startswith("`") for name in unbound), (
        "a setting no resource binds says where it is read instead"
    )


def test_a_setting_bound_nowhere_and_not_placed_stops_the_page(generator, monkeypatch):
    monkeypatch.delitem(generator.READ_OUTSIDE_RESOURCES, "FOXHUNT_PARTITIONS_START")
    with pytest.raises(SystemExit, match="FOXHUNT_PARTITIONS_START"):
        generator.configuration()


def test_a_table_no_asset_or_sensor_writes_stops_the_page(generator, monkeypatch):
    from foxhunt_obs.defs.alerts import sensors

    monkeypatch.delitem(sensors.WRITTEN_BY_SENSORS, "alerts")
    with pytest.raises(SystemExit, match="alerts"):
        generator.tables()


def test_the_tuning_paragraph_lists_every_overridable_field(generator, monkeypatch):
    from foxhunt_obs.lib.alerts.rules import OVERRIDABLE

    tuning = next(
        line
        for line in (ROOT / "docs" / "reference" / "alert-rules.md").read_text().splitlines()
        if line.startswith("**Tuning.**")
    )
    assert re.findall(r"`(\w+)`(?: \([^)]*\))?(?:,| and|;)", tuning) == list(OVERRIDABLE)
    monkeypatch.setitem(generator.OVERRIDE_NOTES, "labels", "not overridable")
    with pytest.raises(SystemExit, match="labels"):
        generator.alert_rules()


def test_a_bench_result_without_a_description_stops_the_page(generator, monkeypatch, tmp_path):
    (tmp_path / "new_bench.json").write_text(json.dumps({"benchmark": "new_bench", "ratios": {"x": 1.0}}))
    monkeypatch.setattr(generator, "BENCH_RESULTS", tmp_path)
    with pytest.raises(SystemExit, match="new_bench"):
        generator.speed()


def test_a_bench_without_a_docstring_stops_the_page(generator, monkeypatch, tmp_path):
    """What a benchmark measures is its module docstring's first paragraph: none, no page."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "report.json").write_text(
        (ROOT / "bench" / "results" / "report.json").read_text()
    )
    (tmp_path / "report.py").write_text("import sys\n")
    monkeypatch.setattr(generator, "BENCH", tmp_path)
    monkeypatch.setattr(generator, "BENCH_RESULTS", tmp_path / "results")
    with pytest.raises(SystemExit, match="bench/report.py: no module docstring"):
        generator.speed()
    (tmp_path / "report.py").write_text('"""Benchmark: the report, against pandas.\n\nMore."""\n')
    assert "## The weekly report\n\nThe report, against pandas.\n" in generator.speed()


def test_every_bench_result_is_on_the_speed_page():
    page = (ROOT / "docs" / "reference" / "speed.md").read_text()
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        result = json.loads(path.read_text())
        assert f"`bench/results/{path.name}`" in page
        assert result["when"] in page, path.name
        for name, value in (result.get("ratios") or {}).items():
            if isinstance(value, float):
                assert re.search(rf"\| {re.escape(name)} \| {re.escape(f'{value:.3g}')} \|", page), name


def test_readme_shows_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme


def test_architecture_names_every_package_folder():
    """ARCHITECTURE.md's tree has a line for every folder of the package (a new folder must say why)."""
    tree = (ROOT / "ARCHITECTURE.md").read_text()
    folders = sorted(
        p.parent.name
        for p in (ROOT / "foxhunt_obs").glob("*/*/__init__.py")
        if p.parent.parent.name != "defs"
    ) + sorted(p.parent.name for p in (ROOT / "foxhunt_obs").glob("*/__init__.py"))
    missing = [f for f in folders if f"{f}/" not in tree]
    assert not missing, f"add these folders to ARCHITECTURE.md: {missing}"
