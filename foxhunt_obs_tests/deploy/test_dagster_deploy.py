"""deploy/dagster: the code location's image, the dagster/dagster Helm chart's values, the Secret, the IRSA
policy and the Postgres instance file, checked against the project itself (the settings registry, the
definitions module, workspace.yaml, pyproject), and the image's command run for real: it starts a code server
that serves the definitions over gRPC (health check, then the repository's asset keys).

Facts about the chart these checks rely on (dagster-io/dagster, cited in values.yaml's header):
* the user deployment's container gets only `args`, never a `command`:
  ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "<port>", *codeServerArgs]
  (charts/dagster-user-deployments/templates/deployment-user.yaml), so the image's command is a CMD with no
  ENTRYPOINT, and it must equal that list;
* the Postgres password is the `postgresql-password` key of global.postgresqlSecretName (secret-postgres.yaml,
  deployment-user.yaml);
* the workspace names a location after `dagsterWebserver.workspace.servers[].name`
  (templates/configmap-workspace.yaml).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from fnmatch import fnmatch
from pathlib import Path

import pytest
import tomllib
import yaml

from foxhunt_obs.lib.settings import SETTING, SETTINGS
from foxhunt_obs.sandbox.servers.local_server import free_port

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "dagster"
SECRET_NAME = "foxhunt-obs-secrets"
PG_PASSWORD_KEY = "postgresql-password"  # the chart's key in global.postgresqlSecretName
MODULE = "foxhunt_obs.definitions"
PLACEHOLDER = "CHANGE-ME"
SECRETS = {s.env for s in SETTINGS if s.secret}
CHART_ARGS_PREFIX = ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p"]  # deployment-user.yaml
ASSETS_SERVED = {"gpu_samples", "cost_allocation", "spend_now"}
START_DEADLINE_S = 180.0  # the code server loads every module under foxhunt_obs/defs (2 shared cores)

# Every key path of values.yaml, as found in the chart's own values.yaml and schema (values.yaml's header
# cites path and commit). `*` is a free-form map the chart passes through (Kubernetes objects, annotations).
CHART_KEYS = {
    "global.serviceAccountName",
    "global.postgresqlSecretName",
    "serviceAccount.create",
    "serviceAccount.annotations.*",
    "dagsterWebserver.workspace.enabled",
    "dagsterWebserver.workspace.servers[].host",
    "dagsterWebserver.workspace.servers[].port",
    "dagsterWebserver.workspace.servers[].name",
    "dagster-user-deployments.enabled",
    "dagster-user-deployments.enableSubchart",
    "dagster-user-deployments.deployments[].name",
    "dagster-user-deployments.deployments[].image.repository",
    "dagster-user-deployments.deployments[].image.tag",
    "dagster-user-deployments.deployments[].image.pullPolicy",
    "dagster-user-deployments.deployments[].codeServerArgs",
    "dagster-user-deployments.deployments[].port",
    "dagster-user-deployments.deployments[].includeConfigInLaunchedRuns.enabled",
    "dagster-user-deployments.deployments[].env",  # a list of Kubernetes EnvVar (name, value / valueFrom)
    "dagster-user-deployments.deployments[].podSecurityContext.*",
    "dagster-user-deployments.deployments[].securityContext.*",
    "postgresql.enabled",
    "postgresql.postgresqlHost",
    "postgresql.postgresqlUsername",
    "postgresql.postgresqlDatabase",
    "postgresql.postgresqlScheme",  # helm/dagster/schema/schema/charts/dagster/subschema/postgresql.py
    "postgresql.service.port",
    "generatePostgresqlPasswordSecret",
    "scheduler.type",
    "runLauncher.type",
    "runLauncher.config.k8sRunLauncher.runK8sConfig.containerConfig.*",
    "dagsterDaemon.enabled",
    "dagsterDaemon.sensors.useThreads",
    "dagsterDaemon.sensors.numWorkers",
    "dagsterDaemon.schedules.useThreads",
    "dagsterDaemon.schedules.numWorkers",
}


# ------------------------------------------------------------------------------------------ reading the files


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


@pytest.fixture(scope="module")
def values() -> dict:
    return load("values.yaml")


@pytest.fixture(scope="module")
def deployment(values) -> dict:
    (d,) = values["dagster-user-deployments"]["deployments"]
    return d


def env_entries(deployment: dict) -> list[dict]:
    return deployment["env"]


def dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped, per build stage."""
    lines, buf = [], ""
    for raw in (DEPLOY / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        buf += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            lines.append(buf)
            buf = ""
    stages: list[list[tuple[str, str]]] = []
    for line in lines:
        instr, _, rest = line.partition(" ")
        if instr.upper() == "FROM":
            stages.append([])
        stages[-1].append((instr.upper(), rest.strip()))
    return stages


def final_stage() -> list[tuple[str, str]]:
    return dockerfile_stages()[-1]


def image_cmd() -> list[str]:
    (cmd,) = [rest for instr, rest in final_stage() if instr == "CMD"]
    return json.loads(cmd)  # exec form: no shell between Kubernetes' args and the command


def key_paths(node, prefix: str = ""):
    """Every key path of a values tree: lists of mappings as `key[]`, other lists as leaves."""
    if isinstance(node, dict):
        for k, v in node.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                yield from key_paths(v, path)
            elif (
                isinstance(v, list)
                and v
                and all(isinstance(i, dict) for i in v)
                and not path.endswith(".env")
            ):
                for item in v:
                    yield from key_paths(item, path + "[]")
            else:
                yield path


def walk(node):
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


# ----------------------------------------------------------------------------------------------- the values


def test_every_values_key_is_one_the_chart_has(values):
    unknown = [
        p for p in key_paths(values) if p not in CHART_KEYS and not any(fnmatch(p, k) for k in CHART_KEYS)
    ]
    assert not unknown, f"keys not verified against the dagster/dagster chart: {unknown}"


def test_every_env_name_is_a_setting(deployment):
    names = [e["name"] for e in env_entries(deployment)]
    assert len(names) == len(set(names)), "an env name set twice"
    assert not [n for n in names if n not in SETTING], "env names not in lib/settings.SETTINGS"
    for e in env_entries(deployment):
        assert set(e) in ({"name", "value"}, {"name", "valueFrom"}), e


def test_every_secret_setting_comes_from_the_secret(deployment):
    by_name = {e["name"]: e for e in env_entries(deployment)}
    assert SECRETS <= set(by_name), f"secret settings missing from the deployment: {SECRETS - set(by_name)}"
    for name in SECRETS:
        entry = by_name[name]
        assert "value" not in entry, f"{name} has a literal value"
        ref = entry["valueFrom"]["secretKeyRef"]
        assert (ref["name"], ref["key"]) == (SECRET_NAME, name), ref
    # and only secrets come from a Secret: a plain setting is visible configuration
    assert {n for n, e in by_name.items() if "valueFrom" in e} == SECRETS


def test_no_secret_appears_with_a_literal_value_anywhere(values):
    for node in walk(values):
        if isinstance(node, dict):
            assert not (node.get("name") in SECRETS and "value" in node), node
            assert not (SECRETS & set(node)), f"a secret as a literal map entry: {SECRETS & set(node)}"
        if isinstance(node, str):
            assert not any(node.startswith(f"{s}=") for s in SECRETS), node  # envVars' NAME=value form


def test_plain_values_are_the_registry_defaults_or_marked_to_change(deployment):
    for e in env_entries(deployment):
        if "value" in e:
            value = e["value"]
            assert isinstance(value, str), f"{e['name']}: Kubernetes env values are strings"
            assert value == SETTING[e["name"]].default or PLACEHOLDER in value, e
    # the ones with no usable default in a cluster (the sandbox's 127.0.0.1 addresses, a local lake) are set
    by_name = {e["name"]: e.get("value", "") for e in env_entries(deployment)}
    for name in ("FOXHUNT_LAKE", "FOXHUNT_PROMETHEUS_URL", "MLFLOW_TRACKING_URI", "FOXHUNT_DAGSTER_URL"):
        assert PLACEHOLDER in by_name[name], name
    assert by_name["FOXHUNT_LAKE"].startswith("s3://")


def test_the_secret_example_holds_every_secret_and_only_placeholders(values):
    secret = load("secret.example.yaml")
    assert (secret["apiVersion"], secret["kind"], secret["metadata"]["name"]) == ("v1", "Secret", SECRET_NAME)
    assert "data" not in secret, "stringData only: no base64 that could hide a real value"
    assert set(secret["stringData"]) == SECRETS | {PG_PASSWORD_KEY}
    assert set(secret["stringData"].values()) == {PLACEHOLDER}
    # the chart reads Dagster's Postgres password from the same Secret and generates none
    assert values["global"]["postgresqlSecretName"] == SECRET_NAME
    assert values["generatePostgresqlPasswordSecret"] is False


def test_the_user_deployment_serves_the_definitions_module_on_its_port(values, deployment):
    assert "dagsterApiGrpcArgs" not in deployment, "one command: codeServerArgs (dagster code-server start)"
    assert deployment["codeServerArgs"] == ["-m", MODULE]
    assert importlib.util.find_spec(MODULE) is not None, MODULE
    port = deployment["port"]
    assert port == 3030
    # the chart's args are exactly the image's command: the image and the chart agree
    assert [*CHART_ARGS_PREFIX, str(port), *deployment["codeServerArgs"]] == image_cmd()
    exposed = [rest for instr, rest in final_stage() if instr == "EXPOSE"]
    assert exposed == [str(port)]
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True, "runs need the same env"


def test_the_code_location_keeps_its_name(values, deployment):
    """workspace.yaml, [tool.dg.project] and the alerts' links name the location foxhunt_obs; the chart's
    workspace names it so and points at the Service the subchart creates for the deployment."""
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    (entry,) = workspace["load_from"]
    location = entry["python_module"]["location_name"]
    assert entry["python_module"]["module_name"] == MODULE
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["tool"]["dg"]["project"]["code_location_name"] == location
    ws = values["dagsterWebserver"]["workspace"]
    assert ws["enabled"] is True
    (server,) = ws["servers"]
    assert server == {"host": deployment["name"], "port": deployment["port"], "name": location}
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", deployment["name"]), "a Service name (DNS-1035 label)"


def test_runs_launch_as_kubernetes_jobs_with_resource_requests(values):
    launcher = values["runLauncher"]
    assert launcher["type"] == "K8sRunLauncher"
    resources = launcher["config"]["k8sRunLauncher"]["runK8sConfig"]["containerConfig"]["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]
    # a user deployment's resources reach its runs' container context and would replace these
    # (dagster_k8s.container_context: the code location's context is merged over the run launcher's)
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert "resources" not in deployment


def test_postgres_storage_daemon_schedules_and_sensors(values):
    pg = values["postgresql"]
    assert pg["enabled"] is False and pg["postgresqlHost"], "an external Postgres"
    assert "postgresqlPassword" not in pg, "the password comes from the Secret"
    assert values["scheduler"]["type"] == "DagsterDaemonScheduler"
    daemon = values["dagsterDaemon"]
    assert daemon["enabled"] is True
    assert daemon["sensors"]["useThreads"] and daemon["schedules"]["useThreads"]


def test_one_irsa_service_account_for_every_pod(values, deployment):
    assert values["serviceAccount"]["create"] is True
    assert values["global"]["serviceAccountName"] == "foxhunt-obs"
    role = values["serviceAccount"]["annotations"]["eks.amazonaws.com/role-arn"]
    assert re.fullmatch(r"arn:aws:iam::[^:]+:role/[\w+=,.@/-]+", role), role
    # the pod runs as the image's user
    uid = final_stage_user()[0]
    assert deployment["podSecurityContext"]["runAsUser"] == uid
    assert deployment["podSecurityContext"]["runAsNonRoot"] is True


def test_what_the_chart_passes_to_kubernetes_verbatim_is_valid_kubernetes(values, deployment):
    """The chart copies the deployment's env, podSecurityContext and securityContext into the code server's
    pod (deployment-user.yaml) and runK8sConfig.containerConfig into each run's container: put together as
    one Pod, they validate against Kubernetes' own strict schema (kubernetes-validate, as the manifests do)."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    run_container = values["runLauncher"]["config"]["k8sRunLauncher"]["runK8sConfig"]["containerConfig"]
    image = deployment["image"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": deployment["name"]},
        "spec": {
            "serviceAccountName": values["global"]["serviceAccountName"],
            "securityContext": deployment["podSecurityContext"],
            "containers": [
                {
                    "name": "dagster-user-deployments",
                    "image": f"{image['repository']}:{image['tag']}",
                    "imagePullPolicy": image["pullPolicy"],
                    "args": [*CHART_ARGS_PREFIX, str(deployment["port"]), *deployment["codeServerArgs"]],
                    "env": deployment["env"],
                    "securityContext": deployment["securityContext"],
                    **run_container,
                }
            ],
        },
    }
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)  # raises if invalid


# boto3 operation (as the code calls it) -> the IAM action it needs
IAM_ACTIONS = {
    "get_cost_and_usage": "ce:GetCostAndUsage",
    "get_cost_forecast": "ce:GetCostForecast",
    "describe_budgets": "budgets:ViewBudget",
    "get_metric_data": "cloudwatch:GetMetricData",
    "describe_file_systems": "fsx:DescribeFileSystems",
    "describe_instances": "ec2:DescribeInstances",
    "get_caller_identity": "sts:GetCallerIdentity",
    "list_objects_v2": "s3:ListBucket",
    "get_object": "s3:GetObject",
    "put_object": "s3:PutObject",
    "delete_dir": "s3:DeleteObject",  # pyarrow's S3FileSystem: the lake replaces a partition
}


def test_the_iam_policy_allows_every_aws_call_the_code_makes():
    policy = json.loads((DEPLOY / "iam-policy.json").read_text())
    allowed = {a for st in policy["Statement"] if st["Effect"] == "Allow" for a in st["Action"]}
    source = "\n".join(p.read_text() for p in (REPO / "foxhunt_obs" / "lib").rglob("*.py"))
    for op, action in IAM_ACTIONS.items():
        assert re.search(rf"\b{op}\b", source), f"{op} is no longer called: update IAM_ACTIONS"
        assert action in allowed, f"{action} (for {op}) missing from iam-policy.json"
    assert not any(a.endswith("*") for a in allowed), "no wildcard actions"


# ----------------------------------------------------------------------------------------------- the image


def final_stage_user() -> tuple[int, int]:
    users = [rest for instr, rest in final_stage() if instr == "USER"]
    assert users, "the final stage sets a USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and gid.isdigit(), "numeric uid:gid, so Kubernetes can verify runAsNonRoot"
    return int(uid), int(gid)


def test_the_image_runs_as_a_non_root_user():
    uid, gid = final_stage_user()
    assert uid != 0 and gid != 0


def test_the_image_installs_the_package_with_the_deploy_extra():
    stages = dockerfile_stages()
    froms = [rest.split()[0] for stage in stages for instr, rest in stage if instr == "FROM"]
    assert froms and all(re.fullmatch(r"python:3\.\d+-slim", f) for f in froms), froms
    runs = " ".join(rest for stage in stages for instr, rest in stage if instr == "RUN")
    assert re.search(r"pip install .*'\.\[deploy\]'", runs), "pip install '.[deploy]'"
    # the extra pins dagster-k8s and dagster-postgres to the family's one integration version
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    pins = dict(
        re.match(r"([\w-]+)==(.+)", d).groups() for d in pyproject["project"]["dependencies"] if "==" in d
    )
    deploy = dict(
        re.match(r"([\w-]+)==(.+)", d).groups()
        for d in pyproject["project"]["optional-dependencies"]["deploy"]
    )
    assert deploy == {"dagster-k8s": pins["dagster-aws"], "dagster-postgres": pins["dagster-aws"]}


def test_the_image_command_is_a_cmd_the_chart_can_replace():
    """The chart and the K8sRunLauncher set the container's `args` only: an ENTRYPOINT would prefix them."""
    assert not [1 for stage in dockerfile_stages() for instr, _ in stage if instr == "ENTRYPOINT"]
    cmd = image_cmd()
    assert cmd[:3] == ["dagster", "code-server", "start"]
    assert cmd[cmd.index("-m") + 1] == MODULE


def test_the_build_context_keeps_what_pip_install_needs():
    ignore = [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    # the tested versions for the base image's Python (python:3.11-slim -> constraints/py3.11.txt)
    (base,) = {rest for instr, rest in dockerfile_stages()[0] if instr == "FROM"}
    python = re.match(r"python:(\d+\.\d+)", base).group(1)
    constraints = f"constraints/py{python}.txt"
    assert (REPO / constraints).is_file(), constraints
    (pip,) = [rest for instr, rest in dockerfile_stages()[0] if instr == "RUN" and "pip install" in rest]
    assert f"-c {constraints}" in pip, pip
    for kept in ("pyproject.toml", pyproject["project"]["readme"], constraints, "foxhunt_obs/"):
        assert f"!{kept}" in ignore, kept
    # a non-editable install carries only the package data pyproject names: every non-Python file the
    # package holds must match one of its globs, or the image lacks it
    globs = pyproject["tool"]["setuptools"]["package-data"]["foxhunt_obs"]
    pkg = REPO / "foxhunt_obs"
    for f in pkg.rglob("*"):
        if f.is_file() and f.suffix not in (".py", ".pyc") and "__pycache__" not in f.parts:
            rel = f.relative_to(pkg).as_posix()
            assert any(fnmatch(rel, g) for g in globs), f"{rel} is not package data: missing from the image"


# --------------------------------------------------------------------------------------- the instance file


def test_dagster_yaml_is_postgres_storage_with_env_provided_credentials():
    from dagster._core.instance.config import dagster_instance_config

    config, custom_class = dagster_instance_config(str(DEPLOY))  # validated against Dagster's schema
    assert custom_class is None
    (kind,) = load("dagster.yaml")["storage"]
    assert kind == "postgres"
    db = load("dagster.yaml")["storage"]["postgres"]["postgres_db"]
    assert set(db) == {"username", "password", "hostname", "db_name", "port", "scheme"}
    # the driver named: SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3, not installed
    assert db.pop("scheme") == "postgresql+psycopg2"
    # every other value from the environment: nothing secret (nor a host) is written in the file
    assert all(isinstance(v, dict) and set(v) == {"env"} for v in db.values()), db
    assert db["password"]["env"].startswith("DAGSTER_PG_")
    assert config["storage"]["postgres"]["postgres_db"]["password"] == {"env": db["password"]["env"]}


def test_dagster_yaml_storage_is_dagster_postgres_own_config():
    dagster_postgres = pytest.importorskip("dagster_postgres")  # the deploy extra
    from dagster._config import validate_config

    storage = load("dagster.yaml")["storage"]["postgres"]
    result = validate_config(dagster_postgres.DagsterPostgresStorage.config_type(), storage)
    assert result.success, result.errors


# -------------------------------------------------------------------------------- the command, for real


def stop_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def code_server(tmp_path):
    """The image's command with the host and port of this test: -h 127.0.0.1 -p <free port>."""
    port = free_port()
    cmd = image_cmd()
    cmd[cmd.index("-h") + 1] = "127.0.0.1"
    cmd[cmd.index("-p") + 1] = str(port)
    dagster = str(Path(sys.executable).parent / "dagster")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    log = (tmp_path / "code-server.log").open("wb")
    proc = subprocess.Popen(
        [dagster, *cmd[1:]],
        cwd=tmp_path,  # not the checkout: the image runs from its own directory
        env={**os.environ, "DAGSTER_HOME": str(home)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the code server spawns its gRPC worker
    )
    try:
        yield proc, port, dagster, tmp_path / "code-server.log"
    finally:
        stop_group(proc)
        log.close()


@pytest.mark.servers
def test_the_image_command_serves_the_definitions_over_grpc(code_server):
    import dagster as dg
    from dagster._core.remote_origin import GrpcServerCodeLocationOrigin

    proc, port, dagster, log = code_server
    deadline = time.monotonic() + START_DEADLINE_S

    def alive():
        assert proc.poll() is None, f"the code server exited ({proc.returncode}):\n{log.read_text()[-4000:]}"

    # 1. the chart's probe: `dagster api grpc-health-check -p <port>` until SERVING
    health = None
    while time.monotonic() < deadline:
        alive()
        health = subprocess.run(
            [dagster, "api", "grpc-health-check", "-h", "127.0.0.1", "-p", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if health.returncode == 0:
            break
        time.sleep(1)
    assert health is not None and health.returncode == 0, f"never SERVING: {health and health.stdout}"

    # 2. the repository over gRPC, as the webserver and the daemon load it. The code server loads the code
    # before it serves (dagster/_grpc/proxy_server.py), so SERVING means loaded, or failed to load for good.
    with dg.instance_for_test() as instance:
        origin = GrpcServerCodeLocationOrigin(host="127.0.0.1", port=port, location_name="foxhunt_obs")
        try:
            with origin.create_location(instance) as location:
                repos = location.get_repositories().values()
                keys = {n.asset_key.to_user_string() for r in repos for n in r.get_asset_node_snaps()}
        except Exception as e:
            pytest.fail(f"the code server does not serve the definitions: {e!r}\n{log.read_text()[-4000:]}")
    assert ASSETS_SERVED <= keys, ASSETS_SERVED - keys


def test_the_prometheus_pool_is_capped_by_the_instance_file(tmp_path):
    """The steps that query Prometheus share the `prometheus` pool (the definitions snapshot pins which);
    an instance with deploy/dagster/dagster.yaml's concurrency block grants its 4 slots and makes the
    fifth step wait, across runs: a backfill never sends Prometheus more than 4 queries at once."""
    from dagster import DagsterInstance

    from foxhunt_obs.definitions import defs
    from foxhunt_obs.defs.resources import PROMETHEUS_POOL

    graph = (defs() if callable(defs) else defs).resolve_asset_graph()
    pooled = sorted(
        k.to_user_string()
        for k in graph.get_all_asset_keys()
        if PROMETHEUS_POOL in (graph.get(k).pools or ())
    )
    assert pooled == ["gpu_samples", "node_samples", "ray_samples", "spend_now"]
    shipped = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump({"concurrency": shipped["concurrency"]}))
    instance = DagsterInstance.from_config(str(tmp_path))  # the shipped limit on a local (sqlite) instance
    try:
        # what the step launcher does when a step of a pool with no slots yet asks for one
        assert instance.event_log_storage.initialize_concurrency_limit_to_default(PROMETHEUS_POOL)
        limit = instance.event_log_storage.get_concurrency_info(PROMETHEUS_POOL).limit
        assert limit == shipped["concurrency"]["pools"]["default_limit"] == 4
        claims = [
            instance.event_log_storage.claim_concurrency_slot(PROMETHEUS_POOL, f"run-{i}", "gpu_samples")
            for i in range(limit + 1)
        ]
        assert [c.is_claimed for c in claims] == [True] * limit + [False]
    finally:
        instance.dispose()
