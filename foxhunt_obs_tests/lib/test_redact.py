"""lib/redact.py: what a URL or an error text shows of its secrets (nothing)."""

import pytest

from foxhunt_obs.lib.delivery.alert_sinks import display_url
from foxhunt_obs.lib.redact import mask_path_tokens, redact_url, scrub, split_userinfo


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://u:p4ss@prometheus:9090", "http://***@prometheus:9090"),
        ("https://prom.example/api?token=abc123&step=15", "https://prom.example/api?token=***&step=15"),
        ("https://x.example/q?X-Amz-Signature=deadbeef&a=1", "https://x.example/q?X-Amz-Signature=***&a=1"),
        ("http://127.0.0.1:9090", "http://127.0.0.1:9090"),
        # a webhook's secret in its path; words and short ids stay
        (
            "https://hooks.example/services/T0AB12CD/B0XY34ZW/kX9dQ2mNw8pLr5sTz3vY",
            "https://hooks.example/services/T0AB12CD/B0XY34ZW/***",
        ),
        ("http://alertmanager:9093/alerts/receiver", "http://alertmanager:9093/alerts/receiver"),
    ],
)
def test_redact_url(url, shown):
    assert redact_url(url) == shown


def test_split_userinfo_sends_credentials_as_auth():
    assert split_userinfo("http://fh%40corp:p%3Ass@h:9090/p") == ("http://h:9090/p", ("fh@corp", "p:ss"))
    assert split_userinfo("http://h:9090") == ("http://h:9090", None)


def test_scrub_masks_urls_and_configured_secrets(monkeypatch):
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-1234-secret")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://user:UrlPw-99@mlflow:5000")
    text = "to http://a:b@h/x?token=t0k failed: xoxb-1234-secret rejected; UrlPw-99 wrong"
    assert scrub(text) == "to http://***@h/x?token=*** failed: *** rejected; *** wrong"


def test_webhook_urls_in_sink_errors_hide_their_path_token():
    assert (
        display_url("https://u:p@hooks.example/T0AB12CD/kX9dQ2mNw8pLr5sTz3vY?x=1")
        == "https://hooks.example/T0AB12CD/***"
    )
    assert mask_path_tokens("/a/b/receiver") == "/a/b/receiver"


def test_more_token_parameters_and_passwords_with_an_at_sign():
    assert redact_url("https://h/x?auth_token=S1&client_secret=S2&private_token=S3&page=2") == (
        "https://h/x?auth_token=***&client_secret=***&private_token=***&page=2"
    )
    assert scrub("http://user:p@ss-9@host/x", ["p@ss-9"]) == "http://***@host/x"
