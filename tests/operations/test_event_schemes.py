"""Provider events as real providers sign and shape them (issue 33): the four signature schemes,
the body reader through JSON pointers, and the pointers themselves (RFC 6901)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import stripe
from django.core.exceptions import ImproperlyConfigured
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook

from operations.adapters.event_bodies import check_fields, parse_mapped_event
from operations.adapters.event_schemes import SCHEMES, check_scheme, verify
from operations.adapters.events import EventFacts, EventInvalid, EventSignatureInvalid
from operations.adapters.json_pointer import pointer_from_tokens, pointer_tokens, resolve_pointer

STANDARD_SECRET = "whsec_" + "c3RhbmRhcmQtd2ViaG9va3Mtc2VjcmV0"
STRIPE_SECRET = "whsec_" + "c3RyaXBlLWVuZHBvaW50LXNlY3JldA"
GITHUB_SECRET = "It's a Secret to Everybody"
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
DELIVERY = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
BODY = b'{"id":"evt_1","type":"charge.succeeded","data":{"object":{"id":"ch_1"}}}'


# --- Signing as each provider does -------------------------------------------------------------


def sign_standard(body: bytes, secret: str, timestamp: int) -> dict[str, str]:
    moment = datetime.fromtimestamp(timestamp, UTC)
    return {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(timestamp),
        "webhook-signature": Webhook(secret).sign("msg_1", moment, body.decode()),
    }


def sign_stripe(body: bytes, secret: str, timestamp: int) -> dict[str, str]:
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), secret, timestamp=timestamp)
    return {"Stripe-Signature": header}


def sign_github(body: bytes, secret: str, timestamp: int) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={digest}", "X-GitHub-Delivery": DELIVERY}


def sign_slack(body: bytes, secret: str, timestamp: int) -> dict[str, str]:
    digest = hmac.new(secret.encode(), f"v0:{timestamp}:".encode() + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Signature": f"v0={digest}", "X-Slack-Request-Timestamp": str(timestamp)}


@dataclass(frozen=True)
class Scheme:
    name: str
    secret: str
    sign: Callable[[bytes, str, int], dict[str, str]]
    returns: str
    signs_time: bool
    malformed: dict[str, str]  # header -> a malformed value


SCHEME_CASES = [
    Scheme(
        "standard-webhooks",
        STANDARD_SECRET,
        sign_standard,
        "msg_1",
        True,
        {"webhook-signature": "v1,not-base64!", "webhook-timestamp": "soon"},
    ),
    Scheme(
        "stripe",
        STRIPE_SECRET,
        sign_stripe,
        "",
        True,
        {"Stripe-Signature": "v1=abc,nonsense"},
    ),
    Scheme(
        "github-hmac",
        GITHUB_SECRET,
        sign_github,
        DELIVERY,
        False,
        {"X-Hub-Signature-256": "sha1=0123456789abcdef", "X-GitHub-Delivery": "a\x00b"},
    ),
    Scheme(
        "slack-v0",
        SLACK_SECRET,
        sign_slack,
        "",
        True,
        {"X-Slack-Signature": "v1=abc", "X-Slack-Request-Timestamp": "-5"},
    ),
]
by_name = pytest.mark.parametrize("scheme", SCHEME_CASES, ids=[case.name for case in SCHEME_CASES])


def refused(scheme: Scheme, body: bytes, headers: dict[str, str], now: int, **options: Any) -> str:
    with pytest.raises(EventSignatureInvalid) as caught:
        verify(scheme.name, scheme.secret, body, headers, now=now, **options)
    message = str(caught.value)
    assert scheme.secret not in message
    return message


def test_the_registry_names_four_schemes() -> None:
    assert sorted(SCHEMES) == ["github-hmac", "slack-v0", "standard-webhooks", "stripe"]


@by_name
def test_a_correct_signature_passes(scheme: Scheme) -> None:
    # given
    now = int(time.time())
    headers = scheme.sign(BODY, scheme.secret, now)
    # when
    delivery_id = verify(scheme.name, scheme.secret, BODY, headers, now=now)
    # then
    assert delivery_id == scheme.returns


@by_name
def test_header_names_are_read_in_any_letter_case(scheme: Scheme) -> None:
    now = int(time.time())
    headers = {name.lower(): value for name, value in scheme.sign(BODY, scheme.secret, now).items()}
    assert verify(scheme.name, scheme.secret, BODY, headers, now=now) == scheme.returns


@by_name
def test_a_wrong_secret_is_refused(scheme: Scheme) -> None:
    now = int(time.time())
    other = "whsec_" + "b3RoZXItc2VjcmV0LWVudGlyZWx5"
    refused(scheme, BODY, scheme.sign(BODY, other, now), now)


@by_name
def test_an_altered_body_is_refused(scheme: Scheme) -> None:
    now = int(time.time())
    headers = scheme.sign(BODY, scheme.secret, now)
    refused(scheme, BODY.replace(b"ch_1", b"ch_2"), headers, now)


@by_name
def test_no_secret_configured_refuses_everything(scheme: Scheme) -> None:
    now = int(time.time())
    headers = scheme.sign(BODY, scheme.secret, now)
    with pytest.raises(EventSignatureInvalid, match="no event secret"):
        verify(scheme.name, "", BODY, headers, now=now)


@by_name
def test_each_missing_header_is_refused(scheme: Scheme) -> None:
    now = int(time.time())
    headers = scheme.sign(BODY, scheme.secret, now)
    for name in headers:
        # given a signed request without one of its headers
        partial = {key: value for key, value in headers.items() if key != name}
        # then
        refused(scheme, BODY, partial, now)


@by_name
def test_each_malformed_header_is_refused(scheme: Scheme) -> None:
    now = int(time.time())
    for name, value in scheme.malformed.items():
        headers = {**scheme.sign(BODY, scheme.secret, now), name: value}
        refused(scheme, BODY, headers, now)


@by_name
@pytest.mark.parametrize("offset", [-301, 301, -86_400 * 365, 86_400 * 365])
def test_a_timestamp_outside_the_tolerance_is_refused(scheme: Scheme, offset: int) -> None:
    # given a correct signature made `offset` seconds away from now
    now = int(time.time())
    headers = scheme.sign(BODY, scheme.secret, now + offset)
    # when / then
    if scheme.signs_time:
        message = refused(scheme, BODY, headers, now)
        assert "timestamp" in message.lower()
    else:  # GitHub signs no time: an old delivery verifies, only its delivery id deduplicates it
        assert verify(scheme.name, scheme.secret, BODY, headers, now=now) == scheme.returns


@pytest.mark.parametrize("name", ["stripe", "slack-v0", "standard-webhooks"])
def test_the_tolerance_is_configurable_and_symmetric(name: str) -> None:
    scheme = next(case for case in SCHEME_CASES if case.name == name)
    now = int(time.time())
    for offset in (-60, 60):
        headers = scheme.sign(BODY, scheme.secret, now + offset)
        assert verify(name, scheme.secret, BODY, headers, now=now, tolerance_seconds=60) == scheme.returns
        refused(scheme, BODY, headers, now, tolerance_seconds=59)


def test_stripe_accepts_any_v1_and_ignores_other_schemes() -> None:
    # given a secret being rolled: two v1 signatures, the test-mode v0 beside them
    now = int(time.time())
    good = sign_stripe(BODY, STRIPE_SECRET, now)["Stripe-Signature"].split(",")[1]
    header = f"t={now},v1={'0' * 64},{good},v0={'1' * 64}"
    # then
    assert verify("stripe", STRIPE_SECRET, BODY, {"Stripe-Signature": header}, now=now) == ""


def test_stripe_uses_the_secret_as_text_not_base64() -> None:
    # given a signature keyed with the base64-decoded part of the secret
    now = int(time.time())
    decoded_key = b"stripe-endpoint-secret"
    digest = hmac.new(decoded_key, f"{now}.".encode() + BODY, hashlib.sha256).hexdigest()
    headers = {"Stripe-Signature": f"t={now},v1={digest}"}
    # then
    with pytest.raises(EventSignatureInvalid, match="no v1 signature"):
        verify("stripe", STRIPE_SECRET, BODY, headers, now=now)


@pytest.mark.parametrize(
    "header",
    ["t=1,t=2,v1=ab", "v1=ab", "t=12x,v1=ab", "t=1", "t=1,v1=é", "", " , "],
)
def test_stripe_malformed_headers(header: str) -> None:
    with pytest.raises(EventSignatureInvalid):
        verify("stripe", STRIPE_SECRET, BODY, {"Stripe-Signature": header}, now=1)


def test_stripe_body_that_is_not_utf8_is_refused() -> None:
    now = int(time.time())
    headers = sign_stripe(BODY, STRIPE_SECRET, now)
    with pytest.raises(EventSignatureInvalid, match="UTF-8"):
        verify("stripe", STRIPE_SECRET, BODY + b"\xff", headers, now=now)


def test_a_header_given_twice_in_two_letter_cases_is_refused() -> None:
    headers = {**sign_github(BODY, GITHUB_SECRET, 0), "x-github-delivery": "other"}
    with pytest.raises(EventSignatureInvalid, match="twice"):
        verify("github-hmac", GITHUB_SECRET, BODY, headers)


def test_github_documented_example() -> None:
    # GitHub's own example: secret "It's a Secret to Everybody", payload "Hello, World!"
    headers = {
        "X-Hub-Signature-256": "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        "X-GitHub-Delivery": DELIVERY,
    }
    assert verify("github-hmac", GITHUB_SECRET, b"Hello, World!", headers) == DELIVERY


def test_unknown_scheme() -> None:
    with pytest.raises(ImproperlyConfigured, match="unknown event signature scheme 'hmac'"):
        check_scheme("hmac", "acme-pay")
    with pytest.raises(ImproperlyConfigured):
        verify("hmac", "s", BODY, {})
    check_scheme("slack-v0", "acme-chat")


# --- Bodies read through pointers -------------------------------------------------------------

STRIPE_FIELDS = {
    "provider_reference": "/data/object/id",
    "reference": "/data/object/metadata/reference",
    "idempotency_key": "/data/object/metadata/idempotency_key",
    "amount": "/data/object/amount",
    "currency": "/data/object/currency",
    "object": "/data/object/object",
}


def stripe_charge(**changes: Any) -> dict[str, Any]:
    """A ``charge.succeeded`` event as Stripe sends it (fields trimmed)."""
    charge: dict[str, Any] = {
        "id": "ch_3QabcDEF1234567890",
        "object": "charge",
        "amount": 1200,
        "amount_captured": 1200,
        "amount_refunded": 0,
        "captured": True,
        "currency": "eur",
        "customer": "cus_Q1a2b3",
        "livemode": False,
        "metadata": {"reference": "order-77", "idempotency_key": "k-4f1c"},
        "paid": True,
        "payment_intent": "pi_3QabcDEF1234567890",
        "status": "succeeded",
    }
    event: dict[str, Any] = {
        "id": "evt_3QabcDEF1234567890",
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1764653904,
        "data": {"object": charge},
        "livemode": False,
        "pending_webhooks": 1,
        "request": {"id": "req_8yKx", "idempotency_key": "3e2c1a"},
        "type": "charge.succeeded",
    }
    for name, value in changes.items():  # data__object__amount=... sets /data/object/amount
        *path, last = pointer_tokens("/" + name.replace("__", "/"))
        target = event
        for token in path:
            target = target[token]
        target[last] = value
    return event


def read_stripe(event: Any, **options: Any) -> EventFacts:
    arguments: dict[str, Any] = {
        "delivery_id": "",
        "fields": STRIPE_FIELDS,
        "proving_types": {"charge.succeeded"},
        "types": {"charge.succeeded", "charge.refunded"},
        "proves_action": "payments.charge",
        **options,
    }
    body = event if isinstance(event, bytes) else json.dumps(event).encode()
    return parse_mapped_event(body, **arguments)


def test_a_stripe_charge_succeeded() -> None:
    # when
    facts = read_stripe(stripe_charge())
    # then
    assert facts == EventFacts(
        event_id="evt_3QabcDEF1234567890",
        event_type="charge.succeeded",
        occurred_at=datetime(2025, 12, 2, 5, 38, 24, tzinfo=UTC),
        idempotency_key="k-4f1c",
        reference="order-77",
        provider_reference="ch_3QabcDEF1234567890",
        amount=1200,
        currency="EUR",
        object_kind="charge",
        proves_action="payments.charge",
    )


def test_a_type_that_proves_nothing_and_lacks_the_optional_fields() -> None:
    # given a refund event without metadata or amount
    event = stripe_charge(type="charge.refunded")
    del event["data"]["object"]["metadata"], event["data"]["object"]["amount"]
    # when
    facts = read_stripe(event)
    # then
    assert (facts.proves_action, facts.reference, facts.idempotency_key, facts.amount) == ("", "", "", None)


def test_a_github_deployment_status() -> None:
    # given a deployment_status delivery: no id or type at the top, ids as text in node_id
    event = {
        "action": "created",
        "deployment_status": {
            "id": 1,
            "node_id": "DES_kwDOABCD",
            "state": "success",
            "created_at": "2026-12-02T06:38:24+01:00",
        },
        "deployment": {
            "id": 42,
            "node_id": "DE_kwDOABCD",
            "ref": "main",
            "environment": "production",
            "payload": {"reference": "release-9", "idempotency_key": "k-deploy-9"},
        },
        "repository": {"id": 7, "full_name": "acme/shop"},
        "sender": {"login": "octocat"},
    }
    fields = {
        "type": "/deployment_status/state",
        "created": "/deployment_status/created_at",
        "provider_reference": "/deployment/node_id",
        "reference": "/deployment/payload/reference",
        "idempotency_key": "/deployment/payload/idempotency_key",
    }
    # when
    facts = parse_mapped_event(
        json.dumps(event).encode(),
        delivery_id=DELIVERY,
        fields=fields,
        proving_types={"success"},
        types={"success", "failure", "error", "pending", "in_progress", "queued"},
        proves_action="deploy.release",
    )
    # then
    assert facts.event_id == DELIVERY
    assert facts.event_type == "success"
    assert facts.occurred_at == datetime(2026, 12, 2, 5, 38, 24, tzinfo=UTC)
    assert (facts.reference, facts.idempotency_key) == ("release-9", "k-deploy-9")
    assert facts.provider_reference == "DE_kwDOABCD"
    assert (facts.amount, facts.currency, facts.object_kind) == (None, "", "")
    assert facts.proves_action == "deploy.release"


def test_a_slack_message_event() -> None:
    # given an Events API callback for a message posted with our metadata
    event = {
        "token": "XXYYZZ",
        "team_id": "T123ABC456",
        "api_app_id": "A123ABC456",
        "event": {
            "type": "message",
            "channel": "C123ABC456",
            "user": "U123ABC456",
            "text": "Payment approved",
            "ts": "1764653904.000200",
            "client_msg_id": "5f1b8c3e",
            "metadata": {"event_type": "effect", "event_payload": {"idempotency_key": "k-msg-1"}},
        },
        "type": "event_callback",
        "event_id": "Ev123ABC456",
        "event_time": 1764653904,
    }
    fields = {
        "id": "/event_id",
        "type": "/event/type",
        "created": "/event_time",
        "provider_reference": "/event/ts",
        "idempotency_key": "/event/metadata/event_payload/idempotency_key",
    }
    # when
    facts = parse_mapped_event(
        json.dumps(event).encode(),
        delivery_id="",
        fields=fields,
        proving_types={"message"},
        types=None,
        proves_action="chat.post",
    )
    # then
    assert (facts.event_id, facts.event_type) == ("Ev123ABC456", "message")
    assert facts.occurred_at == datetime(2025, 12, 2, 5, 38, 24, tzinfo=UTC)
    assert (facts.provider_reference, facts.idempotency_key) == ("1764653904.000200", "k-msg-1")


def test_the_delivery_id_is_the_event_id_even_when_the_body_has_another() -> None:
    assert read_stripe(stripe_charge(), delivery_id="msg_1").event_id == "msg_1"


def test_our_key_from_a_message_id() -> None:
    fields = {**STRIPE_FIELDS, "message_id": "/data/object/metadata/message_id"}
    event = stripe_charge(data__object__metadata={"message_id": "<k-mail-1@effect-ledger.local>"})
    assert read_stripe(event, fields=fields).idempotency_key == "k-mail-1"


def test_a_pointer_to_nothing_or_to_null_leaves_the_field_absent() -> None:
    fields = {**STRIPE_FIELDS, "reference": "/data/object/no/such/member", "currency": "/nowhere"}
    facts = read_stripe(stripe_charge(data__object__amount=None), fields=fields)
    assert (facts.reference, facts.currency, facts.amount) == ("", "", None)


def test_a_default_pointer_turned_off() -> None:
    facts = read_stripe(stripe_charge(), fields={**STRIPE_FIELDS, "created": ""})
    assert facts.occurred_at is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        (b'{"id": 1, "id": 2}', "not JSON"),
        (b'{"amount": NaN}', "not JSON"),
        (b"\xff{}", "not JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"id": "evt_1", "type": "a\\u0000b"}', "NUL"),
        (b'{"id": "evt_1", "type": "\\ud800"}', "not UTF-8"),
        (stripe_charge(data__object__amount=12.0), r"amount \(/data/object/amount\) must be an integer"),
        (stripe_charge(data__object__amount=True), "amount .* must be an integer"),
        (stripe_charge(data__object__amount="1200"), "amount .* must be an integer"),
        (stripe_charge(data__object__amount=-1), "must not be negative"),
        (stripe_charge(data__object__amount=2**63), "out of range"),
        (stripe_charge(data__object__currency="euro"), "currency .* ISO 4217"),
        (stripe_charge(data__object__currency="e1r"), "ISO 4217"),
        (stripe_charge(data__object__currency=978), r"currency \(/data/object/currency\) must be text"),
        (stripe_charge(id=None), "the event has no id"),
        (stripe_charge(id=7), r"id \(/id\) must be a string"),
        (stripe_charge(id="e" * 201), "longer than 200"),
        (stripe_charge(type=None), r"type \(/type\) is required"),
        (stripe_charge(type="charge.disputed"), "no events of type 'charge.disputed'"),
        (stripe_charge(data__object__id=""), "provider's id of the effect is required"),
        (stripe_charge(data__object__metadata={"reference": {"order": 77}}), "reference .* must be a string"),
        (stripe_charge(created=1764653904.5), "created .* integer Unix time"),
        (stripe_charge(created=True), "created .* integer Unix time"),
        (stripe_charge(created=946684799), "between 2000-01-01 and 2100-01-01"),
        (stripe_charge(created=4102444800), "between 2000-01-01 and 2100-01-01"),
        (stripe_charge(created="2026-12-02T05:38:24"), "time zone"),
        (stripe_charge(created="yesterday"), "RFC 3339"),
    ],
)
def test_refusals(body: Any, message: str) -> None:
    with pytest.raises(EventInvalid, match=message):
        read_stripe(body)


def test_a_pointer_to_an_object_where_text_is_expected() -> None:
    fields = {**STRIPE_FIELDS, "reference": "/data/object/metadata"}
    with pytest.raises(EventInvalid, match=r"reference \(/data/object/metadata\) must be a string"):
        read_stripe(stripe_charge(), fields=fields)


def test_created_at_the_bounds() -> None:
    assert read_stripe(stripe_charge(created=946684800)).occurred_at == datetime(2000, 1, 1, tzinfo=UTC)
    assert read_stripe(stripe_charge(created=4102444799)).occurred_at == datetime(
        2099, 12, 31, 23, 59, 59, tzinfo=UTC
    )


def test_any_type_when_types_are_not_given() -> None:
    assert read_stripe(stripe_charge(type="charge.disputed"), types=None).event_type == "charge.disputed"


def test_proving_types_need_the_action_they_prove() -> None:
    with pytest.raises(ImproperlyConfigured, match="proving types"):
        read_stripe(stripe_charge(), proves_action="")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"amount_minor": "/amount"}, "unknown event field 'amount_minor'"),
        ({"amount": "data/amount"}, "starts with '/'"),
        ({"amount": "/data/~2"}, "'~' must be followed by 0 or 1"),
        ({"amount": 7}, "must be text"),
        (["/id"], "must map field names"),
    ],
)
def test_fields_configuration_is_validated(fields: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        check_fields(fields, "acme-pay events.fields")


def test_fields_configuration_accepts_pointers_and_empty() -> None:
    check_fields({**STRIPE_FIELDS, "created": "", "id": "/a~1b/~0c/0"}, "acme-pay events.fields")


# --- JSON pointers (RFC 6901) -----------------------------------------------------------------

RFC_6901_DOCUMENT = {
    "foo": ["bar", "baz"],
    "": 0,
    "a/b": 1,
    "c%d": 2,
    "e^f": 3,
    "g|h": 4,
    "i\\j": 5,
    'k"l': 6,
    " ": 7,
    "m~n": 8,
}


@pytest.mark.parametrize(
    ("pointer", "value"),
    [
        ("", RFC_6901_DOCUMENT),
        ("/foo", ["bar", "baz"]),
        ("/foo/0", "bar"),
        ("/", 0),
        ("/a~1b", 1),
        ("/c%d", 2),
        ("/e^f", 3),
        ("/g|h", 4),
        ("/i\\j", 5),
        ('/k"l', 6),
        ("/ ", 7),
        ("/m~0n", 8),
    ],
)
def test_the_examples_of_rfc_6901_section_5(pointer: str, value: Any) -> None:
    assert resolve_pointer(RFC_6901_DOCUMENT, pointer) == value


@pytest.mark.parametrize("pointer", ["/foo/2", "/foo/01", "/foo/-", "/foo/+1", "/foo/0/x", "/none", "/m~1n"])
def test_pointers_to_nothing(pointer: str) -> None:
    missing = object()
    assert resolve_pointer(RFC_6901_DOCUMENT, pointer, missing) is missing


def test_unescaping_order() -> None:
    # "~01" is "~1" (the ~0 unescaped last), never "/"
    assert pointer_tokens("/~01") == ["~1"]
    assert resolve_pointer({"~1": "right", "/": "wrong"}, "/~01") == "right"


@pytest.mark.parametrize("pointer", ["foo", "#/foo", "/~", "/a~2", "/~a"])
def test_invalid_pointers(pointer: str) -> None:
    with pytest.raises(ValueError):
        pointer_tokens(pointer)


@given(st.lists(st.text(alphabet=st.sampled_from("ab~/01 é"), max_size=6), max_size=6))
def test_escaping_round_trips(tokens: list[str]) -> None:
    assert pointer_tokens(pointer_from_tokens(tokens)) == tokens


@given(st.lists(st.text(max_size=8), min_size=1, max_size=6), st.integers())
def test_a_pointer_built_from_member_names_finds_the_value(tokens: list[str], leaf: int) -> None:
    # given a document nesting one object per token
    document: Any = leaf
    for token in reversed(tokens):
        document = {token: document}
    # then
    assert resolve_pointer(document, pointer_from_tokens(tokens)) == leaf
