"""Held intents in the console (issue 20): the queue's Held section, the decision page beside
the earlier intent, release and reject with every refusal, the intent page's links, the
dashboard's counts and the held gauges of ``/metrics``.

A held intent is made as agents make one: a second submission with the same reference under
a new client key. A likely duplicate: the earlier one SUCCEEDED, then the reconcile pass's
``decide_held`` put the held one in front of a person.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from operations.adapters.base import ExecutionResult
from operations.engine.protocol import execute_intent
from operations.models import AuditEvent, Intent
from operations.services import intent_claim, intent_record_success
from reconciliation.held import decide_held
from reconciliation.models import Evidence
from tests.console.conftest import seen
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}


def held_pair(reference: str = "order-77", amount: int = 4990, **kwargs: Any) -> tuple[Intent, Intent]:
    """An earlier READY intent and a second one for the same reference, new client key: HELD."""
    earlier = submit(arguments=charge_arguments(4990), reference=reference, **kwargs)
    held = submit(arguments=charge_arguments(amount), reference=reference, **kwargs)
    assert held.status == Intent.Status.HELD and held.held_behind_id == earlier.id
    return earlier, held


def succeed(intent: Intent, provider_reference: str = "ch_first") -> None:
    """The earlier intent runs and succeeds, through the services the worker uses."""
    claim = intent_claim(intent_id=intent.id, worker="test-worker", lease_seconds=30)
    assert claim is not None
    result = ExecutionResult(provider_reference=provider_reference, response_digest="0" * 64)
    assert intent_record_success(claim=claim, result=result)


def likely_duplicate(reference: str = "order-77", amount: int = 4990) -> tuple[Intent, Intent]:
    """A held intent whose earlier intent SUCCEEDED, escalated to a person by ``decide_held``."""
    earlier, held = held_pair(reference, amount)
    succeed(earlier)
    assert decide_held().to_a_person == 1
    held.refresh_from_db()
    assert held.status == Intent.Status.HELD and held.escalated_at is not None
    return earlier, held


def decide(client: Client, intent: Intent, verb: str, **data: Any) -> Any:
    extra = {key: data.pop(key) for key in list(data) if key.startswith("HTTP_")}
    data.setdefault("seen_seq", seen(intent))  # the page was loaded just now
    return client.post(reverse("held-resolve", args=[intent.id, verb]), data, **extra)


# The queue


def test_queue_lists_a_held_intent_beside_its_earlier_intent(viewer_client: Client) -> None:
    # given: a second charge for order-77 with a changed amount
    earlier, held = held_pair(amount=5990)
    # when
    for body in (
        viewer_client.get(reverse("unknown")).content.decode(),
        viewer_client.get(reverse("unknown"), **HTMX).content.decode(),  # type: ignore[arg-type]
    ):
        # then: one row with both, their amounts and the earlier one's status
        section = body[body.index('id="held-h"') : body.index('id="compensations-h"')]
        assert "No intent is held." not in section
        assert reverse("held-detail", args=[held.id]) in section
        assert reverse("intent-detail", args=[earlier.id]) in section
        assert "order-77" in section
        assert "59.90 EUR" in section and "49.90 EUR" in section
        assert '<span class="status status-ready">READY</span> for' in section
        assert '<span class="warning">likely duplicate</span>' not in section


def test_queue_puts_likely_duplicates_first_and_marks_them(viewer_client: Client) -> None:
    # given: an older held intent still waiting for its earlier one, and a newer likely duplicate
    _, waiting = held_pair(reference="order-1")
    Intent.objects.filter(id=waiting.id).update(created_at=Now() - timedelta(hours=1))
    _, duplicate = likely_duplicate(reference="order-2")
    # when
    body = viewer_client.get(reverse("unknown")).content.decode()
    # then
    section = body[body.index('id="held-h"') : body.index('id="compensations-h"')]
    assert section.index(str(duplicate.id)) < section.index(str(waiting.id))
    assert section.count('<span class="warning">likely duplicate</span>') == 1
    assert '<span class="status status-succeeded">SUCCEEDED</span>' in section
    assert "1 h 0 min" in section  # the older one's age


def test_queue_says_so_when_nothing_is_held(viewer_client: Client) -> None:
    body = viewer_client.get(reverse("unknown")).content.decode()
    assert "No intent is held." in body


# The decision page


def test_decision_page_shows_both_intents_and_the_diff(operator_client: Client) -> None:
    # given
    earlier, held = held_pair(amount=5990)
    # when
    body = operator_client.get(reverse("held-detail", args=[held.id])).content.decode()
    # then: both, side by side, with what changed and the two forms
    assert str(held.id) in body and str(earlier.id) in body
    assert 'id="earlier-status">READY<' in body
    assert ">amount<" in body and "4990" in body and "5990" in body
    assert "Release (I accept the duplicate risk)" in body and ">Reject<" in body
    assert 'name="accept_duplicate_risk"' in body
    assert "the rule decides when it ends" in body


def test_decision_page_names_what_the_earlier_intent_already_did(operator_client: Client) -> None:
    # given: the earlier charge succeeded as ch_first
    earlier, held = likely_duplicate()
    # when
    body = operator_client.get(reverse("held-detail", args=[held.id])).content.decode()
    # then
    assert 'id="likely-duplicate"' in body
    assert f"order-77 was already done 49.90 EUR by intent {earlier.id} as ch_first" in body
    assert "<code>ch_first</code>" in body  # the earlier one's outcome
    assert "Same arguments" in body
    assert "The earlier intent succeeded" in body


def test_decision_page_shows_no_forms_to_a_viewer(viewer_client: Client) -> None:
    _, held = held_pair()
    body = viewer_client.get(reverse("held-detail", args=[held.id])).content.decode()
    assert "Only operators and admins can release or reject held intents." in body
    assert "held-resolve" not in body and "/resolve/release" not in body


def test_likely_duplicate_built_by_a_real_run_against_the_sandbox(
    operator_client: Client, sandbox: Any
) -> None:
    # given: the earlier charge runs for real at the sandbox provider, then the reconcile pass
    earlier, held = held_pair(reference="order-sbx")
    assert execute_intent(earlier.id) == "succeeded"
    assert decide_held().to_a_person == 1
    # when
    queue = operator_client.get(reverse("unknown")).content.decode()
    body = operator_client.get(reverse("held-detail", args=[held.id])).content.decode()
    # then
    assert str(held.id) in queue and "likely duplicate" in queue
    earlier.refresh_from_db()
    reference = earlier.outcomes.get().provider_reference
    assert reference and f"as {reference}" in body


# Release and reject


def test_release_with_the_risk_accepted_moves_it_to_ready_in_place(operator_client: Client) -> None:
    # given
    _, held = likely_duplicate()
    # when
    response = decide(
        operator_client, held, "release", reason="customer ordered twice", accept_duplicate_risk="on", **HTMX
    )
    # then: the decision partial, the intent READY, the risk on record
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    assert body.lstrip().startswith('<section id="decision"')
    assert "Released. The intent is READY." in body
    assert Intent.objects.get(id=held.id).status == Intent.Status.READY
    event = AuditEvent.objects.get(intent=held, event="released")
    assert event.actor == "user:otto" and event.data["duplicate_risk_accepted"] is True
    assert Evidence.objects.get(intent=held, kind=Evidence.Kind.RESOLUTION).result == "release"


def test_release_without_javascript_redirects_to_the_intent(operator_client: Client) -> None:
    _, held = held_pair()
    response = decide(operator_client, held, "release", reason="urgent", accept_duplicate_risk="on")
    assert response.status_code == 302 and response["Location"] == reverse("intent-detail", args=[held.id])
    page = operator_client.get(response["Location"]).content.decode()
    assert "Released. The intent is READY." in page


def test_reject_moves_it_to_rejected(operator_client: Client) -> None:
    # given
    _, held = likely_duplicate()
    # when
    response = decide(operator_client, held, "reject", reason="order-77 was already charged", **HTMX)
    # then
    assert response.status_code == 200 and "Rejected. The intent is REJECTED." in response.content.decode()
    assert Intent.objects.get(id=held.id).status == Intent.Status.REJECTED
    event = AuditEvent.objects.get(intent=held, to_status="REJECTED")
    assert event.reason == "order-77 was already charged" and event.actor == "user:otto"


def test_reject_without_javascript_redirects_to_the_intent(operator_client: Client) -> None:
    _, held = held_pair()
    response = decide(operator_client, held, "reject", reason="not wanted")
    assert response.status_code == 302 and response["Location"] == reverse("intent-detail", args=[held.id])
    assert Intent.objects.get(id=held.id).status == Intent.Status.REJECTED


@pytest.mark.parametrize("verb", ["release", "reject"])
def test_a_decision_needs_a_reason(operator_client: Client, verb: str) -> None:
    _, held = held_pair()
    response = decide(operator_client, held, verb, reason="  ", accept_duplicate_risk="on", **HTMX)
    body = response.content.decode()
    assert response.status_code == 422
    assert f"Refused ({verb}): Reason: This field is required." in body
    assert Intent.objects.get(id=held.id).status == Intent.Status.HELD


def test_release_needs_the_duplicate_risk_accepted(operator_client: Client) -> None:
    _, held = held_pair()
    response = decide(operator_client, held, "release", reason="the first one is stuck", **HTMX)
    body = response.content.decode()
    assert response.status_code == 409
    assert "Accept the duplicate risk explicitly to release it." in body
    assert Intent.objects.get(id=held.id).status == Intent.Status.HELD
    assert not AuditEvent.objects.filter(intent=held, event="released").exists()


@pytest.mark.parametrize("verb", ["release", "reject"])
def test_a_viewer_cannot_decide(viewer_client: Client, verb: str) -> None:
    _, held = held_pair()
    response = decide(viewer_client, held, verb, reason="mine", accept_duplicate_risk="on", **HTMX)
    assert response.status_code == 403
    assert "Only operators and admins can release or reject held intents." in response.content.decode()
    assert Intent.objects.get(id=held.id).status == Intent.Status.HELD


@pytest.mark.parametrize("verb", ["release", "reject"])
def test_a_stale_decision_is_refused_with_the_current_status(operator_client: Client, verb: str) -> None:
    # given: somebody released it first
    _, held = held_pair()
    first = decide(operator_client, held, "release", reason="first", accept_duplicate_risk="on", **HTMX)
    assert first.status_code == 200
    # when: a second operator decides on the page they loaded before
    response = decide(operator_client, held, verb, reason="second", accept_duplicate_risk="on", **HTMX)
    # then
    body = response.content.decode()
    assert response.status_code == 409
    assert "was expected in HELD but is READY; reload and decide again" in body
    assert "there is nothing to decide" in body
    assert Intent.objects.get(id=held.id).status == Intent.Status.READY


def test_a_stale_plain_post_answers_the_page_with_the_refusal(operator_client: Client) -> None:
    _, held = held_pair()
    decide(operator_client, held, "reject", reason="first")
    response = decide(operator_client, held, "reject", reason="second")
    body = response.content.decode()
    assert response.status_code == 409 and "<html" in body
    assert "was expected in HELD but is REJECTED" in body


def test_an_unknown_decision_is_not_found(operator_client: Client) -> None:
    _, held = held_pair()
    assert decide(operator_client, held, "approve", reason="x").status_code == 404


# The intent page, the evidence page, the dashboard and /metrics


def test_intent_page_says_what_a_held_intent_waits_behind(viewer_client: Client) -> None:
    # given
    earlier, held = held_pair()
    # when
    body = viewer_client.get(reverse("intent-detail", args=[held.id])).content.decode()
    status_line = viewer_client.get(reverse("intent-detail", args=[held.id]), **HTMX).content.decode()  # type: ignore[arg-type]
    # then
    for text in (body, status_line):
        assert "Held behind" in text
        assert reverse("intent-detail", args=[earlier.id]) in text
        assert '<span class="status status-ready">READY</span>' in text
        assert reverse("held-detail", args=[held.id]) in text


def test_intent_page_lists_the_intents_held_behind_it(viewer_client: Client) -> None:
    # given: two later intents for order-77 held behind the first
    earlier, held = held_pair()
    other = submit(arguments=charge_arguments(), reference="order-77")
    assert other.status == Intent.Status.HELD
    # when
    body = viewer_client.get(reverse("intent-detail", args=[earlier.id])).content.decode()
    # then
    listed = body[body.index('id="held-intents"') :]
    assert str(held.id) in listed and str(other.id) in listed
    assert listed.index(str(held.id)) < listed.index(str(other.id))


def test_a_released_intent_still_shows_what_it_was_held_behind(operator_client: Client) -> None:
    earlier, held = held_pair()
    decide(operator_client, held, "release", reason="urgent", accept_duplicate_risk="on")
    body = operator_client.get(reverse("intent-detail", args=[held.id])).content.decode()
    assert "Was held behind" in body and str(earlier.id) in body
    assert 'id="held-behind"' not in body


def test_evidence_page_of_a_held_intent_points_to_the_decision(operator_client: Client) -> None:
    _, held = held_pair()
    body = operator_client.get(reverse("unknown-detail", args=[held.id])).content.decode()
    assert reverse("held-detail", args=[held.id]) in body


def test_dashboard_counts_held_intents_and_likely_duplicates(viewer_client: Client) -> None:
    # given: one held intent waiting for its earlier one, one likely duplicate
    held_pair(reference="order-1")
    likely_duplicate(reference="order-2")
    # when
    for body in (
        viewer_client.get(reverse("dashboard")).content.decode(),
        viewer_client.get(reverse("dashboard"), **HTMX).content.decode(),  # type: ignore[arg-type]
    ):
        # then
        assert '<td class="num" id="held-behind">1</td>' in body  # issue 39 item 5: apart
        assert '<td class="num" id="held-likely-duplicates">1</td>' in body
        assert f'href="{reverse("unknown")}#held"' in body
        assert 'class="status status-held"' in body  # the by-state row's badge


def test_metrics_show_held_intents_by_age(db: Any) -> None:
    # given: one held intent an hour old, one likely duplicate just now
    _, old = held_pair(reference="order-1")
    Intent.objects.filter(id=old.id).update(created_at=Now() - timedelta(hours=1, minutes=1))
    likely_duplicate(reference="order-2")
    # when
    text = Client().get("/metrics").content.decode()
    # then
    assert 'effect_ledger_intents{status="HELD"} 2.0' in text
    assert 'effect_ledger_held_by_age{age="lt_1m"} 1.0' in text
    assert 'effect_ledger_held_by_age{age="lt_24h"} 1.0' in text
    assert "effect_ledger_held_likely_duplicates 1.0" in text
    oldest = next(line for line in text.splitlines() if line.startswith("effect_ledger_held_oldest_seconds "))
    assert 3660 <= float(oldest.split()[1]) < 3700


@pytest.mark.parametrize("sent", ["off", "false", "0", "no", "maybe"])
def test_a_box_sent_as_anything_but_ticked_is_no_acknowledgement(operator_client: Client, sent: str) -> None:
    # given: a hand-made form post whose box value is not what a ticked box sends
    _, held = held_pair()
    # when
    response = decide(operator_client, held, "release", reason="x", accept_duplicate_risk=sent, **HTMX)
    # then: refused, nothing released
    assert response.status_code == 409
    assert Intent.objects.get(id=held.id).status == Intent.Status.HELD
