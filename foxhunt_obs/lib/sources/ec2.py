"""Running EC2 instances, in every configured region (money the cluster doesn't see).

``describe_instances`` through its paginator, instance states pending and running only (a stopped instance
bills no compute hours), so a forgotten GPU box outside the cluster shows up while it runs, not a day later
on the bill. Each region's client comes from the ``aws`` resource (lib/sources/aws.py: retries and
connect/read timeouts); a region that cannot be listed is an ``Ec2Error`` naming it, never a shorter list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.redact import scrub

BILLED_STATES = ("pending", "running")
PAGE_SIZE = 1000  # describe_instances' MaxResults limit
# kube_node_info's provider_id on EKS: aws:///<availability zone>/<instance id>
_PROVIDER_ID = re.compile(r"^aws://(?:/[^/]*)?/(i-[0-9a-f]+)$")


class Ec2Error(InputError, RuntimeError):
    """A region whose instances could not be listed."""


@dataclass(frozen=True)
class Ec2Instance:
    region: str
    instance_id: str
    instance_type: str
    state: str
    launch_time: datetime | None
    lifecycle: str  # "on-demand" (describe_instances leaves it out), "spot", "scheduled", "capacity-block"
    availability_zone: str
    tags: dict[str, str] = field(default_factory=dict)

    __hash__ = None  # dict field

    @property
    def name(self) -> str:
        return self.tags.get("Name", "")


def instance_id_of(provider_id: str) -> str | None:
    """The EC2 instance id in a Kubernetes node's spec.providerID (kube_node_info's provider_id label):
    ``aws:///us-east-1a/i-0410cf13f3a172fda`` -> ``i-0410cf13f3a172fda``; None for another provider."""
    m = _PROVIDER_ID.match((provider_id or "").strip())
    return m.group(1) if m else None


def _instance(region: str, raw: Mapping[str, Any]) -> Ec2Instance:
    launch = raw.get("LaunchTime")
    if isinstance(launch, datetime) and launch.tzinfo is None:
        launch = launch.replace(tzinfo=timezone.utc)
    lifecycle = raw.get("InstanceLifecycle") or "on-demand"  # "capacity-block" comes here too
    return Ec2Instance(
        region=region,
        instance_id=raw["InstanceId"],
        instance_type=raw.get("InstanceType", ""),
        state=(raw.get("State") or {}).get("Name", ""),
        launch_time=launch if isinstance(launch, datetime) else None,
        lifecycle=lifecycle,
        availability_zone=(raw.get("Placement") or {}).get("AvailabilityZone", ""),
        tags={t["Key"]: t.get("Value", "") for t in raw.get("Tags") or []},
    )


class Ec2Inventory:
    """``clients``: region -> boto3 EC2 client. ``running()`` lists every billed instance of every region."""

    def __init__(self, clients: Mapping[str, Any]):
        if not clients:
            raise ValueError("EC2 inventory: no region to list (set FOXHUNT_EC2_REGIONS or AWS_REGION)")
        self.clients = dict(clients)

    def running(self) -> list[Ec2Instance]:
        out: list[Ec2Instance] = []
        for region, client in self.clients.items():
            try:
                pages = client.get_paginator("describe_instances").paginate(
                    Filters=[{"Name": "instance-state-name", "Values": list(BILLED_STATES)}],
                    PaginationConfig={"PageSize": PAGE_SIZE},
                )
                for page in pages:
                    for reservation in page.get("Reservations") or []:
                        out += [_instance(region, raw) for raw in reservation.get("Instances") or []]
            except Exception as e:  # noqa: BLE001 - botocore's errors are many; each names the call
                raise Ec2Error(
                    f"EC2 {region}: describe_instances (states {', '.join(BILLED_STATES)}) failed: "
                    f"{scrub(f'{type(e).__name__}: {e}')}"
                ) from e
        return sorted(out, key=lambda i: (i.region, i.instance_id))
