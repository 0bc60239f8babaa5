"""The Grafana dashboards in deploy/grafana: structure, the metric contracts they rely on, the generated
ConfigMaps, and every panel query run against a real Prometheus holding contract-shaped series."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest
import requests
import yaml

from foxhunt_obs.sandbox.servers.prometheus import PROMTOOL, PrometheusServer

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
TRAINERS_CONTRACT = REPO / "docs" / "contracts" / "trainers.md"
RULES_FILE = REPO / "deploy" / "prometheus" / "foxhunt-recording-rules.yaml"
COCKPIT = "training-cockpit.json"
FLEET = "gpu-fleet.json"
TRACES = "traces.json"
DASHBOARDS = (COCKPIT, FLEET, TRACES)
PROMETHEUS_DS = {"type": "prometheus", "uid": "${datasource}"}
TEMPO_DS = {"type": "tempo", "uid": "${tempo}"}  # traces.json's Tempo panels (test_traces_dashboard.py)

# The training cockpit's rows, in order, and the series each must show.
COCKPIT_ROWS = {
    "Active jobs": ["foxhunt_training_active_workers", "foxhunt_training_fold_progress_ratio"],
    "Training progress": [
        "foxhunt_training_epoch",
        "foxhunt_training_epoch_loss",
        "foxhunt_training_validation_loss",
        "foxhunt_training_batches_total",
        "foxhunt_training_iteration_seconds_sum",
    ],
    "GPU resources": [
        "foxhunt:gpu_util:ratio",
        "foxhunt:gpu_mem_used:bytes",
        "foxhunt:gpu_mem_total:bytes",
        "foxhunt:gpu_temp:celsius",
        "foxhunt:gpu_power:watts",
    ],
    "Model quality": [
        "foxhunt_training_eval_accuracy",
        "foxhunt_training_eval_f1",
        "foxhunt_training_eval_precision",
        "foxhunt_training_eval_recall",
    ],
    "Checkpoints": [
        "foxhunt_training_checkpoint_saves_total",
        "foxhunt_training_checkpoint_failures_total",
        "foxhunt_training_checkpoint_duration_seconds",
        "foxhunt_training_checkpoint_size_bytes",
    ],
    "Data pipeline": ["foxhunt_training_batches_total", "foxhunt_training_data_load_seconds_sum"],
    "Errors": [
        "foxhunt_training_nan_detected_total",
        "foxhunt_training_gradient_explosions_total",
        "foxhunt_training_feature_errors_total",
    ],
    "Timing": ["foxhunt_training_iteration_seconds_bucket", "foxhunt_training_data_load_seconds_bucket"],
}

# The recording rules agreed with deploy/prometheus (labels node, gpu, uuid, model, namespace, pod, container).
RECORDING_RULES = {
    "foxhunt:gpu_util:ratio",
    "foxhunt:gpu_mem_used:bytes",
    "foxhunt:gpu_mem_total:bytes",
    "foxhunt:gpu_temp:celsius",
    "foxhunt:gpu_power:watts",
    "foxhunt:gpu_sm_clock:hertz",
    "foxhunt:gpu_mem_clock:hertz",
    "foxhunt:gpu_energy:joules",
    "foxhunt:gpu_ecc_sbe:total",
    "foxhunt:gpu_ecc_dbe:total",
    "foxhunt:gpu_xid_last:code",
}
# foxhunt exporter series with no recording rule (yet); every other GPU series goes through a rule.
RAW_GPU_ALLOWED = {"foxhunt_gpu_up", "foxhunt_gpu_xid_errors_total"}

NODE_QUERIES = [  # node_exporter's names, the node panels' queries
    '100 - (avg by(instance) (rate(node_cpu_seconds_total{mode="idle"}[5m])) * 100)',
    "node_memory_MemTotal_bytes - node_memory_MemAvailable_bytes",
    'rate(node_network_transmit_bytes_total{device=~"eth.*"}[5m])',
]

# What Grafana would put in place of each variable for the test queries.
VARIABLES = {
    "interval": "1m",
    "__rate_interval": "1m",
    "__interval": "1m",
    "__range": "1h",
    "model": ".*",
    "fold": ".*",
    "pod": "training.*",
    "service": "foxhunt_obs",
}
VARIABLE_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
METRIC_RE = re.compile(r"\b(foxhunt(?:_\w+|:[\w:]+)|DCGM_\w+|node_\w+)")


def load(name: str) -> dict:
    return json.loads((GRAFANA / name).read_text())


def panels(board: dict) -> list[dict]:
    """Every panel, rows included, with the panels of collapsed rows."""
    out = []
    for p in board["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def queries(board: dict) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in panels(board) for t in p.get("targets", []) if t.get("expr")]


def substitute(expr: str, values: dict[str, str] = VARIABLES) -> str:
    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name.isdigit():  # label_replace's "$1": a regex group, which Grafana leaves alone
            return m.group(0)
        if name not in values:
            raise AssertionError(f"unknown dashboard variable ${name} in {expr!r}")
        return values[name]

    return VARIABLE_RE.sub(value, expr)


def metric_names(expr: str) -> set[str]:
    # label values inside quotes are not metric names
    return set(METRIC_RE.findall(re.sub(r'"[^"]*"', '""', expr)))


def variables(board: dict) -> dict[str, dict]:
    return {v["name"]: v for v in board["templating"]["list"]}


def contract() -> dict[str, str]:
    """The training metric contract: name -> type, from docs/contracts/trainers.md's table."""
    rows = re.findall(
        r"^\| `(foxhunt_training_\w+)` \| (gauge|counter|histogram) \| model, fold \|",
        TRAINERS_CONTRACT.read_text(),
        flags=re.M,
    )
    return dict(rows)


