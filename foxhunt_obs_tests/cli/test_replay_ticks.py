"""The demo replay's before_tick (cli/demo.py ReplayTicks) against a real moto server: moto is told the
scenario's running instances only when that set changes, and at every tick moto's running instances are
exactly the scenario's (bills.instances: a node's instance, replaced after its outage; a stray while it
runs) — what calling moto_server.set_ec2_as_of at every tick gives."""

import dataclasses
import logging
from datetime import datetime, timedelta, timezone

import pytest

from foxhunt_obs.cli.demo import ReplayTicks
from foxhunt_obs.lib.sources.aws import AwsConfig
from foxhunt_obs.sandbox.servers.moto_server import MotoServer
from foxhunt_obs.sandbox.story.aws_scenario import StrayInstance
from foxhunt_obs.sandbox.story.scenario import load_scenario
from foxhunt_obs.sandbox.writers import bills

pytestmark = [pytest.mark.servers, pytest.mark.timeout(180)]

T0 = datetime(2026, 11, 16, tzinfo=timezone.utc)
EVERY_S = 600


def stray(name: str, instance_type: str, start_h: float, end_h: float) -> StrayInstance:
    s, e = T0 + timedelta(hours=start_h), T0 + timedelta(hours=end_h)
    return StrayInstance(
        "stray_instance", name, instance_type, "", s, e, int(start_h * 3600), int(end_h * 3600)
    )


def running(ec2) -> set[str]:
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    )
    return {i["InstanceId"] for page in pages for r in page["Reservations"] for i in r["Instances"]}


def test_moto_follows_the_scenario_tick_by_tick_told_only_of_changes(tmp_path, caplog):
    small = load_scenario("small")  # 6 hours; ip-10-0-1-12 lost 03:00-05:00
    scenario = dataclasses.replace(
        small,
        aws=dataclasses.replace(
            small.aws, incidents=small.aws.incidents + (stray("bench-p5", "p5.48xlarge", 1, 2.5),)
        ),
    )
    with MotoServer(workdir=tmp_path, account_id=scenario.aws.account_id) as moto:
        ec2 = AwsConfig(
            region_name=scenario.aws.region,
            endpoint_url=moto.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).client("ec2")
        ticks = ReplayTicks(scenario, moto.url, scenario.start, scenario.end, EVERY_S)
        everything = bills.instances(scenario) + bills.stray_instances(scenario)
        now, seen = scenario.start, []
        with caplog.at_level(logging.INFO, logger="foxhunt_obs.cli"):
            while now <= scenario.end:
                ticks(now)
                truth = {i.instance_id for i in everything if i.start <= now < i.end}
                assert running(ec2) == truth, now
                seen.append(frozenset(truth))
                now += timedelta(seconds=EVERY_S)
    # 37 ticks; the set changes at 00:00 (first), 01:00 (p5 on), 02:30 (p5 off), 03:00 (node lost),
    # 05:00 (its replacement) and 06:00 (the scenario's end: nothing runs)
    changes = 1 + sum(a != b for a, b in zip(seen, seen[1:]))
    assert len(seen) == 37 and changes == 6
    assert ticks.moto_calls == changes
    progress = [r.getMessage() for r in caplog.records if r.name == "foxhunt_obs.cli.demo"]
    assert progress == [
        "alert replay: tick 1 of 37 (11-16 00:00 UTC)",
        "alert replay: tick 37 of 37 (11-16 06:00 UTC)",
    ]
