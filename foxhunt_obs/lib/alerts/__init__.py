"""Alert rules (docs/design.md#alerts): the catalog (`catalog`) and its Prometheus export (`prometheus_rules`)."""

from foxhunt_obs.lib.alerts.rules import (
    SEVERITIES,
    SOURCES,
    Rule,
    RuleCatalogError,
    alert_name,
    format_duration,
    load_rules,
    parse_duration,
)

__all__ = [
    "SEVERITIES",
    "SOURCES",
    "Rule",
    "RuleCatalogError",
    "alert_name",
    "format_duration",
    "load_rules",
    "parse_duration",
]
