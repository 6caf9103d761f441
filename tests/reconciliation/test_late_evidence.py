"""Issue 38: evidence after the decision, and whose effect it is.

C31: an operator's ``absent`` commits between a lookup's provider call and its record; the
found effect is recognised (never silently kept as FAILED). C34: a lookup by reference never
takes another tenant's effect, and never compensates on such a match. Items 3 and 7: the same
rules for a provider's event and a statement line. Against the real sandbox provider process
and real PostgreSQL; the race is made deterministic by running the lookup's two halves (the
provider call, then the record) around the operator's decision, as the reconciler does.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import httpx
import pytest
from django.db.models.functions import Now

from operations.engine.calls import provider_lookup
from operations.engine.protocol import execute_intent
from operations.models import AuditEvent, Intent, Notification, Outcome, WebhookDelivery
from operations.selectors.notifications import notification_recipients
from operations.services import agent_callback_set
from reconciliation.duplicates import run_duplicate_checks
from reconciliation.lookups import reconcile_unknown, record_lookup
from reconciliation.models import DuplicateFinding, ProviderEvent, ProviderFinding
from reconciliation.resolution import resolve_absent
from reconciliation.statements import run as statement_run
from tests.factories import UserFactory, charge_arguments, make_agent, submit
from tests.reconciliation.test_provider_events import charge_event, deliver, process_all
from tests.reconciliation.test_reconciliation import reservation

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def olga(db: Any) -> Any:
    return UserFactory(username="olga", groups=["operator"], email="olga@example.test")


@pytest.fixture
def one_attempt(settings: Any) -> None:
    """Payments with an attempt budget of 1: ``absent`` cannot re-send, it ends the intent FAILED."""
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {
            **settings.EFFECT_LEDGER_POLICIES.get("payments.charge", {}),
            "retry": {"max_attempts": 1},
        },
    }


def charged_then_lost(sandbox: Any, reference: str, **submit_options: Any) -> Intent:
    """A charge the sandbox applied whose answer was lost: UNKNOWN, one charge at the provider."""
    sandbox.inject("crash_after_effect", product="payments")
    intent = submit(reference=reference, **submit_options)
    assert execute_intent(intent.id) == "unknown"
    sandbox.clear_faults()
    assert len(sandbox.ledger("payments", reference=reference)) == 1
    return intent


def test_c31_absent_between_the_lookups_call_and_its_record_ends_with_the_effect_recognised(
    sandbox: Any, olga: Any, one_attempt: None
) -> None:
    # given: agent-1 is told of its intents by webhook; its charge was applied, the answer lost
    agent, _ = make_agent()
    agent_callback_set(agent=agent, url="https://hooks.example.test/agent-1")
    intent = charged_then_lost(sandbox, "order-31")
    (charge,) = sandbox.ledger("payments", reference="order-31")
    # when: the reconciler's lookup has its answer from the provider ...
    found = provider_lookup(intent)
    assert found.provider_references == (charge["id"],)
    # ... the operator's absent commits first (the attempt budget is spent: it ends FAILED) ...
    ended = resolve_absent(intent_id=intent.id, user=olga, reason="customer says no charge")
    assert ended.status == Intent.Status.FAILED
    # ... and only then does the lookup record what it found
    assert record_lookup(intent.id, found) == "resolved"
    # then: the effect is recognised, with both the decision and the evidence on the timeline
    intent.refresh_from_db()
    assert intent.status == Intent.Status.SUCCEEDED
    assert Outcome.objects.get(intent=intent).provider_reference == charge["id"]
    events = list(
        AuditEvent.objects.filter(intent=intent).order_by("seq").values_list("event", "actor", "to_status")
    )
    assert ("outcome_absent", "user:olga", "FAILED") in events
    assert events[-1] == ("effect_found_late", "reconciler", "SUCCEEDED")
    late = AuditEvent.objects.get(intent=intent, event="effect_found_late")
    assert late.data["ended"] == "FAILED" and late.data["provider_reference"] == charge["id"]
    # one open finding for the operators
    (finding,) = ProviderFinding.objects.filter(intent=intent)
    assert (finding.kind, finding.state, finding.provider_reference) == (
        "effect_after_ending",
        "open",
        charge["id"],
    )
    assert finding.detail["ended"] == "FAILED"
    # the agent is told (its signed webhook says the intent succeeded) ...
    webhook = WebhookDelivery.objects.get(intent=intent, status="SUCCEEDED")
    assert webhook.event_type == "intent.succeeded"
    # ... and so are the operators, the one who decided included
    notice = Notification.objects.get(intent=intent, kind=Notification.Kind.EFFECT_FOUND_LATE)
    assert "olga@example.test" in notification_recipients(notice)
    # when: the agent, told earlier that nothing happened, charges the same order again
    again = submit(reference="order-31", client_key="order-31-second-try")
    # then: held as a likely duplicate; nothing is sent; one charge in all
    assert again.status == Intent.Status.HELD
    assert execute_intent(again.id) != "succeeded"
    again.refresh_from_db()
    assert again.status == Intent.Status.HELD and again.escalated_at is not None
    assert len(sandbox.ledger("payments", reference="order-31")) == 1


def test_c31_a_lookup_after_the_ending_that_finds_nothing_changes_nothing(
    sandbox: Any, olga: Any, one_attempt: None
) -> None:
    # given: a charge that never reached the provider (refused before it), answer lost
    sandbox.inject("crash_before_effect", product="payments")
    intent = submit(reference="order-31b")
    assert execute_intent(intent.id) == "unknown"
    sandbox.clear_faults()
    looked = provider_lookup(intent)
    resolve_absent(intent_id=intent.id, user=olga, reason="provider shows nothing")
    # when: the lookup records an answer proving nothing
    assert record_lookup(intent.id, looked) == "moved"
    # then: FAILED stands, no finding, no notice
    intent.refresh_from_db()
    assert intent.status == Intent.Status.FAILED
    assert not ProviderFinding.objects.filter(intent=intent).exists()
    assert not Notification.objects.filter(intent=intent, kind="effect_found_late").exists()


def test_late_event_for_a_failed_charge_is_the_same_rule(
    sandbox: Any, olga: Any, one_attempt: None, client: Any
) -> None:
    # given: the charge ended FAILED by the operator's absent; then the provider's signed event
    # proving it reaches the inbox
    intent = charged_then_lost(sandbox, "order-38e")
    (charge,) = sandbox.ledger("payments", reference="order-38e")
    resolve_absent(intent_id=intent.id, user=olga, reason="customer says no charge")
    event = charge_event(intent, "charge.succeeded", ref=charge["id"])
    assert deliver(client, "sandbox-payments", event).status_code == 200
    # when
    (result,) = process_all()
    # then: applied as late evidence: SUCCEEDED, source provider_event, one finding with the event
    assert result == "applied"
    intent.refresh_from_db()
    assert intent.status == Intent.Status.SUCCEEDED
    assert Outcome.objects.get(intent=intent).source == "provider_event"
    finding = ProviderFinding.objects.get(intent=intent, kind="effect_after_ending")
    assert finding.event_id == ProviderEvent.objects.get().pk and finding.detail["ended"] == "FAILED"
    assert (
        AuditEvent.objects.get(intent=intent, event="effect_found_late").actor == "provider:sandbox-payments"
    )


def test_a_late_event_with_another_amount_is_not_applied(
    sandbox: Any, olga: Any, one_attempt: None, client: Any
) -> None:
    # given: a FAILED charge, and an event for its key that shows another amount
    intent = charged_then_lost(sandbox, "order-38m")
    resolve_absent(intent_id=intent.id, user=olga, reason="customer says no charge")
    event = charge_event(intent, "charge.succeeded", ref="ch_other_amount")
    event["data"]["amount"] = 9990
    assert deliver(client, "sandbox-payments", event).status_code == 200
    # when
    (result,) = process_all()
    # then: an amount mismatch for a person; the intent stays FAILED
    assert result == "recorded"
    intent.refresh_from_db()
    assert intent.status == Intent.Status.FAILED
    assert ProviderFinding.objects.get(intent=intent).kind == "amount_mismatch"


@pytest.mark.parametrize("ending", ["REJECTED", "EXPIRED", "CANCELLED"])
def test_a_statement_line_for_a_sent_intent_that_ended_without_effect_is_late_evidence(
    sandbox: Any, ending: str
) -> None:
    # given: an intent that was sent (one attempt) and ended without effect by the ledger's account
    intent = submit(reference=f"order-{ending}")
    Intent.objects.filter(id=intent.id).update(status=ending, attempt_count=1)
    line = {
        "provider_reference": f"ch_{ending}",
        "idempotency_key": intent.idempotency_key,
        "reference": f"order-{ending}",
        "amount": 4990,
        "currency": "EUR",
    }
    # when
    from operations.adapters.base import StatementEntry

    result = statement_run(
        source="sandbox-payments", day=dt.date(2026, 3, 10), entries=[StatementEntry(**line)], origin="api"
    )
    # then: matched, and the intent holds the effect it was shown to have
    assert (result.matched, result.extra_at_provider) == (1, 0)
    intent.refresh_from_db()
    assert intent.status == Intent.Status.SUCCEEDED
    late = AuditEvent.objects.get(intent=intent, event="effect_found_late")
    assert late.from_status == ending
    assert ProviderFinding.objects.get(intent=intent).kind == "effect_after_ending"


def test_a_line_for_an_intent_never_sent_is_not_its_effect(sandbox: Any) -> None:
    from operations.adapters.base import StatementEntry

    # given: a rejected intent that never reached a worker, and a line naming its reference only
    intent = submit(reference="order-never")
    Intent.objects.filter(id=intent.id).update(status="REJECTED")
    entry = StatementEntry(
        provider_reference="ch_never", reference="order-never", amount=4990, currency="EUR"
    )
    # when
    result = statement_run(source="sandbox-payments", day=dt.date(2026, 3, 10), entries=[entry], origin="api")
    # then: extra at the provider, the intent untouched
    assert (result.matched, result.extra_at_provider) == (0, 1)
    intent.refresh_from_db()
    assert intent.status == "REJECTED"
    finding = ProviderFinding.objects.get(provider_reference="ch_never")
    assert finding.kind == "extra_at_provider" and "before it was ever sent" in finding.detail["why"]


def book(sandbox: Any, tenant: str, reference: str, *, lose_answer: bool) -> Intent:
    if lose_answer:
        sandbox.inject("crash_after_effect", product="reservations")
    intent = submit(tenant=tenant, action="reservations.create", arguments=reservation(reference))
    assert execute_intent(intent.id) == ("unknown" if lose_answer else "succeeded")
    sandbox.clear_faults()
    return intent


def test_c34_a_lookup_never_takes_another_tenants_reservation_and_cancels_nothing(sandbox: Any) -> None:
    # given: globex booked trip-1 (SUCCEEDED); acme booked trip-1, the booking made, the answer lost
    globex = book(sandbox, "globex", "trip-1", lose_answer=False)
    acme = book(sandbox, "acme", "trip-1", lose_answer=True)
    globex_res = Outcome.objects.get(intent=globex).provider_reference
    booked = [item["id"] for item in sandbox.ledger("reservations", reference="trip-1")]
    assert len(booked) == 2 and globex_res in booked
    (acme_res,) = [ref for ref in booked if ref != globex_res]
    # when: the reconciler looks acme's intent up (the listing by reference shows both)
    Intent.objects.filter(id=acme.id).update(next_lookup_at=Now())
    reconcile_unknown()
    Intent.objects.filter(next_duplicate_check_at__isnull=False).update(next_duplicate_check_at=Now())
    run_duplicate_checks()
    # then: acme ends with its own reservation; globex's is untouched; nothing is cancelled
    acme.refresh_from_db()
    globex.refresh_from_db()
    assert acme.status == Intent.Status.SUCCEEDED
    assert Outcome.objects.get(intent=acme).provider_reference == acme_res
    assert globex.status == Intent.Status.SUCCEEDED
    assert Outcome.objects.get(intent=globex).provider_reference == globex_res
    assert not Intent.objects.filter(action="reservations.cancel").exists()
    assert not DuplicateFinding.objects.exists()
    states = {item["id"]: item["status"] for item in sandbox.ledger("reservations", reference="trip-1")}
    assert states == {globex_res: "confirmed", acme_res: "confirmed"}
    evidence = acme.evidence.get(kind="lookup")
    assert globex_res in json.dumps(evidence.detail["not_this_intents"])
    # acme's operators read this evidence: it names neither globex's intent nor globex
    assert str(globex.id) not in json.dumps(evidence.detail) and "globex" not in json.dumps(evidence.detail)


def test_c34_two_unrecorded_bookings_under_one_reference_wait_for_a_person(sandbox: Any) -> None:
    # given: both tenants' bookings were made and both answers lost: nothing tells them apart
    globex = book(sandbox, "globex", "trip-2", lose_answer=True)
    acme = book(sandbox, "acme", "trip-2", lose_answer=True)
    assert len(sandbox.ledger("reservations", reference="trip-2")) == 2
    # when
    Intent.objects.filter(status="UNKNOWN").update(next_lookup_at=Now())
    reconcile_unknown()
    # then: neither takes an effect by reference alone; both are in front of a person, with the
    # reason; nothing is compensated
    for intent in (globex, acme):
        intent.refresh_from_db()
        assert intent.status == Intent.Status.UNKNOWN and intent.escalated_at is not None
        escalation = AuditEvent.objects.get(intent=intent, event="escalated")
        assert "cannot be told apart" in escalation.reason
        other = acme if intent is globex else globex
        assert str(other.id) not in escalation.reason and other.tenant not in escalation.reason
    assert not Outcome.objects.exists()
    assert not Intent.objects.filter(action="reservations.cancel").exists()


def test_c34_a_duplicate_check_never_compensates_another_intents_effect(sandbox: Any) -> None:
    # given: acme's reservation trip-3 was sent twice (a blind retry) and SUCCEEDED; globex
    # booked trip-3 too (SUCCEEDED) — three reservations listed under trip-3
    acme = book(sandbox, "acme", "trip-3", lose_answer=False)
    globex = book(sandbox, "globex", "trip-3", lose_answer=False)
    httpx.post(f"{sandbox.url}/v1/reservations", json=reservation("trip-3")).raise_for_status()
    Intent.objects.filter(id=acme.id).update(attempt_count=2)
    # when: acme's duplicate check lists trip-3
    Intent.objects.filter(id=acme.id).update(next_duplicate_check_at=Now())
    run_duplicate_checks()
    # then: only the effect no other intent holds is acme's duplicate; globex's is never touched
    globex_res = Outcome.objects.get(intent=globex).provider_reference
    duplicates = list(DuplicateFinding.objects.values_list("intent_id", "provider_reference"))
    assert len(duplicates) == 1 and duplicates[0][0] == acme.id and duplicates[0][1] != globex_res
    cancels = Intent.objects.filter(action="reservations.cancel")
    assert all(c.arguments.get("reservation") != globex_res for c in cancels)


def test_a_late_effect_counts_against_the_days_ceilings_again(sandbox: Any, olga: Any, settings: Any) -> None:
    from operations.models import Reservation, SpendWindow

    # given: payments limited to one charge a day, attempt budget 1; the charge was applied and
    # its answer lost; the operator's absent ended it FAILED, which gave its reservation back
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"retry": {"max_attempts": 1}, "ceilings": {"effects_per_day": 1}},
    }
    intent = charged_then_lost(sandbox, "order-38c")
    found = provider_lookup(intent)
    resolve_absent(intent_id=intent.id, user=olga, reason="customer says no charge")
    assert SpendWindow.objects.get(tenant="acme", action="payments.charge", currency="").effects == 0
    # when: the lookup's late evidence is recorded
    assert record_lookup(intent.id, found) == "resolved"
    # then: the effect counts again (the money moved), marked as over the ceiling if it had to be
    assert SpendWindow.objects.get(tenant="acme", action="payments.charge", currency="").effects == 1
    reservation = Reservation.objects.get(intent=intent, released_at__isnull=True)
    assert reservation.over_ceiling


def test_c34_a_statement_never_settles_a_reference_two_tenants_share(sandbox: Any) -> None:
    from django.utils import timezone

    from reconciliation.statements import fetch_and_run

    # given: both tenants' bookings of trip-5 were made and both answers lost
    globex = book(sandbox, "globex", "trip-5", lose_answer=True)
    acme = book(sandbox, "acme", "trip-5", lose_answer=True)
    # when: the provider's statement of the day (two lines, reference trip-5, no key) is reconciled
    result = fetch_and_run(source="sandbox-reservations", day=timezone.now().date())
    # then: neither line is given to either tenant by reference; both wait for a person
    assert result.error == "" and (result.matched, result.extra_at_provider) == (0, 2)
    for intent in (globex, acme):
        intent.refresh_from_db()
        assert intent.status == Intent.Status.UNKNOWN
    assert not Outcome.objects.exists()
    whys = {f.detail["why"] for f in ProviderFinding.objects.filter(kind="extra_at_provider")}
    assert whys == {"intents of 2 tenants have reference 'trip-5': link it to the right one"}


def test_c34_an_operator_cannot_confirm_another_intents_effect(sandbox: Any, olga: Any) -> None:
    from operations.exceptions import ResolutionRefused
    from reconciliation.resolution import resolve_confirmed

    # given: globex's trip-1 is booked; acme's booking never reached the provider (UNKNOWN)
    globex = book(sandbox, "globex", "trip-1", lose_answer=False)
    sandbox.inject("crash_before_effect", product="reservations")
    acme = submit(tenant="acme", action="reservations.create", arguments=reservation("trip-1"))
    assert execute_intent(acme.id) == "unknown"
    globex_res = Outcome.objects.get(intent=globex).provider_reference
    # when / then: confirming globex's reservation as acme's effect is refused, naming no one
    with pytest.raises(ResolutionRefused, match="the recorded effect of another intent") as refused:
        resolve_confirmed(
            intent_id=acme.id,
            user=olga,
            provider_reference=globex_res,
            reason="I see it in the dashboard",
            accept_unverified=True,
        )
    assert str(globex.id) not in str(refused.value) and "globex" not in str(refused.value)
    acme.refresh_from_db()
    assert acme.status == Intent.Status.UNKNOWN and not Outcome.objects.filter(intent=acme).exists()


def test_c34_an_effect_another_intent_holds_cannot_be_linked_to_this_one(sandbox: Any, olga: Any) -> None:
    from operations.exceptions import ResolutionRefused
    from reconciliation.findings import resolve_provider_finding

    # given: an orphan event's finding for globex's reservation (its reference is shared), and
    # acme's intent for the same reference
    globex = book(sandbox, "globex", "trip-6", lose_answer=False)
    acme = book(sandbox, "acme", "trip-6", lose_answer=False)
    globex_res = Outcome.objects.get(intent=globex).provider_reference
    finding = ProviderFinding.objects.create(
        fingerprint=f"extra:sandbox-reservations:{globex_res}",
        kind=ProviderFinding.Kind.ORPHAN_EVENT,
        source="sandbox-reservations",
        provider_reference=globex_res,
    )
    admin = UserFactory(username="root-op", groups=["operator"])
    # when / then: linking it to acme's intent is refused; the finding stays open
    with pytest.raises(ResolutionRefused, match="the recorded effect of another intent"):
        resolve_provider_finding(
            finding_id=finding.id, user=admin, verb="link", reason="same reference", intent_id=str(acme.id)
        )
    finding.refresh_from_db()
    assert finding.state == "open"


def test_i38_a_charge_that_was_sent_cannot_be_cancelled_and_charged_again(sandbox: Any, api: Any) -> None:
    # given: the provider charged order-lc and answered 500: READY for a same-key retry
    sandbox.inject("error_500_after_effect", product="payments")
    answer = api.post(
        "/api/v1/intents",
        {"action": "payments.charge", "arguments": charge_arguments(reference="order-lc")},
        format="json",
        HTTP_IDEMPOTENCY_KEY="order-lc-1",
    )
    intent = Intent.objects.get(id=answer.json()["intent_id"])
    assert execute_intent(intent.id) == "retry"
    sandbox.clear_faults()
    assert len(sandbox.ledger("payments", reference="order-lc")) == 1
    # when: the agent cancels it
    refused = api.post(f"/api/v1/intents/{intent.id}/cancel", {}, format="json")
    # then: 409 problem details, nothing changed, the refusal on the intent's audit chain
    assert refused.status_code == 409
    assert refused["Content-Type"].startswith("application/problem+json")
    assert refused.json()["code"] == "cancel-too-late"
    intent.refresh_from_db()
    assert intent.status == Intent.Status.READY
    assert AuditEvent.objects.filter(intent=intent, event="decision_refused").exists()
    # and: the retry replays the charge (same key): SUCCEEDED, one charge; the same order under
    # a new key is then a likely duplicate, not a second charge
    Intent.objects.filter(id=intent.id).update(not_before=Now())
    assert execute_intent(intent.id) == "succeeded"
    again = submit(arguments=charge_arguments(reference="order-lc"), client_key="order-lc-2")
    assert again.status == Intent.Status.HELD
    assert len(sandbox.ledger("payments", reference="order-lc")) == 1


def test_i38_an_intent_never_sent_can_still_be_cancelled(api: Any) -> None:
    answer = api.post(
        "/api/v1/intents",
        {"action": "payments.charge", "arguments": charge_arguments(reference="order-c0")},
        format="json",
        HTTP_IDEMPOTENCY_KEY="order-c0-1",
    )
    cancelled = api.post(f"/api/v1/intents/{answer.json()['intent_id']}/cancel", {}, format="json")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "CANCELLED"


def test_c31_a_re_submission_that_ran_before_the_late_evidence_is_named_on_the_finding(
    sandbox: Any, olga: Any, one_attempt: None, client: Any
) -> None:
    from django.urls import reverse

    # given: order-31r charged, answer lost, absent → FAILED; the agent re-submitted at once
    # (nothing held it then) and that charge went through too: two charges
    intent = charged_then_lost(sandbox, "order-31r")
    found = provider_lookup(intent)
    resolve_absent(intent_id=intent.id, user=olga, reason="customer says no charge")
    again = submit(reference="order-31r", client_key="order-31r-second")
    assert again.status == Intent.Status.READY and execute_intent(again.id) == "succeeded"
    assert len(sandbox.ledger("payments", reference="order-31r")) == 2
    # when: the first lookup's evidence is recorded
    assert record_lookup(intent.id, found) == "resolved"
    # then: the finding names the other intent that made the same business action's effect
    finding = ProviderFinding.objects.get(intent=intent, kind="effect_after_ending")
    assert finding.detail["also_done_by"] == [str(again.id)]
    client.force_login(olga)
    page = client.get(reverse("provider-finding-detail", args=[finding.id]))
    assert page.status_code == 200 and str(again.id) in page.content.decode()


def test_c34_a_stray_finding_whose_effect_a_lookup_attributed_since_is_closed_by_the_reconciler(
    sandbox: Any,
) -> None:
    from reconciliation.finding_follow_up import follow_up

    # given: trip-7's event came while two tenants shared the reference (an orphan finding);
    # since then acme's lookup recorded the reservation as acme's effect
    book(sandbox, "globex", "trip-7", lose_answer=True)
    acme = book(sandbox, "acme", "trip-7", lose_answer=False)
    acme_res = Outcome.objects.get(intent=acme).provider_reference
    stray = ProviderFinding.objects.create(
        fingerprint=f"extra:sandbox-reservations:{acme_res}",
        kind=ProviderFinding.Kind.ORPHAN_EVENT,
        source="sandbox-reservations",
        provider_reference=acme_res,
    )
    other_amount = ProviderFinding.objects.create(
        fingerprint="extra:sandbox-payments:ch_other",
        kind=ProviderFinding.Kind.EXTRA_AT_PROVIDER,
        source="sandbox-payments",
        provider_reference="ch_other",
        amount=1,
        currency="EUR",
    )
    charge = submit(reference="order-fu")
    Intent.objects.filter(id=charge.id).update(status="SUCCEEDED", attempt_count=1)
    Outcome.objects.create(intent=charge, source="provider", provider_reference="ch_other")
    # when: the reconciler's follow-up of findings runs
    follow_up()
    # then: the stray is resolved, linked to acme's intent, on acme's audit chain; one whose
    # amount differs from the intent's stays for a person
    stray.refresh_from_db()
    assert (stray.state, stray.resolution, stray.intent_id, stray.resolved_by) == (
        "resolved",
        "linked",
        acme.id,
        "reconciler",
    )
    assert AuditEvent.objects.filter(intent=acme, event="provider_finding_link", actor="reconciler").exists()
    other_amount.refresh_from_db()
    assert other_amount.state == "open" and other_amount.intent_id is None


def test_c34_an_operator_never_undoes_or_verifies_an_effect_by_a_shared_reference(
    sandbox: Any, olga: Any
) -> None:
    from operations.exceptions import ResolutionRefused
    from reconciliation.resolution import resolve_compensate, resolve_confirmed

    # given: both tenants' trip-8 bookings made, both answers lost; the lookups found both
    globex = book(sandbox, "globex", "trip-8", lose_answer=True)
    acme = book(sandbox, "acme", "trip-8", lose_answer=True)
    Intent.objects.filter(status="UNKNOWN").update(next_lookup_at=Now())
    reconcile_unknown()
    booked = [item["id"] for item in sandbox.ledger("reservations", reference="trip-8")]
    # when / then: compensating without naming the effect is refused (the first listed could
    # be the other tenant's booking); nothing is cancelled
    with pytest.raises(ResolutionRefused, match="cannot be told apart"):
        resolve_compensate(intent_id=acme.id, user=olga, reason="customer cancelled")
    assert not Intent.objects.filter(action="reservations.cancel").exists()
    # and confirming one of the listed bookings is not "verified by lookup": it must be accepted
    # as unverified, and then says so
    with pytest.raises(ResolutionRefused, match="cannot verify"):
        resolve_confirmed(intent_id=acme.id, user=olga, provider_reference=booked[0], reason="looks right")
    confirmed = resolve_confirmed(
        intent_id=acme.id, user=olga, provider_reference=booked[0], reason="checked", accept_unverified=True
    )
    assert confirmed.status == Intent.Status.SUCCEEDED
    assert Outcome.objects.get(intent=acme).detail["verified"] is False
    # and the other tenant's operator cannot compensate that booking, now acme's recorded effect
    with pytest.raises(ResolutionRefused, match="the recorded effect of another intent"):
        resolve_compensate(intent_id=globex.id, user=olga, reason="undo", provider_reference=booked[0])
    assert not Intent.objects.filter(action="reservations.cancel").exists()


def test_c34_an_intent_sent_twice_keeps_its_reference_ambiguous_for_others(sandbox: Any) -> None:
    # given: globex's trip-9 was sent twice (recorded with one of its two bookings); acme's
    # trip-9 booking was made, its answer lost: three bookings, one recorded
    globex = book(sandbox, "globex", "trip-9", lose_answer=False)
    httpx.post(f"{sandbox.url}/v1/reservations", json=reservation("trip-9")).raise_for_status()
    Intent.objects.filter(id=globex.id).update(attempt_count=2)
    acme = book(sandbox, "acme", "trip-9", lose_answer=True)
    # when: acme's lookup lists trip-9
    Intent.objects.filter(id=acme.id).update(next_lookup_at=Now())
    reconcile_unknown()
    # then: globex's unrecorded second booking could be any of the two: acme takes none, nothing
    # is cancelled, a person decides
    acme.refresh_from_db()
    assert acme.status == Intent.Status.UNKNOWN and acme.escalated_at is not None
    assert not Intent.objects.filter(action="reservations.cancel").exists()
