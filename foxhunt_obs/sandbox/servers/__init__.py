"""Real local servers (Prometheus, MLflow, moto, Alertmanager) and the Slack Web API stand-in, started on 127.0.0.1 and stopped by PID."""
