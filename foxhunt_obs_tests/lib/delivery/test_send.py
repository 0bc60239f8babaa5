"""Report delivery against real local servers: aiosmtpd (STARTTLS with a CA made here, AUTH) and a small
HTTP stand-in of the Slack Web API (foxhunt_obs/sandbox/servers/slack_standin.py). Secrets must reach neither a log nor an exception.

The tests set the FOXHUNT_REPORT_* variables a deployment sets; `deliver` below hands them over through
the `report` and `slack` resources, as the asset does (send.deliver itself never reads the environment)."""

from __future__ import annotations

import datetime as dt
import email
import email.policy
import ipaddress
import json
import logging
import socket
import time

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from foxhunt_obs.defs.resources import ReportResource, SlackBotResource
from foxhunt_obs.lib.delivery import send
from foxhunt_obs.lib.delivery.send import DeliveryError
from foxhunt_obs.lib.delivery.slack_client import slack_web_client
from foxhunt_obs.lib.report import render_weekly_report
from foxhunt_obs.lib.report.formatting import money
from foxhunt_obs.lib.settings import SETTINGS
from foxhunt_obs.sandbox.servers.slack_standin import SlackStandIn
from foxhunt_obs_tests.lib.report.test_weekly_report import PNG_SIGNATURE, WEEK, make_data

PASSWORD = "s3cr3t-Pa55word-do-not-log"
TOKEN = "xoxb-0000-1111-token-do-not-log"
LINK = "http://127.0.0.1:3000/assets/weekly_cost_report?a=1&b=2"
DELIVERY_VARS = [s.env for s in SETTINGS if s.env.startswith("FOXHUNT_REPORT_") or s.env == "SLACK_BOT_TOKEN"]


def deliver(report, week, link=None, slack_client=None) -> list[str]:
    """send.deliver with the sinks' settings as the resources read them from the environment now."""
    slack_client = slack_client or SlackBotResource.from_env(resolve=True).get_client
    delivery = ReportResource.from_env(resolve=True).delivery()
    return send.deliver(report, week, link, delivery=delivery, slack_client=slack_client)


@pytest.fixture(scope="module")
def report():
    return render_weekly_report(make_data())


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in DELIVERY_VARS:
        monkeypatch.delenv(name, raising=False)


def unchained(exc: BaseException) -> bool:
    """No original exception (whose text or locals could hold a secret) rides along in the traceback."""
    return exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- a CA and a server certificate for 127.0.0.1, trusted through SSL_CERT_FILE -----------------------------
@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    import ssl

    folder = tmp_path_factory.mktemp("tls")
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "foxhunt test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "cert.pem").write_bytes(cert.public_bytes(pem))
    (folder / "key.pem").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    return {"ca": str(folder / "ca.pem"), "server": server}


# -- a real SMTP server ----------------------------------------------------------------------------------------
class Inbox:
    def __init__(self):
        self.messages: list[dict] = []
        self.auth: list[tuple[str, bytes, bool]] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append(
            {
                "mail_from": envelope.mail_from,
                "rcpt_tos": list(envelope.rcpt_tos),
                "raw": envelope.original_content,
                "tls": session.ssl is not None,
                "authenticated": session.authenticated,
            }
        )
        return "250 Message accepted for delivery"

    def authenticator(self, server, session, envelope, mechanism, auth_data):
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login == b"reporter"
            and auth_data.password == PASSWORD.encode()
        )
        self.auth.append((mechanism, getattr(auth_data, "login", b""), ok))
        return AuthResult(success=ok, handled=False)  # aiosmtpd answers 235/535


