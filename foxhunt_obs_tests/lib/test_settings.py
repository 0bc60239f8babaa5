"""One configuration system: every setting in the registry is a field of a Dagster resource,
which takes it from its variable as a `dg.EnvVar` (the UI shows the name, never a secret's value) or has
the registry's default; tests pass values explicitly. Numeric settings are refused with the variable's
name when they are not a positive number: a step or timeout of 0, nan or -1 would loop, give
up at once or write nonsense, silently."""

import ast

import dagster as dg
import pytest

from foxhunt_obs.defs.resources import (
    RESOURCES,
    ClusterResource,
    CostsResource,
    LakeResource,
    PrometheusResource,
    bound_settings,
    resources,
)
from foxhunt_obs.lib.settings import SETTING, SETTINGS
from foxhunt_obs_tests.paths import REPO

PACKAGE = REPO / "foxhunt_obs"
READ_AT_LOAD = {"FOXHUNT_PARTITIONS_START"}  # partitions are built before any resource exists
READ_BY_OTEL = {"OTEL_EXPORTER_OTLP_ENDPOINT"}  # the OTel SDK's own variable, read in every step process


def test_every_setting_is_a_resource_field_with_the_registry_default():
    bound: dict[str, list[str]] = {}
    for key, cls in RESOURCES.items():
        for field, name in bound_settings(cls).items():
            bound.setdefault(name, []).append(f"{key}.{field}")
            assert cls.model_fields[field].default == SETTING[name].default, (key, field)
            assert name in cls.model_fields[field].description
    assert set(bound) == {s.env for s in SETTINGS} - READ_AT_LOAD - READ_BY_OTEL
    # AWS's own region serves the lake's S3 and the AWS sources alike; the rest has one home (boto3
    # resolves AWS_ENDPOINT_URL[_<SERVICE>] for the sources itself: the aws resource leaves it unset)
    assert {n: f for n, f in bound.items() if len(f) > 1} == {
        "AWS_REGION": ["lake.region", "aws.region_name"]
    }


def test_the_code_location_takes_set_variables_as_env_vars_and_secrets_never_as_values(monkeypatch):
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    monkeypatch.setenv("FOXHUNT_LAKE", "/data/lake")
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-do-not-show-1234")
    monkeypatch.setenv("FOXHUNT_PROMETHEUS_BEARER_TOKEN", "bearer-do-not-show-5678")
    built = resources().resources
    assert built["lake"].root == "FOXHUNT_LAKE" and isinstance(built["lake"].root, dg.EnvVar)
    assert isinstance(built["slack"].token, dg.EnvVar) and built["slack"].token == "SLACK_BOT_TOKEN"
    assert built["prometheus"].bearer_token == "FOXHUNT_PROMETHEUS_BEARER_TOKEN"
    assert built["prometheus"].url == SETTING["FOXHUNT_PROMETHEUS_URL"].default  # unset: the default
    shown = repr(built) + str({k: r.model_dump() for k, r in built.items()})
    assert "xoxb-do-not-show" not in shown and "bearer-do-not-show" not in shown


def test_a_run_resolves_the_variables_when_it_starts(monkeypatch, tmp_path):
    """The lake root is read when the run starts, from the variable the code location named."""
    monkeypatch.setenv("FOXHUNT_LAKE", str(tmp_path / "a"))
    lake = LakeResource.from_env()

    @dg.asset
    def where(lake: LakeResource) -> str:
        return lake.lake().root

    monkeypatch.setenv("FOXHUNT_LAKE", str(tmp_path / "b"))
    assert dg.materialize([where], resources={"lake": lake}).output_for_node("where") == str(tmp_path / "b")


