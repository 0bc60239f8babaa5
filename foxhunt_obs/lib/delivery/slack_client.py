"""The one place a Slack Web API client is built: the Dagster ``slack`` resource (defs/resources.py) and
the plain-Python callers (the CLI, tests) both call ``slack_web_client``, so every Slack call has the same
base URL handling, timeout and bounded retries; and ``slack_error_text`` is what both Slack deliveries (the
weekly report, the alert sink) say when a call fails.

No Dagster here (lib/ never imports it): the resource passes its own token and base URL in.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry import ConnectionErrorRetryHandler, RateLimitErrorRetryHandler

from foxhunt_obs.lib.delivery.errors import failure_text, scrub_secrets
from foxhunt_obs.lib.redact import remember
from foxhunt_obs.lib.settings import default

# one HTTP request; an alert sensor tick (60 s) must survive a hanging Slack plus the retries
TIMEOUT_S = 10
RETRIES = 2  # extra attempts after a connection error or a 429
# a longer Retry-After is cut to this: a sensor tick must end inside Dagster's 60 s (sensors.py), and
# a sink that gave up is tried again next tick anyway
MAX_RETRY_AFTER_S = 10.0
SLACK_API_URL = default("FOXHUNT_REPORT_SLACK_API_URL")


class CappedRateLimitRetry(RateLimitErrorRetryHandler):
    """slack_sdk's 429 handler with its sleep (Slack's Retry-After) cut to MAX_RETRY_AFTER_S."""

    def prepare_for_next_attempt(self, *, state, request, response=None, error=None) -> None:
        if response is None:
            raise error  # type: ignore[misc]
        value = next((v for k, v in response.headers.items() if k.lower() == "retry-after"), "1")
        try:
            wait = float(value[0] if isinstance(value, list) else value)
        except (TypeError, ValueError, IndexError):
            wait = 1.0
        state.next_attempt_requested = True
        time.sleep(min(max(wait, 0.0), MAX_RETRY_AFTER_S))
        state.increment_current_attempt()


def slack_web_client(token: str, api_url: str = SLACK_API_URL) -> WebClient:
    """A WebClient with the timeout and the retry handlers. The token may be empty: the sinks check
    ``client.token`` and name the missing setting."""
    remember(token.strip())
    return WebClient(
        token=token.strip(),
        base_url=api_url.strip() or SLACK_API_URL,
        timeout=TIMEOUT_S,
        retry_handlers=[
            ConnectionErrorRetryHandler(max_retry_count=RETRIES),
            CappedRateLimitRetry(max_retry_count=RETRIES),
        ],
    )


def slack_error_text(exc: BaseException, token: str, scopes: Sequence[str] = ()) -> str:
    """What a failed Slack call says, the token cut out: for a SlackApiError Slack's own error code (or
    the HTTP status) with a hint at the fix where a person can make one (``channel_not_found``,
    ``not_in_channel``, ``invalid_auth``, ...; ``missing_scope`` names ``scopes``, the bot scopes the
    caller needs, when it gives them); for anything else (connection errors, timeouts, a bad answer)
    the exception's type and text."""
    if not isinstance(exc, SlackApiError):
        return failure_text(exc, token)
    error = str(exc.response.get("error") or f"HTTP {exc.response.status_code}")
    hint = ""
    if error in ("channel_not_found", "not_in_channel"):
        hint = " (check the channel name and invite the bot to the channel)"
    elif error in ("invalid_auth", "not_authed", "token_revoked", "account_inactive"):
        hint = " (check SLACK_BOT_TOKEN)"
    elif error == "missing_scope" and scopes:
        hint = f" (the bot needs the {' and '.join(scopes)} scopes)"
    return f"{scrub_secrets(error, token)}{hint}"
