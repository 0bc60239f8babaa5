"""Source answers into canonical rows: the metric catalog, GPU and node series with their holder pods, MIG shares, and the recording rules generated from the same catalog."""
