"""Numeric settings are refused with the variable's name when they are not a positive number (issue 13 §6):
a step or timeout of 0, nan or -1 would loop, give up at once or write nonsense, silently."""

import pytest

from foxhunt_obs.lib.settings import Settings, positive_number


@pytest.mark.parametrize(
    "var", ["FOXHUNT_SCRAPE_STEP", "FOXHUNT_PROMETHEUS_TIMEOUT", "FOXHUNT_PROMETHEUS_MAX_POINTS"]
)
@pytest.mark.parametrize("bad", ["nan", "0", "-5", "inf", "fifteen"])
def test_bad_numbers_name_the_variable(monkeypatch, var, bad):
    monkeypatch.setenv(var, bad)
    with pytest.raises(ValueError, match=rf"{var} must be a positive (whole )?number, got '{bad}'"):
        Settings.from_env()


def test_whole_numbers_where_a_count_is_meant(monkeypatch):
    monkeypatch.setenv("FOXHUNT_PROMETHEUS_MAX_POINTS", "10.5")
    with pytest.raises(ValueError, match="FOXHUNT_PROMETHEUS_MAX_POINTS must be a positive whole number"):
        Settings.from_env()
    monkeypatch.setenv("FOXHUNT_CE_RESTATE_DAYS", "0")
    with pytest.raises(ValueError, match="FOXHUNT_CE_RESTATE_DAYS must be a positive whole number, got '0'"):
        positive_number("FOXHUNT_CE_RESTATE_DAYS", integer=True)


def test_good_numbers_and_defaults(monkeypatch):
    monkeypatch.setenv("FOXHUNT_SCRAPE_STEP", "30")
    monkeypatch.delenv("FOXHUNT_PROMETHEUS_TIMEOUT", raising=False)
    s = Settings.from_env()
    assert s.scrape_step_s == 30.0 and s.prometheus_timeout_s == 120.0 and s.prometheus_max_points == 11000
