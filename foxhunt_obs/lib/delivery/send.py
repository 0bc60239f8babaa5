"""Deliver the weekly cost report where it is configured: by e-mail (SMTP) and to a Slack channel.

Both sinks are optional; the caller hands their settings over as a ``ReportDelivery`` (in Dagster the
``report`` resource's, its fields the ``FOXHUNT_REPORT_*`` settings) and a Slack client maker (the ``slack``
resource's). Nothing configured: nothing is sent.

* E-mail: one ``multipart/mixed`` message holding a ``multipart/alternative`` (the Markdown as plain text,
  its inline charts replaced by the names of the attached files; the self-contained HTML page) and, for mail
  clients that strip ``data:`` images, the PNG charts and ``report.html`` as attachments. STARTTLS (verified
  against the system's CA store, so ``SSL_CERT_FILE`` is honoured) when configured, login only when a user
  is set, a timeout on every socket operation.
* Slack (a ``slack_sdk`` WebClient from the caller: in Dagster the ``slack`` resource's, else
  ``slack_client.slack_web_client``; bot scopes ``chat:write`` and ``files:write``, the bot a member of the
  channel): a short message with the headline figures, then the HTML page uploaded into that message's
  thread (``files_upload_v2``). Timeouts and bounded retries (connection errors, rate limits).

Secrets (the SMTP password, the Slack token) never reach a log line, an exception message or a repr: a
failure raises ``DeliveryError`` naming the sink and the server or channel, with the cause's text scrubbed
and its traceback chain cut. Every configured sink is tried even when an earlier one fails, so a dead mail
server does not keep the report from Slack; the error then lists what failed and what was delivered.
"""

from __future__ import annotations

import base64
import html
import logging
import re
import smtplib
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime
from email.message import EmailMessage
from email.utils import formataddr, formatdate, getaddresses, make_msgid

from slack_sdk import WebClient

from foxhunt_obs.lib import settings
from foxhunt_obs.lib.delivery.errors import failure_text
from foxhunt_obs.lib.delivery.slack_client import slack_error_text
from foxhunt_obs.lib.errors import InputError
from foxhunt_obs.lib.redact import remember
from foxhunt_obs.lib.report.formatting import NO_VALUE, money, pct
from foxhunt_obs.lib.report.model import Report
from foxhunt_obs.lib.settings import default

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0  # one SMTP socket operation (Slack's: slack_client.TIMEOUT_S)
SLACK_SCOPES = ("chat:write", "files:write")  # the bot's, named when Slack answers missing_scope


class DeliveryError(InputError, RuntimeError):
    """One or more sinks failed. ``failures``: sink -> message (server or channel named, no secret);
    ``delivered``: what did go out before or despite the failure (the same strings ``deliver`` returns)."""

    def __init__(self, failures: dict[str, str], delivered: list[str] | None = None):
        self.failures = dict(failures)
        self.delivered = list(delivered or [])
        message = "; ".join(self.failures.values())
        if self.delivered:
            message += f" (delivered nonetheless: {', '.join(self.delivered)})"
        super().__init__(message)


