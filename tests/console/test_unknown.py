"""The UNKNOWN queue, its evidence page and the three resolutions, with every refusal."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from operations import services
from operations.models import Intent
from operations.services import intent_claim, intent_mark_unknown
from reconciliation.models import Evidence
from tests.console.conftest import make_unknown, seen, unknown_with_effect

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
RESERVATION = {"resource": "room-101", "start": "2030-01-01T10:00:00Z", "seats": 2, "reference": "booking-1"}


def resolve(client: Client, intent: Intent, verb: str, **data: Any) -> Any:
    extra = {key: data.pop(key) for key in list(data) if key.startswith("HTTP_")}
    data.setdefault("seen_seq", seen(intent))  # the page was loaded just now
    return client.post(reverse("unknown-resolve", args=[intent.id, verb]), data, **extra)


def test_queue_lists_unknown_oldest_first_with_age(viewer_client: Client) -> None:
    # given
    older = make_unknown(reference="r-1")
    Intent.objects.filter(id=older.id).update(updated_at=Now() - timedelta(hours=2))
    newer = make_unknown(reference="r-2")
    # when
    body = viewer_client.get(reverse("unknown")).content.decode()
    # then
    assert body.index(str(older.id)) < body.index(str(newer.id))
    assert "2 h 0 min" in body
    assert "timeout after the request was sent" in body


def test_detail_gathers_attempts_lookups_and_duplicates(viewer_client: Client) -> None:
    # given: an UNKNOWN intent with a lookup and a duplicate on record
    intent = make_unknown()
    Evidence.objects.create(
        intent=intent, kind="lookup", result="inconclusive", detail={"code": "request_in_progress"}
    )
    Evidence.objects.create(
        intent=intent, kind="duplicate", result="two effects", provider_references=["ch_a", "ch_b"]
    )
    # when
    body = viewer_client.get(reverse("unknown-detail", args=[intent.id])).content.decode()
    # then
    assert "fence" in body.lower() and "test-worker" in body and "unknown" in body
    assert "timeout after the request was sent" in body  # what the provider failed to answer
    assert "inconclusive" in body and "request_in_progress" in body
    assert "ch_a, ch_b" in body
    assert "Only operators and admins can resolve" in body  # a viewer sees no forms


def test_detail_shows_the_three_forms_to_an_operator(operator_client: Client) -> None:
    intent = make_unknown()
    body = operator_client.get(reverse("unknown-detail", args=[intent.id])).content.decode()
    for label in ("Resolve as confirmed", "Resolve as absent", "Resolve by compensating"):
        assert label in body
    assert "accept_duplicate_risk" not in body  # payments deduplicate on the key


def test_resolve_confirmed_needs_a_reference_and_a_reason(operator_client: Client) -> None:
    intent = make_unknown()
    no_ref = resolve(operator_client, intent, "confirmed", reason="seen in dashboard", **HTMX)
    assert no_ref.status_code == 422 and b"Provider reference" in no_ref.content
    no_reason = resolve(operator_client, intent, "confirmed", provider_reference="ch_1", **HTMX)
    assert no_reason.status_code == 422 and b"Reason" in no_reason.content
    assert Intent.objects.get(id=intent.id).status == Intent.Status.UNKNOWN


def test_resolve_confirmed_with_the_provider_reference(operator_client: Client, sandbox: Any) -> None:
    # given: the charge reached the provider but its answer was lost
    intent, charge_id = unknown_with_effect()
    # when
    response = resolve(
        operator_client,
        intent,
        "confirmed",
        provider_reference=charge_id,
        reason="found in the provider dashboard",
    )
    # then
    assert response.status_code == 302
    intent.refresh_from_db()
    assert intent.status == Intent.Status.SUCCEEDED
    assert intent.outcomes.get().provider_reference == charge_id
    assert len(sandbox.ledger("payments")) == 1


def test_resolve_confirmed_contradicted_by_the_provider_is_refused(
    operator_client: Client, sandbox: Any
) -> None:
    intent, _ = unknown_with_effect()
    response = resolve(
        operator_client, intent, "confirmed", provider_reference="ch_wrong", reason="guess", **HTMX
    )
    assert response.status_code == 409 and b"not ch_wrong" in response.content
    assert Intent.objects.get(id=intent.id).status == Intent.Status.UNKNOWN


def test_resolve_absent_retries_with_the_same_key(operator_client: Client) -> None:
    intent = make_unknown()
    key = intent.idempotency_key
    response = resolve(
        operator_client, intent, "absent", reason="provider confirmed nothing happened", **HTMX
    )
    assert response.status_code == 200 and b"Resolved as absent" in response.content
    intent.refresh_from_db()
    assert intent.status == Intent.Status.READY and intent.idempotency_key == key


def test_resolve_absent_without_keys_needs_the_duplicate_risk_acknowledgement(
    operator_client: Client,
) -> None:
    # given: a reservation (the provider has no idempotency keys)
    intent = make_unknown(action="reservations.create", arguments=RESERVATION, reference="booking-1")
    page = operator_client.get(reverse("unknown-detail", args=[intent.id])).content.decode()
    assert "accept_duplicate_risk" in page
    # when: no acknowledgement
    refused = resolve(operator_client, intent, "absent", reason="not in the list", **HTMX)
    # then
    assert refused.status_code == 409 and b"Accept the duplicate risk" in refused.content
    assert Intent.objects.get(id=intent.id).status == Intent.Status.UNKNOWN
    # with it
    resolve(operator_client, intent, "absent", reason="not in the list", accept_duplicate_risk="on")
    assert Intent.objects.get(id=intent.id).status == Intent.Status.READY


def test_i21_9_absent_is_refused_in_place_when_a_lookup_found_the_effect(operator_client: Client) -> None:
    # given: a reservation whose effect a lookup found (its intent is still UNKNOWN)
    intent = make_unknown(action="reservations.create", arguments=RESERVATION, reference="booking-1")
    Evidence.objects.create(intent=intent, kind="lookup", result="found", provider_references=["rsv_77"])
    # when: an operator says it is absent, accepting the duplicate risk
    refused = resolve(
        operator_client, intent, "absent", reason="not in the list", accept_duplicate_risk="on", **HTMX
    )
    # then: refused in place, naming the evidence; nothing moved and nothing was recorded as decided
    assert refused.status_code == 409 and b"rsv_77" in refused.content
    assert Intent.objects.get(id=intent.id).status == Intent.Status.UNKNOWN
    assert not Evidence.objects.filter(intent=intent, kind="resolution").exists()


def test_i21_9_a_decision_from_a_page_loaded_before_the_intent_moved_is_refused(
    operator_client: Client,
) -> None:
    # given: an operator loads the UNKNOWN page of a charge ...
    intent = make_unknown(reference="stale-1")
    page = operator_client.get(reverse("unknown-detail", args=[intent.id])).content.decode()
    seen = re.search(r'name="seen_seq" value="(\d+)"', page)
    assert seen is not None
    # ... meanwhile another operator said absent, it was sent again and came back UNKNOWN
    services.intent_resolve_absent(intent_id=intent.id, actor="user:other", reason="resend")
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    assert intent_mark_unknown(claim=claim, error="timeout again", cause="ambiguous")
    # when: the first operator confirms from the page they loaded before all that
    stale = resolve(
        operator_client, intent, "confirmed", provider_reference="ch_stale", reason="seen it",
        accept_unverified="on", seen_seq=seen.group(1), **HTMX,
    )  # fmt: skip
    # then: refused in place, naming what changed; nothing moved
    assert stale.status_code == 409 and "changed since the page was loaded" in stale.content.decode()
    assert "outcome_absent" in stale.content.decode()
    assert Intent.objects.get(id=intent.id).status == Intent.Status.UNKNOWN
    # and a page state the intent never had, or none, is refused too (nothing moves)
    ahead = resolve(operator_client, intent, "absent", reason="x", seen_seq="999999", **HTMX)
    assert ahead.status_code == 409 and "does not match this intent" in ahead.content.decode()
    missing = operator_client.post(
        reverse("unknown-resolve", args=[intent.id, "absent"]), {"reason": "x"}, **HTMX
    )  # type: ignore[arg-type]
    assert missing.status_code == 422 and "reload it" in missing.content.decode()
    assert Intent.objects.get(id=intent.id).status == Intent.Status.UNKNOWN
    # and the page they now see carries the new state, from which the decision goes through
    fresh = re.search(r'name="seen_seq" value="(\d+)"', stale.content.decode())
    assert fresh is not None and int(fresh.group(1)) > int(seen.group(1))
    assert resolve(
        operator_client, intent, "absent", reason="provider says no", seen_seq=fresh.group(1)
    ).status_code == 302  # fmt: skip


def test_resolve_compensate_without_a_known_effect_is_refused(operator_client: Client) -> None:
    intent = make_unknown()
    response = resolve(operator_client, intent, "compensate", reason="refund to be safe", **HTMX)
    assert response.status_code == 409 and b"no lookup has found one" in response.content


def test_resolve_compensate_opens_a_compensation(operator_client: Client) -> None:
    intent = make_unknown()
    response = resolve(
        operator_client, intent, "compensate", reason="customer asked", provider_reference="ch_123"
    )
    assert response.status_code == 302
    intent.refresh_from_db()
    assert intent.status == Intent.Status.COMPENSATING
    compensation = intent.compensations.get()
    page = operator_client.get(reverse("intent-detail", args=[intent.id])).content.decode()
    assert str(compensation.id) in page


def test_viewer_and_approver_cannot_resolve(viewer_client: Client, approver_client: Client) -> None:
    intent = make_unknown()
    for client in (viewer_client, approver_client):
        response = resolve(client, intent, "absent", reason="x", **HTMX)
        assert response.status_code == 403 and b"Only operators and admins" in response.content
    assert Intent.objects.get(id=intent.id).status == Intent.Status.UNKNOWN


def test_resolving_an_intent_that_moved_is_refused(operator_client: Client) -> None:
    intent = make_unknown()
    resolve(operator_client, intent, "absent", reason="first")
    response = resolve(operator_client, intent, "absent", reason="second", **HTMX)
    assert response.status_code == 409 and b"expected in UNKNOWN" in response.content


def test_unknown_verb_is_404(operator_client: Client) -> None:
    intent = make_unknown()
    assert resolve(operator_client, intent, "shrug", reason="x").status_code == 404
