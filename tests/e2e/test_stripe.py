"""Case C24 against localstripe (a fake Stripe written by others, a real process on loopback):
the shipped Stripe declaration (``docs/providers/stripe.json``), pointed at localstripe through
a proxy that can lose its answers (``tests/support/answer_proxy.py``).

localstripe does not deduplicate on ``Idempotency-Key``, so the tests declare
``"deduplicates": false`` (what ``manage.py provider_probe`` finds, C26): the ledger must find the
first charge by our reference before it could ever send again, and it never sends again after an
ambiguous answer. Every count of charges is localstripe's own.

``test_c24_worker_sigkilled_...`` drives real worker and beat processes (the worker is killed
while the proxy holds localstripe's answer); the others run the engine and the reconciler in this
process so every step is deterministic.

Events: localstripe's own webhook sender signs with ``Stripe-Signature`` exactly as Stripe
does, but sends no ``charge.*`` events (only customer, invoice and payment-intent ones). So one
test has localstripe's sender deliver its ``customer.created`` to the live inbox (verified with
the right secret, refused with a wrong one), and the proving test signs a ``charge.succeeded``
carrying the charge object localstripe itself returns, the way Stripe's documentation signs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db.models.functions import Now

from operations.engine.protocol import execute_intent
from operations.models import Attempt, AuditEvent, Intent, Outcome
from reconciliation.events import process_provider_event
from reconciliation.models import DuplicateFinding, ProviderEvent
from reconciliation.resolution import resolve_absent, resolve_compensate
from tests.e2e.test_unhappy_matrix import passes
from tests.factories import UserFactory, settled, submit
from tests.support.answer_proxy import AnswerProxy
from tests.support.stripe_server import TEST_SECRET_KEY, LocalStripe, stripe_declaration
from tests.support.workers import Cluster, requires_real_broker, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

#: What localstripe does about our key (a probe finds it): sent, ignored.
KEYS_IGNORED = {"header": "Idempotency-Key", "deduplicates": False}
CHARGES = "POST /v1/charges"


@dataclass
class Stripe:
    """localstripe, the proxy in front of it, a customer with a card, and the declaration."""

    server: LocalStripe
    proxy: AnswerProxy
    customer: str
    config: dict[str, dict[str, Any]]
    operator: Any

    def arguments(self, amount: int = 4990) -> dict[str, Any]:
        return {"amount": amount, "currency": "EUR", "customer": self.customer}

    def charges(self) -> list[dict[str, Any]]:
        return self.server.charges(self.customer)


def declare(settings: Any, base_url: str, keys: Any = KEYS_IGNORED) -> dict[str, dict[str, Any]]:
    """Serve ``stripe.charge`` and ``stripe.refund`` from the shipped declaration at ``base_url``,
    with ``keys`` declared, no approval, and short lookup windows."""
    config = stripe_declaration(
        base_url, **{action: {"keys": keys} for action in ("stripe.charge", "stripe.refund")}
    )
    for entry in config.values():
        entry["lookup"]["consistency_window_seconds"] = 5
    settings.EFFECT_LEDGER_GENERIC_HTTP = config
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "stripe.charge": {"approval": "never"},
        "stripe.refund": {"approval": "never"},
    }
    return config


@pytest.fixture
def stripe(localstripe: LocalStripe, settings: Any) -> Any:
    proxy = AnswerProxy(localstripe.url).start()
    try:
        yield Stripe(
            server=localstripe,
            proxy=proxy,
            customer=localstripe.customer_with_card(),
            config=declare(settings, proxy.url),
            operator=UserFactory(username="olga", groups=["operator"]),
        )
    finally:
        proxy.stop()


def charge_with_lost_answer(stripe: Stripe, reference: str) -> Intent:
    """Submit a charge for ``reference`` and execute it once; localstripe charges, the answer is
    dropped on its way back. Returns the intent, re-read."""
    stripe.proxy.lose(CHARGES, mode="drop")
    intent = submit(action="stripe.charge", arguments=stripe.arguments(), reference=reference)
    assert execute_intent(intent.id) == "unknown"
    intent.refresh_from_db()
    return intent


@requires_real_broker
@pytest.mark.integration
def test_c24_worker_sigkilled_after_localstripe_charged_ends_succeeded_through_the_lookup(
    cluster: Cluster, stripe: Stripe, tmp_path: Path
) -> None:
    # given: real worker and beat processes that read the declaration from its file and the key
    # from the environment; localstripe charges, the proxy holds its answer (the worker waits)
    declared = tmp_path / "stripe.json"
    declared.write_text(json.dumps(stripe.config))
    cluster.env["EFFECT_LEDGER_GENERIC_HTTP_FILE"] = str(declared)
    cluster.env["STRIPE_SECRET_KEY"] = TEST_SECRET_KEY
    cluster.set_timing(lease_seconds=8, provider_timeout_seconds=4.0)
    cluster.worker("w1")
    cluster.beat()
    stripe.proxy.lose(CHARGES, mode="hold")
    intent = submit(action="stripe.charge", arguments=stripe.arguments(), reference="order-77")
    wait_for(lambda: len(stripe.charges()) == 1, 30, "localstripe to apply the charge")
    intent.refresh_from_db()
    assert (intent.status, intent.attempt_count) == ("RUNNING", 1), "the worker must still be waiting"

    # when: the worker dies after localstripe applied the charge, and the agent re-plans the
    # same order under a new key
    os.kill(int(intent.lease_owner.rsplit(":", 1)[1]), signal.SIGKILL)
    second = submit(action="stripe.charge", arguments=stripe.arguments(), reference="order-77")

    # then: the reconciler finds the charge by our reference; one charge at localstripe
    wait_for(lambda: Intent.objects.get(id=intent.id).status == "SUCCEEDED", 90, "the lookup to find it")
    (charge,) = stripe.charges()
    outcome = Outcome.objects.get(intent=intent)
    assert (outcome.source, outcome.provider_reference) == ("reconciler", charge["id"])
    assert charge["metadata"] == {"reference": "order-77", "idempotency_key": intent.idempotency_key}
    assert (charge["amount"], charge["currency"], charge["status"]) == (4990, "eur", "succeeded")
    (attempt,) = Attempt.objects.filter(intent=intent)
    assert attempt.result == "abandoned"  # the killed worker never recorded an answer
    taken_over = AuditEvent.objects.get(intent=intent, event="lease_taken_over")
    assert taken_over.to_status == "UNKNOWN"  # no keys honoured: never sent again, looked up
    # the second key for the same order is held behind the first, and sent nothing
    second.refresh_from_db()
    assert (second.status, second.held_behind_id) == ("HELD", intent.id)
    wait_for(lambda: Intent.objects.get(id=second.id).escalated_at is not None, 30, "a person to be asked")
    assert stripe.proxy.count(CHARGES) == 1
    assert len(stripe.charges()) == 1


def test_c24_lost_answer_is_found_by_our_reference_and_a_second_key_is_held(stripe: Stripe) -> None:
    # given: localstripe charged, the answer was lost
    intent = charge_with_lost_answer(stripe, "order-78")
    assert intent.status == "UNKNOWN"
    # when: the agent re-plans the same order under another key; every delivery of it and the
    # reconciler run
    second = submit(action="stripe.charge", arguments=stripe.arguments(), reference="order-78")
    assert second.status == "HELD" and second.held_behind_id == intent.id
    assert execute_intent(second.id) != "succeeded"
    passes()
    # then
    intent.refresh_from_db()
    (charge,) = stripe.charges()
    assert intent.status == "SUCCEEDED"
    assert intent.outcomes.get().provider_reference == charge["id"]
    second.refresh_from_db()
    assert second.status == "HELD" and second.escalated_at is not None
    assert stripe.proxy.count(CHARGES) == 1


def test_c24_compensation_refunds_the_charge_at_localstripe(stripe: Stripe) -> None:
    # given: a charge whose answer was lost; the operator sees it in Stripe's dashboard
    intent = charge_with_lost_answer(stripe, "order-79")
    (charge,) = stripe.charges()
    # when: the operator compensates it, and the compensation runs
    resolve_compensate(
        intent_id=intent.id,
        user=stripe.operator,
        reason="customer cancelled",
        provider_reference=charge["id"],
    )
    (refund_intent,) = Intent.objects.filter(compensates=intent)
    assert refund_intent.action == "stripe.refund"
    assert refund_intent.arguments == {"charge": charge["id"], "amount": 4990, "currency": "EUR"}
    assert execute_intent(refund_intent.id) == "succeeded"
    # then: one refund of the whole charge at localstripe, and the charge is compensated
    (refund,) = stripe.server.refunds(charge["id"])
    assert (refund["amount"], refund["status"]) == (4990, "succeeded")
    assert refund["metadata"]["idempotency_key"] == refund_intent.idempotency_key
    assert refund_intent.outcomes.get().provider_reference == refund["id"]
    assert Intent.objects.get(id=intent.id).status == "COMPENSATED"
    assert len(stripe.charges()) == 1


@pytest.mark.parametrize("declared", ["truthfully", "control: deduplicates claimed"])
def test_c24_a_lost_answer_is_never_followed_by_a_second_post(
    stripe: Stripe, settings: Any, declared: str
) -> None:
    # given: the lookup cannot answer (localstripe's listing is unreachable), so only the
    # engine's rule stands between a lost answer and a second charge
    keys = KEYS_IGNORED if declared == "truthfully" else {"header": "Idempotency-Key", "deduplicates": True}
    config = declare(settings, stripe.proxy.url, keys=keys)
    config["stripe.charge"]["lookup"]["url"] = "http://127.0.0.1:1/v1/charges?customer={customer}"
    settings.EFFECT_LEDGER_GENERIC_HTTP = config
    stripe.proxy.lose(CHARGES, mode="drop")
    intent = submit(action="stripe.charge", arguments=stripe.arguments(), reference="order-80")
    # the control's engine believes the key protects a same-key resend
    assert execute_intent(intent.id) == ("unknown" if declared == "truthfully" else "retry")
    # when: deliveries repeat and the reconciler runs until its patience is spent
    for _ in range(3):
        Intent.objects.filter(id=intent.id, status="READY").update(not_before=Now())
        execute_intent(intent.id)
    passes(intent.policy["unknown_patience"]["lookups"])
    # then: told the truth, the ledger never sent again; an operator has the item
    intent.refresh_from_db()
    if declared == "truthfully":
        assert intent.status == "UNKNOWN" and intent.escalated_at is not None
        assert stripe.proxy.count(CHARGES) == 1
        assert len(stripe.charges()) == 1
    else:  # believing the false claim, the same-key resend charged the customer twice
        assert intent.status == "SUCCEEDED"
        assert stripe.proxy.count(CHARGES) == 2
        assert len(stripe.charges()) == 2


def test_c24_a_charge_without_a_business_reference_is_found_by_our_key(stripe: Stripe) -> None:
    # given: a charge that names no order (no reference); localstripe charged, the answer was lost
    intent = charge_with_lost_answer(stripe, "")
    assert intent.status == "UNKNOWN" and intent.reference == ""
    # when
    passes()
    # then: the customer's charges are listed, and ours carries our key in its metadata
    intent.refresh_from_db()
    (charge,) = stripe.charges()
    assert charge["metadata"] == {"idempotency_key": intent.idempotency_key}
    assert intent.status == "SUCCEEDED"
    assert intent.outcomes.get().provider_reference == charge["id"]


# --- Stripe-signed events (the declaration's "events": scheme "stripe", source "stripe") -------

WEBHOOK_SECRET = "whsec_" + "localstripe-endpoint-secret-for-the-tests"
INBOX = "/providers/stripe/events"


def stripe_signature(body: bytes, secret: str = WEBHOOK_SECRET, at: int | None = None) -> dict[str, str]:
    """``Stripe-Signature`` as Stripe's documentation ("Verify webhook signatures") computes it:
    HMAC-SHA256 with the endpoint secret over ``"{t}.{body}"``, hex, as ``t=...,v1=...``."""
    t = int(time.time()) if at is None else at
    digest = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={t},v1={digest}"}


def charge_succeeded(charge: dict[str, Any]) -> bytes:
    """Stripe's ``charge.succeeded`` event around ``charge`` (the object localstripe returned)."""
    event = {"id": f"evt_{charge['id']}", "object": "event", "type": "charge.succeeded",
             "created": int(time.time()), "data": {"object": charge}}  # fmt: skip
    return json.dumps(event).encode()


