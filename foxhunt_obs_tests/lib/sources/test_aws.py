"""How AWS clients are built: the retry mode is explicit, the endpoint is boto3's unless configured."""

import pytest

from foxhunt_obs.defs.resources import AwsResource
from foxhunt_obs.lib.sources.aws import AwsConfig, aws_snake, cur_tag_key, product_code, tag_column
from foxhunt_obs_tests.paths import REAL

REAL_TAG_KEYS = REAL / "cur" / "tag_keys.tsv"


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for k in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_CE",
        "AWS_ENDPOINT_URL_S3",
        "AWS_RETRY_MODE",
        "AWS_PROFILE",
    ):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


def test_env_endpoints_are_honoured_not_overridden(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:4001")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:4002")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    resource = AwsResource.from_env(resolve=True)
    assert resource.client("ce").meta.endpoint_url == "http://127.0.0.1:4001"
    assert resource.client("s3").meta.endpoint_url == "http://127.0.0.1:4002"
    assert resource.client("fsx").meta.region_name == "eu-west-1"
    explicit = AwsResource(endpoint_url="http://127.0.0.1:4003")
    assert explicit.client("s3").meta.endpoint_url == "http://127.0.0.1:4003"


def test_real_endpoints_by_default(monkeypatch):
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    assert (
        AwsResource().client("cloudwatch").meta.endpoint_url == "https://monitoring.us-east-1.amazonaws.com"
    )


def test_retry_mode_is_explicit_even_when_the_environment_says_legacy(monkeypatch):
    monkeypatch.setenv("AWS_RETRY_MODE", "legacy")
    retries = AwsResource().client("ce").meta.config.retries
    assert retries["mode"] == "standard" and retries["total_max_attempts"] == 5
    assert AwsResource(retry_mode="adaptive").client("ce").meta.config.retries["mode"] == "adaptive"
    with pytest.raises(ValueError, match="legacy does not retry Cost Explorer's LimitExceededException"):
        AwsConfig(retry_mode="legacy")


def _real_tag_keys() -> list[tuple[str, str, str]]:
    rows = []
    for ln in REAL_TAG_KEYS.read_text().splitlines():
        if ln.strip() and not ln.startswith("#"):
            key, written, source = ln.split("\t")
            rows.append((key, written, source))
    return rows


@pytest.mark.parametrize(("key", "written", "source"), _real_tag_keys(), ids=lambda v: str(v)[:40])
def test_tag_keys_as_aws_writes_them_in_cur2(key, written, source):
    """Each pair as a public source shows it (fixtures/real/cur/tag_keys.tsv names the source of each)."""
    assert cur_tag_key(key) == written, source
    assert tag_column(key) == tag_column(written), source


@pytest.mark.parametrize(
    ("key", "written"),
    [
        # user_ + lower snake case; AWS-generated keys keep their aws_
        ("CostCenter", "user_cost_center"),
        ("team:owner", "user_team_owner"),
        ("aws:createdBy", "aws_created_by"),
        # consecutive capitals: one underscore before each, as AWS spells STAGE (user_s_t_a_g_e),
        # AWSApplicationMigrationServiceManaged (user_a_w_s_application_migration_service_managed) and its own
        # column reservation/ReservationARN (reservation_reservation_a_r_n); CID reads tag_a_c_r_o_n_y_m back
        # as "ACRONYM" (tag_keys.tsv: REAL-ACCOUNT, COLUMN-RULE, CID-ACRONYM)
        ("EKSCluster", "user_e_k_s_cluster"),
        ("myTAGKey", "user_my_t_a_g_key"),
        ("GPU", "user_g_p_u"),
        # digits stay attached: sparkoperator.k8s.io/... -> user_sparkoperator_k8s_io_...,
        # product/intelAvx2Available -> product_intel_avx2_available (CID-SCAD, COLUMN-RULE)
        ("k8s-app", "user_k8s_app"),
        ("Tier2Cost", "user_tier2_cost"),
        ("gpu2", "user_gpu2"),
        # '.', '/', '-', ':' -> '_' (app.kubernetes.io/part-of -> user_app_kubernetes_io_part_of,
        # elasticbeanstalk:environment-id -> user_elasticbeanstalk_environment_id: CID-SCAD, REAL-ACCOUNT)
        ("env/stage", "user_env_stage"),
        ("cost.center", "user_cost_center"),
        # a capital after a separator gives one underscore, not two (user:CostCenter -> user_cost_center,
        # lambda:createdBy -> user_lambda_created_by); no source shows a space: it is a separator like the rest
        ("Cost Center", "user_cost_center"),
        ("cost-Center", "user_cost_center"),
    ],
)
def test_the_conversion_rule(key, written):
    assert cur_tag_key(key) == written
    assert tag_column(key) == tag_column(written) == aws_snake(written).removeprefix("user_")


def test_names_normalised():
    assert product_code("Amazon Elastic Compute Cloud - Compute") == "AmazonEC2"
    assert product_code("EC2 - Other") == "AmazonEC2"
    assert product_code("Some New Service") == "Some New Service"
    assert {
        tag_column(k) for k in ("user:Project", "user_project", "Project", "resource_tags_user_project")
    } == {"project"}


def test_one_normal_form_for_every_spelling_of_a_key():
    """A configured key (FOXHUNT_COST_TAGS), Cost Explorer's and legacy CUR's user:Key, a CUR 2.0 resource_tags
    key and a legacy Athena column all meet on one string."""
    assert {
        tag_column(k)
        for k in (
            "CostCenter",  # as configured, and as CE's GROUP BY TAG key (CostCenter$value)
            "user:CostCenter",
            "resourceTags/user:CostCenter",  # legacy CUR CSV header
            "user_cost_center",  # CUR 2.0 resource_tags key
            "resource_tags_user_cost_center",  # legacy CUR Athena/Parquet column
        )
    } == {"cost_center"}
    assert {tag_column(k) for k in ("team:owner", "user_team_owner")} == {"team_owner"}
    assert {tag_column(k) for k in ("aws:createdBy", "aws_created_by", "resource_tags_aws_created_by")} == {
        "aws_created_by"
    }
    # AWS writes the prefixes in lower case: a key that merely starts with "User" is a key of its own
    assert tag_column("UserName") == tag_column("User_Name") == tag_column("user_user_name") == "user_name"
    assert tag_column("Name") == "name" != tag_column("NAME") == "n_a_m_e"  # user_name vs user_n_a_m_e
