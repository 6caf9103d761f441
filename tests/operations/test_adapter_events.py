"""Adapters declaring provider evidence (issue 19): the sandbox's three event sources, a generic
HTTP action's ``events`` configuration (validated), and how each reads an event body."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from operations.adapters.declared_actions import generic_http_config
from operations.adapters.events import EventInvalid, EventSignatureInvalid, key_from_message_id
from operations.adapters.registry import evidence_sources, get_adapter

ACME_SECRET = "whsec_" + "YWNtZS1wYXktZXZlbnRzLXNlY3JldA=="


def acme(events: Any) -> dict[str, Any]:
    return {"acme.transfer": {"url": "https://api.acme.test/v1/transfers", "events": events}}


def signed(event: dict[str, Any], secret: str) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(event).encode()
    now = timezone.now()
    return body, {
        "webhook-id": event["id"],
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(event["id"], now, body.decode()),
    }


def test_sandbox_adapters_declare_their_sources() -> None:
    sources = evidence_sources()
    assert {slug: type(adapter).__name__ for slug, adapter in sources.items()} == {
        "sandbox-payments": "SandboxPaymentsAdapter",
        "sandbox-email": "SandboxEmailAdapter",
        "sandbox-reservations": "SandboxReservationsAdapter",
    }
    assert get_adapter("email.send").proving_event_types == {
        "email.sent": "email.send",
        "email.delivered": "email.send",
    }


def test_sandbox_secret_from_settings_and_per_source_override(settings: Any) -> None:
    adapter = get_adapter("payments.charge")
    assert adapter.event_secret() == settings.SANDBOX_EVENTS_SECRET
    settings.EFFECT_LEDGER_PROVIDER_EVENT_SECRETS = {"sandbox-payments": ACME_SECRET}
    assert adapter.event_secret() == ACME_SECRET
    assert get_adapter("email.send").event_secret() == settings.SANDBOX_EVENTS_SECRET


@pytest.mark.parametrize(
    "events",
    [
        "acme-pay",
        {"source": "Acme Pay"},
        {"source": "acme-pay", "secret": "plain"},
        {"source": "acme-pay", "proving_types": "transfer.succeeded"},
        {"source": "acme-pay", "other": 1},
    ],
)
def test_generic_events_configuration_is_validated(settings: Any, events: Any) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = acme(events)
    with pytest.raises(ImproperlyConfigured, match="events"):
        generic_http_config()


def test_generic_action_declares_its_source_and_proving_types(settings: Any) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = acme({"source": "acme-pay", "secret": ACME_SECRET})
    adapter = evidence_sources()["acme-pay"]
    assert adapter.actions == ("acme.transfer",)
    event = {
        "id": "evt_1",
        "type": "transfer.succeeded",
        "data": {"object": "transfer", "id": "tr_1", "amount": 5},
    }
    body, headers = signed(event, ACME_SECRET)
    webhook_id = adapter.verify_event(body, headers)
    facts = adapter.parse_event(body, webhook_id=webhook_id)
    assert (facts.proves_action, facts.provider_reference, facts.amount) == ("acme.transfer", "tr_1", 5)
    other = adapter.parse_event(
        json.dumps({**event, "type": "transfer.created"}).encode(), webhook_id="evt_1"
    )
    assert other.proves_action == ""
    with pytest.raises(EventSignatureInvalid):
        adapter.verify_event(*signed(event, "whsec_" + "b3RoZXI="))


def test_generic_listed_proving_types_only(settings: Any) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = acme(
        {"source": "acme-pay", "secret": ACME_SECRET, "proving_types": ["transfer.paid"]}
    )
    adapter = evidence_sources()["acme-pay"]
    body = json.dumps({"id": "e", "type": "transfer.succeeded", "data": {}}).encode()
    assert adapter.parse_event(body, webhook_id="e").proves_action == ""
    body = json.dumps({"id": "e", "type": "transfer.paid", "data": {"id": "tr_1"}}).encode()
    assert adapter.parse_event(body, webhook_id="e").proves_action == "acme.transfer"
    # a proving type must name the effect, as the sandbox's reader requires (issue 33)
    body = json.dumps({"id": "e", "type": "transfer.paid", "data": {}}).encode()
    with pytest.raises(EventInvalid, match="names no provider id"):
        adapter.parse_event(body, webhook_id="e")


def test_source_without_a_secret_refuses_everything(settings: Any) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = acme({"source": "acme-pay"})
    adapter = evidence_sources()["acme-pay"]
    with pytest.raises(EventSignatureInvalid, match="no event secret"):
        adapter.verify_event(*signed({"id": "e"}, ACME_SECRET))


def test_email_key_is_read_from_the_message_id() -> None:
    assert key_from_message_id("<abc-123@effect-ledger.local>") == "abc-123"
    assert key_from_message_id("<abc@elsewhere.test>") == ""
    adapter = get_adapter("email.send")
    body = json.dumps(
        {
            "id": "e",
            "type": "email.sent",
            "data": {"object": "email", "id": "em_1", "message_id": "<k1@effect-ledger.local>"},
        }
    ).encode()
    facts = adapter.parse_event(body, webhook_id="e")
    assert (facts.idempotency_key, facts.proves_action) == ("k1", "email.send")
    with pytest.raises(EventInvalid):
        adapter.parse_event(body, webhook_id="other")


@pytest.mark.django_db
def test_generic_source_inbox_end_to_end(settings: Any, client: Client) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = acme({"source": "acme-pay", "secret": ACME_SECRET})
    event = {"id": "evt_g", "type": "transfer.succeeded", "data": {"object": "transfer", "id": "tr_9"}}
    body, headers = signed(event, ACME_SECRET)
    response = client.post(
        "/providers/acme-pay/events", data=body, content_type="application/json", headers=headers
    )
    assert response.status_code == 200 and response.json()["stored"] is True


# --- fixes after review (issue 19): declared types, refusals of the reader -----------------


def test_c20_sandbox_sources_declare_exactly_what_the_sandbox_sends() -> None:
    from console.lab.sandbox_provider.events import EVENT_TYPES

    sources = evidence_sources()
    declared = {t: slug for slug, adapter in sources.items() for t in adapter.event_types}
    assert sorted(declared) == sorted(EVENT_TYPES)
    assert declared["refund.succeeded"] == "sandbox-payments"
    assert sources["sandbox-payments"].event_types["refund.succeeded"] == "refund"
    for slug, adapter in sources.items():
        assert set(adapter.proving_event_types) <= set(adapter.event_types), slug


@pytest.mark.parametrize(
    "action,kind,obj",
    [
        ("email.send", "charge.succeeded", "charge"),
        ("payments.charge", "charge.exploded", "charge"),
        ("payments.charge", "charge.succeeded", "email"),
        ("payments.charge", "charge.succeeded", ""),
        ("reservations.create", "reservation.created", "charge"),
    ],
)
def test_c20_sandbox_reader_refuses_types_and_objects_not_sent(action: str, kind: str, obj: str) -> None:
    body = json.dumps({"id": "e", "type": kind, "data": {"object": obj, "id": "x_1"}}).encode()
    with pytest.raises(EventInvalid, match=kind):
        get_adapter(action).parse_event(body, webhook_id="e")


def test_c20_generic_types_limit_what_is_accepted(settings: Any) -> None:
    # without types: any type is read; only proving types prove
    settings.EFFECT_LEDGER_GENERIC_HTTP = acme({"source": "acme-pay", "secret": ACME_SECRET})
    body = json.dumps({"id": "e", "type": "transfer.whatever", "data": {"object": "x"}}).encode()
    assert evidence_sources()["acme-pay"].parse_event(body, webhook_id="e").proves_action == ""
    # with types: another type is refused
    settings.EFFECT_LEDGER_GENERIC_HTTP = acme(
        {"source": "acme-pay", "secret": ACME_SECRET, "types": ["transfer.created", "transfer.succeeded"]}
    )
    adapter = evidence_sources()["acme-pay"]
    with pytest.raises(EventInvalid, match="transfer.whatever"):
        adapter.parse_event(body, webhook_id="e")
    ok = json.dumps(
        {"id": "e", "type": "transfer.succeeded", "data": {"object": "transfer", "id": "t"}}
    ).encode()
    assert adapter.parse_event(ok, webhook_id="e").proves_action == "acme.transfer"


@pytest.mark.parametrize(
    "events",
    [
        {"source": "acme-pay", "types": "transfer.succeeded"},
        {"source": "acme-pay", "types": []},
        {"source": "acme-pay", "types": ["transfer.created"], "proving_types": ["transfer.succeeded"]},
    ],
)
def test_c20_generic_types_configuration_is_validated(settings: Any, events: Any) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = acme(events)
    with pytest.raises(ImproperlyConfigured, match=r"\['types'\] must|among its 'types'"):
        generic_http_config()


@pytest.mark.parametrize(
    "data,created,words",
    [
        ({"object": "charge", "amount": -1}, None, "negative"),
        ({"object": "charge"}, "0001-01-01T00:00:00+05:00", "created"),
        ({"object": "charge"}, "9999-12-31T23:59:59-05:00", "created"),
        ({"object": "charge"}, "2100-01-01T00:00:00Z", "created"),
        ({"object": "charge", "note": "a\x00b"}, None, "NUL"),
        ({"object": "charge", "note": "\ud800"}, None, "UTF-8"),
        ({"object": "charge", "a\x00": 1}, None, "NUL"),
    ],
)
def test_c20_reader_refuses_what_cannot_be_stored(
    data: dict[str, Any], created: str | None, words: str
) -> None:
    event: dict[str, Any] = {"id": "e", "type": "charge.succeeded", "data": data}
    if created is not None:
        event["created"] = created
    with pytest.raises(EventInvalid, match=words):
        get_adapter("payments.charge").parse_event(json.dumps(event).encode(), webhook_id="e")


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"statements": ["acme-pay"]}, "must be {'source': slug}"),
        ({"statements": {"source": 5}}, "must be a slug"),
        ({"statements": {"source": "Acme Pay!"}}, "must be a slug"),
        ({"statements": {"source": "acme-pay", "extra": 1}}, "must be {'source': slug}"),
        (
            {"events": {"source": "acme-pay", "secret": ACME_SECRET}, "statements": {"source": "acme-stmt"}},
            "must be the same as its events' source",
        ),
    ],
)
def test_c21_generic_statements_configuration_is_validated(settings: Any, entry: Any, words: str) -> None:
    # a bad statements entry is refused when the configuration is read, not per submission
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.transfer": {"url": "https://api.acme.test/v1/t", **entry}}
    with pytest.raises(ImproperlyConfigured, match=re.escape(words)):
        generic_http_config()


def test_c20_a_source_declared_by_two_adapters_is_refused(settings: Any, client: Any) -> None:
    # given: a generic action claiming the sandbox's payments source with its own secret
    settings.EFFECT_LEDGER_GENERIC_HTTP = acme({"source": "sandbox-payments", "secret": ACME_SECRET})
    # then: the configuration check says so, and neither adapter takes that source's events
    from operations.checks import evidence_source_check

    errors = evidence_source_check()
    assert [e.id for e in errors] == ["operations.E003"]
    assert "acme.transfer" in errors[0].msg and "payments.charge" in errors[0].msg
    assert "sandbox-payments" not in evidence_sources()
    assert (
        client.post("/providers/sandbox-payments/events", b"{}", content_type="application/json").status_code
        == 404
    )


def test_c21_a_source_with_statements_only_has_no_inbox(settings: Any, client: Any) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {"url": "https://api.acme.test/v1/t", "statements": {"source": "acme-stmt"}}
    }
    assert "acme-stmt" in evidence_sources()
    response = client.post("/providers/acme-stmt/events", b"{}", content_type="application/json")
    assert response.status_code == 404
