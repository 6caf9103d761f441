"""The shipped Stripe declaration (``docs/providers/stripe.json``) is a valid contract that says
what Stripe's API does: form bodies with our reference in ``metadata``, ``Idempotency-Key``
deduplicated, a lookup listing the customer's charges by our reference, refunds as compensation,
the secret named and never written."""

from __future__ import annotations

from typing import Any

from operations.adapters.base import LookupKind
from operations.adapters.declared_actions import generic_http_adapter, generic_http_config
from operations.adapters.sandbox.common import CHARGE_SCHEMA, REFUND_SCHEMA
from operations.adapters.templates import form_pairs, render
from tests.support.stripe_server import STRIPE_DECLARATION, stripe_declaration


def test_the_stripe_declaration_is_valid_and_says_what_stripe_does(settings: Any) -> None:
    # given
    settings.EFFECT_LEDGER_GENERIC_HTTP = stripe_declaration("https://api.stripe.com")
    # when
    generic_http_config()  # validates every entry, naming the action and field on a mistake
    charge, refund = generic_http_adapter("stripe.charge"), generic_http_adapter("stripe.refund")
    # then
    assert charge is not None and refund is not None
    caps = charge.capabilities_for("stripe.charge")
    assert (caps.idempotency_keys, caps.lookup, caps.consistency_window_seconds) == (
        True,
        LookupKind.EVENTUAL,
        60.0,
    )
    assert caps.list_by_reference and caps.compensation_action == "stripe.refund"
    assert refund.capabilities_for("stripe.refund").compensation_action is None
    assert not charge.test_endpoint and not refund.test_endpoint
    for adapter in (charge, refund):
        assert adapter.contract.encoding == "form"
        assert adapter.contract.auth == {"scheme": "bearer", "secret": "env:STRIPE_SECRET_KEY"}


def test_the_declaration_holds_no_secret_and_the_sandbox_argument_shapes() -> None:
    text = STRIPE_DECLARATION.read_text()
    assert "sk_" not in text and "whsec_" not in text
    config = stripe_declaration("https://api.stripe.com")
    for action, sandbox in (("stripe.charge", CHARGE_SCHEMA), ("stripe.refund", REFUND_SCHEMA)):
        schema = config[action]["schema"]
        assert schema["required"] == sandbox["required"]
        assert set(schema["properties"]) <= set(sandbox["properties"])
        assert schema["additionalProperties"] is False


def test_a_charge_is_sent_as_stripe_reads_form_fields(settings: Any) -> None:
    # given
    settings.EFFECT_LEDGER_GENERIC_HTTP = stripe_declaration("https://api.stripe.com")
    adapter = generic_http_adapter("stripe.charge")
    assert adapter is not None
    values = {"amount": 4990, "currency": "EUR", "customer": "cus_1", "reference": "order-77",
              "idempotency_key": "k-1"}  # fmt: skip
    # when
    pairs = form_pairs(render(adapter.contract.body, values))
    # then: currency lower case, our reference and key in metadata, no description when none
    assert sorted(pairs) == [
        ("amount", "4990"),
        ("currency", "eur"),
        ("customer", "cus_1"),
        ("metadata[idempotency_key]", "k-1"),
        ("metadata[reference]", "order-77"),
    ]
    compensation = adapter.compensation_arguments(
        "stripe.charge", {"amount": 4990, "currency": "EUR", "customer": "cus_1"}, "ch_1"
    )
    assert compensation == {"charge": "ch_1", "amount": 4990, "currency": "EUR"}
