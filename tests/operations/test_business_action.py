"""Case C23: one business action at a time. A second intent for the same business object, under a
new client key, is HELD behind the open one (race-free under real concurrent connections), and
the refusal paths around it: a required reference, an agent's cancel, an operator's release
without accepting the risk, and a same-key replay while held."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from operations.exceptions import ResolutionRefused
from operations.models import AuditEvent, Intent, OutboxMessage
from operations.services import intent_submit
from reconciliation.held import decide_held
from reconciliation.resolution import release_held
from tests.factories import UserFactory, charge_arguments, submit

URL = "/api/v1/intents"


def post(api: APIClient, body: Any, key: str) -> Any:
    return api.post(URL, data=json.dumps(body), content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)


def charge(amount: int = 4990, reference: str | None = "order-77") -> dict[str, Any]:
    body: dict[str, Any] = {"action": "payments.charge", "arguments": charge_arguments(amount)}
    if reference is not None:
        body["reference"] = reference
    return body


def counts() -> tuple[int, int, int]:
    return Intent.objects.count(), OutboxMessage.objects.count(), AuditEvent.objects.count()


# --- the race: sixteen keys for one reference at the same instant --------------------------------


def submit_together(n: int, reference: str) -> list[Any]:
    """``n`` threads, each with its own database connection, submit a charge for ``reference``
    under their own client key at the same instant; returns the results (or exceptions)."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def worker(i: int) -> None:
        try:
            barrier.wait()
            results[i] = intent_submit(
                tenant="acme",
                principal="agent:agent-1",
                client_key=f"replan-{i}-{uuid.uuid4()}",
                action="payments.charge",
                arguments=charge_arguments(4990 + i),  # the planner changes the amount: no escape
                reference=reference,
            )
        except Exception as exc:  # surfaced to the test through results
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


@pytest.mark.django_db(transaction=True)
def test_c23_sixteen_keys_for_one_reference_at_once_one_proceeds() -> None:
    # given: nothing open for order-77
    # when: sixteen submissions with sixteen client keys at the same instant
    results = submit_together(16, "order-77")
    # then: all created; exactly one proceeds, the fifteen others are held behind it
    assert not [r for r in results if isinstance(r, Exception)], results
    assert all(r.created for r in results)
    intents = list(Intent.objects.filter(reference="order-77"))
    assert len(intents) == 16
    (first,) = [i for i in intents if i.status != Intent.Status.HELD]
    assert first.status == Intent.Status.READY and first.held_behind_id is None
    held = [i for i in intents if i.status == Intent.Status.HELD]
    assert len(held) == 15
    assert {i.held_behind_id for i in held} == {first.id}  # open_intent_for prefers the non-held one
    assert all(i.created_at >= first.created_at for i in held)
    # and only the one that proceeds is dispatched
    assert list(OutboxMessage.objects.values_list("intent_id", flat=True)) == [first.id]


@pytest.mark.django_db(transaction=True)
def test_c23_sixteen_keys_while_the_first_is_unknown_all_held_behind_it() -> None:
    # given: the first charge for order-78 lost its answer (UNKNOWN)
    from operations.services import intent_claim, intent_mark_unknown

    earlier = submit(arguments=charge_arguments(reference="order-78"), reference="order-78")
    claim = intent_claim(intent_id=earlier.id, worker="w", lease_seconds=30)
    assert claim is not None and intent_mark_unknown(claim=claim, error="answer lost", cause="ambiguous")
    # when: sixteen re-plans at once
    results = submit_together(16, "order-78")
    # then: none proceeds; all wait behind the UNKNOWN one; a reconcile pass releases nobody
    assert not [r for r in results if isinstance(r, Exception)], results
    held = Intent.objects.filter(reference="order-78").exclude(id=earlier.id)
    assert held.count() == 16
    assert set(held.values_list("status", "held_behind_id")) == {(Intent.Status.HELD, earlier.id)}
    counts_ = decide_held()
    assert counts_.released == 0 and counts_.to_a_person == 0 and not counts_.errors
    assert Intent.objects.filter(reference="order-78", status=Intent.Status.HELD).count() == 16
    assert list(OutboxMessage.objects.values_list("intent_id", flat=True)) == [earlier.id]


