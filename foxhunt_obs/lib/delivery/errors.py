"""The text a failed delivery shows, for the weekly report's sender (send.py) and the alert sinks
(alert_sinks.py) alike: the exception's type and message with every secret cut out. A secret is cut in
the form given and base64-encoded (HTTP basic auth and SMTP AUTH send it so, and a server may echo it).
Slack's own error codes get their hint in slack_client.slack_error_text.
"""

from __future__ import annotations

import base64
import smtplib


def scrub_secrets(text: str, *secrets: str) -> str:
    """``text`` with each non-empty secret, and its base64 form, replaced by ``***``."""
    for secret in secrets:
        if secret:
            for form in (secret, base64.b64encode(secret.encode()).decode()):
                text = text.replace(form, "***")
    return text


def failure_text(exc: BaseException, *secrets: str) -> str:
    """``Type: message`` of an exception (an SMTP reply as ``535 5.7.8 ...``), ``secrets`` cut out; the
    bare type name when there is no message."""
    text = str(exc)
    if isinstance(exc, smtplib.SMTPResponseException):  # "535 5.7.8 ...", not "(535, b'5.7.8 ...')"
        reply = exc.smtp_error
        text = f"{exc.smtp_code} {reply.decode(errors='replace') if isinstance(reply, bytes) else reply}"
    text = scrub_secrets(text, *secrets).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