@pytest.fixture
def smtp(tls, monkeypatch):
    """STARTTLS offered, AUTH required only after it (aiosmtpd's default), CA trusted via SSL_CERT_FILE."""
    inbox = Inbox()
    port = _free_port()
    controller = Controller(
        inbox,
        hostname="127.0.0.1",
        port=port,
        server_hostname="smtp.test",
        tls_context=tls["server"],
        authenticator=inbox.authenticator,
        auth_require_tls=True,
    )
    controller.start()
    monkeypatch.setenv("SSL_CERT_FILE", tls["ca"])
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_PORT", str(port))
    monkeypatch.setenv("FOXHUNT_REPORT_EMAIL_FROM", "GPU reports <reports@foxhunt.test>")
    monkeypatch.setenv("FOXHUNT_REPORT_EMAIL_TO", "alice@foxhunt.test, Bob B <bob@foxhunt.test>")
    yield inbox, port
    controller.stop()


def _parts(raw: bytes):
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    body = {p.get_content_type(): p for p in msg.walk() if p.get_content_disposition() is None}
    attachments = {p.get_filename(): p for p in msg.iter_attachments()}
    return msg, body, attachments


@pytest.mark.servers
def test_email_over_starttls_with_login(smtp, report, monkeypatch, caplog, capsys):
    inbox, port = smtp
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_USER", "reporter")
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_PASSWORD", PASSWORD)
    caplog.set_level(logging.DEBUG)

    done = deliver(report, WEEK, link=LINK)

    assert done == ["email to alice@foxhunt.test, bob@foxhunt.test"]
    assert inbox.auth == [("PLAIN", b"reporter", True)]
    [got] = inbox.messages
    assert got["tls"] and got["authenticated"]
    assert got["mail_from"] == "reports@foxhunt.test"
    assert got["rcpt_tos"] == ["alice@foxhunt.test", "bob@foxhunt.test"]

    msg, body, attachments = _parts(got["raw"])
    f = report.figures
    assert msg["Subject"] == (
        f"GPU cost report — week of 2026-11-16: {money(f['total_usd'])}, "
        f"idle {money(f['idle_usd'])} ({f['idle_pct']:.1f}%)"
    )
    assert msg["To"] == "alice@foxhunt.test, Bob B <bob@foxhunt.test>"
    assert msg["From"] == "GPU reports <reports@foxhunt.test>"
    assert msg.get_content_type() == "multipart/mixed"

    text = body["text/plain"].get_content()
    assert "data:image" not in text and "see the attached daily_spend.png" in text
    assert "Weekly GPU cost report — week of 2026-11-16" in text
    assert f"Open this report in Dagster: {LINK}" in text

    page = body["text/html"].get_content().replace("\r\n", "\n")  # MIME text travels with CRLF
    assert 'href="http://127.0.0.1:3000/assets/weekly_cost_report?a=1&amp;b=2"' in page
    assert page.replace(page[page.index("<p><a href=") : page.index("</a></p>\n") + 9], "") == report.html

    assert set(attachments) == set(report.charts) | {"report.html"}
    for name, png in report.charts.items():
        part = attachments[name]
        assert part.get_content_type() == "image/png"
        assert part.get_content() == png and png.startswith(PNG_SIGNATURE)
    assert attachments["report.html"].get_content_type() == "text/html"
    assert attachments["report.html"].get_payload(decode=True) == report.html.encode()  # byte for byte

    logs = caplog.text + "".join(capsys.readouterr())
    assert "email to alice@foxhunt.test" in logs
    assert PASSWORD not in logs and PASSWORD.encode() not in got["raw"]


@pytest.mark.servers
def test_wrong_password_names_the_server_not_the_password(smtp, report, monkeypatch, caplog):
    inbox, port = smtp
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_USER", "reporter")
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_PASSWORD", PASSWORD + "-wrong")
    caplog.set_level(logging.DEBUG)

    with pytest.raises(DeliveryError) as info:
        deliver(report, WEEK)

    message = str(info.value)
    assert f"127.0.0.1:{port}" in message and "login failed: SMTPAuthenticationError: 535 5.7.8" in message
    assert PASSWORD not in message and PASSWORD not in caplog.text
    assert unchained(info.value)
    assert info.value.failures.keys() == {"email"} and info.value.delivered == []
    assert inbox.auth and not inbox.auth[0][2] and inbox.messages == []