# -- configuration -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EmailConfig:
    host: str
    port: int
    user: str
    password: str = field(repr=False)
    starttls: bool
    sender: str
    to: tuple[str, ...]  # header form, display names kept
    recipients: tuple[str, ...]  # bare addresses, the SMTP envelope

    @property
    def server(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class SlackConfig:
    channel: str
    client: WebClient = field(repr=False)  # holds the token

    @property
    def api_url(self) -> str:
        return self.client.base_url


def _address(value: str) -> str:
    """The bare address of "Name <a@b>" or "a@b"; "" when there is none."""
    parsed = getaddresses([value]) if value else []
    return parsed[0][1].strip() if parsed else ""


@dataclass(frozen=True)
class ReportDelivery:
    """Where the report goes, as configured (the values of the FOXHUNT_REPORT_* settings; empty host: no
    e-mail, empty channel: no Slack). Checked by ``email_config`` and ``slack_config``."""

    smtp_host: str = ""
    smtp_port: str = default("FOXHUNT_REPORT_SMTP_PORT")
    smtp_user: str = ""
    smtp_password: str = field(default="", repr=False)
    smtp_starttls: str = default("FOXHUNT_REPORT_SMTP_STARTTLS")
    email_from: str = ""
    email_to: str = ""
    slack_channel: str = ""


def email_config(d: ReportDelivery) -> EmailConfig | None:
    """The SMTP settings, checked, or None when there is no SMTP host (no e-mail)."""
    host = d.smtp_host.strip()
    if not host:
        return None

    def bad(message: str) -> DeliveryError:
        return DeliveryError({"email": f"email via SMTP {host}: {message}"})

    raw_port = d.smtp_port.strip()
    try:
        port = int(raw_port)
    except ValueError:
        raise bad(f"FOXHUNT_REPORT_SMTP_PORT must be a port number, got {raw_port!r}") from None
    if not 0 < port < 65536:
        raise bad(f"FOXHUNT_REPORT_SMTP_PORT must be a port number, got {port}")
    user = d.smtp_user.strip()
    parsed = [(name, addr.strip()) for name, addr in getaddresses([d.email_to])]
    parsed = [(name, addr) for name, addr in parsed if name or addr]
    wrong = [formataddr(p) for p in parsed if "@" not in p[1]]
    if wrong:
        raise bad(f"FOXHUNT_REPORT_EMAIL_TO holds something that is not an address: {wrong}")
    if not parsed:
        raise bad("FOXHUNT_REPORT_EMAIL_TO is empty: say who receives the report (comma-separated)")
    sender = d.email_from.strip() or (user if "@" in user else "")
    if "@" not in _address(sender):
        raise bad("FOXHUNT_REPORT_EMAIL_FROM is empty or not an address (and the SMTP user is no address)")
    try:
        starttls = settings.flag("FOXHUNT_REPORT_SMTP_STARTTLS", d.smtp_starttls)
    except ValueError as e:
        raise DeliveryError({"config": str(e)}) from None
    remember(d.smtp_password)
    return EmailConfig(
        host=host,
        port=port,
        user=user,
        password=d.smtp_password,
        starttls=starttls,
        sender=sender,
        to=tuple(formataddr(p) for p in parsed),
        recipients=tuple(addr for _, addr in parsed),
    )


def slack_config(d: ReportDelivery, slack_client: Callable[[], WebClient] | None) -> SlackConfig | None:
    """The Slack settings, or None when there is no report channel (no Slack, and no client built).
    ``slack_client`` makes the client (Dagster passes its ``slack`` resource's ``get_client``)."""
    channel = d.slack_channel.strip()
    if not channel:
        return None
    client = slack_client() if slack_client is not None else None
    if client is None or not client.token:
        raise DeliveryError({"slack": f"slack {channel}: SLACK_BOT_TOKEN is empty"})
    return SlackConfig(channel=channel, client=client)


# -- the one entry point -----------------------------------------------------------------------------------
def deliver(
    report: Report,
    week_start: date,
    link: str | None = None,
    delivery: ReportDelivery = ReportDelivery(),
    slack_client: Callable[[], WebClient] | None = None,
) -> list[str]:
    """Send the report to every configured sink; returns what was done ("email to a@b, c@d",
    "slack #costs"), [] when nothing is configured. link: an http(s) URL to the report (the Dagster UI),
    added to the e-mail and the Slack message. delivery: the sinks' settings. slack_client: makes the Slack
    client, called only when a report channel is set. Raises DeliveryError (configuration checked before anything
    is sent; then every sink is tried and the failures are raised together)."""
    week = week_start.date() if isinstance(week_start, datetime) else week_start
    link = link if link and re.match(r"https?://", link) else None
    email = email_config(delivery)
    slack = slack_config(delivery, slack_client)
    done: list[str] = []
    failures: dict[str, str] = {}
    if email is not None:
        try:
            done.append(send_email(build_email(report, week, email, link), email))
        except DeliveryError as exc:
            failures.update(exc.failures)
    if slack is not None:
        try:
            done.append(send_slack(report, week, slack, link))
        except DeliveryError as exc:
            failures.update(exc.failures)
    if failures:
        raise DeliveryError(failures, done)
    return done


# -- e-mail --------------------------------------------------------------------------------------------------
def report_subject(report: Report, week_start: date) -> str:
    f = report.figures
    return (
        f"GPU cost report — week of {week_start.isoformat()}: {money(f.get('total_usd'))}, "
        f"idle {money(f.get('idle_usd'))} ({pct(f.get('idle_pct'))})"
    )


_MD_IMAGE = re.compile(r"!\[((?:\\.|[^\]\\])*)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)")


def _plain_text(report: Report, link: str | None) -> str:
    """The Markdown without its data: images (each becomes the name of the attached PNG)."""
    names = {base64.b64encode(png).decode("ascii"): name for name, png in report.charts.items()}

    def image(m: re.Match) -> str:
        alt = re.sub(r"\\(.)", r"\1", m.group(1))
        name = names.get(m.group(2))
        return f"[{alt}: see the attached {name}]" if name else f"[{alt}: see the attached report.html]"

    text = _MD_IMAGE.sub(image, report.markdown)
    if link:
        text = f"Open this report in Dagster: {link}\n\n{text}"
    return text


def _html_body(report: Report, link: str | None) -> str:
    if not link or "<main>" not in report.html:
        return report.html
    anchor = f'<p><a href="{html.escape(link, quote=True)}">Open this report in Dagster</a></p>\n'
    return report.html.replace("<main>\n", "<main>\n" + anchor, 1)


def build_email(
    report: Report, week_start: date, config: EmailConfig, link: str | None = None
) -> EmailMessage:
    msg = EmailMessage()
    msg["Subject"] = report_subject(report, week_start)
    msg["From"] = config.sender
    msg["To"] = ", ".join(config.to)
    msg["Date"] = formatdate(usegmt=True)
    msg["Message-ID"] = make_msgid(domain=_address(config.sender).rpartition("@")[2] or None)
    msg.set_content(_plain_text(report, link))
    msg.add_alternative(_html_body(report, link), subtype="html")
    for name, png in sorted(report.charts.items()):
        msg.add_attachment(png, maintype="image", subtype="png", filename=name)
    # base64 bytes: the saved file is the page byte for byte (text parts travel with CRLF line ends)
    html_bytes = report.html.encode("utf-8")
    msg.add_attachment(
        html_bytes, maintype="text", subtype="html", filename="report.html", params={"charset": "utf-8"}
    )
    return msg


def send_email(msg: EmailMessage, config: EmailConfig, timeout: float = TIMEOUT_S) -> str:
    """Send over SMTP; returns "email to a@b, c@d"."""
    step = "connect"
    try:
        with smtplib.SMTP(config.host, config.port, timeout=timeout) as smtp:
            step = "EHLO"
            smtp.ehlo()
            if config.starttls:
                step = "STARTTLS"
                smtp.starttls(context=ssl.create_default_context())
                smtp.ehlo()
            if config.user:
                if not config.starttls:
                    log.warning(
                        "e-mail: logging in to %s as %s without STARTTLS (the password travels in clear)",
                        config.server,
                        config.user,
                    )
                step = "login"
                smtp.login(config.user, config.password)
            step = "send"
            refused = smtp.send_message(msg, from_addr=config.sender, to_addrs=list(config.recipients))
    except (OSError, smtplib.SMTPException) as exc:  # socket errors, timeouts and TLS errors are OSErrors
        message = f"email via SMTP {config.server}: {step} failed: {failure_text(exc, config.password)}"
        raise DeliveryError({"email": message}) from None
    if refused:
        accepted = [r for r in config.recipients if r not in refused]
        message = (
            f"email via SMTP {config.server}: recipients refused: {sorted(refused)} "
            f"(sent to {', '.join(accepted)})"
        )
        raise DeliveryError({"email": message})
    done = f"email to {', '.join(config.recipients)}"
    log.info("weekly report: %s via %s", done, config.server)
    return done


# -- Slack ---------------------------------------------------------------------------------------------------
def slack_text(report: Report, week_start: date, link: str | None = None) -> str:
    """The headline in Slack mrkdwn (only numbers and the link come from outside; the link is escaped)."""
    f = report.figures
    lines = [
        f"*GPU cost report — week of {week_start.isoformat()}*",
        f"Spend {money(f.get('total_usd'))} · idle {money(f.get('idle_usd'))} ({pct(f.get('idle_pct'))}) · "
        f"GPU utilization {pct(f.get('util_pct'))} · {money(f.get('usd_per_active_gpu_hour'))} "
        "per active GPU-hour",
    ]
    extra = []
    if money(f.get("bill_usd")) != NO_VALUE:
        gap = pct(f.get("estimate_gap_pct"), signed=True)
        extra.append(f"Bill {money(f.get('bill_usd'))} (estimate gap {gap})")
    if pct(f.get("week_over_week_usd_pct")) != NO_VALUE:
        extra.append(f"Week over week {pct(f.get('week_over_week_usd_pct'), signed=True)}")
    if extra:
        lines.append(" · ".join(extra))
    tail = "The full report (HTML) is in the thread."
    if link:
        safe = link.replace("&", "&amp;").replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")
        tail = f"<{safe}|Open it in Dagster>. " + tail
    lines.append(tail)
    return "\n".join(lines)


def send_slack(report: Report, week_start: date, config: SlackConfig, link: str | None = None) -> str:
    """Post the headline to the channel and upload report.html into its thread; returns "slack #channel"."""
    client = config.client
    step = "chat.postMessage"
    try:
        posted = client.chat_postMessage(
            channel=config.channel,
            text=slack_text(report, week_start, link),
            unfurl_links=False,
            unfurl_media=False,
        )
        step = "files_upload_v2"
        client.files_upload_v2(
            channel=posted["channel"],  # the id: files.completeUploadExternal takes no channel name
            thread_ts=posted["ts"],
            content=report.html,
            filename=f"gpu-cost-report-{week_start.isoformat()}.html",
            title=f"GPU cost report — week of {week_start.isoformat()}",
        )
    except Exception as exc:  # Slack's error, a connection error, a timeout, a failed upload, a bad answer
        error = slack_error_text(exc, client.token, SLACK_SCOPES)
        message = f"slack {config.channel} via {config.api_url}: {step} failed: {error}"
        raise DeliveryError({"slack": message}) from None
    done = f"slack {config.channel}"
    log.info("weekly report: %s (message %s, report.html in its thread)", done, posted["ts"])
    return done
