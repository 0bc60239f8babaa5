"""XID events: counted per GPU and code by the event thread, monotonic, kept while the GPU is down."""

from __future__ import annotations

from exporter_helpers import render, samples, wait_for
from foxhunt_gpu_exporter.backend import ErrorCode, NvmlError
from foxhunt_gpu_exporter.events import XidCounters


def xids(exporter) -> dict[tuple[str, str], float]:
    return {(s.labels["gpu"], s.labels["xid"]): s.value for s in samples(render(exporter), "foxhunt_gpu_xid_errors_total")}


def test_xid_counter_increments_per_event_and_never_goes_back(make_exporter):
    exporter, fake = make_exporter({"gpus": 2}, interval=0.05)
    exporter.start()
    wait_for(lambda: exporter.poller.xid_registered.is_set(), what="event registration")
    assert xids(exporter) == {}
    fake.inject_fault("xid", gpu=1, xid=79)
    wait_for(lambda: xids(exporter) == {("1", "79"): 1}, what="first XID")
    seen = [1.0]
    for _ in range(2):
        fake.inject_fault("xid", gpu=1, xid=79)
    fake.inject_fault("xid", gpu=0, xid=48)
    wait_for(lambda: xids(exporter) == {("1", "79"): 3, ("0", "48"): 1}, what="three more XIDs")
    # XID 79 means "fallen off the bus": the GPU is lost, but its counter stays (and stays put).
    fake.inject_fault("gpu_lost", gpu=1)
    up = lambda: {s.labels["gpu"]: s.value for s in samples(render(exporter), "foxhunt_gpu_up")}  # noqa: E731
    wait_for(lambda: up() == {"0": 1, "1": 0}, what="GPU 1 down")
    polls = exporter.poller.snapshot.polls.count
    while exporter.poller.snapshot.polls.count < polls + 3:
        seen.append(xids(exporter)[("1", "79")])
    assert seen == sorted(seen) and seen[-1] == 3
    series = [s for s in samples(render(exporter), "foxhunt_gpu_xid_errors_total") if s.labels["gpu"] == "1"][0]
    assert series.labels["uuid"].startswith("GPU-") and series.labels["hostname"] == "node-a"


def test_scenario_xid_arrives_on_its_time_line(make_exporter, clock):
    exporter, fake = make_exporter({"gpus": 2, "faults": [{"kind": "xid", "gpu": 0, "xid": 13, "at": 5}]}, clock=clock)
    exporter.poller.poll_once()
    assert fake.wait_xid_event(0.01) is None  # not yet: t=0
    clock.advance(5)
    event = fake.wait_xid_event(0.01)
    assert (event.gpu, event.xid) == (0, 13)
    assert fake.wait_xid_event(0.01) is None  # delivered once


def test_xid_wait_before_registration_is_an_error():
    from foxhunt_gpu_exporter.fake_backend import FakeBackend

    fake = FakeBackend({"gpus": 1})
    fake.init()
    try:
        fake.wait_xid_event(0.01)
    except NvmlError as e:
        assert e.code == ErrorCode.UNINITIALIZED
    else:
        raise AssertionError("expected UNINITIALIZED")


def test_counters_are_sorted_and_versioned():
    c = XidCounters()
    c.add(1, 79)
    c.add(0, 48)
    c.add(1, 79)
    assert c.items() == [((0, 48), 1), ((1, 79), 2)] and c.version == 3