def test_c24_localstripes_own_webhook_sender_reaches_the_inbox_verified(
    stripe: Stripe, live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: localstripe delivers its events to the live inbox, once with the endpoint's secret
    # and once with another one
    monkeypatch.setenv("STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET)
    for name, secret in (("right", WEBHOOK_SECRET), ("wrong", "whsec_" + "not-the-endpoints-secret")):
        response = stripe.server.client.post(
            f"/_config/webhooks/{name}",
            data={"url": f"{live_server.url}{INBOX}", "secret": secret, "events[0]": "customer.created"},
        )
        response.raise_for_status()

    try:
        # when: a customer is created at localstripe (its sender signs and posts customer.created)
        customer = stripe.server.customer_with_card()

        # then: the delivery signed with the right secret is stored once; the other was refused
        # (the fixture's own customer, created a moment before, may be delivered too)
        mine = ProviderEvent.objects.filter(source="stripe", provider_reference=customer)
        wait_for(mine.exists, 30, "localstripe's event")
        wait_for(
            lambda: "failed with response code 401" in stripe.server.log_path.read_text(), 30, "the refusal"
        )
    finally:
        # localstripe cannot delete a webhook and outlives this test (so does the live server):
        # switch both off, or the next test's customer would be posted to the inbox as well
        for name in ("right", "wrong"):
            stripe.server.client.post(
                f"/_config/webhooks/{name}",
                data={"url": "http://127.0.0.1:9/", "secret": "whsec_off", "events[0]": "effect-ledger.none"},
            ).raise_for_status()
    (event,) = mine
    assert event.event_type == "customer.created" and event.event_id.startswith("evt_")
    assert set(ProviderEvent.objects.values_list("event_type", flat=True)) == {"customer.created"}


def test_c24_a_stripe_signed_charge_succeeded_proves_an_unknown_charge(
    stripe: Stripe, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a charge whose answer was lost (UNKNOWN), and Stripe's event for the charge
    monkeypatch.setenv("STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET)
    intent = charge_with_lost_answer(stripe, reference="order-88")
    assert intent.status == "UNKNOWN"
    (charge,) = stripe.charges()
    body = charge_succeeded(charge)

    # when: refusals first — a forged signature, an altered body, a stale and a future timestamp
    refused = [
        client.post(INBOX, data=body, content_type="application/json", headers=headers).status_code
        for headers in (
            stripe_signature(body, secret="whsec_" + "forged"),
            stripe_signature(body.replace(b'"amount": 4990', b'"amount": 1')),
            stripe_signature(body, at=int(time.time()) - 360),
            stripe_signature(body, at=int(time.time()) + 360),
        )
    ]
    stored_after_refusals = ProviderEvent.objects.filter(event_id=f"evt_{charge['id']}").count()
    response = client.post(INBOX, data=body, content_type="application/json", headers=stripe_signature(body))

    # then: nothing was stored for the refused ones; the signed one proves the charge
    assert refused == [401, 401, 401, 401] and stored_after_refusals == 0
    assert response.status_code == 200, response.content
    event = ProviderEvent.objects.get(source="stripe", event_id=f"evt_{charge['id']}")
    assert (event.provider_reference, event.idempotency_key, event.amount, event.currency) == (
        charge["id"], intent.idempotency_key, 4990, "EUR",
    )  # fmt: skip
    process_provider_event(event_pk=event.pk)
    intent.refresh_from_db()
    assert intent.status == "SUCCEEDED"
    assert Outcome.objects.get(intent=intent).provider_reference == charge["id"]
    assert len(stripe.charges()) == 1


def test_c24_a_resend_the_operator_accepted_leaves_a_second_charge_the_ledger_finds_and_refunds(
    stripe: Stripe, settings: Any
) -> None:
    # given: a lost answer, and no lookup before the operator decides (the listing is down)
    config = declare(settings, stripe.proxy.url)
    listing = config["stripe.charge"]["lookup"]["url"]
    config["stripe.charge"]["lookup"]["url"] = "http://127.0.0.1:1/v1/charges?customer={customer}"
    settings.EFFECT_LEDGER_GENERIC_HTTP = config
    intent = charge_with_lost_answer(stripe, reference="order-90")
    # when: the operator says "absent" and accepts the duplicate risk (refused without it)
    with pytest.raises(Exception, match="does not deduplicate"):
        resolve_absent(intent_id=intent.id, user=stripe.operator, reason="not in the dashboard")
    resolve_absent(
        intent_id=intent.id, user=stripe.operator, reason="not in the dashboard", accept_duplicate_risk=True
    )
    assert execute_intent(settled(intent).id) == "succeeded"  # localstripe charges a second time
    assert len(stripe.charges()) == 2
    # and the listing answers again for the duplicate check
    config["stripe.charge"]["lookup"]["url"] = listing
    settings.EFFECT_LEDGER_GENERIC_HTTP = config
    passes(2)
    # then: the charge not kept is a duplicate, refunded by the declared compensation
    kept = Outcome.objects.get(intent=intent).provider_reference
    (duplicate,) = DuplicateFinding.objects.filter(intent=intent)
    assert duplicate.provider_reference != kept
    assert {kept, duplicate.provider_reference} == {c["id"] for c in stripe.charges()}
    (refund_intent,) = Intent.objects.filter(action="stripe.refund")
    assert refund_intent.arguments["charge"] == duplicate.provider_reference
    assert execute_intent(refund_intent.id) == "succeeded"
    (refund,) = stripe.server.refunds(duplicate.provider_reference)
    assert refund["amount"] == 4990 and not stripe.server.refunds(kept)
