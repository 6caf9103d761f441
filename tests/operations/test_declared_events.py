"""Issue 33 item 4: a declared provider's events reach the inbox however the provider signs and
shapes them — Stripe (``Stripe-Signature``), GitHub (``X-Hub-Signature-256``), Slack (``v0``) —
read through the source's JSON pointers; a forged or stale one is refused with nothing stored."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from operations.adapters.declared_actions import generic_http_config
from reconciliation.models import ProviderEvent

STRIPE_SECRET = "whsec_test_stripe_endpoint_secret"
SHARED = "gh-or-slack-shared-secret"

STRIPE_FIELDS = {
    "provider_reference": "/data/object/id",
    "reference": "/data/object/metadata/reference",
    "idempotency_key": "/data/object/metadata/idempotency_key",
    "amount": "/data/object/amount",
    "currency": "/data/object/currency",
    "object": "/data/object/object",
}


def declare(settings: Any, monkeypatch: pytest.MonkeyPatch, events: dict[str, Any]) -> None:
    monkeypatch.setenv("TEST_EVENTS_SECRET", STRIPE_SECRET if events.get("scheme") == "stripe" else SHARED)
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.charge": {
            "url": "https://api.acme.test/v1/charges",
            "events": {"secret": "env:TEST_EVENTS_SECRET", **events},
        }
    }


def stripe_event(event_id: str = "evt_1", event_type: str = "charge.succeeded") -> dict[str, Any]:
    return {
        "id": event_id,
        "object": "event",
        "type": event_type,
        "created": int(time.time()),
        "data": {
            "object": {
                "id": "ch_1",
                "object": "charge",
                "amount": 1200,
                "currency": "eur",
                "status": "succeeded",
                "metadata": {"reference": "order-77", "idempotency_key": "k-1"},
            }
        },  # fmt: skip
    }


def stripe_signed(body: bytes, secret: str = STRIPE_SECRET, at: int | None = None) -> dict[str, str]:
    """Stripe's documented signature: HMAC-SHA256 of "{t}.{body}" with the endpoint secret."""
    t = int(time.time()) if at is None else at
    signature = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={t},v1={signature}"}


def post(client: Client, body: bytes, headers: dict[str, str]) -> Any:
    return client.post(
        "/providers/acme-pay/events", data=body, content_type="application/json", headers=headers
    )


@pytest.mark.django_db
def test_i33_4_a_stripe_signed_event_proves_a_charge_through_its_pointers(
    settings: Any, monkeypatch: pytest.MonkeyPatch, client: Client
) -> None:
    # given
    declare(settings, monkeypatch, {"source": "acme-pay", "scheme": "stripe", "fields": STRIPE_FIELDS,
                                    "proving_types": ["charge.succeeded"]})  # fmt: skip
    body = json.dumps(stripe_event()).encode()

    # when
    response = post(client, body, stripe_signed(body))

    # then
    assert response.status_code == 200, response.content
    stored = ProviderEvent.objects.get()
    assert (stored.event_id, stored.provider_reference, stored.reference, stored.idempotency_key) == (
        "evt_1", "ch_1", "order-77", "k-1",
    )  # fmt: skip
    assert (stored.amount, stored.currency, stored.event_type) == (1200, "EUR", "charge.succeeded")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "forgery",
    ["wrong secret", "altered body", "stale timestamp", "future timestamp", "no header"],
)
def test_i33_4_a_forged_or_stale_stripe_event_is_refused_with_nothing_stored(
    settings: Any, monkeypatch: pytest.MonkeyPatch, client: Client, forgery: str
) -> None:
    declare(settings, monkeypatch, {"source": "acme-pay", "scheme": "stripe", "fields": STRIPE_FIELDS})
    body = json.dumps(stripe_event()).encode()
    headers = {
        "wrong secret": stripe_signed(body, secret="whsec_someone_else"),
        "altered body": stripe_signed(body.replace(b"1200", b"9900")),
        "stale timestamp": stripe_signed(body, at=int(time.time()) - 360),
        "future timestamp": stripe_signed(body, at=int(time.time()) + 360),
        "no header": {},
    }[forgery]
    response = post(client, body, headers)
    assert response.status_code == 401
    assert not ProviderEvent.objects.exists()


@pytest.mark.django_db
def test_i33_4_github_and_slack_signed_events_reach_the_inbox(
    settings: Any, monkeypatch: pytest.MonkeyPatch, client: Client
) -> None:
    # GitHub: HMAC-SHA256 of the body, the delivery id in X-GitHub-Delivery
    declare(settings, monkeypatch, {"source": "acme-pay", "scheme": "github-hmac",
                                    "fields": {"type": "/action", "provider_reference": "/deployment/node_id"}})  # fmt: skip
    body = json.dumps({"action": "created", "deployment": {"node_id": "DE_1"}}).encode()
    signature = "sha256=" + hmac.new(SHARED.encode(), body, hashlib.sha256).hexdigest()
    headers = {"X-Hub-Signature-256": signature, "X-GitHub-Delivery": "d-1"}
    assert post(client, body, headers).status_code == 200
    assert post(client, body, {**headers, "X-Hub-Signature-256": "sha256=" + "0" * 64}).status_code == 401
    # Slack: v0:{timestamp}:{body}
    declare(
        settings,
        monkeypatch,
        {"source": "acme-pay", "scheme": "slack-v0", "fields": {"id": "/event_id", "type": "/event/type"}},
    )
    body = json.dumps({"event_id": "Ev1", "event": {"type": "message"}}).encode()
    ts = str(int(time.time()))
    signature = "v0=" + hmac.new(SHARED.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
    assert (
        post(client, body, {"X-Slack-Signature": signature, "X-Slack-Request-Timestamp": ts}).status_code
        == 200
    )
    old = str(int(time.time()) - 600)
    signature = "v0=" + hmac.new(SHARED.encode(), f"v0:{old}:".encode() + body, hashlib.sha256).hexdigest()
    assert (
        post(client, body, {"X-Slack-Signature": signature, "X-Slack-Request-Timestamp": old}).status_code
        == 401
    )
    assert sorted(ProviderEvent.objects.values_list("event_id", flat=True)) == ["Ev1", "d-1"]


@pytest.mark.django_db
def test_an_unreadable_named_secret_refuses_every_event(
    settings: Any, monkeypatch: pytest.MonkeyPatch, client: Client
) -> None:
    declare(settings, monkeypatch, {"source": "acme-pay", "scheme": "stripe", "fields": STRIPE_FIELDS})
    monkeypatch.delenv("TEST_EVENTS_SECRET")
    body = json.dumps(stripe_event()).encode()
    assert post(client, body, stripe_signed(body)).status_code == 401
    assert not ProviderEvent.objects.exists()


@pytest.mark.parametrize(
    ("events", "words"),
    [
        ({"source": "acme-pay", "scheme": "stripe", "secret": "whsec_literal"}, "must name a secret"),
        ({"source": "acme-pay", "scheme": "hmac-of-my-own"}, "unknown event signature scheme"),
        ({"source": "acme-pay", "tolerance_seconds": 0}, "tolerance_seconds"),
        ({"source": "acme-pay", "fields": {"colour": "/c"}}, "unknown event field"),
        ({"source": "acme-pay", "fields": {"id": "id"}}, "pointer of 'id'"),
    ],
)
def test_i33_4_a_malformed_events_declaration_is_refused_at_start_up(
    settings: Any, events: Any, words: str
) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.charge": {"url": "https://api.acme.test", "events": events}}
    with pytest.raises(ImproperlyConfigured, match=words):
        generic_http_config()
