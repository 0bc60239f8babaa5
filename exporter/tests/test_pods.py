"""Pod labels: sidecar (Downward API env), DaemonSet (kubelet PodResources, cached), and the gRPC client."""

from __future__ import annotations

import logging
from concurrent import futures

import pytest
from exporter_helpers import OPENMETRICS, families, render, samples, wait_for
from foxhunt_gpu_exporter.podresources import (
    LIST_METHOD,
    Allocation,
    PodRef,
    PodResourcesWatcher,
    StaticPod,
    build_mapping,
    device_key,
    kubelet_lister,
    podresources_messages,
    replica,
)


def pod_labels(exporter) -> dict[str, tuple[str, str, str]]:
    return {
        s.labels["gpu"]: (s.labels["pod"], s.labels["namespace"], s.labels["container"])
        for s in samples(render(exporter), "foxhunt_gpu_utilization_percent")
    }


def holder(s) -> tuple[str, str, str, str]:
    return s.labels["pod"], s.labels["namespace"], s.labels["container"], s.labels["vgpu"]


def test_sidecar_labels_from_downward_api_env(make_exporter):
    env = {"POD_NAME": "trainer-0", "POD_NAMESPACE": "rl-train", "CONTAINER_NAME": "learner"}
    exporter, _ = make_exporter({"gpus": 2}, pods=StaticPod.from_env(env))
    exporter.poller.poll_once()
    assert pod_labels(exporter) == {g: ("trainer-0", "rl-train", "learner") for g in "01"}
    up = samples(render(exporter), "foxhunt_gpu_up")[0]
    assert up.labels["pod"] == "trainer-0"


def test_sidecar_without_env_warns_and_labels_empty(caplog):
    with caplog.at_level(logging.WARNING, "foxhunt_gpu_exporter"):
        pods = StaticPod.from_env({})
    assert pods.pods_for("GPU-x", 0) == (PodRef("", "", ""),) and "POD_NAME" in caplog.text


def test_standalone_has_no_pod_labels(make_exporter):
    exporter, _ = make_exporter({"gpus": 1})
    exporter.poller.poll_once()
    assert "pod" not in samples(render(exporter), "foxhunt_gpu_up")[0].labels


def test_build_mapping():
    allocations = [
        Allocation("b-pod", "ns", "c", "nvidia.com/gpu", ("GPU-aaa", "GPU-bbb")),
        Allocation("x", "ns", "c", "example.com/nic", ("GPU-ccc",)),  # another resource: ignored
        Allocation("z-pod", "ns", "c", "nvidia.com/gpu", ("GPU-ddd::1",)),  # time-slicing replicas...
        Allocation("a-pod", "ns", "c", "nvidia.com/gpu", ("GPU-ddd::0",)),  # ...of one GPU: both hold it
        Allocation("a-pod", "aa-ns", "c", "nvidia.com/gpu", ("GPU-ddd::2",)),  # namespace sorts first
        Allocation("idx", "ns", "c", "nvidia.com/gpu", ("5",)),  # device plugin's index strategy
    ]
    mapping = build_mapping(allocations)
    assert mapping == {
        "GPU-aaa": (PodRef("b-pod", "ns", "c"),),
        "GPU-bbb": (PodRef("b-pod", "ns", "c"),),
        "GPU-ddd": (
            PodRef("a-pod", "aa-ns", "c", "2"),
            PodRef("a-pod", "ns", "c", "0"),
            PodRef("z-pod", "ns", "c", "1"),
        ),
        "5": (PodRef("idx", "ns", "c"),),
    }
    assert device_key("GPU-1::3") == "GPU-1" and replica("GPU-1::3") == "3" and replica("GPU-1") == ""


def test_build_mapping_one_container_with_two_replicas_holds_the_gpu_twice():
    # dcgm-exporter's virtual-GPU mode does the same: a series per replica held, told apart by `vgpu`
    ids = ("GPU-a::1", "GPU-a::0", "GPU-a::1")  # a replica listed twice is held once
    mapping = build_mapping([Allocation("p", "ns", "c", "nvidia.com/gpu", ids)])
    assert mapping == {"GPU-a": (PodRef("p", "ns", "c", "0"), PodRef("p", "ns", "c", "1"))}


def test_a_time_sliced_gpu_gets_one_series_per_pod_with_the_same_device_values(make_exporter):
    shared = []  # GPU 0's UUID, known once polled

    def lister():
        return [Allocation("trainer", "rl", "main", "nvidia.com/gpu", (f"{shared[0]}::0",)),
                Allocation("notebook", "dev", "jupyter", "nvidia.com/gpu", (f"{shared[0]}::3",))]  # fmt: skip

    watcher = PodResourcesWatcher(lister)
    exporter, _ = make_exporter({"gpus": 2}, pods=watcher)
    exporter.poller.poll_once()
    shared.append(exporter.poller.snapshot.gpus[0].identity.uuid)
    assert watcher.refresh()
    exporter.xids.add(0, 79)
    text = render(exporter)
    holders = [("notebook", "dev", "jupyter", "3"), ("trainer", "rl", "main", "0")]  # namespace/pod order
    for name in ("foxhunt_gpu_utilization_percent", "foxhunt_gpu_memory_used_bytes", "foxhunt_gpu_up",
                 "foxhunt_gpu_xid_errors_total"):  # fmt: skip
        series = {gpu: [] for gpu in "01"}
        for s in samples(text, name):
            series[s.labels["gpu"]].append((holder(s), s.value))
        assert [pod for pod, _ in series["0"]] == holders, name
        assert len({value for _, value in series["0"]}) == 1, name  # one device: the same value for each pod
        if name != "foxhunt_gpu_xid_errors_total":
            assert [pod for pod, _ in series["1"]] == [("", "", "", "")], name  # held by no pod: one series
    assert len(samples(text, "foxhunt_gpu_ecc_errors_total")) == (2 + 1) * 4  # every family, extra labels too
    assert 'vgpu="3"' in text and 'vgpu=""' in text  # "" is no label to Prometheus: unshared reads as before
    assert families(render(exporter, OPENMETRICS), openmetrics=True)  # label names consistent per family


