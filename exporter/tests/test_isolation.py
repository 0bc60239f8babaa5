"""Scrapes never reach the backend; every backend call but the XID wait happens on the poller thread."""

from __future__ import annotations

import http.client
import threading

import pytest
from exporter_helpers import OPENMETRICS, get, wait_for


@pytest.mark.servers
def test_scrapes_make_zero_backend_calls(make_exporter):
    exporter, fake = make_exporter({"gpus": 8, "faults": [{"kind": "xid", "gpu": 1, "xid": 79}]})
    exporter.poller.poll_once()  # one snapshot, and no poller thread to muddy the count
    exporter.xids.add(1, 79)
    server = exporter.serve("127.0.0.1:0")
    calls_before = sum(fake.calls.values())
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)  # keep-alive, like Prometheus
    for i in range(200):
        conn.request("GET", "/metrics", headers={"Accept": OPENMETRICS if i % 2 else "text/plain"})
        response = conn.getresponse()
        assert response.status == 200 and b"foxhunt_gpu_up" in response.read()
    conn.close()
    assert sum(fake.calls.values()) == calls_before  # zero backend calls in 200 scrapes
    assert exporter.exposition.renders == 2  # one per format: nothing changed between scrapes


@pytest.mark.servers
def test_backend_calls_happen_on_the_poller_thread_only(make_exporter):
    exporter, fake = make_exporter({"gpus": 4, "faults": [{"kind": "xid", "gpu": 2, "xid": 48, "at": 0.1}]},
                                   interval=0.02)  # fmt: skip
    exporter.start()
    server = exporter.serve("127.0.0.1:0")
    stop = threading.Event()

    def scrape_forever():
        while not stop.is_set():
            get(server.url, "/metrics")

    scrapers = [threading.Thread(target=scrape_forever) for _ in range(3)]
    for t in scrapers:
        t.start()
    wait_for(lambda: exporter.poller.snapshot.polls.count >= 10 and exporter.xids.items(), what="polls and an XID")
    stop.set()
    for t in scrapers:
        t.join()
    threads = {name: names for name, names in fake.call_threads.items()}
    assert threads.pop("wait_xid_event") == {"foxhunt-xid"}
    assert threads and all(names == {"foxhunt-poller"} for names in threads.values()), threads


def test_scrape_after_a_poll_is_already_rendered(make_exporter):
    exporter, _ = make_exporter({"gpus": 2}, interval=0.02)
    exporter.exposition.render("")  # a scraper asked for the text format once
    exporter.start()
    wait_for(lambda: exporter.poller.snapshot.polls.count >= 5, what="polls")
    exporter.stop()
    renders = exporter.exposition.renders
    assert renders >= 5  # the poller thread re-rendered after each poll
    body, _ = exporter.exposition.render("")
    assert exporter.exposition.renders == renders  # the scrape itself rendered nothing
    assert f"foxhunt_exporter_poll_duration_seconds_count {float(exporter.poller.snapshot.polls.count)}" in body.decode()


def test_formats_nobody_asks_for_stop_being_rendered(make_exporter, monkeypatch):
    from foxhunt_gpu_exporter import exposition

    exporter, _ = make_exporter({"gpus": 1})
    exporter.poller.poll_once()
    exporter.exposition.render(OPENMETRICS)
    exporter.poller.poll_once()
    exporter.exposition.warm()
    assert exporter.exposition.renders == 2
    monkeypatch.setattr(exposition, "KEEP_WARM_S", -1.0)  # asked for "too long ago"
    exporter.poller.poll_once()
    exporter.exposition.warm()
    assert exporter.exposition.renders == 2
    body, content_type = exporter.exposition.render(OPENMETRICS)  # asked again: rendered on demand
    assert exporter.exposition.renders == 3 and body.endswith(b"# EOF\n") and "openmetrics" in content_type
