"""Which pod holds which GPU: the `pod`, `namespace`, `container` labels.

* Sidecar mode: the exporter runs inside the pod that owns the GPUs it sees; the Downward API puts the
  pod's identity into env vars (POD_NAME, POD_NAMESPACE; CONTAINER_NAME is set literally in the manifest,
  the Downward API has no field for it).
* DaemonSet mode: the kubelet PodResources `List` API on its unix socket says which container was given
  which device of resource `nvidia.com/gpu`; the device ids are GPU UUIDs (or indexes, with the device
  plugin's index strategy). A background thread refreshes it every ~15 s and keeps the last good answer:
  scrapes never call the kubelet. A time-sliced GPU's replicas (`GPU-...::3`) are handed to several pods:
  every one of them is a holder of that GPU, with its replica number as `vgpu` (dcgm-exporter's
  --kubernetes-virtual-gpus mode).

The gRPC client needs the `k8s` extra (grpcio, protobuf). The four messages it reads are built at run time
from a descriptor with the protobuf runtime, so no generated code or protoc is needed.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from .poller import ErrorCounts

log = logging.getLogger(__name__)

KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCE = "nvidia.com/gpu"
LIST_METHOD = "/v1.PodResourcesLister/List"  # k8s.io/kubelet/pkg/apis/podresources/v1, package `v1`
ENV_POD, ENV_NAMESPACE, ENV_CONTAINER = "POD_NAME", "POD_NAMESPACE", "CONTAINER_NAME"


@dataclass(frozen=True)
class PodRef:
    """A container holding a GPU."""

    pod: str
    namespace: str
    container: str
    vgpu: str = ""  # the time-slicing replica it holds (the id's part after `::`); "" for a whole GPU


@dataclass(frozen=True)
class Allocation:
    """One container's devices of one resource, as the kubelet lists them."""

    pod: str
    namespace: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


class PodSource(Protocol):
    def pods_for(self, uuid: str, index: int) -> tuple[PodRef, ...]: ...  # () when no pod holds it


class StaticPod:
    """Sidecar mode: every GPU this exporter sees belongs to its own pod."""

    def __init__(self, ref: PodRef):
        self.ref = ref

    def pods_for(self, uuid: str, index: int) -> tuple[PodRef, ...]:
        return (self.ref,)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> StaticPod:
        ref = PodRef(env.get(ENV_POD, ""), env.get(ENV_NAMESPACE, ""), env.get(ENV_CONTAINER, ""))
        if not ref.pod:
            log.warning("sidecar mode but %s is not set (Downward API: metadata.name): pod label empty", ENV_POD)
        return cls(ref)


def device_key(device_id: str) -> str:
    """GPU UUID (or index) of a device id; time-slicing replicas look like `GPU-...::3`."""
    return device_id.split("::", 1)[0]


def replica(device_id: str) -> str:
    """The time-slicing replica of a device id (`GPU-...::3` -> "3"); "" for a whole GPU."""
    return device_id.partition("::")[2]


def _order(ref: PodRef) -> tuple[str, str, str, str]:
    return ref.namespace, ref.pod, ref.container, ref.vgpu


def build_mapping(
    allocations: Iterable[Allocation], resource: str = GPU_RESOURCE
) -> dict[str, tuple[PodRef, ...]]:
    """Device key -> every container holding it (one per replica held), sorted by namespace/pod/container."""
    holders: dict[str, set[PodRef]] = {}
    for a in allocations:
        if a.resource != resource:
            continue
        for device_id in a.device_ids:
            ref = PodRef(a.pod, a.namespace, a.container, replica(device_id))
            holders.setdefault(device_key(device_id), set()).add(ref)
    return {key: tuple(sorted(refs, key=_order)) for key, refs in holders.items()}