def test_watcher_keeps_the_last_good_mapping(caplog):
    answers = [[Allocation("p", "ns", "c", "nvidia.com/gpu", ("GPU-1",))], OSError("kubelet restarting"),
               OSError("still"), []]  # fmt: skip

    def lister():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    watcher = PodResourcesWatcher(lister)
    held = (PodRef("p", "ns", "c"),)
    assert watcher.refresh() and watcher.pods_for("GPU-1", 0) == held and watcher.version == 1
    with caplog.at_level(logging.WARNING, "foxhunt_gpu_exporter"):
        assert not watcher.refresh() and not watcher.refresh()
    assert watcher.pods_for("GPU-1", 0) == held  # last good answer kept
    assert watcher.errors["podresources"] == 2 and caplog.text.count("PodResources List failed") == 1
    assert watcher.refresh() and watcher.pods_for("GPU-1", 0) == () and watcher.version == 2  # pod gone


def test_watcher_refreshes_on_its_own_thread_never_per_scrape(make_exporter):
    calls = []

    def lister():
        calls.append(1)
        return [Allocation("trainer", "rl", "main", "nvidia.com/gpu", (uuid0,))]

    watcher = PodResourcesWatcher(lister, interval=0.05)
    exporter, _ = make_exporter({"gpus": 2}, pods=watcher)
    exporter.poller.poll_once()
    uuid0 = exporter.poller.snapshot.gpus[0].identity.uuid
    watcher.start()
    wait_for(lambda: pod_labels(exporter)["0"] == ("trainer", "rl", "main"), what="pod labels")
    assert pod_labels(exporter)["1"] == ("", "", "")
    watcher.stop()
    before = len(calls)
    for _ in range(20):
        render(exporter)
        exporter.exposition.render("text/plain")
    assert len(calls) == before


def _kubelet(tmp_path, answer):
    """A real gRPC server on a unix socket, answering List like the kubelet."""
    grpc = pytest.importorskip("grpc")
    msgs = podresources_messages()
    served = []

    def list_handler(request, context):
        served.append(request)
        return answer(msgs)

    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {"List": grpc.unary_unary_rpc_method_handler(
            list_handler,
            request_deserializer=msgs["ListPodResourcesRequest"].FromString,
            response_serializer=msgs["ListPodResourcesResponse"].SerializeToString,
        )},
    )  # fmt: skip
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    socket_path = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    return server, str(socket_path), served


def test_grpc_client_against_a_real_server_on_a_unix_socket(tmp_path):
    def answer(msgs):
        return msgs["ListPodResourcesResponse"](pod_resources=[
            {"name": "trainer-0", "namespace": "rl-train", "containers": [
                {"name": "learner", "devices": [{"resource_name": "nvidia.com/gpu", "device_ids": ["GPU-a", "GPU-b"]}]},
                {"name": "sidecar", "devices": []},
            ]},
            {"name": "web", "namespace": "default", "containers": [{"name": "nginx"}]},
        ])  # fmt: skip

    server, socket_path, served = _kubelet(tmp_path, answer)
    try:
        lister = kubelet_lister(socket_path, timeout_s=5)
        assert lister() == [Allocation("trainer-0", "rl-train", "learner", "nvidia.com/gpu", ("GPU-a", "GPU-b"))]
        watcher = PodResourcesWatcher(lister)
        held = (PodRef("trainer-0", "rl-train", "learner"),)
        assert watcher.refresh() and watcher.pods_for("GPU-b", 1) == held
        assert len(served) == 2 and LIST_METHOD == "/v1.PodResourcesLister/List"
        lister.channel.close()
    finally:
        server.stop(None)


def test_grpc_client_error_keeps_serving(tmp_path):
    lister = kubelet_lister(str(tmp_path / "absent.sock"), timeout_s=0.2)
    watcher = PodResourcesWatcher(lister)
    assert not watcher.refresh() and watcher.errors["podresources"] == 1
    assert watcher.pods_for("GPU-a", 0) == ()
    lister.channel.close()


def test_daemonset_without_the_k8s_extra_serves_without_pod_labels(monkeypatch, caplog):
    import builtins

    from foxhunt_gpu_exporter import cli
    from foxhunt_gpu_exporter.poller import ErrorCounts

    real_import = builtins.__import__

    def no_grpc(name, *args, **kwargs):
        if name == "grpc" or name.startswith("google.protobuf"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_grpc)
    args = cli.parse_args(["--fake", "--mode", "daemonset"])
    with caplog.at_level(logging.WARNING, "foxhunt_gpu_exporter"):
        assert cli.make_pods(args, ErrorCounts()) is None
    assert caplog.text.count("k8s extra") == 1
