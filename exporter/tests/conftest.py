"""Fixtures: a manual clock and fake-backed exporters that are always stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from exporter_helpers import ManualClock
from foxhunt_gpu_exporter.app import Exporter
from foxhunt_gpu_exporter.fake_backend import FakeBackend


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make_exporter() -> Iterator[Callable[..., tuple[Exporter, FakeBackend]]]:
    """Build (exporter, fake) pairs; everything started is stopped (and any hang released) afterwards."""
    made: list[tuple[Exporter, FakeBackend]] = []

    def make(scenario=None, *, clock=None, **options) -> tuple[Exporter, FakeBackend]:
        fake = FakeBackend(scenario, clock=clock)
        options.setdefault("hostname", "node-a")
        options.setdefault("xid_timeout_s", 0.05)
        exporter = Exporter(fake, **options)
        made.append((exporter, fake))
        return exporter, fake

    yield make
    for exporter, fake in made:
        fake.release_hang()
        exporter.stop()