def test_values_given_explicitly_need_no_environment(monkeypatch):
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    client = PrometheusResource(url="http://prom.example:9090/", timeout_s="7").client()
    assert client.url == "http://prom.example:9090" and client.timeout_s == 7.0
    cluster = ClusterResource(node_labels="kubernetes_node, instance", scrape_step="30").settings()
    assert cluster.node_labels == ("kubernetes_node", "instance") and cluster.scrape_step_s == 30.0
    assert CostsResource(cost_tags="team,env,exp").tags() == ("team", "env", "exp")
    # an empty value means the default, as an empty variable does
    assert PrometheusResource(timeout_s="").client().timeout_s == 120.0


def test_lib_never_reads_the_environment():
    """Only defs/resources.py, defs/partitions.py (at load), the CLI and the sandbox read variables; lib/
    is handed values. (Redaction reads the secret variables' values to mask them: that is not config.)"""
    # mlflow: its retry bounds; tracing: whether OTEL_EXPORTER_OTLP_ENDPOINT is set (the SDK reads the rest)
    allowed = {"lib/settings.py", "lib/redact.py", "lib/sources/mlflow/client.py", "lib/tracing.py"}
    readers = []
    for path in sorted((PACKAGE / "lib").rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and rel not in allowed:
                readers.append(f"{rel}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "env":
                readers.append(f"{rel}:{node.lineno}")
    assert readers == []


@pytest.mark.parametrize(
    "field, var",
    [
        ("timeout_s", "FOXHUNT_PROMETHEUS_TIMEOUT"),
        ("max_points", "FOXHUNT_PROMETHEUS_MAX_POINTS"),
    ],
)
@pytest.mark.parametrize("bad", ["nan", "0", "-5", "inf", "fifteen"])
def test_bad_numbers_name_the_variable(field, var, bad):
    with pytest.raises(ValueError, match=rf"{var} must be a positive (whole )?number, got '{bad}'"):
        PrometheusResource(**{field: bad}).client()


@pytest.mark.parametrize("bad", ["nan", "0", "-5", "inf", "fifteen"])
def test_a_bad_step_names_its_variable(bad):
    with pytest.raises(ValueError, match=rf"FOXHUNT_SCRAPE_STEP must be a positive number, got '{bad}'"):
        ClusterResource(scrape_step=bad).settings()


def test_whole_numbers_where_a_count_is_meant():
    with pytest.raises(ValueError, match="FOXHUNT_PROMETHEUS_MAX_POINTS must be a positive whole number"):
        PrometheusResource(max_points="10.5").client()
    with pytest.raises(ValueError, match="FOXHUNT_CE_RESTATE_DAYS must be a positive whole number, got '0'"):
        CostsResource(ce_restate_days="0").restate_days()
    with pytest.raises(ValueError, match="FOXHUNT_PROMETHEUS_GZIP must be 1 or 0 .*, got 'maybe'"):
        PrometheusResource(gzip="maybe").client()


def test_good_numbers_and_defaults(monkeypatch):
    monkeypatch.setenv("FOXHUNT_SCRAPE_STEP", "30")
    monkeypatch.delenv("FOXHUNT_PROMETHEUS_TIMEOUT", raising=False)
    monkeypatch.delenv("FOXHUNT_PROMETHEUS_MAX_POINTS", raising=False)
    assert ClusterResource.from_env(resolve=True).settings().scrape_step_s == 30.0
    client = PrometheusResource.from_env(resolve=True).client()
    assert client.timeout_s == 120.0 and client.max_points == 11000


def test_the_region_falls_back_to_boto3s_older_variable(monkeypatch):
    from foxhunt_obs.defs.resources import AwsResource

    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert LakeResource.from_env(resolve=True).lake().region == "eu-west-1"
    assert AwsResource.from_env(resolve=True).config().region_name == "eu-west-1"
    assert LakeResource.from_env().region == "AWS_DEFAULT_REGION"  # the variable's name in the UI
    monkeypatch.setenv("AWS_REGION", "ap-south-1")  # the newer variable wins, as in boto3
    assert LakeResource.from_env(resolve=True).lake().region == "ap-south-1"
