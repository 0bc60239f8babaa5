"""docs/contracts/webhook.md against the real sender: the page's worked example is rebuilt through
WebhookSink.body and signed with alert_sinks.sign, byte for byte, and the page's receiver code is run on it
(it accepts the example and refuses an altered, re-signed-with-another-key or stale body). Starts nothing."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest

from foxhunt_obs.lib.delivery.alert_sinks import Notification, WebhookSink, notification_dict, sign

PAGE = Path(__file__).resolve().parents[3] / "docs" / "contracts" / "webhook.md"


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The text under `## heading` up to the next `## `."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


@pytest.fixture(scope="module")
def example(page) -> dict:
    text = section(page, "Worked example")
    secret = re.search(r"secret `([^`]+)`", text).group(1)
    timestamp = int(re.search(r"timestamp `(\d+)`", text).group(1))
    (pretty,) = fenced(text, "json")
    (raw,) = fenced(text, "text")
    headers = dict(re.findall(r"^(X-Foxhunt-[\w-]+): (\S+)$", text, flags=re.M))
    return {
        "secret": secret,
        "timestamp": timestamp,
        "payload": json.loads(pretty),
        "raw": raw.rstrip("\n").encode("utf-8"),
        "headers": headers,
    }


def as_notification(d: dict) -> Notification:
    """A notification of the page, as the sensors would hand it to the sink."""

    def when(s: str | None) -> datetime | None:
        return None if s is None else datetime.fromisoformat(s.replace("Z", "+00:00"))

    return Notification(
        rule=d["rule"],
        fingerprint=d["fingerprint"],
        status=d["status"],
        severity=d["severity"],
        labels=d["labels"],
        summary=d["summary"],
        description=d["description"],
        value=float("nan") if d["value"] is None else d["value"],
        starts_at=when(d["starts_at"]),
        ends_at=when(d["ends_at"]),
        generator_url=d["generator_url"],
        links=d.get("links", {}),
    )


def receiver(page: str):
    """The page's `verify` and `Refused`, executed from its one Python block."""
    (code,) = fenced(section(page, "Verifying a delivery"), "python")
    scope: dict = {}
    exec(compile(code, str(PAGE), "exec"), scope)  # noqa: S102 - the documented code, run as written
    return scope["verify"], scope["Refused"]


def test_the_example_body_is_what_the_sender_builds(example):
    notes = [as_notification(d) for d in example["payload"]["notifications"]]
    sink = WebhookSink("https://hooks.example.com/foxhunt", example["secret"])
    body = sink.body(notes, example["timestamp"])
    assert body == example["raw"], "the page's byte-for-byte body is not what WebhookSink.body sends"
    assert json.loads(body) == example["payload"]
    assert example["payload"]["timestamp"] == example["timestamp"]
    # every field of the contract's notification table is one the sender fills, and no more
    table = section(PAGE.read_text(encoding="utf-8"), "The body").split("Each notification:", 1)[1]
    documented = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert set(documented) == set(notification_dict(notes[0])), documented


def test_the_example_signature_is_the_senders(example):
    assert example["headers"]["X-Foxhunt-Signature"] == sign(example["secret"], example["raw"])
    assert example["headers"]["X-Foxhunt-Timestamp"] == str(example["timestamp"])
    assert sign("another-secret", example["raw"]) != example["headers"]["X-Foxhunt-Signature"]


def test_the_documented_receiver_accepts_the_example_and_refuses_forgeries(page, example):
    verify, refused = receiver(page)
    secret, raw, headers, at = example["secret"], example["raw"], example["headers"], example["timestamp"]

    got = verify(secret, raw, headers, now=at + 5)
    assert [n["rule"] for n in got] == ["gpu_training_stall", "nan_loss"]

    altered = raw.replace(b'"value":0.0', b'"value":0.9')
    with pytest.raises(refused) as bad:
        verify(secret, altered, headers, now=at)
    assert bad.value.status == 401
    with pytest.raises(refused):  # signed, but with the wrong key
        verify(secret, altered, {**headers, "X-Foxhunt-Signature": sign("another-secret", altered)}, now=at)
    with pytest.raises(refused) as stale:  # a replay of the genuine body an hour later
        verify(secret, raw, headers, now=at + 3600)
    assert stale.value.status == 401
    with pytest.raises(refused) as mismatch:
        verify(secret, raw, {**headers, "X-Foxhunt-Timestamp": str(at + 1)}, now=at)
    assert mismatch.value.status == 400


def test_the_documented_receiver_verifies_what_the_sink_sends_now(page):
    """The receiver against a fresh body with the real clock: what a deployment's receiver would see."""
    import time

    verify, _ = receiver(page)
    secret = "whsec-fresh"
    note = as_notification(
        {
            "rule": "gpu_overheat", "fingerprint": "ab" * 32, "status": "firing", "severity": "warning",
            "labels": {"node": "n1", "gpu": "3"}, "summary": "hot", "description": "GPU 3 above 85 °C",
            "value": 88.5, "starts_at": "2026-11-21T14:00:00.000Z", "ends_at": None,
            "generator_url": "http://127.0.0.1:3000/locations/foxhunt_obs/sensors/alert_sensor?rule=gpu_overheat",
        }
    )  # fmt: skip
    timestamp = int(time.time())
    body = WebhookSink("https://hooks.example.com/x", secret).body([note], timestamp)
    headers = {"X-Foxhunt-Timestamp": str(timestamp), "X-Foxhunt-Signature": sign(secret, body)}
    [got] = verify(secret, body, headers)
    assert got["description"] == "GPU 3 above 85 °C" and "\\u" not in body.decode()