# --- refusal paths ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_c23_reference_required_policy_refuses_an_intent_without_reference(
    api: APIClient, settings: Any
) -> None:
    # given: high-risk charges must name the business object they act on
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {**settings.EFFECT_LEDGER_POLICIES["payments.charge"], "reference_required": True},
    }
    before = counts()
    # when
    response = post(api, charge(reference=None), key="no-ref-1")
    blank = post(api, charge(reference=""), key="no-ref-2")
    # then: 422 problem naming the reference; nothing stored
    for answer in (response, blank):
        assert answer.status_code == 422, answer.content
        assert answer["Content-Type"] == "application/problem+json"
        assert "reference" in answer.json()["detail"]
    assert counts() == before
    # and: with a reference it is accepted
    assert post(api, charge(reference="order-1"), key="no-ref-3").status_code == 201


@pytest.mark.django_db
def test_c23_api_answers_held_with_the_link_and_the_agent_can_cancel_it(api: APIClient) -> None:
    # given: a charge for order-77 in flight, and a re-plan under a new key with another amount
    first = post(api, charge(), key="K1").json()
    second = post(api, charge(5990), key="K2")
    assert second.status_code == 201
    body = second.json()
    assert body["status"] == "HELD" and body["held_behind"] == first["intent_id"]
    assert not OutboxMessage.objects.filter(intent_id=body["intent_id"]).exists()
    # when: the agent learns its retry is not needed and cancels it
    cancelled = api.post(f"{URL}/{body['intent_id']}/cancel", data={"reason": "not needed"}, format="json")
    # then
    assert cancelled.status_code == 200, cancelled.content
    assert cancelled.json()["status"] == "CANCELLED"
    assert Intent.objects.get(id=body["intent_id"]).status == Intent.Status.CANCELLED
    assert Intent.objects.get(id=first["intent_id"]).status == Intent.Status.READY
    # and: GET shows it; cancelling again is idempotent
    assert api.get(f"{URL}/{body['intent_id']}").json()["status"] == "CANCELLED"
    assert api.post(f"{URL}/{body['intent_id']}/cancel", data={}, format="json").status_code == 200


@pytest.mark.django_db
def test_c23_release_without_accepting_the_duplicate_risk_is_refused() -> None:
    # given: a held intent behind an open one, and an operator
    operator = UserFactory(username="olga", groups=["operator"])
    earlier = submit(reference="order-77")
    held = submit(reference="order-77")
    assert held.status == Intent.Status.HELD
    # when: released without accepting the risk
    with pytest.raises(ResolutionRefused, match="duplicate risk"):
        release_held(intent_id=held.id, user=operator, reason="customer asked", accept_duplicate_risk=False)
    # then: still held, nothing dispatched
    assert Intent.objects.get(id=held.id).status == Intent.Status.HELD
    assert not OutboxMessage.objects.filter(intent=held).exists()
    # when: released with the risk accepted
    released = release_held(
        intent_id=held.id, user=operator, reason="customer asked", accept_duplicate_risk=True
    )
    # then: READY, dispatched, audited with the risk accepted
    assert released.status == Intent.Status.READY
    assert OutboxMessage.objects.filter(intent=held).exists()
    event = AuditEvent.objects.get(intent=held, event="released")
    assert event.data["duplicate_risk_accepted"] is True and event.actor == "user:olga"
    assert Intent.objects.get(id=earlier.id).status == Intent.Status.READY


@pytest.mark.django_db
def test_c23_same_key_same_request_while_held_is_a_replay(api: APIClient) -> None:
    # given: a held intent
    post(api, charge(), key="K1")
    held = post(api, charge(5990), key="K2").json()
    assert held["status"] == "HELD"
    before = counts()
    # when: the same key and the same request again
    replay = post(api, charge(5990), key="K2")
    # then: the stored intent, replayed; nothing new
    assert replay.status_code == 201
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.json()["intent_id"] == held["intent_id"]
    assert replay.json()["status"] == "HELD" and replay.json()["held_behind"] == held["held_behind"]
    assert counts() == before
    # and: the same key with another request is still refused
    assert post(api, charge(6990), key="K2").status_code == 422
    assert counts() == before