def contract_series(name: str, kind: str) -> set[str]:
    return {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name}


# ---------------------------------------------------------------- structure


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_is_a_grafana_model_on_the_datasource_variable(name):
    board = load(name)
    assert board["schemaVersion"] >= 36 and board["uid"] and board["title"]
    assert board["id"] is None, "a provisioned dashboard must not carry a database id"
    ds = variables(board).get("datasource")
    assert ds and ds["type"] == "datasource" and ds["query"] == "prometheus"
    for p in panels(board):
        if p["type"] == "row":
            continue
        assert p["targets"], f"{p['title']}: no query"
        if p["datasource"] == TEMPO_DS:  # a trace search or the service map: checked by test_traces_dashboard
            assert all(t["datasource"] == TEMPO_DS for t in p["targets"]), p["title"]
            continue
        assert p["datasource"] == PROMETHEUS_DS, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            assert t.get("expr", "").strip(), f"{p['title']}: target {t['refId']} has no expr"
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), f"{p['title']}: duplicate refIds {refs}"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_queries_use_only_variables_the_dashboard_defines(name):
    board = load(name)
    defined = set(variables(board))
    for title, expr in queries(board):
        for m in VARIABLE_RE.finditer(expr):
            var = m.group(1) or m.group(2) or m.group(3)
            assert var.startswith("__") or var.isdigit() or var in defined, (
                f"{title}: ${var} is not a variable of {name}"
            )


@pytest.mark.parametrize("name", DASHBOARDS)
def test_panel_ids_are_unique(name):
    ids = [p["id"] for p in panels(load(name))]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.parametrize("name", DASHBOARDS)
def test_panels_fit_the_grid_without_overlap(name):
    taken: dict[tuple[int, int], str] = {}
    for p in panels(load(name)):
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in taken, f"{p['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = p["title"]


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_panel_has_a_unit(name):
    missing = [
        p["title"]
        for p in panels(load(name))
        if p["type"] != "row" and not p["fieldConfig"]["defaults"].get("unit")
    ]
    assert not missing, missing


