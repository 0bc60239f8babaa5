from pathlib import Path

from foxhunt_obs.lib.settings import SETTINGS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_every_setting_is_in_the_readme_configuration_table():
    missing = [s.env for s in SETTINGS if f"| `{s.env}` |" not in README]
    assert not missing, f"document these in README.md's configuration table: {missing}"


def test_readme_shows_the_two_commands():
    assert "make demo" in README and "make test" in README


def test_the_configuration_table_names_each_settings_resource_field():
    from foxhunt_obs.defs.resources import RESOURCES, bound_settings

    fields: dict[str, set[str]] = {}
    for key, cls in RESOURCES.items():
        for field, name in bound_settings(cls).items():
            fields.setdefault(name, set()).add(f"`{key}.{field}`")
    rows = [ln.split(" | ") for ln in README.splitlines() if ln.startswith("| `")]
    shown = {row[0].strip("| `"): set(row[1].split(", ")) for row in rows if row[0].strip("| `") in fields}
    assert shown == fields


def test_architecture_names_every_package_folder():
    """ARCHITECTURE.md's tree has a line for every folder of the package (a new folder must say why)."""
    root = Path(__file__).resolve().parents[1]
    tree = (root / "ARCHITECTURE.md").read_text()
    folders = sorted(
        p.parent.name
        for p in (root / "foxhunt_obs").glob("*/*/__init__.py")
        if p.parent.parent.name != "defs"
    ) + sorted(p.parent.name for p in (root / "foxhunt_obs").glob("*/__init__.py"))
    missing = [f for f in folders if f"{f}/" not in tree]
    assert not missing, f"add these folders to ARCHITECTURE.md: {missing}"
