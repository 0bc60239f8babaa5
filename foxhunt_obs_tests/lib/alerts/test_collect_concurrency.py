"""The Prometheus rules' queries run side by side (the client's queries_at_once): the same
findings, in the catalog's order, as one after another, on a real Prometheus; never more queries in
flight than the bound; a failing query still fails the whole source, naming its rule."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone

import pytest

from foxhunt_obs.lib.alerts import collect
from foxhunt_obs.lib.alerts.collect import Sources
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.sources.prometheus import QUERIES_AT_ONCE, PrometheusClient
from foxhunt_obs.sandbox.servers import prometheus as sandbox_prometheus
from foxhunt_obs.sandbox.servers.prometheus import PrometheusServer, backfill_openmetrics

pytestmark = [pytest.mark.servers, pytest.mark.timeout(120)]
T0 = datetime(2026, 11, 16, tzinfo=timezone.utc)
NOW = T0 + timedelta(minutes=50)
STEP_S = 15
# Two nodes of 4 GPUs as the canonical records show them. Ground truth at NOW:
#   ip-a GPU 0 at 91 °C and GPU 2 at 430 W (gpu_overheat, power_over_limit); ip-b GPU 3 reports XID 79
#   pod rl/stalled holds ip-a GPUs 0-1 at 0 % (gpu_training_stall, {gpus} = 2); rl/busy holds ip-b 0-3 at 90 %
#   ip-a GPUs 2-3 are held by no pod, ip-b's all are: no idle_spend (one node has a pod)
GPUS = [("ip-a", g, "rl", "stalled" if g < 2 else "") for g in range(4)]
GPUS += [("ip-b", g, "rl", "busy") for g in range(4)]


def _openmetrics() -> str:
    families = {
        "foxhunt:gpu_util:ratio": lambda node, g, pod: 0.0 if pod == "stalled" else 0.9 if pod else 0.0,
        "foxhunt:gpu_temp:celsius": lambda node, g, pod: 91.0 if (node, g) == ("ip-a", 0) else 60.0,
        "foxhunt:gpu_power:watts": lambda node, g, pod: 430.0 if (node, g) == ("ip-a", 2) else 250.0,
        "foxhunt:gpu_xid_last:code": lambda node, g, pod: 79.0 if (node, g) == ("ip-b", 3) else 0.0,
    }
    lines = []
    times = [int(T0.timestamp()) + k * STEP_S for k in range(int(3600 / STEP_S))]
    for family, value in families.items():
        lines.append(f"# TYPE {family} gauge")
        for node, g, ns, pod in GPUS:
            labels = f'node="{node}",gpu="{g}",uuid="GPU-{node}-{g}",model="NVIDIA A100-SXM4-80GB"'
            if pod:
                labels += f',namespace="{ns}",pod="{pod}",container="trainer"'
            lines += [f"{family}{{{labels}}} {value(node, g, pod)} {t}" for t in times]
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    if not os.path.exists(sandbox_prometheus.PROMTOOL):
        pytest.skip("needs /usr/bin/prometheus and /usr/bin/promtool")
    work = tmp_path_factory.mktemp("prom")
    (work / "series.om").write_text(_openmetrics())
    tsdb = backfill_openmetrics(work / "series.om", work / "tsdb")
    with PrometheusServer(tsdb, workdir=work) as server:
        yield server


def _rules():
    return [r for r in load_rules(overrides="") if r.enabled and r.source == "prometheus"]


def _findings(url: str, at_once: int):
    client = PrometheusClient(url, timeout_s=20, queries_at_once=at_once)
    ev = collect.collect(_rules(), Sources(prometheus=client), NOW)
    assert not ev.errors, ev.errors
    return ev, [(f.rule, f.labels, f.value, f.extra) for f in ev.findings]


def test_side_by_side_finds_what_one_after_another_finds_in_the_same_order(prometheus):
    serial_ev, serial = _findings(prometheus.url, 1)
    ev, found = _findings(prometheus.url, 4)
    assert found == serial  # same findings, same order
    assert ev.evaluated == serial_ev.evaluated == {r.id for r in _rules()}
    by_rule = {}
    for rule, labels, value, extra in found:
        by_rule.setdefault(rule, []).append((labels, value, extra))
    assert sorted(by_rule) == ["gpu_overheat", "gpu_training_stall", "power_over_limit", "xid_errors"]
    ((labels, value, _),) = by_rule["gpu_overheat"]
    assert (labels["node"], labels["gpu"], value) == ("ip-a", "0", 91.0)
    ((labels, value, _),) = by_rule["power_over_limit"]
    assert (labels["node"], labels["gpu"], value) == ("ip-a", "2", 430.0)
    ((labels, value, _),) = by_rule["xid_errors"]
    assert (labels["node"], labels["gpu"], value) == ("ip-b", "3", 79.0)
    ((labels, value, extra),) = by_rule["gpu_training_stall"]
    assert (labels, value, extra) == ({"namespace": "rl", "pod": "stalled"}, 0.0, {"gpus": 2})
    rule_order = [r.id for r in _rules()]
    assert [rule for rule, *_ in found] == sorted((rule for rule, *_ in found), key=rule_order.index)


class _Slow(http.server.BaseHTTPRequestHandler):
    """A Prometheus answering every instant query with an empty vector after DELAY_S, counting how many
    requests it holds at once; the query `fail` names gets HTTP 400 as Prometheus answers a bad query."""

    DELAY_S = 0.2
    lock = threading.Lock()
    in_flight = 0
    most = 0
    seen: list[str] = []
    fail = "\x00"

    def do_POST(self):
        from urllib.parse import parse_qs

        form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
        query = form["query"][0]
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.most = max(cls.most, cls.in_flight)
            cls.seen.append(query)
        try:
            time.sleep(self.DELAY_S)
        finally:
            # no longer held once its answer is ready: counted down before the answer leaves, since the
            # client may send its next query the moment it reads this one's (under load, before a count
            # taken after the write)
            with cls.lock:
                cls.in_flight -= 1
        if self.fail in query:
            status, doc = 400, {"status": "error", "errorType": "bad_data", "error": "parse error"}
        else:
            status, doc = 200, {"status": "success", "data": {"resultType": "vector", "result": []}}
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextmanager
def _slow_server(fail: str = "\x00"):
    handler = type("Slow", (_Slow,), {"in_flight": 0, "most": 0, "seen": [], "fail": fail})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    finally:
        srv.shutdown()
        srv.server_close()


def test_queries_overlap_up_to_the_bound_and_no_further():
    rules = _rules()
    assert len(rules) > 3  # else the bound is not exercised
    with _slow_server() as (url, seen):
        t = time.monotonic()
        ev = collect.collect(
            rules, Sources(prometheus=PrometheusClient(url, timeout_s=20, queries_at_once=3)), NOW
        )
        took = time.monotonic() - t
    assert not ev.errors and ev.evaluated == {r.id for r in rules}
    assert seen.most == 3
    assert sorted(seen.seen) == sorted(r.expr() for r in rules)  # each rule asked once
    assert took < len(rules) * _Slow.DELAY_S  # under one after another's time (~2.5x under, when quiet)


def test_one_at_once_is_one_after_another():
    with _slow_server() as (url, seen):
        client = PrometheusClient(url, timeout_s=20, queries_at_once=1)
        collect.collect(_rules()[:3], Sources(prometheus=client), NOW)
    assert seen.most == 1 and len(seen.seen) == 3


def test_a_failing_query_fails_the_source_and_names_its_rule():
    rules = _rules()
    bad = next(r for r in rules if r.id == "xid_errors")
    with _slow_server(fail="foxhunt:gpu_xid_last:code") as (url, _):
        ev = collect.collect(rules, Sources(prometheus=PrometheusClient(url, timeout_s=20)), NOW)
    assert not ev.evaluated and not ev.findings  # the source is not evaluated: its alerts keep their state
    assert "alert rule xid_errors" in ev.errors["prometheus"] and "HTTP 400" in ev.errors["prometheus"]
    assert bad.expr().strip() in ev.errors["prometheus"]


HUNG = """
import socket, sys, time
from datetime import datetime, timezone
from foxhunt_obs.lib.alerts.collect import Sources, collect
from foxhunt_obs.lib.alerts.rules import load_rules
from foxhunt_obs.lib.sources.prometheus import PrometheusClient

listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(64)  # accepts connections, never answers
url = "http://127.0.0.1:%d" % listener.getsockname()[1]
rules = [r for r in load_rules() if r.enabled and r.source == "prometheus"]
t = time.monotonic()
ev = collect(rules, Sources(prometheus=PrometheusClient(url, timeout_s=8)), datetime.now(timezone.utc), deadline_s=0.5)
print(len(rules), sorted(ev.errors), round(time.monotonic() - t, 2), repr(t), flush=True)
"""


def test_a_hung_prometheus_does_not_hold_the_process_at_exit(tmp_path):
    """The rules' queries run on daemon threads, as the source's own: when Prometheus never answers, the
    tick gives up at its deadline and the process exits then, not once every query's own timeout ran."""
    import subprocess
    import sys

    script = tmp_path / "hung.py"
    script.write_text(HUNG)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    exited = time.monotonic()
    assert out.returncode == 0, out.stderr
    # from the tick's start to the process's exit (CLOCK_MONOTONIC is one clock for every process on Linux),
    # not counting the interpreter's start and imports, which take seconds on a loaded machine
    took = exited - float(out.stdout.split()[-1])
    n_rules = int(out.stdout.split()[0])
    assert n_rules > QUERIES_AT_ONCE and "['prometheus']" in out.stdout  # late: not evaluated
    assert took < 8  # the client's timeout: a pool's worker threads would be joined at exit, 2 x 8 s
