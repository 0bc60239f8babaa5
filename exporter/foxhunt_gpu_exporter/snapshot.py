"""The immutable result of one poll cycle: what every scrape renders, and all that it reads.

The poller builds a new Snapshot each cycle and swaps one reference; scrapes read whichever Snapshot is
current. Nothing here is ever mutated, so readers need no lock and can never see half a cycle.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .backend import Clocks, Ecc, GpmActivity, GpuIdentity, Memory, Nvlink, RemappedRows, Utilization

# Poll-duration histogram buckets (seconds): a healthy NVML poll of 8 GPUs takes a few ms; the top
# buckets catch a driver that is slowing down before the watchdog calls it stuck.
POLL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class GpuReading:
    index: int
    up: bool
    identity: GpuIdentity | None  # None when the GPU failed before it could be identified
    memory: Memory | None = None
    utilization: Utilization | None = None
    temperature: float | None = None
    power: float | None = None
    energy: float | None = None
    clocks: Clocks | None = None
    clock_events: int | None = None
    ecc: Ecc | None = None
    pcie_replays: int | None = None
    nvlink: Nvlink | None = None
    remapped_rows: RemappedRows | None = None
    gpm: GpmActivity | None = None  # None also on a GPU's first poll: GPM needs two samples

    def down(self) -> GpuReading:
        """The same GPU with up=0 and every reading dropped (identity kept for the up/info labels)."""
        return GpuReading(index=self.index, up=False, identity=self.identity)


@dataclass(frozen=True)
class PollStats:
    """Cumulative poll-duration histogram: bucket counts are per bucket (not cumulative)."""

    bucket_counts: tuple[int, ...] = (0,) * (len(POLL_BUCKETS) + 1)
    total_seconds: float = 0.0
    count: int = 0

    def observe(self, seconds: float) -> PollStats:
        i = next((k for k, b in enumerate(POLL_BUCKETS) if seconds <= b), len(POLL_BUCKETS))
        counts = list(self.bucket_counts)
        counts[i] += 1
        return PollStats(tuple(counts), self.total_seconds + seconds, self.count + 1)


@dataclass(frozen=True)
class Snapshot:
    taken_at: float = 0.0  # unix seconds
    hostname: str = ""
    driver: str = ""
    nvml_up: bool = False
    init_error_code: int = 0  # the last NVML init attempt's error code; 0 once init succeeded
    gpus: tuple[GpuReading, ...] = ()
    polls: PollStats = PollStats()
    last_success: float = 0.0  # unix seconds of the last poll that reached NVML; 0 = never

    def all_down(self) -> Snapshot:
        return dataclasses.replace(self, nvml_up=False, gpus=tuple(g.down() for g in self.gpus))
