"""Clients of the outside systems (Prometheus, MLflow, AWS): each call bounded in time, each failure named."""
