"""End to end on a real Prometheus: backfill the `small` scenario with promtool, query it, compare with
the truth sample for sample."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest

from foxhunt_obs.sandbox.servers import prometheus
from foxhunt_obs.sandbox.servers.prometheus import (
    RECORDING_RULES,
    PrometheusServer,
    SandboxError,
    build_tsdb,
    copy_tsdb,
    tsdb_path,
)
from foxhunt_obs.sandbox.story import truth
from foxhunt_obs.sandbox.story.scenario import load_scenario
from foxhunt_obs.sandbox.writers import bills
from foxhunt_obs.sandbox.writers.cache import COMPLETE

RECORDING_RULE_COUNT = RECORDING_RULES.read_text().count("- record:")
COST_RULE_COUNT = prometheus.COST_RULES.read_text().count("- record:")

pytestmark = pytest.mark.skipif(
    not (os.path.exists(prometheus.PROMETHEUS) and os.path.exists(prometheus.PROMTOOL)),
    reason="needs /usr/bin/prometheus and /usr/bin/promtool",
)

T0 = datetime(2026, 11, 16, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def small():
    return load_scenario("small")


@pytest.fixture(scope="module")
def cache(tmp_path_factory, small):
    """Built under a relative cache root, as `make demo` builds it (.foxhunt/sandbox/cache): promtool
    runs in a directory of its own, and a relative output path once sent its blocks astray."""
    root = tmp_path_factory.mktemp("cache")
    here = os.getcwd()
    os.chdir(root.parent)
    try:
        tsdb = build_tsdb(small, Path(root.name))
    finally:
        os.chdir(here)
    return root, root / tsdb.relative_to(root.name)


@pytest.fixture(scope="module")
def server(cache, tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    srv = PrometheusServer(copy_tsdb(cache[1], run / "tsdb"), workdir=run)
    with srv:
        yield srv


def api(url: str, path: str, **params) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def instant(url: str, query: str, at: datetime) -> list[dict]:
    return api(url, "query", query=query, time=at.timestamp())


@pytest.mark.servers
def test_cache_is_complete_and_reused(cache, small):
    root, tsdb = cache
    assert tsdb == tsdb_path(small, root) and tsdb.parent.name.startswith(
        f"small-{small.fingerprint()[:12]}-r"
    )
    # blocks only: one per 2 h of samples, plus the recording and cost rules' (one per rule per 2 h); no WAL
    entries = list(tsdb.iterdir())
    assert all((p / "meta.json").exists() for p in entries)
    # rules without input data write nothing
    assert 3 < len(entries) <= 3 * (1 + RECORDING_RULE_COUNT + COST_RULE_COUNT)
    assert (tsdb.parent / COMPLETE).exists()
    assert [p.name for p in root.iterdir()] == [tsdb.parent.name]  # no temp dir left behind
    t = time.monotonic()
    assert build_tsdb(small, root) == tsdb and time.monotonic() - t < 0.5


@pytest.mark.servers
def test_failed_promtool_raises_and_caches_nothing(small, tmp_path, monkeypatch):
    def bad_blocks(scenario, out_dir, metrics=None):
        out_dir.mkdir(parents=True)
        (out_dir / "broken.om").write_text("this is not openmetrics\n")
        return [out_dir / "broken.om"]

    monkeypatch.setattr(prometheus, "write_blocks", bad_blocks)
    with pytest.raises(SandboxError, match="promtool failed on broken.om"):
        build_tsdb(small, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.servers
def test_gpu_count_follows_the_lost_node(server):
    # 2 + 2 whole GPUs, and ip-10-0-1-13's GPU 1 (its GPU 0 is in MIG mode: no GPU_UTIL on its slices);
    # at 01:00 two pods share ip-10-0-1-12's time-sliced GPU 1: a copy of its series each
    assert (
        instant(server.url, "count(DCGM_FI_DEV_GPU_UTIL)", T0 + timedelta(minutes=45))[0]["value"][1] == "5"
    )
    shared = instant(
        server.url, 'DCGM_FI_DEV_GPU_UTIL{Hostname="ip-10-0-1-12",gpu="1"}', T0 + timedelta(hours=1)
    )
    assert sorted(
        (r["metric"]["exported_namespace"], r["metric"]["exported_pod"], r["metric"]["vgpu"]) for r in shared
    ) == [
        ("rl-atari", "trainer-0", "1"),
        ("rl-train", "trainer-0", "0"),
    ]
    assert len({r["value"][1] for r in shared}) == 1  # the device's value on each copy
    # GR_ENGINE_ACTIVE on all 7 units, slices included, plus the shared GPU's second copy (01:30: no
    # holder changed in the last 5 minutes, whose samples a backfilled series without staleness markers
    # would still repeat)
    gr = instant(server.url, "count(DCGM_FI_PROF_GR_ENGINE_ACTIVE)", T0 + timedelta(hours=1, minutes=30))
    assert gr[0]["value"][1] == "8"
    # 04:00: ip-10-0-1-12 has been silent for an hour (lost 03:00-05:00)
    got = instant(server.url, "count by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", T0 + timedelta(hours=4))
    assert {r["metric"]["Hostname"]: r["value"][1] for r in got} == {"ip-10-0-1-11": "2", "ip-10-0-1-13": "1"}
    up = instant(server.url, 'up{job="dcgm-exporter"}', T0 + timedelta(hours=4))
    assert {r["metric"]["instance"]: r["value"][1] for r in up} == {
        "ip-10-0-1-11:9400": "1",
        "ip-10-0-1-12:9400": "0",
        "ip-10-0-1-13:9400": "1",
    }
    # each target's up carries its exporter pod: the GPU Operator's, and the Helm chart's (container exporter)
    pods = {r["metric"]["instance"]: (r["metric"]["pod"], r["metric"]["container"]) for r in up}
    assert (
        pods["ip-10-0-1-13:9400"][1] == "exporter" and pods["ip-10-0-1-11:9400"][1] == "nvidia-dcgm-exporter"
    )


@pytest.mark.servers
@pytest.mark.parametrize(
    "metric, column, node, gpu, hour, gi",
    [
        (
            "DCGM_FI_DEV_GPU_UTIL",
            "util_pct",
            "ip-10-0-1-11",
            0,
            0,
            None,
        ),  # pod arrives at 00:30: labels change
        ("DCGM_FI_DEV_GPU_UTIL", "util_pct", "ip-10-0-1-11", 1, 2, None),  # the stall 02:00-02:40
        ("DCGM_FI_DEV_GPU_UTIL", "util_pct", "ip-10-0-1-12", 0, 2.5, None),  # pod ends 02:45, node lost 03:00
        ("DCGM_FI_DEV_POWER_USAGE", "power_w", "ip-10-0-1-11", 0, 1, None),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_mj", "ip-10-0-1-12", 1, 4.5, None),  # back at 05:00
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_sbe", "ip-10-0-1-11", 0, 1, None),
        # MIG slices of ip-10-0-1-13 GPU 0: pods arrive at 00:30 (slice 1) and 01:00 (slice 2)
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr_active", "ip-10-0-1-13", 0, 0.25, 1),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr_active", "ip-10-0-1-13", 0, 0.5, 2),
        ("DCGM_FI_DEV_FB_USED", "fb_used_mib", "ip-10-0-1-13", 0, 3.5, 2),  # its pod ends at 04:00
        ("DCGM_FI_DEV_POWER_USAGE", "power_w", "ip-10-0-1-13", 0, 1, 1),  # the GPU's, on each slice
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr_active", "ip-10-0-1-13", 1, 1.5, None),  # a whole GPU's
        # ip-10-0-1-12's time-sliced GPU 1: the Ray head, then two trainer-0s (two namespaces) at once
        ("DCGM_FI_DEV_GPU_UTIL", "util_pct", "ip-10-0-1-12", 1, 0.25, None),
        ("DCGM_FI_DEV_FB_USED", "fb_used_mib", "ip-10-0-1-12", 1, 2, None),  # shared, then no pod 02:45
        ("DCGM_FI_PROF_SM_ACTIVE", "sm_active", "ip-10-0-1-11", 0, 4.5, None),  # trainer-0 to 05:20
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active", "ip-10-0-1-11", 1, 0, None),
    ],
)
def test_range_query_returns_the_truth(server, small, metric, column, node, gpu, hour, gi):
    gpus = truth.gpu_samples(small)
    uuid = truth.gpu_uuid(small, node, gpu)
    start = T0 + timedelta(hours=hour)
    end = start + timedelta(hours=1)
    unit = gpus["gpu_instance"].isna() if gi is None else gpus["gpu_instance"] == gi
    want = gpus[(gpus["uuid"] == uuid) & unit.fillna(False) & gpus["ts"].between(start, end)]
    selector = f'UUID="{uuid}"' + (f',GPU_I_ID="{gi}"' if gi is not None else "")
    result = api(
        server.url,
        "query_range",
        query=f"{metric}{{{selector}}}",
        start=start.timestamp(),
        end=end.timestamp(),
        step=15,
    )
    matched = 0
    for series in result:
        # A series is one holder of the GPU. Prometheus also repeats a series' last sample for up to
        # 5 minutes after it ends (backfill has no staleness markers): the ts-and-holder join drops those.
        labels = series["metric"]
        mine = want[
            (want["pod"] == labels.get("exported_pod", ""))
            & (want["namespace"] == labels.get("exported_namespace", ""))
            & (want["vgpu"] == labels.get("vgpu", ""))
        ]
        expected = dict(zip(mine["ts"].astype("int64") // 10**9, mine[column]))
        for ts, value in series["values"]:
            if ts in expected:
                assert float(value) == expected[ts], (series["metric"], ts)
                matched += 1
    assert matched == len(want) > 0


@pytest.mark.servers
def test_recording_rules_read_each_other_as_a_live_prometheus_does(server, small):
    """foxhunt:gpu_util:ratio takes GR_ENGINE_ACTIVE's record where a MIG slice has no GPU_UTIL, and
    foxhunt:gpu_mem_total:bytes sums the memory records: backfilled with those references inlined
    (promtool's rule backfill alone cannot see one rule's output from another). The Helm chart's
    exporter pod holds nothing; each slice is a series of its own with its pod."""
    at = T0 + timedelta(hours=1, minutes=30)
    gpus = truth.gpu_samples(small)
    near = gpus[(gpus["node"] == "ip-10-0-1-13") & gpus["ts"].between(at - timedelta(seconds=15), at)]

    def by_unit(query):
        return {
            (r["metric"]["gpu"], r["metric"].get("gpu_instance", ""), r["metric"].get("pod", "")): float(
                r["value"][1]
            )
            for r in instant(server.url, query, at)
        }

    util = by_unit('foxhunt:gpu_util:ratio{node="ip-10-0-1-13"}')
    assert set(util) == {("0", "1", "ppo-humanoid-mig-0"), ("0", "2", "dqn-atari-mig-0"), ("1", "", "")}
    gr = by_unit('foxhunt:gpu_gr_engine_active:ratio{node="ip-10-0-1-13"}')
    for key, value in util.items():
        gpu, gi, _ = key
        unit = near[(near["gpu"] == int(gpu)) & (near["gpu_instance"].fillna(-1) == (int(gi) if gi else -1))]
        assert value in set(unit["util"]), key  # the truth's (promtool stamps a rule's value a step late)
        if gi:  # a slice: util is GR_ENGINE_ACTIVE's record, exactly
            assert value == gr[key]
        else:  # a whole GPU keeps GPU_UTIL (GR_ENGINE_ACTIVE is 0.95 x it there)
            assert gr[key] == pytest.approx(0.95 * value, abs=1e-4)
    total = instant(server.url, 'foxhunt:gpu_mem_total:bytes{node="ip-10-0-1-13"}', at)
    assert sorted(float(r["value"][1]) for r in total) == [40960 * 2**20] * 2 + [81920 * 2**20]


def test_inline_records_leaves_no_record_reference(tmp_path):
    doc = prometheus.inline_records(RECORDING_RULES)
    records = [r["record"] for g in doc["groups"] for r in g["rules"]]
    assert len(records) == RECORDING_RULE_COUNT
    for g in doc["groups"]:
        for r in g["rules"]:
            assert not any(f"{other}" in r["expr"] for other in records), r["record"]
    bad = tmp_path / "rules.yaml"
    bad.write_text(
        "groups: [{name: g, rules: [{record: 'a:b', expr: up}, {record: 'c:d', expr: 'a:b{x=\"1\"}'}]}]"
    )
    with pytest.raises(SandboxError, match="c:d reads a:b with matchers or a range"):
        prometheus.inline_records(bad)


@pytest.mark.servers
def test_cpu_rate_recovers_cpu_busy(server, small):
    at = T0 + timedelta(hours=1, minutes=30)
    got = instant(server.url, '1 - avg by (instance) (rate(node_cpu_seconds_total{mode="idle"}[1m]))', at)
    nodes = truth.node_samples(small)
    want = nodes[nodes["ts"] == pd.Timestamp(at)].set_index("node")["cpu_busy"]
    # node_exporter is scraped by the node's IP (kube-prometheus-stack): 10.0.1.11:9100 is ip-10-0-1-11
    assert {
        "ip-" + r["metric"]["instance"].split(":")[0].replace(".", "-"): pytest.approx(
            float(r["value"][1]), abs=1e-9
        )
        for r in got
    } == want.to_dict()


@pytest.mark.servers
def test_kube_labels(server, small):
    at = T0 + timedelta(hours=5, minutes=30)
    # last_over_time over one step: backfilled series have no staleness markers (a pod ends at 05:30)
    pods = instant(server.url, "last_over_time(kube_pod_labels[14s])", at)
    assert {
        (r["metric"]["namespace"], r["metric"]["pod"], r["metric"]["label_experiment"]) for r in pods
    } == {t for t, p in zip(truth.pod_labels(small), small.pods) if p.start <= at < p.end}
    nodes = instant(server.url, "kube_node_labels", at)
    assert {r["metric"]["label_node_kubernetes_io_instance_type"] for r in nodes} == {"p4de.24xlarge"}


@pytest.mark.servers
def test_kube_node_info_follows_the_instance(server, small):
    """One kube_node_info series per EC2 instance: ip-10-0-1-12's is replaced by its outage (03:00-05:00)."""
    (old, new), (other,) = (
        [i.instance_id for i in bills.instances(small) if i.node == n]
        for n in ("ip-10-0-1-12", "ip-10-0-1-11")
    )

    def info(at: datetime) -> dict[str, str]:
        # last_over_time over one step: backfilled series have no staleness markers
        rows = instant(server.url, "last_over_time(kube_node_info[14s])", at)
        assert all(r["value"][1] == "1" for r in rows)
        return {r["metric"]["node"]: r["metric"]["provider_id"] for r in rows}

    (third,) = [i.instance_id for i in bills.instances(small) if i.node == "ip-10-0-1-13"]
    before = info(T0 + timedelta(hours=2, minutes=59, seconds=45))
    assert before == {
        "ip-10-0-1-11": f"aws:///us-east-1a/{other}",
        "ip-10-0-1-12": f"aws:///us-east-1a/{old}",
        "ip-10-0-1-13": f"aws:///us-east-1a/{third}",
    }
    assert info(T0 + timedelta(hours=3)) == {
        "ip-10-0-1-11": f"aws:///us-east-1a/{other}",
        "ip-10-0-1-13": f"aws:///us-east-1a/{third}",
    }
    assert info(T0 + timedelta(hours=5))["ip-10-0-1-12"] == f"aws:///us-east-1a/{new}"
    (r, *_) = instant(server.url, 'kube_node_info{node="ip-10-0-1-12"}', T0 + timedelta(hours=1))
    assert r["metric"]["internal_ip"] == "10.0.1.12" and r["metric"]["job"] == "kube-state-metrics"


