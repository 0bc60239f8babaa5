"""The alert rule catalog (docs/design.md#alerts): foxhunt_obs/data/alert_rules.yaml, optionally overridden.

One list of `Rule`s serves both paths: the Dagster sensors evaluate every enabled rule each tick, and the
rules with `promql` are also exported as Prometheus alerting rules (`prometheus_rules.py`). Loading is
strict: an unknown field, severity or source, a duplicate id, PromQL on a non-Prometheus rule or a
`$placeholder` without its threshold is a `RuleCatalogError` naming the file and the rule.

Overrides (the `overrides` file: the alerting resource passes FOXHUNT_ALERT_RULES) change thresholds,
`for`, `severity`, `select` or `enabled` of existing rules::

    rules:
      gpu_underutilized: {thresholds: {util_min: 0.5}, for: 2h}
      idle_spend: {enabled: false}
      untracked_spend: {select: {instance_type: "p.*"}}
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.yaml_text import YamlAliasError, load_operator_yaml, load_yaml
from foxhunt_obs.lib.yaml_text import excerpt as _show

SEVERITIES = ("critical", "warning", "info")
SOURCES = ("prometheus", "mlflow", "cloudwatch", "lake", "ec2")
DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "alert_rules.yaml"
OVERRIDES_ENV = "FOXHUNT_ALERT_RULES"
# the most bytes a rules file may have (the catalog is ~17 KB, an overrides file a few KB): a bigger
# one is refused before it is parsed
MAX_FILE_BYTES = 1024 * 1024

_REQUIRED = ("id", "severity", "source", "for", "thresholds", "key", "summary", "description")
_OPTIONAL = ("labels", "promql", "enabled", "select", "budgets", "refreshes_training")
# The fields an overrides file (FOXHUNT_ALERT_RULES) may set on a rule; the alert rules page lists them.
OVERRIDABLE = ("thresholds", "for", "severity", "enabled", "select", "budgets")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class RuleCatalogError(InputError, ValueError):
    """A bad rule catalog or overrides file; the message names the file and the rule."""


def parse_duration(text: str) -> float:
    """A Prometheus-style duration in seconds: "30m" → 1800, "1h30m" → 5400, "0s" → 0, "90s" → 90."""
    if not isinstance(text, str):
        raise ValueError(f"duration must be a string like '30m', got {_show(text)}")
    s = text.strip()
    if not s:
        raise ValueError("empty duration")
    if len(s) > 64:  # no duration is longer; and the scan below is quadratic in a run of digits
        raise ValueError(f"bad duration {_show(text)}: use e.g. '0s', '90s', '5m', '1h', '1h30m'")
    pos, total = 0, 0.0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError(f"bad duration {_show(text)}: use e.g. '0s', '90s', '5m', '1h', '1h30m'")
    return total


def format_duration(seconds: float) -> str:
    """seconds as a Prometheus duration, largest units first: 1800 → "30m", 5400 → "1h30m", 0 → "0s"."""
    ms = round(seconds * 1000)
    if ms < 0:
        raise ValueError(f"negative duration {seconds}")
    if ms == 0:
        return "0s"
    parts = []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        n, ms = divmod(ms, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)


def number_literal(value: float) -> str:
    """A threshold as written into PromQL or a text: integral values without ".0" (`[15m]`, not `[15.0m]`)."""
    if math.isfinite(value) and float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def alert_name(rule_id: str) -> str:
    """A rule's alert name in Prometheus and Alertmanager: its id, unchanged. The Dagster sensors' Alertmanager
    sink sends `alertname` = the id too, so one name (in routes, silences, inhibitions, `group_by`) covers
    an incident whichever path raised it; CamelCase (Prometheus' habit) would split every rule in two."""
    return rule_id


def threshold_display(value: float) -> float | int:
    """A threshold as a summary shows it: a whole number as an int (``90``, not ``90.0``)."""
    return int(value) if math.isfinite(value) and float(value).is_integer() else value


class _Template(string.Template):
    # $name and ${name}; `$$` is a literal `$`; any other `$` (label_replace's "$1") stays as written.
    pattern = r"""
    \$(?:
      (?P<escaped>\$) |
      (?P<named>[a-zA-Z_][a-zA-Z0-9_]*) |
      {(?P<braced>[a-zA-Z_][a-zA-Z0-9_]*)} |
      (?P<invalid>(?!))
    )
    """


class _LenientFormatter(string.Formatter):
    """str.format that renders a missing key or a value its format spec does not fit as '?'."""

    def get_field(self, field_name, args, kwargs):
        try:
            return super().get_field(field_name, args, kwargs)
        except Exception:
            return None, field_name

    def get_value(self, key, args, kwargs):
        if isinstance(key, int):
            return None
        return kwargs.get(key)

    def format_field(self, value, format_spec):
        if value is None:
            return "?"
        try:
            return format(value, format_spec)
        except Exception:
            # a label holds a string; "{x:.0f}" still shows a numeric string
            try:
                return format(float(value), format_spec)
            except Exception:
                return "?" if format_spec else str(value)

    def convert_field(self, value, conversion):
        try:
            return super().convert_field(value, conversion)
        except Exception:
            return "?"


_FORMATTER = _LenientFormatter()


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    source: str
    for_seconds: float
    thresholds: dict[str, float]
    key: tuple[str, ...]
    summary: str
    description: str
    labels: dict[str, str] = field(default_factory=dict)
    promql: str | None = None
    enabled: bool = True
    select: dict[str, str] = field(default_factory=dict)  # label -> regex a finding's label must fullmatch
    budgets: dict[str, float] = field(default_factory=dict)  # budget_burn: experiment -> monthly limit $
    refreshes_training: bool = False  # its notification makes the alert sensor refresh today's training_job

    __hash__ = None  # dict fields: not hashable; compare by value

    def selects(self, labels: Mapping[str, Any]) -> bool:
        """Whether an instance with these labels is one the rule is about (its `select` regexes)."""
        return all(re.fullmatch(rx, str((labels or {}).get(k, ""))) for k, rx in self.select.items())

    @property
    def alertname(self) -> str:
        """The alert's name in Prometheus and Alertmanager: the rule id (see `alert_name`)."""
        return alert_name(self.id)

    def expr(self) -> str | None:
        """The PromQL with thresholds substituted ($name / ${name}); None for a rule without promql."""
        if self.promql is None:
            return None
        values = {k: number_literal(v) for k, v in self.thresholds.items()}
        return _Template(self.promql).substitute(values)

    def render(self, template: str, labels: Mapping[str, Any], value: float | None, **extra: Any) -> str:
        """template (summary or description) formatted over labels, thresholds, extra and value, later
        ones winning; a missing key or a value that does not fit its format spec renders as '?'."""
        values: dict[str, Any] = dict(labels or {})
        values.update({k: threshold_display(v) for k, v in self.thresholds.items()})
        values.update(extra)
        values["value"] = value
        try:
            return _FORMATTER.vformat(template, (), values)
        except Exception:  # malformed template ("{" unbalanced): show it as written
            return template

    def fingerprint(self, labels: Mapping[str, Any]) -> str:
        """A stable hex id of one alert instance: the rule id and the key labels' values (by key name)."""
        parts = [self.id] + [f"{k}={(labels or {}).get(k, '')}" for k in sorted(self.key)]
        return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def load_rules(path: Path | None = None, overrides: Path | str | None = None) -> list[Rule]:
    """The rules of `path` (default: the packaged catalog) with the `overrides` file applied (None or
    empty: none; the alerting resource passes FOXHUNT_ALERT_RULES), in file order. Parsed once per version
    of the two files (the sensor asks every tick; parsing costs ~35 ms); an edited file is read again."""
    path = Path(path) if path is not None else DEFAULT_PATH
    extra = Path(overrides) if overrides is not None and str(overrides).strip() else None
    return list(_load_rules(path, _version(path), extra, _version(extra) if extra else None))


def training_refresh_rules(rules: list[Rule]) -> frozenset[str]:
    """The ids of the rules (`refreshes_training: true`) whose notifications make today's training_health
    worth refreshing: the alert sensor then requests training_job for today."""
    return frozenset(r.id for r in rules if r.refreshes_training)


_LAST_GOOD: dict[str, list[Rule]] = {}  # overrides file -> the rules it last gave


def load_rules_or_last_good(
    path: Path | None = None, overrides: Path | str | None = None
) -> tuple[list[Rule], str]:
    """(rules, error): like load_rules, but a broken overrides file (FOXHUNT_ALERT_RULES) does not stop
    alerting, whatever loading it raises: the rules it gave last (or, never good, the catalog's own) are
    used, and `error` says what is wrong in it (YAML errors name the line; a bad value is shown as an
    excerpt). A broken packaged catalog still raises."""
    chosen = "" if overrides is None else str(overrides)
    try:
        rules = load_rules(path, chosen)
    except Exception as e:  # a RuleCatalogError, or whatever else a bad file brings (MemoryError, ...)
        if not chosen.strip():
            raise
        last = _LAST_GOOD.get(chosen)
        fallback = last if last is not None else load_rules(path, "")
        which = "the rules it gave last" if last is not None else "the catalog's own rules"
        why = str(e) if isinstance(e, RuleCatalogError) else f"{chosen}: {type(e).__name__}: {_show(str(e))}"
        return fallback, f"{OVERRIDES_ENV} is broken, alerting goes on with {which}: {_short(why)}"
    _LAST_GOOD[chosen] = rules
    return rules, ""


def _version(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None  # reading it then fails with the loader's own message (errors are not cached)
    return st.st_mtime_ns, st.st_size


@lru_cache(maxsize=8)
def _load_rules(
    path: Path, version: tuple | None, overrides: Path | None, overrides_version: tuple | None
) -> tuple[Rule, ...]:
    doc = _read_yaml(path, aliases=True)
    if not isinstance(doc, dict) or set(doc) != {"rules"} or not isinstance(doc["rules"], list):
        raise RuleCatalogError(f"{path}: expected a mapping with one key `rules` holding a list of rules")
    rules: list[Rule] = []
    seen: set[str] = set()
    for i, raw in enumerate(doc["rules"]):
        rule = _parse_rule(raw, path, i)
        if rule.id in seen:
            raise RuleCatalogError(f"{path}: rule {_show(rule.id)}: duplicate id")
        seen.add(rule.id)
        rules.append(rule)
    if overrides is not None:
        rules = _apply_overrides(rules, overrides)
    return tuple(rules)


def _read_yaml(path: Path, aliases: bool) -> Any:
    """The document of a rules file of at most MAX_FILE_BYTES; aliases=False (the operator's overrides
    file): one with an alias is refused, naming the line, before its values are built."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
            if len(data) > MAX_FILE_BYTES:
                size = os.fstat(f.fileno()).st_size
                raise RuleCatalogError(
                    f"{path}: {size} bytes, over the {MAX_FILE_BYTES} bytes an alert rules file may have"
                    f" ({OVERRIDES_ENV}): a rules file is a few KB"
                )
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RuleCatalogError(f"{path}: cannot read the alert rules: {_show(str(e))}") from e
    try:
        return load_yaml(text) if aliases else load_operator_yaml(text, str(path))
    except YamlAliasError as e:
        raise RuleCatalogError(str(e)) from e
    except yaml.YAMLError as e:
        raise RuleCatalogError(f"{path}: not valid YAML: {_short(str(e))}") from e


def _name(value: Any) -> str:
    """A name (a threshold, a label, a placeholder) as errors show it: as written when short."""
    return value if isinstance(value, str) and len(value) <= 100 else _show(value)


def _short(message: str, limit: int = 2000) -> str:
    """An error message cut to `limit` characters: what a log line shows of a loader's own error."""
    return message if len(message) <= limit else f"{message[:limit]}… ({len(message)} characters)"


def _parse_rule(raw: Any, path: Path, index: int) -> Rule:
    if not isinstance(raw, dict):
        raise RuleCatalogError(f"{path}: rule #{index + 1}: expected a mapping, got {type(raw).__name__}")
    rid = raw.get("id")
    where = f"{path}: rule {_show(rid)}" if isinstance(rid, str) and rid else f"{path}: rule #{index + 1}"

    def fail(msg: str) -> RuleCatalogError:
        return RuleCatalogError(f"{where}: {msg}")

    unknown = sorted(set(raw) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise fail(f"unknown fields {_show(unknown)} (allowed: {list(_REQUIRED + _OPTIONAL)})")
    missing = [f for f in _REQUIRED if f not in raw]
    if missing:
        raise fail(f"missing fields {missing}")
    if not isinstance(rid, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", rid):
        raise fail("id must be snake_case: lower-case letters, digits and _")
    _check_severity(raw["severity"], fail)
    if raw["source"] not in SOURCES:
        raise fail(f"source {_show(raw['source'])} is not one of {SOURCES}")
    for_seconds = _duration(raw["for"], fail)
    thresholds = _thresholds(raw["thresholds"], fail)
    key = raw["key"]
    if not isinstance(key, list) or not all(isinstance(k, str) and _LABEL_NAME.fullmatch(k) for k in key):
        raise fail("key must be a list of label names")
    if len(set(key)) != len(key):
        raise fail(f"key {_show(key)} names a label twice")
    for name in ("summary", "description"):
        if not isinstance(raw[name], str) or not raw[name].strip():
            raise fail(f"{name} must be a non-empty string")
        try:
            list(string.Formatter().parse(raw[name]))
        except ValueError as e:
            raise fail(f"{name} is not a valid str.format template: {e}") from e
    labels = raw.get("labels") or {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and _LABEL_NAME.fullmatch(k) and isinstance(v, str) for k, v in labels.items()
    ):
        raise fail("labels must map label names to strings")
    reserved = {"severity", "foxhunt_rule"} & set(labels)
    if reserved:
        raise fail(f"labels may not set {sorted(reserved)}: the export sets them")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise fail("enabled must be true or false")
    select = _select(raw.get("select"), fail)
    budgets = _budgets(raw.get("budgets"), fail)
    refreshes_training = raw.get("refreshes_training", False)
    if not isinstance(refreshes_training, bool):
        raise fail("refreshes_training must be true or false")
    promql = raw.get("promql")
    if promql is not None and select:
        raise fail("select is for rules evaluated in Python; a promql rule says it in its PromQL")
    if promql is not None:
        if raw["source"] != "prometheus":
            raise fail(f"promql is only for source prometheus, not {_show(raw['source'])}")
        if not isinstance(promql, str) or not promql.strip():
            raise fail("promql must be a non-empty string")
        promql = promql.strip() + "\n" if "\n" in promql.strip() else promql.strip()
    rule = Rule(
        id=rid,
        severity=raw["severity"],
        source=raw["source"],
        for_seconds=for_seconds,
        thresholds=thresholds,
        key=tuple(key),
        summary=raw["summary"],
        description=raw["description"],
        labels=dict(labels),
        promql=promql,
        enabled=enabled,
        select=select,
        budgets=budgets,
        refreshes_training=refreshes_training,
    )
    _check_expr(rule, fail)
    return rule


def _select(value: Any, fail) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and _LABEL_NAME.fullmatch(k) and isinstance(v, str) for k, v in value.items()
    ):
        raise fail("select must map label names to regular expressions")
    for k, rx in value.items():
        try:
            re.compile(rx)
        except re.error as e:
            raise fail(f"select {_name(k)}: bad regular expression {_show(rx)}: {_show(str(e))}") from None
    return dict(value)


def _budgets(value: Any, fail) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
        raise fail("budgets must map experiment names to monthly limits in USD")
    out = {}
    for name, limit in value.items():
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int | float)
            or not math.isfinite(limit)
            or limit <= 0
        ):
            raise fail(
                f"budgets {_name(name)}: the limit must be a positive number of USD, got {_show(limit)}"
            )
        out[name] = float(limit)
    return out


def _check_severity(value: Any, fail) -> None:
    if value not in SEVERITIES:
        raise fail(f"severity {_show(value)} is not one of {SEVERITIES}")


def _duration(value: Any, fail) -> float:
    if isinstance(value, bool):
        raise fail(f"for must be a duration like '30m', got {_show(value)}")
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value):
            raise fail(f"for must be >= 0 seconds, got {_show(value)}")
        return float(value)
    try:
        return parse_duration(value)
    except ValueError as e:
        raise fail(f"for: {e}") from e


