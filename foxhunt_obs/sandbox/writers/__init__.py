"""Writers that turn a scenario into the sources' own formats: OpenMetrics history, bills, MLflow runs."""