@pytest.mark.servers
def test_stop_takes_the_process_group_down(cache, tmp_path):
    srv = PrometheusServer(copy_tsdb(cache[1], tmp_path / "tsdb"), workdir=tmp_path)
    srv.start()
    pgid, url = srv.pid, srv.url
    assert os.getpgid(pgid) == pgid  # its own session and group
    srv.stop()
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/-/ready", timeout=2)


@pytest.mark.servers
def test_start_failure_shows_the_log(tmp_path):
    bad = tmp_path / "tsdb"
    bad.write_text("not a directory")
    with pytest.raises(SandboxError, match="log tail"):
        PrometheusServer(bad, workdir=tmp_path).start(timeout=10)


@pytest.mark.servers
def test_up_status_down(cache, tmp_path):
    state = tmp_path / "state"
    # seed the state dir's cache from the module's build so up() reuses it
    shutil.copytree(cache[0], state / "cache")
    info = prometheus.up("small", state, port=prometheus.free_port())
    try:
        assert json.loads((state / "sandbox.json").read_text()) == info
        assert info["scenario"] == "small" and info["start"] == "2026-11-16T00:00:00+00:00"
        assert prometheus.status(state) == info
        assert (
            instant(info["url"], "count(DCGM_FI_DEV_GPU_UTIL)", T0 + timedelta(minutes=45))[0]["value"][1]
            == "5"
        )
    finally:
        prometheus.down(state)
    assert prometheus.status(state) is None and not (state / "run").exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(info["pid"], 0)
    prometheus.down(state)  # nothing running: no error


