"""Case C33 (issue 38 item 5): one business action at a time does not end when the first action
ends. Within its policy's reuse window after an earlier intent for the same business identity
made its effect, a new intent under a new client key is a likely duplicate, decided at once by
``after_success``: HELD for a person (escalated) or REJECTED, and the submission's answer says
why. Outside the window, with the window off, or after an earlier intent that left no effect,
it proceeds as before.

The earlier intent's effect time is its first outcome's ``created_at``; "outside the window" is
made by moving that outcome back, never by waiting.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from rest_framework.test import APIClient

from operations.adapters.base import ExecutionResult
from operations.audit.chain_checks import audit_verify
from operations.models import AuditEvent, Intent, OutboxMessage, Outcome
from operations.policies.rules import (
    DEFAULT_REUSE_WINDOW_MONEY_SECONDS,
    DEFAULT_REUSE_WINDOW_OTHER_SECONDS,
    MAX_POLICY_SECONDS,
    Policy,
    PolicyError,
    policy_for,
)
from operations.services import intent_claim, intent_record_failure, intent_record_success
from reconciliation.held import decide_held
from reconciliation.resolution import release_held
from tests.factories import UserFactory, charge_arguments, make_agent, submit

pytestmark = pytest.mark.django_db

URL = "/api/v1/intents"
EMAIL = {"to": "ann@example.test", "subject": "Your receipt", "body": "Thanks", "reference": "receipt-33"}


def succeeded(intent: Intent, provider_reference: str = "ch_c33") -> Intent:
    """Run ``intent`` to SUCCEEDED through the services a worker uses (claim, record)."""
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    assert intent_record_success(claim=claim, result=ExecutionResult(provider_reference, "a" * 64))
    intent.refresh_from_db()
    assert intent.status == Intent.Status.SUCCEEDED
    return intent


def effect_recorded_ago(intent: Intent, seconds: float) -> None:
    """Move the earlier intent's effect (its outcomes) ``seconds`` into the past."""
    outcome = Outcome.objects.get(intent=intent)
    Outcome.objects.filter(id=outcome.id).update(created_at=outcome.created_at - timedelta(seconds=seconds))


def with_policy(settings: Any, action: str, **fields: Any) -> None:
    policies = settings.EFFECT_LEDGER_POLICIES
    settings.EFFECT_LEDGER_POLICIES = {**policies, action: {**policies.get(action, {}), **fields}}


def events(intent: Intent) -> list[str]:
    return list(AuditEvent.objects.filter(intent=intent).order_by("seq").values_list("event", flat=True))


