"""The demo's first history build (prometheus.build_tsdb with records_from): every series, the recording
rules only from the rule piece holding that time, no cost rules. Where it has records they are exactly the
whole build's (the same pieces, promtool aligning every evaluation to the group); before, none; and the
demo asks from early enough for every range its alert rules read."""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest

from foxhunt_obs.cli.demo import RECORDS_MARGIN, records_needed
from foxhunt_obs.sandbox.servers import prometheus
from foxhunt_obs.sandbox.servers.prometheus import (
    PrometheusServer,
    build_tsdb,
    copy_tsdb,
    records_start,
    tsdb_path,
)
from foxhunt_obs.sandbox.story.scenario import load_scenario
from foxhunt_obs.sandbox.writers.cache import COMPLETE

pytestmark = pytest.mark.timeout(600)

T0 = datetime(2026, 11, 16, tzinfo=timezone.utc)
RECORDS = '{__name__=~"foxhunt:.+"}'


def samples(url: str, before: datetime, seconds: int) -> list:
    """Every recorded sample stored in (before - seconds, before]: the raw samples (a range selector),
    not a query's look-back, which would reach across the piece's start."""
    params = urllib.parse.urlencode({"query": f"{RECORDS}[{seconds}s]", "time": before.timestamp()})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=30) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return sorted((json.dumps(x["metric"], sort_keys=True), x["values"]) for x in body["data"]["result"])


@pytest.mark.servers
def test_records_from_a_piece_on_are_the_whole_builds(tmp_path, monkeypatch):
    small = load_scenario("small")  # 6 hours
    from foxhunt_obs.sandbox.writers.openmetrics import ALL_METRICS

    raw = build_tsdb(small, tmp_path / "cache", metrics=set(ALL_METRICS))  # the series, no rules
    monkeypatch.setattr(prometheus, "RULE_CHUNK_S", 3600)
    first = records_start(small, T0 + timedelta(hours=3, minutes=20))
    assert first == (T0 + timedelta(hours=3)).timestamp()
    answers = []
    for start in (None, first):
        work = tmp_path / f"from-{start}"
        tsdb = copy_tsdb(raw, work / "tsdb")
        prometheus.backfill_recording_rules(small, tsdb, work, start)
        with PrometheusServer(tsdb, workdir=work) as srv:
            # before the piece: (00:00, 02:59:59]; from it: (02:59:59, 06:00]
            cut = T0 + timedelta(hours=3) - timedelta(seconds=1)
            answers.append([samples(srv.url, cut, 3 * 3600), samples(srv.url, small.end, 3 * 3600 + 1)])
    (whole_before, whole_after), (part_before, part_after) = answers
    assert len(whole_after) > 10 and sum(len(v) for _, v in whole_after) > 1000
    assert part_after == whole_after
    assert whole_before and part_before == []


def test_records_start_is_a_piece_of_the_whole_backfill():
    small = load_scenario("small")  # 00:00-06:00: pieces at 00:00, 02:00, 04:00
    start = int(small.start.timestamp())
    assert prometheus.RULE_CHUNK_S == 7200
    assert records_start(small, small.start - timedelta(days=3)) == start  # before the scenario: all of it
    assert records_start(small, T0 + timedelta(hours=3, minutes=59)) == start + 7200
    assert records_start(small, small.end + timedelta(days=3)) == start + 4 * 3600  # its last piece
    # the demo's replay starts 11-21 09:00 (an hour before the stray instance), less the 2-hour margin
    default = load_scenario("default")
    assert records_needed("default") == datetime(2026, 11, 21, 7, tzinfo=timezone.utc)
    assert (
        records_start(default, records_needed("default"))
        == datetime(2026, 11, 21, 6, tzinfo=timezone.utc).timestamp()
    )


def test_a_whole_build_already_there_is_used(tmp_path):
    small = load_scenario("small")
    whole = tsdb_path(small, tmp_path)
    (whole).mkdir(parents=True)
    (whole.parent / COMPLETE).write_text("built\n")
    assert build_tsdb(small, tmp_path, records_from=small.start + timedelta(hours=3)) == whole
    part = tsdb_path(small, tmp_path, records_from=small.start + timedelta(hours=3))
    assert part != whole and part.parent.name.endswith("-from20261116T0200")


def test_the_margin_covers_every_range_the_alert_rules_read():
    from foxhunt_obs.lib.alerts.rules import load_rules

    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    ranges = [
        int(n) * units[u]
        for rule in load_rules(overrides="")
        if rule.enabled and rule.source == "prometheus"
        for n, u in re.findall(r"\[(\d+)([smhdw])(?::[^\]]*)?\]", rule.expr())
    ]
    # a query also looks back 5 minutes: the sandbox's Prometheus runs with the default
    # --query.lookback-delta, 5m (`prometheus --help`, Debian's 2.42)
    assert ranges and max(ranges) + 300 <= RECORDS_MARGIN.total_seconds()