@pytest.mark.servers
def test_rule_backfill_in_pieces_records_what_one_run_does(small, tmp_path, monkeypatch, caplog):
    """The rule backfill runs a piece of the window per promtool process, two at a time: cut into 1-hour
    pieces, the `small` scenario's recording rules hold exactly the samples one run over the whole
    window records (none missed at a seam or at the window's end), and each piece is a progress line."""
    caplog.set_level("INFO", logger="foxhunt_obs.sandbox")
    from foxhunt_obs.sandbox.writers.openmetrics import ALL_METRICS

    raw = build_tsdb(small, tmp_path / "cache", metrics=set(ALL_METRICS))  # the series, no rules
    answers = []
    for piece_s in (10**9, 3600):
        monkeypatch.setattr(prometheus, "RULE_CHUNK_S", piece_s)
        work = tmp_path / f"pieces-{piece_s}"
        tsdb = copy_tsdb(raw, work / "tsdb")
        prometheus.backfill_recording_rules(small, tsdb, work)
        with PrometheusServer(tsdb, workdir=work) as srv:
            start, end = small.start.timestamp(), small.end.timestamp()
            result = api(srv.url, "query_range", query='{__name__=~"foxhunt:gpu_.+"}', start=start, end=end,
                         step=small.step_s)  # fmt: skip
        answers.append(sorted((json.dumps(r["metric"], sort_keys=True), r["values"]) for r in result))
    whole, pieces = answers
    assert len(whole) > 10 and sum(len(v) for _, v in whole) > 1000
    assert pieces == whole
    # a line every PROGRESS_EVERY_S at most, and the last piece's
    progress = [r.getMessage() for r in caplog.records if "evaluated" in r.getMessage()]
    mine = [m for m in progress if "of 6 pieces" in m]
    assert mine and mine[-1] == "  recording rules: 6 of 6 pieces of 3600 s evaluated", progress
    assert all(re.fullmatch(r"  recording rules: [1-6] of 6 pieces of 3600 s evaluated", m) for m in mine)