def post(api: APIClient, body: Any, key: str) -> Any:
    return api.post(URL, data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


# --- inside the window: held for a person --------------------------------------------------------


def test_c33_a_new_key_for_an_order_already_charged_is_held_for_a_person_at_once() -> None:
    # given: order-33 charged a minute ago (its intent SUCCEEDED, nothing open for it)
    first = succeeded(submit(arguments=charge_arguments(3000), reference="order-33"))
    effect_recorded_ago(first, 60)
    # when: the agent, restarted, submits the same charge under a new client key
    second = submit(arguments=charge_arguments(3000), reference="order-33")
    # then: held behind the first, in front of a person already, not dispatched
    second.refresh_from_db()
    assert (second.status, second.held_behind_id) == (Intent.Status.HELD, first.id)
    assert second.escalated_at is not None
    assert not OutboxMessage.objects.filter(intent=second).exists()
    assert events(second) == ["submitted", "likely_duplicate"]
    flagged = AuditEvent.objects.get(intent=second, event="likely_duplicate")
    assert flagged.reason.startswith("likely duplicate: order-33 was already done 30.00 EUR")
    assert f"by intent {first.id} as ch_c33" in flagged.reason
    assert flagged.data == {
        "earlier": str(first.id),
        "earlier_status": "SUCCEEDED",
        "reuse_window_seconds": DEFAULT_REUSE_WINDOW_MONEY_SECONDS,
    }
    assert flagged.actor == "policy"
    submitted = AuditEvent.objects.get(intent=second, event="submitted")
    assert submitted.to_status == "HELD" and submitted.data["held_behind"] == str(first.id)
    # and: the reconciler's rule leaves it to the person; the chains verify
    assert decide_held().examined == 0
    assert list(audit_verify()) == []


def test_c33_the_api_answer_says_held_as_a_likely_duplicate_and_names_the_earlier_intent(
    api: APIClient,
) -> None:
    # given: the agent's first charge for order-33 succeeded
    body = {"action": "payments.charge", "arguments": charge_arguments(3000), "reference": "order-33"}
    first = post(api, body, "run-1-call-1").json()
    succeeded(Intent.objects.get(id=first["intent_id"]))
    # when: the same charge under a new key (a new run)
    answer = post(api, body, "run-2-call-1")
    # then: 201 HELD, and why, with the earlier intent named
    assert answer.status_code == 201, answer.content
    data = answer.json()
    assert (data["status"], data["held_behind"]) == ("HELD", first["intent_id"])
    assert data["likely_duplicate"]["earlier_intent"] == first["intent_id"]
    assert data["likely_duplicate"]["reason"].startswith("likely duplicate: order-33 was already done")
    assert data["links"]["console"].endswith(reverse("held-detail", args=[data["intent_id"]]))
    # and: the same key again replays the same answer; a GET says the same
    replay = post(api, body, "run-2-call-1")
    assert (
        replay["Idempotent-Replayed"] == "true"
        and replay.json()["likely_duplicate"] == data["likely_duplicate"]
    )
    assert api.get(f"{URL}/{data['intent_id']}").json()["likely_duplicate"] == data["likely_duplicate"]
    # and: the first intent (and any intent not held as a duplicate) says nothing of the kind
    assert api.get(f"{URL}/{first['intent_id']}").json()["likely_duplicate"] is None


def test_c33_an_agent_of_scope_own_is_not_told_a_colleagues_intent(settings: Any) -> None:
    # given: a colleague's charge for order-33 succeeded; this agent sees only its own intents
    colleague = succeeded(submit(principal="agent:colleague", reference="order-33"))
    _, token = make_agent(name="solo", scope="own")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    # when
    body = {"action": "payments.charge", "arguments": charge_arguments(), "reference": "order-33"}
    data = post(api, body, "solo-1").json()
    # then: held, told it is a likely duplicate, but not which intent nor what it did
    assert data["status"] == "HELD" and data["held_behind"] is None
    assert data["likely_duplicate"]["earlier_intent"] is None
    assert str(colleague.id) not in json.dumps(data) and "ch_c33" not in json.dumps(data)
    assert data["likely_duplicate"]["reason"].startswith("likely duplicate: an intent of another principal")


def test_c33_a_third_key_while_the_second_waits_for_a_person_is_a_likely_duplicate_too() -> None:
    # given: order-33 charged; the first re-run held for a person
    first = succeeded(submit(reference="order-33"))
    second = submit(reference="order-33")
    # when: another re-run (a new run_id) comes in while the person has not decided
    third = submit(reference="order-33")
    # then: it is a likely duplicate of the charge, not merely waiting behind the held one
    third.refresh_from_db()
    assert (third.status, third.held_behind_id) == (Intent.Status.HELD, first.id)
    assert third.escalated_at is not None and second.id != third.id
    assert str(first.id) in AuditEvent.objects.get(intent=third, event="likely_duplicate").reason


def test_c33_an_operator_can_release_it_accepting_the_duplicate_risk_and_the_pages_render() -> None:
    # given: a likely duplicate of a charge that succeeded
    first = succeeded(submit(reference="order-33"))
    second = submit(reference="order-33")
    operator = UserFactory(username="olga", groups=["operator"])
    client = Client()
    client.force_login(operator)
    # then: the operators' queue, the held page and the intent page show it as a likely duplicate
    queue = client.get(reverse("unknown")).content.decode()
    assert str(second.id) in queue and "likely duplicate" in queue
    held_page = client.get(reverse("held-detail", args=[second.id]))
    assert held_page.status_code == 200
    assert f"by intent {first.id}" in held_page.content.decode()
    detail = client.get(reverse("intent-detail", args=[second.id]))
    assert detail.status_code == 200 and "likely duplicate" in detail.content.decode()
    assert client.get("/").status_code == 200
    # when: the operator releases it, the duplicate risk accepted
    released = release_held(
        intent_id=second.id, user=operator, reason="the customer ordered twice", accept_duplicate_risk=True
    )
    # then: it runs (READY, dispatched), audited as a release with the risk accepted
    assert released.status == Intent.Status.READY
    assert OutboxMessage.objects.filter(intent=second).exists()
    release = AuditEvent.objects.get(intent=second, event="released")
    assert release.data["duplicate_risk_accepted"] is True and release.actor == "user:olga"


# --- after_success = "reject" ---------------------------------------------------------------------


def test_c33_after_success_reject_refuses_it_at_once_with_the_reason(api: APIClient, settings: Any) -> None:
    # given: charges whose policy refuses a likely duplicate outright; order-33 charged
    with_policy(settings, "payments.charge", after_success="reject")
    body = {"action": "payments.charge", "arguments": charge_arguments(3000), "reference": "order-33"}
    first = post(api, body, "k1").json()
    succeeded(Intent.objects.get(id=first["intent_id"]))
    # when
    answer = post(api, body, "k2")
    # then: stored REJECTED (a replay answers the same), with why; nothing dispatched
    assert answer.status_code == 201, answer.content
    data = answer.json()
    assert data["status"] == "REJECTED"
    assert data["likely_duplicate"]["earlier_intent"] == first["intent_id"]
    assert "order-33 was already done 30.00 EUR" in data["likely_duplicate"]["reason"]
    second = Intent.objects.get(id=data["intent_id"])
    assert (str(second.held_behind_id), second.escalated_at) == (first["intent_id"], None)
    assert events(second) == ["submitted", "likely_duplicate", "rejected"]
    rejected = AuditEvent.objects.get(intent=second, event="rejected")
    assert (rejected.from_status, rejected.to_status, rejected.actor) == ("HELD", "REJECTED", "policy")
    assert not OutboxMessage.objects.filter(intent=second).exists()
    assert list(audit_verify()) == []
    assert post(api, body, "k2").json()["status"] == "REJECTED"


def test_c33_the_reconcilers_reject_also_records_why_for_the_agent(api: APIClient, settings: Any) -> None:
    # given: a re-plan held behind a charge in flight, under after_success = "reject"
    with_policy(settings, "payments.charge", after_success="reject")
    body = {"action": "payments.charge", "arguments": charge_arguments(), "reference": "order-34"}
    first = post(api, body, "k1").json()
    held = post(api, body, "k2").json()
    assert held["status"] == "HELD" and held["likely_duplicate"] is None  # waiting, not yet a duplicate
    # when: the first succeeds and the rule runs
    succeeded(Intent.objects.get(id=first["intent_id"]))
    assert decide_held().rejected == 1
    # then: the agent reads the same answer as for a rejection at submission
    data = api.get(f"{URL}/{held['intent_id']}").json()
    assert data["status"] == "REJECTED"
    assert data["likely_duplicate"]["earlier_intent"] == first["intent_id"]
    assert data["likely_duplicate"]["reason"].startswith("likely duplicate: order-34 was already done")


# --- outside the window, window off, no effect: it proceeds -------------------------------------


def test_c33_outside_the_window_a_new_intent_proceeds() -> None:
    # given: order-33 charged just over 24 hours ago (the default window for money)
    first = succeeded(submit(reference="order-33"))
    effect_recorded_ago(first, DEFAULT_REUSE_WINDOW_MONEY_SECONDS + 60)
    # when
    second = submit(reference="order-33")
    # then: it proceeds as any new intent
    assert (second.status, second.held_behind_id, second.escalated_at) == (Intent.Status.READY, None, None)
    assert OutboxMessage.objects.filter(intent=second).exists()
    assert events(second) == ["submitted"]


def test_c33_just_inside_the_window_it_is_held() -> None:
    # given: order-33 charged a minute less than 24 hours ago
    first = succeeded(submit(reference="order-33"))
    effect_recorded_ago(first, DEFAULT_REUSE_WINDOW_MONEY_SECONDS - 60)
    # when / then
    assert submit(reference="order-33").status == Intent.Status.HELD


def test_c33_a_window_of_zero_turns_the_rule_off(settings: Any) -> None:
    # given
    with_policy(settings, "payments.charge", reuse_window_seconds=0)
    succeeded(submit(reference="order-33"))
    # when
    second = submit(reference="order-33")
    # then: proceeds (the rule for an open intent still holds: see test_business_action)
    assert second.status == Intent.Status.READY and second.held_behind_id is None


def test_c33_the_window_is_the_policys(settings: Any) -> None:
    # given: a one-hour window for charges; order-33 charged two hours ago, order-35 ten minutes ago
    with_policy(settings, "payments.charge", reuse_window_seconds=3600)
    old = succeeded(submit(reference="order-33"))
    effect_recorded_ago(old, 7200)
    recent = succeeded(submit(reference="order-35"), provider_reference="ch_c35")
    effect_recorded_ago(recent, 600)
    # when / then
    assert submit(reference="order-33").status == Intent.Status.READY
    again = submit(reference="order-35")
    assert again.status == Intent.Status.HELD
    assert AuditEvent.objects.get(intent=again, event="likely_duplicate").data["reuse_window_seconds"] == 3600


def test_c33_an_earlier_intent_that_ended_without_effect_holds_nothing_back() -> None:
    # given: order-33's first charge was declined (FAILED)
    first = submit(reference="order-33")
    claim = intent_claim(intent_id=first.id, worker="w", lease_seconds=30)
    assert claim is not None and intent_record_failure(claim=claim, error="card_declined")
    # when
    second = submit(reference="order-33")
    # then
    assert second.status == Intent.Status.READY and second.held_behind_id is None


def test_c33_an_intent_without_a_business_identity_is_never_held() -> None:
    # given: a charge without any reference succeeded
    succeeded(submit(reference=""))
    # when: the same charge again (nothing names the business object)
    second = submit(reference="")
    # then: nothing to recognise it by (the MCP server sends a derived reference: test_mcp_server)
    assert second.status == Intent.Status.READY


def test_c33_actions_that_move_no_money_have_a_one_hour_window() -> None:
    # given: a receipt email sent a minute ago, and one sent two hours ago
    first = succeeded(submit(action="email.send", arguments=EMAIL), provider_reference="msg_1")
    effect_recorded_ago(first, 60)
    old = succeeded(
        submit(action="email.send", arguments={**EMAIL, "reference": "receipt-old"}),
        provider_reference="msg_2",
    )
    effect_recorded_ago(old, 7200)
    # when
    again = submit(action="email.send", arguments=EMAIL)
    old_again = submit(action="email.send", arguments={**EMAIL, "reference": "receipt-old"})
    # then
    assert (again.status, again.held_behind_id) == (Intent.Status.HELD, first.id)
    flagged = AuditEvent.objects.get(intent=again, event="likely_duplicate")
    assert flagged.data["reuse_window_seconds"] == DEFAULT_REUSE_WINDOW_OTHER_SECONDS
    assert flagged.reason.startswith("likely duplicate: receipt-33 was already done by intent")
    assert old_again.status == Intent.Status.READY


def test_c33_a_likely_duplicate_costs_the_same_three_statements_to_submit() -> None:
    # given: order-33 charged
    succeeded(submit(reference="order-33"))
    # when: the likely duplicate is submitted
    with CaptureQueriesContext(connection) as queries:
        held = submit(reference="order-33")
    # then: lock, the one read of earlier intents, one insert of the intent and its events
    statements = [
        q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]
    assert held.status == Intent.Status.HELD
    assert len(statements) == 3, "\n".join(statements)


# --- the policy field -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-1, "24h", 1.5, True, 2**53])
def test_c33_a_bad_reuse_window_is_a_policy_error_naming_the_field(value: Any) -> None:
    with pytest.raises(PolicyError, match="reuse_window_seconds must be an integer from 0") as raised:
        Policy.from_config("payments.charge", {"reuse_window_seconds": value})
    assert (raised.value.action, raised.value.field) == ("payments.charge", "reuse_window_seconds")


def test_c33_the_configured_policy_is_validated_at_start(settings: Any) -> None:
    from operations.policies.rules import validate_configured_policies

    with_policy(settings, "email.send", reuse_window_seconds="one day")
    with pytest.raises(PolicyError, match="policy for email.send: reuse_window_seconds"):
        validate_configured_policies()


def test_c33_defaults_and_old_snapshots() -> None:
    # given: the policy in force, and a snapshot written before the field existed
    policy = policy_for("payments.charge")
    old_snapshot = {k: v for k, v in policy.to_snapshot().items() if k != "reuse_window_seconds"}
    # then: unset, the window follows the money the arguments move
    for read in (policy, Policy.from_snapshot(old_snapshot)):
        assert read.reuse_window_seconds is None
        assert read.reuse_window_for(charge_arguments()) == DEFAULT_REUSE_WINDOW_MONEY_SECONDS == 86_400
        assert read.reuse_window_for(EMAIL) == DEFAULT_REUSE_WINDOW_OTHER_SECONDS == 3_600
    # and: a configured value applies to every intent of the action, and is snapshotted
    configured = Policy.from_config("payments.charge", {"reuse_window_seconds": 0})
    assert configured.reuse_window_for(charge_arguments()) == 0
    assert Policy.from_snapshot(configured.to_snapshot()).reuse_window_seconds == 0


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("reuse_window_seconds", {"reuse_window_seconds": MAX_POLICY_SECONDS + 1}),
        ("reuse_window_seconds", {"reuse_window_seconds": 9_007_199_254_740_991}),
        ("approval_ttl_seconds", {"approval_ttl_seconds": MAX_POLICY_SECONDS + 1}),
        ("retry.deadline_seconds", {"retry": {"deadline_seconds": 10.0**13}}),
        ("unknown_patience.seconds", {"unknown_patience": {"seconds": 10**15}}),
    ],
)
def test_i38_a_time_the_database_clock_cannot_add_is_refused_at_start(
    field: str, fields: dict[str, Any]
) -> None:
    # A window near 2**53 s passed the start-up check and made every submission of the action
    # a 500 (PostgreSQL: interval out of range); every policy time is bounded to ten years.
    with pytest.raises(PolicyError, match=f"{field} must be .* from [01] to {MAX_POLICY_SECONDS}"):
        Policy.from_config("payments.charge", fields)


def test_i38_the_longest_reuse_window_still_submits(settings: Any) -> None:
    # given: the longest window a policy may name, and an earlier charge that succeeded
    with_policy(settings, "payments.charge", reuse_window_seconds=MAX_POLICY_SECONDS)
    first = succeeded(submit(arguments=charge_arguments(reference="order-max"), reference="order-max"))
    effect_recorded_ago(first, MAX_POLICY_SECONDS - 60)
    # when: the same order again under a new key
    again = submit(arguments=charge_arguments(reference="order-max"), reference="order-max")
    # then: answered (no database overflow), and still a likely duplicate
    assert again.status == Intent.Status.HELD and again.held_behind_id == first.id
