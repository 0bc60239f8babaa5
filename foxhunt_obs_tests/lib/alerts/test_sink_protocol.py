"""Every sink is an AlertSink and is called one way: the engine's `deliver` and `deliver_all` hand each
sink the notifications, the sinks that took them already and the deadline, whatever kind it is."""

from __future__ import annotations

import inspect
from datetime import datetime, timezone

import pytest

from foxhunt_obs.lib.alerts.engine import deliver, transition_key
from foxhunt_obs.lib.delivery.alert_sinks import (
    AlertmanagerSink,
    AlertSink,
    AlertSinkError,
    LakeAlertSink,
    Notification,
    SlackAlertSink,
    WebhookSink,
    deliver_all,
)

NOW = datetime(2026, 11, 28, 10, tzinfo=timezone.utc)


def _note(fingerprint: str) -> Notification:
    return Notification(
        rule="gpu_overheat",
        fingerprint=fingerprint,
        status="firing",
        severity="warning",
        labels={"node": "ip-1"},
        summary="hot",
        description="",
        value=91.0,
        starts_at=NOW,
        ends_at=None,
        generator_url="",
    )


class Recording:
    """A sink that takes everything (or refuses, with `refuse`) and records how it was called."""

    def __init__(self, name: str, refuse: bool = False):
        self.name = name
        self.target = f"test://{name}"
        self.refuse = refuse
        self.calls: list[tuple[list[str], tuple[str, ...], float | None]] = []

    def send(self, notifications, *, sent_to=(), deadline=None) -> None:
        self.calls.append(([n.fingerprint for n in notifications], tuple(sent_to), deadline))
        if self.refuse:
            raise AlertSinkError(self.name, self.target, "refused")


def test_every_sink_has_the_protocols_send():
    expected = inspect.signature(AlertSink.send)
    for cls in (AlertmanagerSink, SlackAlertSink, WebhookSink, LakeAlertSink):
        assert inspect.signature(cls.send) == expected, cls.__name__


def test_deliver_all_tells_every_sink_who_took_them_before_it():
    a, down, b = Recording("a"), Recording("down", refuse=True), Recording("b")
    notes = [_note("fp-1")]
    assert deliver_all([a, down, b], notes) == {"a": None, "down": "down test://down: refused", "b": None}
    assert a.calls == [(["fp-1"], (), None)]
    assert down.calls == [(["fp-1"], ("a",), None)]
    assert b.calls == [(["fp-1"], ("a",), None)]


@pytest.mark.parametrize("sink_budget_s", [None, 5.0])
def test_the_engine_calls_every_sink_alike(sink_budget_s):
    a, down, b = Recording("a"), Recording("down", refuse=True), Recording("b")
    notes = [_note("fp-1"), _note("fp-2")]
    keys = [transition_key(n) for n in notes]
    took = {keys[0]: ["b"], keys[1]: []}  # b took fp-1 on an earlier tick

    failed, posted = deliver([a, down, b], notes, keys, took, lambda: False, sink_budget_s=sink_budget_s)

    assert set(failed) == {"down"} and posted == {("a", "fp-1"), ("a", "fp-2"), ("b", "fp-2")}
    assert [c[:2] for c in a.calls] == [(["fp-1", "fp-2"], ("b",))]
    assert [c[:2] for c in down.calls] == [(["fp-1", "fp-2"], ("a", "b"))]
    assert [c[:2] for c in b.calls] == [(["fp-2"], ("a",))]
    deadlines = [c[2] for s in (a, down, b) for c in s.calls]
    assert (
        all(d is None for d in deadlines) if sink_budget_s is None else all(d is not None for d in deadlines)
    )
    assert took == {keys[0]: ["b", "a"], keys[1]: ["a", "b"]}