class PodResourcesWatcher:
    """DaemonSet mode: GPU -> pod from a lister, refreshed on its own thread, last good answer kept."""

    def __init__(
        self,
        lister: Callable[[], Iterable[Allocation]],
        *,
        resource: str = GPU_RESOURCE,
        interval: float = 15.0,
        errors: ErrorCounts | None = None,
    ):
        self.lister, self.resource, self.interval = lister, resource, interval
        self.errors = errors or ErrorCounts()
        self._mapping: Mapping[str, tuple[PodRef, ...]] = MappingProxyType({})
        self._failing = False
        self.version = 0  # bumped when the mapping changes: part of the exposition cache key
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pods_for(self, uuid: str, index: int) -> tuple[PodRef, ...]:
        mapping = self._mapping  # one reference read: a refresh swaps the whole mapping
        return mapping.get(uuid) or mapping.get(str(index)) or ()

    def refresh(self) -> bool:
        try:
            mapping = build_mapping(self.lister(), self.resource)
        except Exception as e:  # grpc.RpcError, OSError, ...: keep serving the last good mapping
            self.errors.inc("podresources")
            if not self._failing:
                log.warning("PodResources List failed: %s; keeping the last good pod labels", e)
            self._failing = True
            return False
        if self._failing:
            log.info("PodResources List answers again: %d GPU(s) assigned", len(mapping))
        self._failing = False
        if mapping != self._mapping:
            self._mapping = MappingProxyType(mapping)
            self.version += 1
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="foxhunt-podresources", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            self.refresh()
            if self._stop.wait(self.interval):
                return


def podresources_messages() -> dict[str, Any]:
    """Message classes for the part of podresources/v1 we read (unknown fields are skipped on parse)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="foxhunt/podresources_v1.proto", package="v1", syntax="proto3")
    F = descriptor_pb2.FieldDescriptorProto
    string, message, repeated = F.TYPE_STRING, F.TYPE_MESSAGE, F.LABEL_REPEATED

    def add(name: str, *fields: tuple) -> None:
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            field = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name

    add("ListPodResourcesRequest")
    add("ListPodResourcesResponse", ("pod_resources", 1, message, repeated, ".v1.PodResources"))
    add(
        "PodResources",
        ("name", 1, string, F.LABEL_OPTIONAL, ""),
        ("namespace", 2, string, F.LABEL_OPTIONAL, ""),
        ("containers", 3, message, repeated, ".v1.ContainerResources"),
    )
    add(
        "ContainerResources",
        ("name", 1, string, F.LABEL_OPTIONAL, ""),
        ("devices", 2, message, repeated, ".v1.ContainerDevices"),
    )
    add(
        "ContainerDevices",
        ("resource_name", 1, string, F.LABEL_OPTIONAL, ""),
        ("device_ids", 2, string, repeated, ""),
    )
    pool = descriptor_pool.DescriptorPool()  # private: never clashes with another `v1` package
    pool.Add(fdp)
    names = ("ListPodResourcesRequest", "ListPodResourcesResponse", "PodResources", "ContainerResources",
             "ContainerDevices")  # fmt: skip
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{n}")) for n in names}


def kubelet_lister(socket_path: str = KUBELET_SOCKET, timeout_s: float = 5.0) -> Callable[[], list[Allocation]]:
    """A lister over the kubelet's PodResources gRPC socket. Raises ImportError without the k8s extra."""
    import grpc

    msgs = podresources_messages()
    request_cls, response_cls = msgs["ListPodResourcesRequest"], msgs["ListPodResourcesResponse"]
    # A busy node's answer can pass gRPC's default 4 MiB receive limit.
    channel = grpc.insecure_channel(f"unix://{socket_path}", options=[("grpc.max_receive_message_length", 16 << 20)])
    call = channel.unary_unary(
        LIST_METHOD, request_serializer=request_cls.SerializeToString, response_deserializer=response_cls.FromString
    )

    def list_allocations() -> list[Allocation]:
        response = call(request_cls(), timeout=timeout_s)
        return [
            Allocation(p.name, p.namespace, c.name, d.resource_name, tuple(d.device_ids))
            for p in response.pod_resources
            for c in p.containers
            for d in c.devices
        ]

    list_allocations.channel = channel  # type: ignore[attr-defined]  # closed by tests
    return list_allocations