@pytest.mark.servers
def test_plain_smtp_without_login(report, monkeypatch):
    inbox = Inbox()
    port = _free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port, server_hostname="smtp.test")
    controller.start()
    try:
        monkeypatch.setenv("FOXHUNT_REPORT_SMTP_HOST", "127.0.0.1")
        monkeypatch.setenv("FOXHUNT_REPORT_SMTP_PORT", str(port))
        monkeypatch.setenv("FOXHUNT_REPORT_SMTP_STARTTLS", "0")
        monkeypatch.setenv("FOXHUNT_REPORT_EMAIL_FROM", "reports@foxhunt.test")
        monkeypatch.setenv("FOXHUNT_REPORT_EMAIL_TO", "ops@foxhunt.test")
        assert deliver(report, WEEK) == ["email to ops@foxhunt.test"]
    finally:
        controller.stop()
    [got] = inbox.messages
    assert not got["tls"] and not got["authenticated"] and got["rcpt_tos"] == ["ops@foxhunt.test"]
    _, body, attachments = _parts(got["raw"])
    page = body["text/html"].get_content().replace("\r\n", "\n")
    assert page == report.html  # no link given: the page as rendered
    assert len(attachments) == len(report.charts) + 1


def test_dead_smtp_port_names_host_and_port(report, monkeypatch):
    port = _free_port()
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_PORT", str(port))
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_USER", "reports@foxhunt.test")
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_PASSWORD", PASSWORD)
    monkeypatch.setenv("FOXHUNT_REPORT_EMAIL_TO", "ops@foxhunt.test")

    with pytest.raises(DeliveryError, match=rf"email via SMTP 127\.0\.0\.1:{port}: connect failed") as info:
        deliver(report, WEEK)
    assert "ConnectionRefusedError" in str(info.value)
    assert PASSWORD not in str(info.value) and PASSWORD not in repr(info.value) and unchained(info.value)


