"""foxhunt-gpu-exporter: a per-node NVML GPU exporter for Prometheus (the live path of foxhunt_obs).

Modules, one job each: backend (interface, readings, NVML error codes), nvml_backend (pynvml), fake_backend
(JSON scenarios), snapshot (immutable poll results), poller (the one device thread + watchdog), events (XID
counters), podresources (pod labels), collector (prometheus_client Collector over the snapshot),
exposition (render once per change), server (HTTP/TLS/basic auth), app (wiring), cli (the console script).
training/ is the library trainers import: the training metric contract on :9094, the in-process GPU poller,
one MLflow run and one span per fold (`from foxhunt_gpu_exporter import training`).
"""

__version__ = "0.1.0"
