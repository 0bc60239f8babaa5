"""YAML for the project's data files and users' rule files: PyYAML's safe loader on libyaml when the
installed PyYAML has it (~8x faster: the price table took ~45 ms to parse in pure Python, paid by every
cost run and code-location load). A document that does not parse is parsed again by the pure-Python
loader, whose error names the line and shows it. libyaml accepts a few documents the pure-Python loader
refuses (a tab after `key:`), never the other way round.

A file an operator writes (the alert rules overrides, FOXHUNT_ALERT_RULES) goes through
`load_operator_yaml`: aliases (`*name`, `<<: *name`) are refused before anything is built, so a small
file cannot expand into gigabytes ("billion laughs") wherever its values are walked or shown."""

from __future__ import annotations

import reprlib

import yaml

from foxhunt_obs.lib.errors import InputError

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
EXCERPT_CHARS = 200  # the most of a bad value an error or a log line shows

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, EXCERPT_CHARS, EXCERPT_CHARS
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = _REPR.maxset = 10


class YamlAliasError(InputError, yaml.YAMLError):
    """An alias in a file that may not use them (the operator's file: their input's fault); the message
    names the file and the line."""


def load_yaml(text: str):
    """yaml.safe_load(text), faster; raises yaml.YAMLError as yaml.safe_load does."""
    try:
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader (C or Python)
    except yaml.YAMLError:
        return yaml.safe_load(text)  # its error, with the line shown; a document libyaml refused


def load_operator_yaml(text: str, source: str):
    """load_yaml for a file an operator writes: a YamlAliasError naming `source` and the line if the
    document uses an alias, found by scanning its tokens (nothing is built yet); yaml.YAMLError as
    load_yaml raises it for a document that does not parse."""
    try:
        for token in yaml.scan(text, Loader=_LOADER):
            if isinstance(token, yaml.AliasToken):
                name = token.value if len(token.value) <= 60 else excerpt(token.value, 60)
                raise YamlAliasError(
                    f"{source}, line {token.start_mark.line + 1}: alias *{name} "
                    "refused: aliases (*name, <<: *name) are not accepted in this file, write the values out"
                )
    except YamlAliasError:
        raise
    except yaml.YAMLError:
        pass  # not a document: load_yaml raises the parser's error, with the line shown
    return load_yaml(text)


def excerpt(value, limit: int = EXCERPT_CHARS) -> str:
    """repr(value) cut to about `limit` characters: a long string as its first `limit` characters and
    "… (N bytes)"; a container shown in part (reprlib). Never builds the whole repr of a big value."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}… ({len(value.encode('utf-8', 'replace'))} bytes)"
    text = _REPR.repr(value)
    return text if len(text) <= limit else f"{text[:limit]}…"
