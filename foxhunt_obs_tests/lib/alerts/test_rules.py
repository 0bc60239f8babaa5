"""The alert rule catalog: strict loading, overrides, rendering and fingerprints."""

from __future__ import annotations

import re
import string

import pytest
import yaml

from foxhunt_obs.lib.alerts import (
    SEVERITIES,
    SOURCES,
    Rule,
    RuleCatalogError,
    format_duration,
    load_rules,
    parse_duration,
)
from foxhunt_obs.lib.alerts.rules import DEFAULT_PATH, training_refresh_rules


@pytest.fixture(autouse=True)
def _no_env_overrides(monkeypatch):
    monkeypatch.delenv("FOXHUNT_ALERT_RULES", raising=False)


def by_id(rules: list[Rule]) -> dict[str, Rule]:
    return {r.id: r for r in rules}


# ---- the shipped catalog --------------------------------------------------------------------------


def test_the_shipped_catalog_loads_with_every_field():
    rules = load_rules()
    ids = [r.id for r in rules]
    assert len(ids) == len(set(ids)) >= 15
    for r in rules:
        assert r.severity in SEVERITIES and r.source in SOURCES, r.id
        assert r.summary.strip() and r.description.strip(), r.id
        assert isinstance(r.key, tuple) and all(isinstance(k, str) for k in r.key), r.id
        assert all(isinstance(v, float) for v in r.thresholds.values()), r.id
        assert r.for_seconds >= 0 and r.enabled, r.id
        assert (r.promql is not None) == (r.expr() is not None)
        if r.promql is not None:
            assert r.source == "prometheus", r.id
            assert not re.search(r"\$\{?[A-Za-z_]", r.expr()), f"{r.id}: unsubstituted placeholder"
    assert {"gpu_training_stall", "nan_loss", "fsx_low_space", "budget_burn", "idle_spend"} <= set(ids)
    assert by_id(rules)["gpu_training_stall"].for_seconds == 1800


def test_the_shipped_templates_name_only_known_values():
    """Every placeholder of a promql rule's texts is a key label, a threshold, `value` or a derived value
    the Prometheus export knows (a typo would render '?' in every notification)."""
    from foxhunt_obs.lib.alerts.prometheus_rules import DERIVED

    for r in load_rules():
        if r.promql is None:
            continue
        for text in (r.summary, r.description):
            names = {name for _, name, _, _ in string.Formatter().parse(text) if name}
            unknown = names - set(r.key) - set(r.thresholds) - set(DERIVED) - {"value", "container"}
            assert not unknown, f"{r.id}: {unknown}"


def test_thresholds_are_substituted_into_promql():
    rules = by_id(load_rules())
    assert rules["gpu_overheat"].expr() == "max by (node, gpu, uuid, model) (foxhunt:gpu_temp:celsius) > 85"
    oom = rules["gpu_oom_restarts"].expr()
    assert "[15m]" in oom and ">= 1\n" in oom  # integral thresholds without ".0"
    assert "< 0.7" in rules["gpu_underutilized"].expr()
    assert rules["nan_loss"].expr() is None


# ---- durations ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, seconds",
    [("30m", 1800), ("5m", 300), ("1h", 3600), ("0s", 0), ("90s", 90), ("1h30m", 5400), ("500ms", 0.5)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "m", "5 m", "1x", "-5m", "5m3", 300])
