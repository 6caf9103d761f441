"""Issue 21, item 8: an action removed from the configuration (or whose adapter cannot be
loaded) leaves its intents resolvable: escalated with the reason, every page renders, and an
operator's decisions answer 200 or a 4xx with a clear message, never a 500."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from operations.engine.protocol import execute_intent
from operations.models import AuditEvent, Intent, Outcome
from operations.services import intent_claim, intent_mark_unknown
from reconciliation.services import reconcile_pass
from tests.console.conftest import seen
from tests.factories import submit

pytestmark = pytest.mark.django_db

S = Intent.Status
HTMX = {"HTTP_HX_REQUEST": "true"}
TRANSFER = {"amount": 1250, "currency": "USD", "account": "acc_9"}
GENERIC = {
    "acme.transfer": {
        "url": "http://127.0.0.1:9/v1/transfers",
        "lookup_url": "http://127.0.0.1:9/v1/transfers?idempotency_key={idempotency_key}",
    }
}


@pytest.fixture
def configured(settings: Any) -> Any:
    settings.EFFECT_LEDGER_GENERIC_HTTP = GENERIC
    settings.EFFECT_LEDGER_POLICIES = {"acme.transfer": {"approval": "never"}}
    return settings


def unknown_transfer(reference: str = "t-1") -> Intent:
    intent = submit(action="acme.transfer", arguments=TRANSFER, reference=reference)
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    assert intent_mark_unknown(claim=claim, error="timeout after send", cause="ambiguous")
    return intent


def remove(settings: Any) -> None:
    settings.EFFECT_LEDGER_GENERIC_HTTP = {}


def resolve(client: Client, intent: Intent, verb: str, **data: str) -> Any:
    return client.post(reverse("unknown-resolve", args=[intent.id, verb]), {"seen_seq": seen(intent), **data})


def test_i21_8_unknown_intents_of_a_removed_action_are_escalated_with_the_reason(configured: Any) -> None:
    # given
    intent = unknown_transfer()
    remove(configured)
    # when: one reconciler pass
    reconcile_pass()
    # then: in front of operators at once, saying why no lookup is possible
    intent.refresh_from_db()
    assert intent.status == S.UNKNOWN and intent.escalated_at is not None
    reason = AuditEvent.objects.get(intent=intent, event="escalated").reason
    assert "acme.transfer is not served by this deployment" in reason


def test_i21_8_a_ready_intent_of_a_removed_action_is_held_not_left_running(configured: Any) -> None:
    # given
    intent = submit(action="acme.transfer", arguments=TRANSFER, reference="t-2")
    remove(configured)
    # when
    label = execute_intent(intent.id)
    # then
    intent.refresh_from_db()
    assert (label, intent.status, intent.attempt_count) == ("held", S.HELD, 0)
    assert "no adapter is registered" in intent.hold_reason


def test_i21_8_a_broken_adapter_holds_its_intents_with_the_reason(settings: Any) -> None:
    # given: payments.charge configured to a class that does not exist
    intent = submit()
    settings.EFFECT_LEDGER_ADAPTERS = {"payments.charge": "operations.adapters.sandbox.NoSuchAdapter"}
    # when
    label = execute_intent(intent.id)
    # then
    intent.refresh_from_db()
    assert (label, intent.status) == ("held", S.HELD)
    assert "cannot be loaded" in intent.hold_reason


def test_i21_8_confirmed_on_a_removed_action_works_unverified_only(
    configured: Any, operator_client: Client
) -> None:
    # given
    intent = unknown_transfer()
    remove(configured)
    # when: confirmed without saying "unverified"
    refused = resolve(operator_client, intent, "confirmed", provider_reference="tr_1", reason="seen at acme")
    # then: a clear refusal, not a 500
    assert refused.status_code == 409
    assert "not served by this deployment" in refused.content.decode()
    assert "no lookup is possible" in refused.content.decode()
    # when: confirmed as unverified
    done = resolve(
        operator_client,
        intent,
        "confirmed",
        provider_reference="tr_1",
        reason="seen at acme",
        accept_unverified="on",
    )
    # then
    assert done.status_code == 302
    intent.refresh_from_db()
    assert intent.status == S.SUCCEEDED
    outcome = Outcome.objects.get(intent=intent)
    assert outcome.provider_reference == "tr_1" and outcome.detail["verified"] is False


def test_i21_8_compensate_on_a_removed_action_is_refused_with_a_clear_message(
    configured: Any, operator_client: Client
) -> None:
    # given
    intent = unknown_transfer()
    remove(configured)
    # when
    response = resolve(
        operator_client, intent, "compensate", provider_reference="tr_1", reason="undo it", **{}
    )
    htmx = operator_client.post(
        reverse("unknown-resolve", args=[intent.id, "compensate"]),
        {"provider_reference": "tr_1", "reason": "undo it", "seen_seq": seen(intent)},
        **HTMX,  # type: ignore[arg-type]
    )
    # then
    for answer in (response, htmx):
        assert answer.status_code == 409
        assert "cannot be compensated here" in answer.content.decode()
    intent.refresh_from_db()
    assert intent.status == S.UNKNOWN


def test_i21_8_absent_on_a_removed_action_ends_failed_as_the_page_says(
    configured: Any, operator_client: Client
) -> None:
    # given
    intent = unknown_transfer()
    remove(configured)
    page = operator_client.get(reverse("unknown-detail", args=[intent.id]))
    assert page.status_code == 200
    assert 'id="absent-ends-failed"' in page.content.decode()
    # when
    response = resolve(operator_client, intent, "absent", reason="acme has no such transfer")
    # then
    assert response.status_code == 302
    intent.refresh_from_db()
    assert intent.status == S.FAILED
    assert "not sent again: acme.transfer is not served" in intent.last_error


def test_i21_8_release_of_a_held_removed_action_is_refused_reject_works(
    configured: Any, operator_client: Client
) -> None:
    # given
    intent = submit(action="acme.transfer", arguments=TRANSFER, reference="t-3")
    remove(configured)
    assert execute_intent(intent.id) == "held"
    url = reverse("held-resolve", args=[intent.id, "release"])
    # when
    refused = operator_client.post(
        url, {"reason": "go", "accept_duplicate_risk": "on", "seen_seq": seen(intent)}
    )
    rejected = operator_client.post(
        reverse("held-resolve", args=[intent.id, "reject"]), {"reason": "gone", "seen_seq": seen(intent)}
    )
    # then
    assert refused.status_code == 409 and "cannot run here" in refused.content.decode()
    assert rejected.status_code == 302
    intent.refresh_from_db()
    assert intent.status == S.REJECTED


def test_i21_8_release_of_a_not_served_intent_names_that_reason_without_the_risk_box(
    configured: Any, operator_client: Client, api: Any
) -> None:
    # given: a READY intent held because its action was removed
    intent = submit(action="acme.transfer", arguments=TRANSFER, reference="t-7")
    remove(configured)
    assert execute_intent(intent.id) == "held"
    # when: released without ticking the duplicate-risk box (there is no earlier intent)
    refused = operator_client.post(
        reverse("held-resolve", args=[intent.id, "release"]), {"reason": "go", "seen_seq": seen(intent)}
    )
    # then: the refusal gives the real reason, and the agent sees it in the API too
    assert refused.status_code == 409 and "cannot run here" in refused.content.decode()
    assert "an earlier intent for the same business action is open" not in refused.content.decode()
    body = api.get(f"/api/v1/intents/{intent.id}").json()
    assert body["status"] == "HELD" and body["held_behind"] is None
    assert "acme.transfer" in body["hold_reason"]


def test_i21_8_every_page_renders_for_a_removed_action(
    configured: Any, approver: Any, viewer_client: Client
) -> None:
    # given: one UNKNOWN, one HELD (not served), one awaiting approval, then the action removed
    unknown = unknown_transfer("t-4")
    held = submit(action="acme.transfer", arguments=TRANSFER, reference="t-5")
    configured.EFFECT_LEDGER_POLICIES = {"acme.transfer": {"approval": "always"}}
    gated = submit(action="acme.transfer", arguments=TRANSFER, reference="t-6")
    assert gated.status == S.AWAITING_APPROVAL
    remove(configured)
    assert execute_intent(held.id) == "held"
    reconcile_pass()
    # when / then: every page and partial answers 200 and names them
    lists = [
        reverse("dashboard"),
        reverse("unknown"),
        reverse("approvals"),
        reverse("intents"),
        reverse("audit"),
    ]
    for url in lists:
        for headers in ({}, HTMX):
            assert viewer_client.get(url, **headers).status_code == 200, url  # type: ignore[arg-type]
    queue = viewer_client.get(reverse("unknown")).content.decode()
    assert str(unknown.id) in queue and str(held.id) in queue and "not served here" in queue
    for intent in (unknown, held, gated):
        for name in ("intent-detail", "unknown-detail", "held-detail", "approval-detail"):
            for headers in ({}, HTMX):
                response = viewer_client.get(reverse(name, args=[intent.id]), **headers)  # type: ignore[arg-type]
                assert response.status_code == 200, (name, intent.status)
    held_page = viewer_client.get(reverse("held-detail", args=[held.id])).content.decode()
    assert 'id="hold-reason"' in held_page and "no adapter is registered" in held_page
