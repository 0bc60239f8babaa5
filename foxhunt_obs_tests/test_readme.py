from pathlib import Path

from foxhunt_obs.lib.settings import SETTINGS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_every_setting_is_in_the_readme_configuration_table():
    missing = [s.env for s in SETTINGS if f"| `{s.env}` |" not in README]
    assert not missing, f"document these in README.md's configuration table: {missing}"


def test_readme_shows_the_two_commands():
    assert "make demo" in README and "make test" in README
