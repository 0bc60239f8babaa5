"""exporter/deploy: the image recipe and the Kubernetes manifests, checked field by field, with the
exporter's real command line parsing their arguments and one sidecar run with the manifest's env."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

from foxhunt_obs.sandbox.servers.local_server import free_port

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "exporter" / "deploy"
EXPORTER_SRC = REPO / "exporter"  # run from source: `make install` does not install the exporter package
EXPORTER_LABELS = {"app.kubernetes.io/name": "foxhunt-gpu-exporter"}


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def one(name: str, kind: str) -> dict:
    found = [d for d in docs(name) if d["kind"] == kind]
    assert len(found) == 1, f"{name}: expected one {kind}, found {len(found)}"
    return found[0]


def env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def field_ref(container: dict, name: str) -> str | None:
    return env(container).get(name, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.fixture(scope="module")
def daemonset():
    return one("daemonset.yaml", "DaemonSet")


@pytest.fixture(scope="module")
def exporter_container(daemonset):
    (c,) = daemonset["spec"]["template"]["spec"]["containers"]
    return c


@pytest.fixture(scope="module")
def job():
    return one("sidecar-job.yaml", "Job")


def job_containers(job: dict) -> tuple[dict, dict]:
    spec = job["spec"]["template"]["spec"]
    (sidecar,) = [c for c in spec.get("initContainers", []) if c["name"] == "gpu-exporter"]
    (trainer,) = spec["containers"]
    return sidecar, trainer


# ---------------------------------------------------------------- Dockerfile


def test_dockerfile_builds_a_non_root_exporter_image():
    text = (DEPLOY / "Dockerfile").read_text()
    instructions = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    froms = [i.split()[1] for i in instructions if i.startswith("FROM ")]
    assert froms and all(f == "python:3.11-slim" for f in froms), froms
    assert re.search(r"pip install .*'\.\[k8s\]'", text), "install the exporter with its k8s extra"
    users = [i.split()[1] for i in instructions if i.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root"), "the image must run as a non-root user"
    assert users[-1].split(":")[0].isdigit(), "a numeric uid, so Kubernetes can verify runAsNonRoot"
    assert "EXPOSE 9094" in instructions
    assert instructions[-1] == 'ENTRYPOINT ["foxhunt-gpu-exporter"]'


def test_dockerignore_keeps_what_pip_needs():
    ignored = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    for needed in ("pyproject.toml", "README.md", "foxhunt_gpu_exporter"):
        assert needed not in ignored


# ---------------------------------------------------------------- DaemonSet, Service, ServiceMonitor


def test_daemonset_runs_on_gpu_training_nodes(daemonset):
    assert daemonset["metadata"]["namespace"] == "monitoring"
    spec = daemonset["spec"]
    assert selects(spec["selector"]["matchLabels"], spec["template"]["metadata"]["labels"])
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"role": "gpu-training"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


def test_daemonset_sees_gpus_without_requesting_one(daemonset, exporter_container):
    pod = daemonset["spec"]["template"]["spec"]
    e = env(exporter_container)
    assert (
        pod.get("runtimeClassName") == "nvidia" or e.get("NVIDIA_VISIBLE_DEVICES", {}).get("value") == "all"
    )
    assert "nvidia.com/gpu" not in str(exporter_container.get("resources", {})), (
        "would take a GPU from training"
    )


def test_daemonset_mounts_pod_resources_read_only(daemonset, exporter_container):
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [
        m for m in exporter_container["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pod-resources"
    ]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"


def test_daemonset_container(exporter_container):
    c = exporter_container
    assert c["args"][c["args"].index("--mode") + 1] == "daemonset", (
        "without --mode the exporter sets no pod labels"
    )
    assert field_ref(c, "NODE_NAME") == "spec.nodeName"
    assert "POD_NAME" not in env(c), "the exporter pod's own name must not label the node's GPUs"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 9094}
    probe = c["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and probe["port"] in ("metrics", 9094)
    res = c["resources"]
    for key in ("cpu", "memory"):
        assert res["requests"][key] and res["limits"][key]
    assert res["requests"] == {"cpu": "50m", "memory": "64Mi"} and res["limits"] == {
        "cpu": "200m",
        "memory": "128Mi",
    }
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]


def test_service_exposes_the_daemonset_metrics_port(daemonset):
    svc = one("service.yaml", "Service")
    assert svc["metadata"]["namespace"] == "monitoring"
    assert selects(svc["spec"]["selector"], daemonset["spec"]["template"]["metadata"]["labels"])
    (port,) = svc["spec"]["ports"]
    assert port["name"] == "metrics" and port["port"] == 9094 and port["targetPort"] in ("metrics", 9094)


def test_servicemonitor_scrapes_every_15s_keeping_the_exporters_pod_labels():
    sm = one("servicemonitor.yaml", "ServiceMonitor")
    svc = one("service.yaml", "Service")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["namespace"] == "monitoring"
    assert selects(sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"])
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] == "metrics" and ep["interval"] == "15s"
    assert ep["honorLabels"] is True, "else the GPU holder's pod label becomes exported_pod"
    relabel = ep["relabelings"]
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
        "action": "replace",
    } in relabel
    # with honorLabels, an unallocated GPU would otherwise get the exporter pod's own pod label
    drops = [r["regex"] for r in relabel if r.get("action") == "labeldrop"]
    assert drops and all(re.fullmatch(drops[0], x) for x in ("pod", "namespace", "container"))


# ---------------------------------------------------------------- sidecar Job


def test_sidecar_reads_its_pod_from_the_downward_api(job):
    sidecar, trainer = job_containers(job)
    assert sidecar["args"][sidecar["args"].index("--mode") + 1] == "sidecar"
    assert field_ref(sidecar, "POD_NAME") == "metadata.name"
    assert field_ref(sidecar, "POD_NAMESPACE") == "metadata.namespace"
    assert field_ref(sidecar, "NODE_NAME") == "spec.nodeName"
    assert env(sidecar)["CONTAINER_NAME"]["value"] == trainer["name"], "CONTAINER_NAME must name the trainer"


def test_sidecar_lets_the_job_complete_and_ports_do_not_clash(job):
    sidecar, trainer = job_containers(job)
    assert sidecar["restartPolicy"] == "Always", "a native sidecar, or the Job never completes"
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")
    ports = [p["containerPort"] for c in (sidecar, trainer) for p in c["ports"]]
    assert len(ports) == len(set(ports)), f"containers of one pod share ports: {ports}"
    listen = sidecar["args"][sidecar["args"].index("--listen-address") + 1]
    assert int(listen.rsplit(":", 1)[1]) == sidecar["ports"][0]["containerPort"]
    assert sidecar["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_trainer_sends_traces_to_tempo(job):
    _, trainer = job_containers(job)
    assert env(trainer)["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"].endswith(":4317")
    assert trainer["resources"]["limits"]["nvidia.com/gpu"]


def test_job_runs_on_gpu_nodes_and_is_scraped_by_its_podmonitor(job):
    pod = job["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"role": "gpu-training"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]
    assert re.match("training", job["metadata"]["name"]), (
        "the GPU fleet dashboard's default $pod is training.*"
    )
    pm = one("sidecar-job.yaml", "PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["namespace"] == job["metadata"]["namespace"]
    assert selects(pm["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    sidecar, trainer = job_containers(job)
    endpoints = {e["port"]: e for e in pm["spec"]["podMetricsEndpoints"]}
    assert set(endpoints) == {sidecar["ports"][0]["name"], trainer["ports"][0]["name"]}
    assert all(e["interval"] == "15s" for e in endpoints.values())
    assert endpoints[sidecar["ports"][0]["name"]]["honorLabels"] is True


def test_manifests_use_one_exporter_image(exporter_container, job):
    sidecar, _ = job_containers(job)
    assert sidecar["image"] == exporter_container["image"]


# ---------------------------------------------------------------- against the real exporter


def _exporter_cli():
    if str(EXPORTER_SRC) not in sys.path:
        sys.path.insert(0, str(EXPORTER_SRC))
    import foxhunt_gpu_exporter.cli

    return foxhunt_gpu_exporter.cli


def test_the_exporter_cli_accepts_the_manifests_arguments(exporter_container, job):
    cli = _exporter_cli()
    sidecar, _ = job_containers(job)
    assert cli.parse_args(exporter_container["args"]).mode == "daemonset"
    args = cli.parse_args(sidecar["args"])
    assert args.mode == "sidecar" and args.listen_address == ":9095"


@pytest.mark.servers
def test_the_sidecar_labels_gpus_with_its_pod(job, tmp_path):
    """Run the exporter (fake GPUs) with the sidecar's args and env, the Downward API values filled in."""
    sidecar, trainer = job_containers(job)
    downward = {
        "metadata.name": "training-ppo-policy-fold-0-x7k2q",
        "metadata.namespace": "training",
        "spec.nodeName": "gpu-node-1",
    }
    child_env = {
        k: v for k, v in os.environ.items() if k not in ("POD_NAME", "POD_NAMESPACE", "CONTAINER_NAME")
    }
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXPORTER_SRC), os.environ.get("PYTHONPATH")]))
    for e in sidecar["env"]:
        child_env[e["name"]] = (
            e["value"] if "value" in e else downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
        )
    port = free_port()
    args = list(sidecar["args"])
    args[args.index("--listen-address") + 1] = f"127.0.0.1:{port}"
    log = (tmp_path / "exporter.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "foxhunt_gpu_exporter.cli", *args, "--fake", "--interval", "0.5"],
        env=child_env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, f"exporter exited: {(tmp_path / 'exporter.log').read_text()[-2000:]}"
            try:
                if requests.get(f"{url}/healthz", timeout=1).status_code == 200:
                    body = requests.get(f"{url}/metrics", timeout=5).text
                    if "foxhunt_gpu_utilization_percent{" in body:
                        break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "exporter not serving GPU metrics after 15 s"
            time.sleep(0.2)
        series = [line for line in body.splitlines() if line.startswith("foxhunt_gpu_utilization_percent{")]
        for line in series:
            assert f'pod="{downward["metadata.name"]}"' in line, line
            assert 'namespace="training"' in line and f'container="{trainer["name"]}"' in line, line
            assert 'hostname="gpu-node-1"' in line, f"NODE_NAME should name the host: {line}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