def _files(root: Path) -> dict[str, tuple[int, str]]:
    return {
        str(p.relative_to(root)): (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.servers
def test_a_servers_copy_links_the_caches_blocks_and_rewriting_them_leaves_the_cache_as_it_was(
    cache, tmp_path
):
    """copy_tsdb hard-links the blocks' files; Prometheus deleting a series and cleaning its tombstones
    (which rewrites the blocks that held it and deletes the old ones) changes the copy, never the cache."""
    before = _files(cache[1])
    tsdb = copy_tsdb(cache[1], tmp_path / "tsdb")
    copied = _files(tsdb)
    assert {k: v[1] for k, v in copied.items()} == {k: v[1] for k, v in before.items()}
    assert all(copied[k][0] == before[k][0] for k in before if k.endswith(("/index", "/meta.json")))
    with PrometheusServer(tsdb, workdir=tmp_path, extra_args=("--web.enable-admin-api",)) as srv:
        assert instant(srv.url, "count(up)", T0 + timedelta(hours=1))
        for path in ("delete_series?match[]=up", "clean_tombstones"):
            req = urllib.request.Request(f"{srv.url}/api/v1/admin/tsdb/{path}", method="POST")
            with urllib.request.urlopen(req, timeout=60) as r:
                assert r.status == 204, path
        assert instant(srv.url, "count(up)", T0 + timedelta(hours=1)) == []
    after = _files(tsdb)
    assert set(after) != set(copied)  # the blocks holding `up` were rewritten
    assert _files(cache[1]) == before
