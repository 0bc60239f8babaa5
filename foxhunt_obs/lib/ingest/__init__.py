"""Source answers into canonical rows: the metric catalog, GPU and node series with their holder pods, MIG shares, the recording rules generated from the same catalog, and the MLflow sync."""