def test_parse_duration_refuses_garbage(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    "seconds, text", [(0, "0s"), (90, "1m30s"), (1800, "30m"), (5400, "1h30m"), (7200, "2h")]
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


# ---- overrides ------------------------------------------------------------------------------------


def write(tmp_path, name: str, doc) -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return str(path)


def test_overrides_change_thresholds_for_severity_and_enabled(tmp_path):
    path = write(
        tmp_path,
        "o.yaml",
        {
            "rules": {
                "gpu_underutilized": {"thresholds": {"util_min": 0.5}, "for": "2h", "severity": "info"},
                "idle_spend": {"enabled": False},
                "success_rate_drop": {"thresholds": {"drop": 0.3}},
            }
        },
    )
    shipped, changed = by_id(load_rules()), by_id(load_rules(overrides=path))
    under = changed["gpu_underutilized"]
    assert (under.thresholds["util_min"], under.for_seconds, under.severity) == (0.5, 7200, "info")
    assert "< 0.5" in under.expr()
    assert not changed["idle_spend"].enabled
    # untouched thresholds stay
    assert changed["success_rate_drop"].thresholds == {"window": 6.0, "drop": 0.3}
    assert changed["gpu_overheat"] == shipped["gpu_overheat"]
    assert [r.id for r in load_rules(overrides=path)] == [r.id for r in load_rules()]  # order kept


def test_overrides_come_from_the_alerting_resource_not_the_environment(tmp_path, monkeypatch):
    from foxhunt_obs.defs.resources import AlertingResource

    path = write(tmp_path, "o.yaml", "rules:\n  gpu_overheat: {thresholds: {temp_max_celsius: 80}}\n")
    monkeypatch.setenv("FOXHUNT_ALERT_RULES", path)
    chosen = AlertingResource.from_env(resolve=True).rules_file
    assert chosen == path
    assert by_id(load_rules(overrides=chosen))["gpu_overheat"].expr() == (
        "max by (node, gpu, uuid, model) (foxhunt:gpu_temp:celsius) > 80"
    )
    # lib/ never reads the variable itself: no argument, or an empty one, means no overrides
    assert by_id(load_rules())["gpu_overheat"].thresholds["temp_max_celsius"] == 85
    assert by_id(load_rules(overrides=""))["gpu_overheat"].thresholds["temp_max_celsius"] == 85


@pytest.mark.parametrize(
    "overrides, rule, message",
    [
        ({"rules": {"no_such_rule": {"enabled": False}}}, "no_such_rule", "no such rule"),
        ({"rules": {"gpu_overheat": {"promql": "up"}}}, "gpu_overheat", "unknown fields"),
        ({"rules": {"gpu_overheat": {"thresholds": {"temp_max": 1}}}}, "gpu_overheat", "unknown thresholds"),
        ({"rules": {"gpu_overheat": {"thresholds": {"temp_max_celsius": "hot"}}}}, "gpu_overheat", "number"),
        ({"rules": {"gpu_overheat": {"severity": "page"}}}, "gpu_overheat", "severity"),
        ({"rules": {"gpu_overheat": {"for": "five minutes"}}}, "gpu_overheat", "duration"),
        ({"rules": {"gpu_overheat": {"enabled": "no"}}}, "gpu_overheat", "enabled"),
    ],
)
def test_bad_overrides_name_the_file_and_the_rule(tmp_path, overrides, rule, message):
    path = write(tmp_path, "overrides.yaml", overrides)
    with pytest.raises(RuleCatalogError, match=message) as err:
        load_rules(overrides=path)
    assert path in str(err.value) and rule in str(err.value)


def test_an_edited_overrides_file_is_read_again(tmp_path):
    """load_rules parses once per version of the files (the sensor asks every tick), not once for all."""
    path = write(tmp_path, "o.yaml", "rules:\n  gpu_overheat: {thresholds: {temp_max_celsius: 80}}\n")
    assert by_id(load_rules(overrides=path))["gpu_overheat"].thresholds["temp_max_celsius"] == 80
    assert load_rules(overrides=path) == load_rules(overrides=path)
    write(tmp_path, "o.yaml", "rules:\n  gpu_overheat: {thresholds: {temp_max_celsius: 90}, for: 1m}\n")
    changed = by_id(load_rules(overrides=path))["gpu_overheat"]
    assert (changed.thresholds["temp_max_celsius"], changed.for_seconds) == (90, 60)
    (tmp_path / "o.yaml").unlink()
    with pytest.raises(RuleCatalogError, match="o.yaml"):  # a file gone is an error, not the old rules
        load_rules(overrides=path)


def test_unreadable_overrides(tmp_path):
    with pytest.raises(RuleCatalogError, match="missing.yaml"):
        load_rules(overrides=tmp_path / "missing.yaml")
    with pytest.raises(RuleCatalogError, match="not valid YAML"):
        load_rules(overrides=write(tmp_path, "bad.yaml", "rules: {a: [\n"))
    with pytest.raises(RuleCatalogError, match="rules"):
        load_rules(overrides=write(tmp_path, "list.yaml", "- a\n"))


# ---- strict validation of the catalog file --------------------------------------------------------

GOOD = {
    "id": "hot_gpu",
    "severity": "warning",
    "source": "prometheus",
    "for": "5m",
    "thresholds": {"t": 85},
    "key": ["node", "gpu"],
    "summary": "{node} GPU {gpu} at {value:.0f}",
    "description": "above {t}",
    "promql": "foxhunt:gpu_temp:celsius > $t",
}


def catalog(tmp_path, *rules) -> str:
    return write(tmp_path, "alert_rules.yaml", {"rules": list(rules)})


def test_a_minimal_rule_loads(tmp_path):
    (rule,) = load_rules(catalog(tmp_path, GOOD), overrides="")
    assert rule == Rule(
        id="hot_gpu",
        severity="warning",
        source="prometheus",
        for_seconds=300.0,
        thresholds={"t": 85.0},
        key=("node", "gpu"),
        summary=GOOD["summary"],
        description=GOOD["description"],
        labels={},
        promql="foxhunt:gpu_temp:celsius > $t",
    )
    assert rule.expr() == "foxhunt:gpu_temp:celsius > 85"
    assert rule.alertname == "hot_gpu"  # as the Alertmanager sink names it


def test_the_rules_that_refresh_training_are_data(tmp_path):
    """The alert sensor refreshes today's training_health on a notification of the rules flagged
    refreshes_training in the catalog: the MLflow training-health rules, and any rule a catalog flags."""
    assert training_refresh_rules(load_rules()) == {"nan_loss", "success_rate_drop", "entropy_collapse"}
    flagged = {**GOOD, "id": "hot_trainer", "refreshes_training": True}
    rules = load_rules(catalog(tmp_path, GOOD, flagged), overrides="")
    assert [r.refreshes_training for r in rules] == [False, True]
    assert training_refresh_rules(rules) == {"hot_trainer"}


def test_promql_keeps_non_placeholder_dollars(tmp_path):
    promql = 'label_replace(up, "node", "$1", "instance", "(.+)") > ${t} and up > $$5'
    (rule,) = load_rules(catalog(tmp_path, {**GOOD, "promql": promql}), overrides="")
    assert rule.expr() == 'label_replace(up, "node", "$1", "instance", "(.+)") > 85 and up > $5'


@pytest.mark.parametrize(
    "change, message",
    [
        ({"colour": "red"}, "unknown fields"),
        ({"severity": "page"}, "severity"),
        ({"source": "grafana"}, "source"),
        ({"source": "mlflow"}, "promql is only for source prometheus"),
        ({"promql": "foxhunt:gpu_temp:celsius > $t_max"}, r"\$t_max"),
        ({"promql": "foxhunt:gpu_temp:celsius > ${t_max}"}, r"\$t_max"),
        ({"for": "5 minutes"}, "duration"),
        ({"for": -1}, "for"),
        ({"thresholds": {"t": "85"}}, "number"),
        ({"thresholds": {"t": True}}, "number"),
        ({"thresholds": {"value": 1}}, "threshold name"),
        ({"key": "node"}, "key"),
        ({"key": ["node", "node"]}, "twice"),
        ({"labels": {"team": 1}}, "labels"),
        ({"labels": {"severity": "x"}}, "may not set"),
        ({"summary": ""}, "summary"),
        ({"summary": "{node"}, "str.format"),
        ({"enabled": "yes"}, "enabled"),
        ({"refreshes_training": "yes"}, "refreshes_training"),
        ({"promql": ""}, "promql"),
    ],
)
def test_bad_rules_name_the_file_and_the_rule(tmp_path, change, message):
    path = catalog(tmp_path, {**GOOD, **change})
    with pytest.raises(RuleCatalogError, match=message) as err:
        load_rules(path, overrides="")
    assert path in str(err.value) and "'hot_gpu'" in str(err.value)


def test_missing_fields_duplicates_and_shape(tmp_path):
    rule = {k: v for k, v in GOOD.items() if k != "summary"}
    with pytest.raises(RuleCatalogError, match=r"hot_gpu.*missing fields \['summary'\]"):
        load_rules(catalog(tmp_path, rule), overrides="")
    with pytest.raises(RuleCatalogError, match="'hot_gpu': duplicate id"):
        load_rules(catalog(tmp_path, GOOD, GOOD), overrides="")
    with pytest.raises(RuleCatalogError, match="rule #2"):
        load_rules(catalog(tmp_path, GOOD, {**GOOD, "id": None}), overrides="")
    with pytest.raises(RuleCatalogError, match="alert_rules.yaml.*one key `rules`"):
        load_rules(write(tmp_path, "alert_rules.yaml", {"rules": [GOOD], "extra": 1}), overrides="")
    with pytest.raises(RuleCatalogError, match="rule #1: expected a mapping"):
        load_rules(write(tmp_path, "alert_rules.yaml", {"rules": ["hot_gpu"]}), overrides="")


def test_catalog_optional_fields(tmp_path):
    (rule,) = load_rules(
        catalog(tmp_path, {**GOOD, "labels": {"team": "ml"}, "enabled": False}), overrides=""
    )
    assert rule.labels == {"team": "ml"} and not rule.enabled
    python_rule = {k: v for k, v in GOOD.items() if k != "promql"} | {"source": "lake"}
    (rule,) = load_rules(catalog(tmp_path, python_rule), overrides="")
    assert rule.promql is None and rule.expr() is None


def test_the_default_path_is_the_packaged_catalog():
    assert DEFAULT_PATH.name == "alert_rules.yaml" and DEFAULT_PATH.is_file()
    assert load_rules(DEFAULT_PATH) == load_rules()


# ---- render and fingerprint -----------------------------------------------------------------------


def stall() -> Rule:
    return by_id(load_rules())["gpu_training_stall"]


def test_render_formats_labels_thresholds_extra_and_value():
    r = stall()
    labels = {"namespace": "rl", "pod": "trainer-0"}
    assert (
        r.render(r.summary, labels, 0.0, gpus=8)
        == "Training stalled: trainer-0 holds 8 GPUs at 0% utilization"
    )
    assert "<= 0% for 30 minutes" in r.render(r.description, labels, 0.0)
    budget = by_id(load_rules())["budget_burn"]
    text = budget.render(budget.summary, {"budget_name": "gpu"}, 8500.0, pct=85, limit_usd=10000)
    assert text == "Budget gpu: $8,500 spent and forecast, 85 % of $10,000"
    # thresholds show as written: 6, not 6.0; thresholds win over labels, extra over both
    drop = by_id(load_rules())["success_rate_drop"]
    assert "last 6 success_rate points fell more than 0.2 below" in drop.render(drop.description, {}, 0.1)
    assert r.render("{pod} {util_max} {value}", {"pod": "a", "util_max": "label"}, 1, pod="b") == "b 0 1"


@pytest.mark.parametrize(
    "template, labels, value, expected",
    [
        ("{missing} {pod}", {"pod": "p"}, 1.0, "? p"),
        ("{value:.0%}", {}, None, "?"),
        ("{value:.0%}", {}, float("nan"), "nan%"),
        ("{pod:.0f}", {"pod": "trainer"}, 1.0, "?"),
        ("{gpu:.0f}", {"gpu": "3"}, 1.0, "3"),  # Prometheus labels are strings
        ("{pod}", {"pod": "x"}, "not a number", "x"),
        ("{value:.2f}", {}, "0.5", "0.50"),
        ("{0} {1}", {}, 1.0, "? ?"),
        ("{0} {}", {}, 1.0, "{0} {}"),  # mixed numbering: str.format refuses, shown as written
        ("{pod.attr} {pod[0]}", {"pod": "x"}, 1.0, "? x"),
        ("{pod!r}", {"pod": "x"}, 1.0, "'x'"),
        ("{pod!z}", {"pod": "x"}, 1.0, "?"),
        ("{unclosed", {}, 1.0, "{unclosed"),
        ("}{", {}, 1.0, "}{"),
        ("{value:{nested}}", {}, 1.0, "?"),
        ("{value:%Y}", {}, 1.0, "?"),
    ],
)
def test_render_never_raises(template, labels, value, expected):
    assert stall().render(template, labels, value) == expected


def test_render_tolerates_every_shipped_template_without_data():
    for r in load_rules():
        for text in (r.summary, r.description):
            out = r.render(text, {}, None)
            assert isinstance(out, str) and out


def test_fingerprint_is_stable_and_depends_on_the_key_only():
    r = stall()  # key: namespace, pod
    a = r.fingerprint({"namespace": "rl", "pod": "trainer-0", "node": "ip-1"})
    assert re.fullmatch(r"[0-9a-f]{64}", a)
    assert a == r.fingerprint({"pod": "trainer-0", "namespace": "rl"})  # other labels, order: no matter
    assert a == stall().fingerprint({"namespace": "rl", "pod": "trainer-0"})  # stable across loads
    assert a != r.fingerprint({"namespace": "rl", "pod": "trainer-1"})
    assert a != r.fingerprint({"namespace": "rl"})
    assert r.fingerprint({"namespace": "a", "pod": "bc"}) != r.fingerprint({"namespace": "ab", "pod": "c"})
    other = by_id(load_rules())["gpu_underutilized"]  # the same key, another rule
    assert a != other.fingerprint({"namespace": "rl", "pod": "trainer-0"})
    # a keyless rule has one instance
    missing = by_id(load_rules())["gpu_node_missing"]
    assert missing.fingerprint({}) == missing.fingerprint({"node": "x"})
    # pinned: a change would re-notify every open alert after an upgrade
    assert a == "9314e9a62b7b194430b2471feaa6c7744363e89ff6288d20f747e692cb716d2c"


# ---- a hostile or oversized overrides file -----------------------------------------------------------


def alias_bomb() -> str:
    """~0.5 KB of YAML whose aliases, nested 9 deep, stand for 9**9 (~387 million) strings once walked."""
    levels = ['&a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return f"rules:\n  gpu_overheat:\n    thresholds: {{temp_max_celsius: [{', '.join(levels)}]}}\n"


BOMB_CHILD = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (600 * 2**20, 600 * 2**20))
from foxhunt_obs.lib.alerts.rules import RuleCatalogError, load_rules, load_rules_or_last_good
start = time.monotonic()
try:
    load_rules(overrides=sys.argv[1])
except RuleCatalogError as e:
    print("refused", round(time.monotonic() - start, 3), e)
rules, error = load_rules_or_last_good(overrides=sys.argv[1])
print("fallback", len(rules), len(error), error)
"""


@pytest.mark.servers  # a child process: the bomb, should it go off, goes off under a 600 MB limit
def test_an_alias_bomb_is_refused_fast_in_bounded_memory(tmp_path):
    import subprocess
    import sys

    path = write(tmp_path, "bomb.yaml", alias_bomb())
    done = subprocess.run(
        [sys.executable, "-c", BOMB_CHILD, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    refused, fallback = done.stdout.splitlines()
    _, seconds, message = refused.split(" ", 2)
    assert float(seconds) < 1.0
    assert message.startswith(f"{path}, line 3: alias *a0 refused")
    _, count, length, error = fallback.split(" ", 3)
    assert int(count) == len(load_rules(overrides="")) and int(length) < 500
    assert error.startswith("FOXHUNT_ALERT_RULES is broken, alerting goes on with the catalog's own rules")


def test_any_failure_to_load_the_overrides_falls_back_to_the_last_good_rules(tmp_path, monkeypatch):
    """Not only a RuleCatalogError: whatever loading a bad file raises (here a MemoryError) keeps alerting
    on the rules the file gave last, and says so."""
    from foxhunt_obs.lib.alerts import rules as rules_module

    path = write(tmp_path, "o.yaml", "rules:\n  gpu_overheat: {thresholds: {temp_max_celsius: 70}}\n")
    good, error = rules_module.load_rules_or_last_good(overrides=path)
    assert error == "" and by_id(good)["gpu_overheat"].thresholds["temp_max_celsius"] == 70

    def out_of_memory(*args):
        raise MemoryError("x" * 5_000_000)

    write(tmp_path, "o.yaml", "rules:\n  gpu_overheat: {thresholds: {temp_max_celsius: 600}}\n")
    monkeypatch.setattr(rules_module, "_apply_overrides", out_of_memory)
    rules, error = rules_module.load_rules_or_last_good(overrides=path)
    assert rules == good
    assert error.startswith("FOXHUNT_ALERT_RULES is broken, alerting goes on with the rules it gave last: ")
    assert f"{path}: MemoryError: " in error and "(5000000 bytes)" in error and len(error) < 500


def test_an_oversized_overrides_file_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("rules:\n  gpu_overheat: {for: '" + "9" * 20_000_000 + "'}\n")
    with pytest.raises(RuleCatalogError) as err:
        load_rules(overrides=path)
    message = str(err.value)
    assert message.startswith(f"{path}: {path.stat().st_size} bytes, over the 1048576 bytes")
    assert "FOXHUNT_ALERT_RULES" in message and len(message) < 300


def test_an_error_about_a_long_value_shows_an_excerpt(tmp_path):
    with pytest.raises(ValueError) as err:
        parse_duration("9" * 20_000_000)
    assert "… (20000000 bytes)" in str(err.value) and len(str(err.value)) < 300
    # under the size cap, in a file: the error names the file and the rule, shows 200 characters
    path = write(tmp_path, "o.yaml", {"rules": {"gpu_overheat": {"severity": "p" * 900_000}}})
    with pytest.raises(RuleCatalogError) as err:
        load_rules(overrides=path)
    message = str(err.value)
    assert message.startswith(f"{path}: rule 'gpu_overheat': severity 'ppp")
    assert "… (900000 bytes) is not one of" in message and len(message) < 400
    path = write(tmp_path, "k.yaml", {"rules": {"gpu_overheat": {"thresholds": {"x" * 900_000: 1}}}})
    with pytest.raises(RuleCatalogError, match="unknown thresholds") as err:
        load_rules(overrides=path)
    assert len(str(err.value)) < 600