@pytest.mark.django_db
def test_c23_a_held_one_cancelled_before_the_rule_ran_does_not_block_the_next() -> None:
    # given: order-79's first charge declined (FAILED) before the rule released K2, and K3
    # submitted meanwhile (held behind K2, the only open intent)
    from operations.services import intent_cancel, intent_claim, intent_record_failure

    first = submit(reference="order-79")
    second = submit(reference="order-79")
    claim = intent_claim(intent_id=first.id, worker="w", lease_seconds=30)
    assert claim is not None and intent_record_failure(claim=claim, error="card_declined")
    third = submit(reference="order-79")
    assert (third.status, third.held_behind_id) == (Intent.Status.HELD, second.id)
    # when: the agent cancels K2, then the rule runs
    intent_cancel(intent_id=second.id, actor="agent:agent-1", reason="superseded")
    counts_ = decide_held()
    # then: K3 is decided on the first's ending (no effect): released, and only K3 is dispatched
    third.refresh_from_db()
    assert counts_.released == 1 and third.status == Intent.Status.READY
    assert list(OutboxMessage.objects.exclude(intent=first).values_list("intent_id", flat=True)) == [third.id]


def test_c23_a_reference_only_in_the_arguments_is_the_business_identity(db: Any) -> None:
    # given: an email whose reference travels only inside its arguments
    arguments = {"to": "ann@example.test", "subject": "Welcome", "body": "Hi", "reference": "welcome-42"}
    first = submit(action="email.send", arguments=arguments)
    # when: the agent re-plans under a new key, again without a top-level reference
    second = submit(action="email.send", arguments=arguments)
    # then
    assert first.status == "READY"
    assert (second.status, second.held_behind_id) == ("HELD", first.id)


def test_c23_the_identity_is_the_reference_the_provider_gets(api: APIClient) -> None:
    # given: the first charge names order-97 at the top but order-98 in its arguments, which is
    # the reference the provider records
    first = charge(reference="order-97")
    first["arguments"]["reference"] = "order-98"
    first_id = post(api, first, "mm-1").json()["intent_id"]
    # when: a re-plan charges order-98
    second = post(api, charge(reference="order-98"), "mm-2").json()
    # then: it waits behind the first: both act on order-98 at the provider
    assert (second["status"], second["held_behind"]) == ("HELD", first_id)


def test_c23_a_reference_only_in_the_arguments_is_stored_and_searchable(api: APIClient) -> None:
    # given: two charges for order-99, the reference only inside the arguments
    body = {"action": "payments.charge", "arguments": charge_arguments(4990, reference="order-99")}
    # when
    first, second = post(api, body, "arg-ref-1").json(), post(api, body, "arg-ref-2").json()
    # then: the intent's reference is the one the provider gets; the second is held; both are found
    assert (first["reference"], second["status"], second["held_behind"]) == (
        "order-99",
        "HELD",
        first["intent_id"],
    )
    found = api.get(URL, {"reference": "order-99"}).json()["results"]
    assert {row["intent_id"] for row in found} == {first["intent_id"], second["intent_id"]}


def test_c23_an_over_long_reference_in_the_arguments_is_a_422_not_a_500(
    api: APIClient, settings: Any
) -> None:
    # given: a generic action whose schema lets any object through
    settings.EFFECT_LEDGER_GENERIC_HTTP = {"acme.notify": {"url": "http://127.0.0.1:9/v1/notify"}}
    body = {"action": "acme.notify", "arguments": {"reference": "x" * 201}}
    # when / then
    response = post(api, body, "long-ref")
    assert response.status_code == 422 and "arguments.reference" in response.json()["detail"]