def test_cockpit_has_seed_003_rows_in_order_each_with_its_series():
    board = load(COCKPIT)
    rows: list[tuple[str, list[dict]]] = []
    for p in sorted(board["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        if p["type"] == "row":
            rows.append((p["title"], list(p.get("panels", []))))
        else:
            assert rows, f"panel {p['title']!r} above the first row"
            rows[-1][1].append(p)
    assert [title for title, _ in rows] == list(COCKPIT_ROWS)
    for title, row_panels in rows:
        used = set().union(*(metric_names(t["expr"]) for p in row_panels for t in p["targets"]))
        missing = [m for m in COCKPIT_ROWS[title] if m not in used]
        assert not missing, f"row {title!r} does not show {missing}"


def test_cockpit_variables():
    v = variables(load(COCKPIT))
    assert {"datasource", "model", "fold", "interval"} <= set(v)
    for name in ("model", "fold"):
        assert v[name]["type"] == "query" and v[name]["multi"] and v[name]["includeAll"]
        assert v[name]["allValue"] == ".*"
    assert "$model" in v["fold"]["definition"], "fold choices should follow the chosen models"
    assert v["interval"]["type"] == "interval" and v["interval"]["current"]["value"] in v["interval"]["query"]


def test_fleet_pod_variable_defaults_to_training_pods():
    v = variables(load(FLEET))
    assert v["pod"]["type"] == "textbox" and v["pod"]["query"] == "training.*"
    assert v["pod"]["current"]["value"] == "training.*"


def test_cockpit_filters_every_training_query_by_model_and_fold():
    for title, expr in queries(load(COCKPIT)):
        for selector in re.findall(r"foxhunt_training_\w+(\{[^}]*\})?", expr):
            assert 'model=~"$model"' in selector and 'fold=~"$fold"' in selector, f"{title}: {expr}"


def test_fleet_keeps_the_gpu_headline_and_node_panels():
    exprs = [e for _, e in queries(load(FLEET))]
    assert 'avg(foxhunt:gpu_util:ratio{pod=~"$pod"})' in exprs
    for q in NODE_QUERIES:
        assert q in exprs, f"node query missing: {q}"
    used = set().union(*(metric_names(e) for e in exprs))
    for needed in (
        "foxhunt:gpu_mem_used:bytes",
        "foxhunt:gpu_temp:celsius",
        "foxhunt:gpu_power:watts",
        "foxhunt:gpu_ecc_sbe:total",
        "foxhunt:gpu_ecc_dbe:total",
        "foxhunt_gpu_xid_errors_total",
        "foxhunt_gpu_up",
    ):
        assert needed in used, f"GPU fleet does not show {needed}"


# ---------------------------------------------------------------- metric contracts


@pytest.mark.parametrize("name", DASHBOARDS)
def test_gpu_panels_query_recording_rules_not_exporter_names(name):
    recorded = {r["record"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]}
    for title, expr in queries(load(name)):
        for m in metric_names(expr):
            assert not m.startswith("DCGM_"), f"{title}: {m} is a dcgm-exporter name, use a recording rule"
            if m.startswith("foxhunt_gpu_"):
                assert m in RAW_GPU_ALLOWED, f"{title}: {m} has a recording rule, query that instead"
            if m.startswith("foxhunt:"):
                assert m in RECORDING_RULES, f"{title}: {m} is not one of the agreed recording rules"
                assert m in recorded, f"{title}: {m} is not recorded by {RULES_FILE.relative_to(REPO)}"


def test_training_contract_is_documented_and_fully_used():
    documented = contract()
    assert len(documented) >= 19, "docs/contracts/trainers.md's contract table did not parse"
    allowed = set().union(*(contract_series(n, k) for n, k in documented.items()))
    used = set().union(*(metric_names(e) for _, e in queries(load(COCKPIT))))
    training = {m for m in used if m.startswith("foxhunt_training_")}
    assert training <= allowed, f"cockpit uses series outside the contract: {sorted(training - allowed)}"
    for n, k in documented.items():
        assert contract_series(n, k) & training, f"contract metric {n} is on no panel"
    for n, k in documented.items():  # Prometheus naming: counters end in _total, others never do
        assert n.endswith("_total") == (k == "counter"), n


# ---------------------------------------------------------------- generated ConfigMaps


def _build_configmaps():
    spec = importlib.util.spec_from_file_location("build_configmaps", GRAFANA / "build_configmaps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configmaps_are_exactly_what_the_script_generates():
    generated = _build_configmaps().render(GRAFANA)
    assert (GRAFANA / "configmaps.yaml").read_text() == generated, (
        "deploy/grafana/configmaps.yaml is stale: run python deploy/grafana/build_configmaps.py"
    )


def test_configmaps_embed_each_dashboard_for_the_grafana_sidecar():
    docs = [d for d in yaml.safe_load_all((GRAFANA / "configmaps.yaml").read_text()) if d]
    by_file = {}
    for d in docs:
        assert d["apiVersion"] == "v1" and d["kind"] == "ConfigMap"
        meta = d["metadata"]
        assert meta["namespace"] == "monitoring"
        assert meta["labels"]["grafana_dashboard"] == "1"  # the string "1", as the sidecar matches it
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", meta["name"]) and len(meta["name"]) <= 63
        assert len(d["data"]) == 1
        ((key, text),) = d["data"].items()
        by_file[key] = text
    assert sorted(by_file) == sorted(p.name for p in GRAFANA.glob("*.json"))
    for key, text in by_file.items():
        assert text == (GRAFANA / key).read_text(), f"{key} differs from its ConfigMap"
    names = [d["metadata"]["name"] for d in docs]
    assert len(names) == len(set(names))


def test_configmap_check_mode_reports_drift(tmp_path, capsys):
    module = _build_configmaps()
    board = tmp_path / "a.json"
    board.write_text(json.dumps({"uid": "a", "panels": []}, indent=2) + "\n")
    assert module.main(["--dir", str(tmp_path), "--check"]) == 1  # nothing generated yet
    assert module.main(["--dir", str(tmp_path)]) == 0
    assert module.main(["--dir", str(tmp_path), "--check"]) == 0
    board.write_text(json.dumps({"uid": "a", "panels": [], "title": "edited"}, indent=2) + "\n")
    assert module.main(["--dir", str(tmp_path), "--check"]) == 1
    assert "stale" in capsys.readouterr().err


# ---------------------------------------------------------------- queries on a real Prometheus

T0 = 1_767_225_600  # 2026-01-01T00:00:00Z, 2h-aligned so the history lands in one block
STEP = 15
POINTS = 161  # 40 minutes
T_END = T0 + STEP * (POINTS - 1)
MODELS = ("ppo-policy", "reward-model")
FOLDS = ("0", "1")
NODE = "gpu-node-1"
GPU_MODEL = "NVIDIA H100 80GB HBM3"
BUCKETS = ("0.01", "0.1", "1", "10", "+Inf")


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


class _History:
    """OpenMetrics text for promtool: one series at a time, a sample every STEP seconds."""

    def __init__(self):
        self.lines: list[str] = []
        self.families: set[str] = set()

    def series(self, name: str, labels: dict, value) -> None:
        if name not in self.families:  # every family as a gauge, as the sandbox does: names stay as written
            self.lines.append(f"# TYPE {name} gauge")
            self.families.add(name)
        prefix = name + _labels(**labels)
        self.lines += [f"{prefix} {float(value(i))} {T0 + i * STEP}" for i in range(POINTS)]

    def text(self) -> str:
        # OpenMetrics wants a family's samples together
        grouped: dict[str, list[str]] = {}
        current = None
        for line in self.lines:
            if line.startswith("# TYPE"):
                current = line.split()[2]
                grouped.setdefault(current, [line])
            else:
                grouped[current].append(line)
        return "\n".join(line for lines in grouped.values() for line in lines) + "\n# EOF\n"


# Tempo's metrics-generator series as it remote-writes them. Names, labels and label values: grafana/tempo
# @ad33aa8 modules/generator/processor/spanmetrics/spanmetrics.go (traces_spanmetrics_calls_total and
# traces_spanmetrics_latency, labels service, span_name, span_kind, status_code: SPAN_KIND_*, STATUS_CODE_*),
# servicegraphs/servicegraphs.go (traces_service_graph_request_total, _failed_total, _server_seconds,
# _client_seconds; labels client, server, connection_type), registry/registry.go (every series carries
# __metrics_gen_instance, the generator's hostname); default buckets from docs/sources/tempo/configuration.
# A series exists only once a span made it: a span name that never failed has no STATUS_CODE_ERROR series.
SPAN_BUCKETS = (
    "0.002", "0.004", "0.008", "0.016", "0.032", "0.064", "0.128", "0.256",
    "0.512", "1.024", "2.048", "4.096", "8.192", "16.384", "+Inf",
)  # fmt: skip
GRAPH_BUCKETS = ("0.1", "0.2", "0.4", "0.8", "1.6", "3.2", "6.4", "12.8", "+Inf")
GENERATORS = ("tempo-metrics-generator-0", "tempo-metrics-generator-1")  # each counts half the spans
# (service, span name, kind, spans ended OK per STEP, ended in error per STEP, the bucket all durations fall in)
SPANS = (
    ("foxhunt_obs", "run gpu_ingest_job", "SPAN_KIND_INTERNAL", 3, 1, "+Inf"),
    ("foxhunt_obs", "materialize gpu_samples", "SPAN_KIND_INTERNAL", 9, 1, "4.096"),
    ("foxhunt_obs", "POST /api/v1/query_range", "SPAN_KIND_CLIENT", 38, 2, "0.128"),
    ("foxhunt_obs", "S3.PutObject", "SPAN_KIND_CLIENT", 20, 0, "0.064"),
    ("foxhunt_obs", "alert tick", "SPAN_KIND_INTERNAL", 4, 0, "8.192"),
    ("ppo-trainer", "training.fold", "SPAN_KIND_INTERNAL", 2, 0, "16.384"),
)
# (client, server, connection_type, requests per STEP, failed per STEP): the foxhunt_obs edges are virtual
# nodes (no server spans) named by the client span's server.address, MLflow's store by its db.system.name
EDGES = (
    ("foxhunt_obs", "prometheus-k8s.monitoring.svc", "virtual_node", 40, 2),
    ("foxhunt_obs", "s3.us-east-1.amazonaws.com", "virtual_node", 20, 0),
    ("foxhunt_obs", "postgresql", "database", 5, 0),
    ("ppo-trainer", "mlflow.mlflow.svc", "virtual_node", 6, 3),
)
SPANS_RECEIVED = 80  # per STEP, all tenants, as Tempo's distributor counts them


def _histogram(h: _History, name: str, labels: dict, per_step: float, upper: str, buckets, seconds: float):
    """A histogram whose observations (per_step a STEP, split over the generators) all fall in `upper`."""
    for le in buckets:
        inside = le == "+Inf" or (upper != "+Inf" and float(le) >= float(upper))
        h.series(f"{name}_bucket", {**labels, "le": le}, lambda i, n=per_step * inside: n * i)
    h.series(f"{name}_sum", labels, lambda i: per_step * seconds * i)
    h.series(f"{name}_count", labels, lambda i: per_step * i)


def tempo_series(h: _History) -> None:
    half = 1 / len(GENERATORS)
    for generator in GENERATORS:
        for service, name, kind, ok, errors, upper in SPANS:
            base = dict(service=service, span_name=name, span_kind=kind, __metrics_gen_instance=generator)
            for status, n in (("STATUS_CODE_UNSET", ok), ("STATUS_CODE_ERROR", errors)):
                if n:
                    labels = {**base, "status_code": status}
                    h.series("traces_spanmetrics_calls_total", labels, lambda i, n=n: n * half * i)
                    _histogram(h, "traces_spanmetrics_latency", labels, n * half, upper, SPAN_BUCKETS, 0.05)
        for client, server, kind, total, failed in EDGES:
            labels = dict(
                client=client, server=server, connection_type=kind, __metrics_gen_instance=generator
            )
            h.series("traces_service_graph_request_total", labels, lambda i, n=total: n * half * i)
            if failed:
                h.series(
                    "traces_service_graph_request_failed_total", labels, lambda i, n=failed: n * half * i
                )
            for side in ("server", "client"):
                name = f"traces_service_graph_request_{side}_seconds"
                _histogram(h, name, labels, total * half, "0.2", GRAPH_BUCKETS, 0.15)
    tempo = dict(tenant="single-tenant", job="tempo", instance="tempo-distributor-0:3200")
    h.series("tempo_distributor_spans_received_total", tempo, lambda i: SPANS_RECEIVED * i)


def _training_pod(model: str, fold: str) -> str:
    return f"training-{model}-{fold}"


def synthetic_history(documented: dict[str, str]) -> str:
    """Series shaped as the contracts say: training metrics as a trainer's scrape stores them, the GPU
    recording rules, the foxhunt exporter's raw series, node_exporter, Tempo's span metrics and service
    graph. GPU 7 is held by no pod."""
    h = _History()
    for model in MODELS:
        for fold in FOLDS:
            pod = _training_pod(model, fold)
            scrape = dict(
                model=model,
                fold=fold,
                namespace="training",
                pod=pod,
                container="trainer",
                job="training-metrics",
                instance=f"{pod}:9094",
            )
            for name, kind in documented.items():
                if kind == "counter":
                    h.series(name, scrape, lambda i: 3 * i)
                elif kind == "histogram":
                    for k, le in enumerate(BUCKETS):
                        h.series(f"{name}_bucket", {**scrape, "le": le}, lambda i, k=k: i * (k + 1))
                    h.series(f"{name}_sum", scrape, lambda i: 2.5 * i)
                    h.series(f"{name}_count", scrape, lambda i: i * len(BUCKETS))
                elif name.endswith("_ratio") or "_eval_" in name:
                    h.series(name, scrape, lambda i: min(1.0, i / POINTS))
                else:
                    h.series(name, scrape, lambda i: 1 + i % 7)
    holders = [_training_pod(m, f) for m in MODELS for f in FOLDS]
    for gpu in range(8):
        base = dict(node=NODE, gpu=str(gpu), uuid=f"GPU-0000000{gpu}", model=GPU_MODEL)
        held = dict(namespace="training", pod=holders[gpu // 2], container="trainer") if gpu < 7 else {}
        rule = {**base, **held}
        h.series("foxhunt:gpu_util:ratio", rule, lambda i: 0.85)
        h.series("foxhunt:gpu_mem_used:bytes", rule, lambda i: 64e9)
        h.series("foxhunt:gpu_mem_total:bytes", rule, lambda i: 80e9)
        h.series("foxhunt:gpu_temp:celsius", rule, lambda i: 71)
        h.series("foxhunt:gpu_power:watts", rule, lambda i: 520)
        h.series("foxhunt:gpu_sm_clock:hertz", rule, lambda i: 1.98e9)
        h.series("foxhunt:gpu_mem_clock:hertz", rule, lambda i: 2.619e9)
        h.series("foxhunt:gpu_energy:joules", rule, lambda i: 520 * STEP * i)
        h.series("foxhunt:gpu_ecc_sbe:total", rule, lambda i, gpu=gpu: i // 40 if gpu == 3 else 0)
        h.series("foxhunt:gpu_ecc_dbe:total", rule, lambda i: 0)
        h.series("foxhunt:gpu_xid_last:code", rule, lambda i, gpu=gpu: 79 if gpu == 5 else 0)
        raw = dict(
            gpu=str(gpu),
            uuid=base["uuid"],
            hostname=NODE,
            model=GPU_MODEL,
            node=NODE,
            job="foxhunt-gpu-exporter",
            instance="10.0.0.7:9094",
        )
        h.series("foxhunt_gpu_up", raw, lambda i, gpu=gpu: 0 if gpu == 7 else 1)
        h.series(
            "foxhunt_gpu_xid_errors_total",
            {**raw, **held, "xid": "79"},
            lambda i, gpu=gpu: i // 50 if gpu == 5 else 0,
        )
    node = dict(instance=NODE, job="node-exporter")
    for mode, share in (("idle", 0.6), ("user", 0.4)):
        h.series(
            "node_cpu_seconds_total", {**node, "cpu": "0", "mode": mode}, lambda i, s=share: s * STEP * i
        )
    h.series("node_memory_MemTotal_bytes", node, lambda i: 1.1e12)
    h.series("node_memory_MemAvailable_bytes", node, lambda i: 0.7e12)
    for direction in ("transmit", "receive"):
        h.series(f"node_network_{direction}_bytes_total", {**node, "device": "eth0"}, lambda i: 1e8 * i)
    tempo_series(h)
    return h.text()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    work = tmp_path_factory.mktemp("dashboards-prometheus")
    history = work / "history.om"
    history.write_text(synthetic_history(contract()))
    r = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(history), str(work / "tsdb")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, f"promtool could not backfill the synthetic history: {r.stderr[-2000:]}"
    server = PrometheusServer(work / "tsdb", workdir=work)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _query(server: PrometheusServer, expr: str) -> tuple[list | None, str]:
    """(result, "") on success, (None, why) on an error answer."""
    r = requests.get(f"{server.url}/api/v1/query", params={"query": expr, "time": T_END}, timeout=10)
    try:
        body = r.json()
    except ValueError:
        return None, f"HTTP {r.status_code}: {r.text[:300]}"
    if r.status_code != 200 or body.get("status") != "success":
        return None, f"HTTP {r.status_code} {body.get('errorType')}: {body.get('error')}"
    return body["data"]["result"], ""


@pytest.mark.parametrize("name", DASHBOARDS)
def test_every_panel_query_runs_and_finds_the_contract_series(prometheus, name):
    """With variables substituted, no query errors, none comes back empty (the synthetic history holds
    what the contracts promise, so an empty answer means a wrong name, label or join), and every label a
    legend names is on the series it labels (a typo in `by (...)` shows as a blank legend otherwise)."""
    errors, empty, legends = [], [], []
    for p in panels(load(name)):
        for t in p.get("targets", []):
            if "expr" not in t:
                continue  # a Tempo query (test_traces_dashboard.py)
            expr = t["expr"]
            result, why = _query(prometheus, substitute(expr))
            if result is None:
                errors.append(f"{name} / {p['title']!r}: {expr}\n    -> {why}")
            elif not result:
                empty.append(f"{name} / {p['title']!r}: {expr}")
            else:
                wanted = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))
                missing = {label for s in result for label in wanted if label not in s["metric"]}
                if missing:
                    legends.append(f"{name} / {p['title']!r}: legend needs {sorted(missing)}: {expr}")
    assert not errors, "panel queries Prometheus rejects:\n" + "\n".join(errors)
    assert not empty, "panel queries that find nothing in contract-shaped data:\n" + "\n".join(empty)
    assert not legends, "legends naming labels the series lack:\n" + "\n".join(legends)


def test_cockpit_gpu_row_shows_only_the_gpus_of_the_selected_models_pods(prometheus):
    board = load(COCKPIT)
    util = next(e for t, e in queries(board) if t == "GPU utilization")
    expr = substitute(util, {**VARIABLES, "model": "reward-model", "fold": "0"})
    result, why = _query(prometheus, expr)
    assert result is not None, why
    assert {s["metric"]["pod"] for s in result} == {_training_pod("reward-model", "0")}
    assert sorted(s["metric"]["gpu"] for s in result) == ["4", "5"]


def test_fleet_counts_unallocated_and_down_gpus(prometheus):
    board = load(FLEET)
    got = {t: _query(prometheus, substitute(e))[0] for t, e in queries(board)}
    assert float(got["Unallocated GPUs"][0]["value"][1]) == 1
    assert float(got["GPUs down"][0]["value"][1]) == 1
    assert float(got["GPUs held by training pods"][0]["value"][1]) == 7


@pytest.mark.parametrize("name", DASHBOARDS)
def test_variable_queries_select_existing_series(prometheus, name):
    for v in variables(load(name)).values():
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["definition"])
        assert m, f"{name} ${v['name']}: unexpected variable query {v['definition']!r}"
        selector, label = m.groups()
        result, why = _query(prometheus, substitute(selector))
        assert result is not None, f"{name} ${v['name']}: {selector} -> {why}"
        assert any(label in s["metric"] for s in result), f"{name} ${v['name']}: no {label} on {selector}"
