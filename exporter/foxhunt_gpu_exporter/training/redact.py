"""Secrets out of what the trainers' library sends elsewhere (a log line, a span's status or event).

The exporter package cannot import foxhunt_obs (whose lib/redact.py does this for the batch side), so this
is its own small equivalent. Errors a trainer raises often carry URLs: a checkpoint upload's presigned S3
URL holds its credential and signature in the query (X-Amz-Credential, X-Amz-Signature, and
X-Amz-Security-Token with temporary credentials: docs.aws.amazon.com/AmazonS3/latest/API/
sigv4-query-string-auth.html), an MLflow error the tracking URI with user:password@. Both are masked; so is
an `Authorization`-style `Bearer`/`Basic` credential written out in the text.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

MASK = "***"

# scheme://userinfo@ : everything up to the last @ before the path, query or fragment (a password may hold @)
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")
# a query parameter whose name ends in one of these: X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token,
# X-Goog-Signature, Signature, sig, token, access_token, password, api_key, client_secret, AWSAccessKeyId ...
_SECRET_PARAM = re.compile(
    r"(?i)([?&;][\w.-]*(?:token|key|keyid|password|passwd|pwd|secret|sig|signature|credential)=)[^&;\s#'\"]+"
)
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")


def scrub(text: str) -> str:
    """`text` with URL userinfo, token-like query parameters and Bearer/Basic credentials masked."""
    text = _USERINFO.sub(rf"\1{MASK}@", text)
    text = _SECRET_PARAM.sub(rf"\1{MASK}", text)
    return _AUTH_SCHEME.sub(rf"\1 {MASK}", text)


def redact_uri(uri: str) -> str:
    """A URI to show: without user:password@ (host and port kept) and with token-like parameters masked."""
    try:
        parts = urlsplit(uri)
        if parts.username is not None or parts.password is not None:
            host = parts.hostname or ""
            parts = parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host)
    except ValueError:  # not a URL, or a port that is not a number: mask what looks secret in the text
        return scrub(uri)
    return scrub(urlunsplit(parts))