@pytest.mark.servers
def test_starttls_verifies_the_server_certificate(smtp, report, monkeypatch, tmp_path):
    inbox, port = smtp
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "no-such-ca.pem"))  # our CA no longer trusted
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_USER", "reporter")
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_PASSWORD", PASSWORD)
    with pytest.raises(
        DeliveryError, match=rf"127\.0\.0\.1:{port}: STARTTLS failed: SSLCertVerificationError"
    ):
        deliver(report, WEEK)
    assert inbox.auth == [] and inbox.messages == []  # the password never left


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"FOXHUNT_REPORT_SMTP_HOST": "smtp.test"}, "FOXHUNT_REPORT_EMAIL_TO is empty"),
        (
            {"FOXHUNT_REPORT_SMTP_HOST": "smtp.test", "FOXHUNT_REPORT_EMAIL_TO": "ops@x.test"},
            "FOXHUNT_REPORT_EMAIL_FROM is empty",
        ),
        (
            {"FOXHUNT_REPORT_SMTP_HOST": "smtp.test", "FOXHUNT_REPORT_SMTP_PORT": "smtp"},
            "FOXHUNT_REPORT_SMTP_PORT must be a port number",
        ),
        ({"FOXHUNT_REPORT_SLACK_CHANNEL": "#gpu-costs"}, "slack #gpu-costs: SLACK_BOT_TOKEN is empty"),
    ],
)
def test_bad_configuration_is_refused_before_anything_is_sent(report, monkeypatch, env, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(DeliveryError, match=expected):
        deliver(report, WEEK)


# -- Slack, against the stand-in of its Web API ---------------------------------------------------------------
@pytest.fixture
def slack(monkeypatch):
    stand_in = SlackStandIn()
    monkeypatch.setenv("FOXHUNT_REPORT_SLACK_API_URL", stand_in.url + "/api/")
    monkeypatch.setenv("SLACK_BOT_TOKEN", TOKEN)
    yield stand_in
    stand_in.close()


@pytest.mark.servers
def test_slack_posts_the_headline_and_uploads_the_page(slack, report, monkeypatch, caplog, capsys):
    monkeypatch.setenv("FOXHUNT_REPORT_SLACK_CHANNEL", "#gpu-costs")
    caplog.set_level(logging.DEBUG)

    assert deliver(report, WEEK, link=LINK) == ["slack #gpu-costs"]

    paths = [r["path"] for r in slack.requests]
    assert paths == [
        "/api/chat.postMessage",
        "/api/files.getUploadURLExternal",
        "/upload/v1/F0REPORT",
        "/api/files.completeUploadExternal",
    ]
    post, get_url, upload, complete = slack.requests
    text = post["params"]["text"]
    assert post["params"]["channel"] == "#gpu-costs"
    assert "GPU cost report — week of 2026-11-16" in text
    assert money(report.figures["total_usd"]) in text and money(report.figures["idle_usd"]) in text
    assert "<http://127.0.0.1:3000/assets/weekly_cost_report?a=1&amp;b=2|Open it in Dagster>" in text
    assert get_url["params"]["filename"] == "gpu-cost-report-2026-11-16.html"
    assert int(get_url["params"]["length"]) == len(report.html.encode())
    assert upload["body"].decode() == report.html
    assert complete["params"]["channel_id"] == "C0GPUCOSTS"
    assert complete["params"]["thread_ts"] == "1763337600.000100"
    assert json.loads(complete["params"]["files"])[0]["id"] == "F0REPORT"

    # the token travels only in the Authorization header of the API calls (the upload URL is pre-signed)
    for r in slack.requests:
        auth = r["headers"].get("Authorization")
        assert auth == (None if r["path"].startswith("/upload/") else f"Bearer {TOKEN}")
        assert TOKEN.encode() not in r["body"] and TOKEN not in r["path"]
    assert TOKEN not in caplog.text + "".join(capsys.readouterr())


@pytest.mark.servers
def test_slack_error_names_the_channel_not_the_token(slack, report, monkeypatch, caplog):
    monkeypatch.setenv("FOXHUNT_REPORT_SLACK_CHANNEL", "#no-such-channel")
    caplog.set_level(logging.DEBUG)

    with pytest.raises(DeliveryError) as info:
        deliver(report, WEEK)

    message = str(info.value)
    assert "slack #no-such-channel" in message and "channel_not_found" in message
    assert "invite the bot" in message
    assert TOKEN not in message and TOKEN not in caplog.text and unchained(info.value)
    assert [r["path"] for r in slack.requests] == ["/api/chat.postMessage"]  # nothing uploaded


@pytest.mark.servers
def test_slack_rate_limits_are_retried_a_bounded_number_of_times(slack, report, monkeypatch):
    monkeypatch.setenv("FOXHUNT_REPORT_SLACK_CHANNEL", "#gpu-costs")
    slack.rate_limit_next = 1
    assert deliver(report, WEEK) == ["slack #gpu-costs"]
    assert [r["path"] for r in slack.requests][:2] == ["/api/chat.postMessage"] * 2

    slack.requests.clear()
    slack.rate_limit_next = 100
    with pytest.raises(DeliveryError, match="slack #gpu-costs .*chat.postMessage failed: ratelimited"):
        deliver(report, WEEK)
    assert len(slack.requests) == 3  # the call and two retries


@pytest.mark.servers
def test_a_failing_sink_does_not_stop_the_others(slack, report, monkeypatch):
    monkeypatch.setenv("FOXHUNT_REPORT_SLACK_CHANNEL", "#gpu-costs")
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_PORT", str(_free_port()))
    monkeypatch.setenv("FOXHUNT_REPORT_EMAIL_FROM", "reports@foxhunt.test")
    monkeypatch.setenv("FOXHUNT_REPORT_EMAIL_TO", "ops@foxhunt.test")

    with pytest.raises(DeliveryError) as info:
        deliver(report, WEEK)

    assert info.value.failures.keys() == {"email"}
    assert info.value.delivered == ["slack #gpu-costs"]
    assert "delivered nonetheless: slack #gpu-costs" in str(info.value)
    assert len(slack.requests) == 4


@pytest.mark.servers
def test_the_callers_slack_client_is_used(slack, report, monkeypatch):
    monkeypatch.setenv("FOXHUNT_REPORT_SLACK_CHANNEL", "#gpu-costs")
    monkeypatch.delenv("SLACK_BOT_TOKEN")  # the client brings its own token, as the Dagster resource's does
    other = "xoxb-2222-from-the-caller"
    assert deliver(report, WEEK, slack_client=lambda: slack_web_client(other, slack.url + "/api/")) == [
        "slack #gpu-costs"
    ]
    assert {r["headers"].get("Authorization") for r in slack.requests} == {f"Bearer {other}", None}


@pytest.mark.servers
def test_nothing_configured_sends_nothing(slack, report, monkeypatch):
    # credentials and recipients alone switch nothing on: the SMTP host and the Slack channel do
    monkeypatch.setenv("FOXHUNT_REPORT_EMAIL_TO", "ops@foxhunt.test")
    monkeypatch.setenv("FOXHUNT_REPORT_SMTP_PASSWORD", PASSWORD)
    started = time.monotonic()

    def no_client():
        raise AssertionError("no Slack channel, so no Slack client either")

    assert deliver(report, WEEK, link=LINK, slack_client=no_client) == []
    assert slack.requests == [] and time.monotonic() - started < 1.0


def test_both_deliveries_share_one_error_text():
    """errors.py and slack_client.slack_error_text: the texts the report's sender and the alert sinks show."""
    import smtplib

    from slack_sdk.errors import SlackApiError
    from slack_sdk.web import SlackResponse

    from foxhunt_obs.lib.delivery.errors import failure_text, scrub_secrets
    from foxhunt_obs.lib.delivery.slack_client import slack_error_text

    b64 = "czNjcjN0LVBhNTV3b3JkLWRvLW5vdC1sb2c="  # PASSWORD, base64-encoded
    assert scrub_secrets(f"{PASSWORD} / {b64} / x", PASSWORD, "") == "*** / *** / x"
    assert (
        failure_text(smtplib.SMTPAuthenticationError(535, b"5.7.8 no"))
        == "SMTPAuthenticationError: 535 5.7.8 no"
    )
    assert failure_text(OSError(f"refused {PASSWORD}"), PASSWORD) == "OSError: refused ***"
    assert failure_text(TimeoutError()) == "TimeoutError"

    def slack_error(error: str | None, status: int = 200) -> SlackApiError:
        data = {"ok": False, **({"error": error} if error else {})}
        response = SlackResponse(
            client=None, http_verb="POST", api_url="", req_args={}, data=data, headers={}, status_code=status
        )
        return SlackApiError("refused", response)

    invite = " (check the channel name and invite the bot to the channel)"
    assert slack_error_text(slack_error("not_in_channel"), TOKEN) == "not_in_channel" + invite
    assert slack_error_text(slack_error("channel_not_found"), TOKEN) == "channel_not_found" + invite
    assert slack_error_text(slack_error("invalid_auth"), TOKEN) == "invalid_auth (check SLACK_BOT_TOKEN)"
    assert slack_error_text(slack_error("missing_scope"), TOKEN, send.SLACK_SCOPES) == (
        "missing_scope (the bot needs the chat:write and files:write scopes)"
    )
    assert slack_error_text(slack_error("missing_scope"), TOKEN) == "missing_scope"
    assert slack_error_text(slack_error(None, 502), TOKEN) == "HTTP 502"
    assert slack_error_text(slack_error(f"odd {TOKEN}"), TOKEN) == "odd ***"
    assert slack_error_text(ConnectionError(f"down {TOKEN}"), TOKEN) == "ConnectionError: down ***"
