"""Secrets never reach a log, an error, asset metadata or the UI (docs/design.md#quality-bar): URLs lose their userinfo and
token-like query parameters, and any text built from an error is scrubbed of every configured secret.

A chained exception carries its own message into Dagster's event log, so errors built from a source's
exception are raised `from None` and their text passes through `scrub` first.
"""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from foxhunt_obs.lib.settings import SETTINGS

# Settings that hold a secret themselves (the registry's, and boto3's own keys), and settings that are
# URLs (whose userinfo may hold one).
SECRET_SETTINGS = (
    *(s.env for s in SETTINGS if s.secret),
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)
URL_SETTINGS = (
    "FOXHUNT_PROMETHEUS_URL",
    "MLFLOW_TRACKING_URI",
    "FOXHUNT_MLFLOW_BACKEND_STORE_URI",
    "FOXHUNT_ALERTMANAGER_URL",
    "FOXHUNT_ALERT_WEBHOOK_URL",
)
MASK = "***"
_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
_TOKEN_PARAM = re.compile(  # any parameter whose name ends in one of these (auth_token, client_secret, ...)
    r"(?i)([?&][\w.-]*(?:token|key|password|passwd|secret|sig|signature|credential)=)[^&\s#'\"]+"
)


def redact_url(url: str) -> str:
    """`url` without user and password (`http://u:p@host` -> `http://***@host`) and with token-like query
    parameters masked (`?token=abc` -> `?token=***`)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return scrub(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{MASK}@{netloc.rsplit('@', 1)[1]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        masked = [(k, MASK if _TOKEN_PARAM.match(f"?{k}=x") else v) for k, v in pairs]
        if masked != pairs:
            query = urlencode(masked, safe="*")
    return urlunsplit(parts._replace(netloc=netloc, query=query, path=mask_path_tokens(parts.path)))


_PATH_TOKEN = re.compile(r"^(?=[A-Za-z0-9_-]*[0-9])(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{16,}$")


def mask_path_tokens(path: str) -> str:
    """A URL path with token-like segments masked: webhook URLs carry their secret in the path
    (/services/T0AB12CD/B0XY34ZW/kX9dQ2...): a segment of 16+ letters, digits, `_`, `-` with both letters
    and digits. Words (`/alerts/receiver`) and short ids stay readable."""
    return "/".join(MASK if _PATH_TOKEN.match(seg) else seg for seg in path.split("/"))


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """(url without userinfo, (user, password) or None): send the credentials as auth, never in a URL."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=host)), (
        unquote(parts.username or ""),
        unquote(parts.password or ""),
    )


_REMEMBERED: set[str] = set()


def remember(*secrets: str) -> None:
    """Scrub these too: a secret handed to a client directly (a resource field given a value, not a
    variable) is masked like one the environment holds."""
    _REMEMBERED.update(s for s in secrets if s and len(s) >= 4)


def configured_secrets() -> list[str]:
    """Every secret configured: the secret settings and the passwords inside URL settings in the
    environment, and the secrets handed to clients (`remember`)."""
    found = [os.environ.get(v, "") for v in SECRET_SETTINGS] + sorted(_REMEMBERED)
    for var in URL_SETTINGS:
        try:
            parts = urlsplit(os.environ.get(var, ""))
            found.append(parts.password or "")
        except ValueError:
            continue
    return [s for s in found if len(s) >= 4]


def scrub(text: str, secrets: list[str] | None = None) -> str:
    """`text` with URL userinfo and token parameters masked and every configured secret replaced."""
    # the configured secrets first: a password holding '@' would otherwise be cut in two by _USERINFO
    for secret in sorted(configured_secrets() if secrets is None else secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    text = _USERINFO.sub(rf"\1{MASK}@", text)
    return _TOKEN_PARAM.sub(rf"\1{MASK}", text)