def _thresholds(value: Any, fail) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail("thresholds must map names to numbers")
    out: dict[str, float] = {}
    for name, v in value.items():
        if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name) or name == "value":
            raise fail(f"threshold name {_show(name)} must be an identifier other than 'value'")
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise fail(f"threshold {_name(name)} must be a finite number, got {_show(v)}")
        out[name] = float(v)
    return out


def _check_expr(rule: Rule, fail) -> None:
    if rule.promql is None:
        return
    try:
        rule.expr()
    except KeyError as e:
        raise fail(
            f"promql uses ${_name(e.args[0])}, which is not in thresholds {sorted(rule.thresholds)}"
        ) from e
    except ValueError as e:
        raise fail(f"promql has a bad $placeholder (write $$ for a literal $): {e}") from e


def _apply_overrides(rules: list[Rule], path: Path) -> list[Rule]:
    doc = _read_yaml(path, aliases=False)
    if doc is None:
        return rules
    if not isinstance(doc, dict) or set(doc) - {"rules"}:
        raise RuleCatalogError(f"{path}: expected a mapping {{rules: {{<rule id>: {{...}}}}}}")
    entries = doc.get("rules") or {}
    if not isinstance(entries, dict):
        raise RuleCatalogError(f"{path}: `rules` must map rule ids to overrides")
    by_id = {r.id: r for r in rules}
    for rid, change in entries.items():
        where = f"{path}: rule {_show(rid)}"

        def fail(msg: str, where: str = where) -> RuleCatalogError:
            return RuleCatalogError(f"{where}: {msg}")

        if rid not in by_id:
            raise fail(f"no such rule (known: {sorted(by_id)})")
        if change is None:
            continue
        if not isinstance(change, dict):
            raise fail("expected a mapping of overrides")
        unknown = sorted(set(change) - set(OVERRIDABLE))
        if unknown:
            raise fail(f"unknown fields {_show(unknown)} (overridable: {list(OVERRIDABLE)})")
        rule = by_id[rid]
        updates: dict[str, Any] = {}
        if "thresholds" in change:
            new = _thresholds(change["thresholds"], fail)
            extra = sorted(set(new) - set(rule.thresholds))
            if extra:
                raise fail(f"unknown thresholds {_show(extra)} (the rule has {sorted(rule.thresholds)})")
            updates["thresholds"] = {**rule.thresholds, **new}
        if "for" in change:
            updates["for_seconds"] = _duration(change["for"], fail)
        if "severity" in change:
            _check_severity(change["severity"], fail)
            updates["severity"] = change["severity"]
        if "enabled" in change:
            if not isinstance(change["enabled"], bool):
                raise fail("enabled must be true or false")
            updates["enabled"] = change["enabled"]
        if "select" in change:
            if rule.promql is not None:
                raise fail("select is for rules evaluated in Python; a promql rule says it in its PromQL")
            updates["select"] = _select(change["select"], fail)
        if "budgets" in change:
            updates["budgets"] = _budgets(change["budgets"], fail)
        by_id[rid] = replace(rule, **updates)
        _check_expr(by_id[rid], fail)
    return [by_id[r.id] for r in rules]
