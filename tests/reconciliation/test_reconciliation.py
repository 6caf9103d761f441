"""Reconciliation against the real sandbox provider: UNKNOWN resolved from provider evidence,
escalated when the evidence is not there, duplicates compensated; operators' verbs."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import httpx
import pytest
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from operations.engine.protocol import execute_intent
from operations.exceptions import IntentMoved, ResolutionRefused
from operations.models import Intent, OutboxMessage, Outcome
from operations.services import intent_claim, intent_mark_unknown
from reconciliation.duplicates import run_duplicate_checks
from reconciliation.lookups import claim_unknown_batch, reconcile_unknown
from reconciliation.models import Evidence, ReconciliationRun
from reconciliation.resolution import resolve_absent, resolve_compensate, resolve_confirmed
from reconciliation.services import expire_approvals, reconcile_pass
from tests.factories import UserFactory, charge_arguments, settled, submit

pytestmark = pytest.mark.django_db


def unknown(intent: Intent) -> Intent:
    """Claim the intent and record an ambiguous outcome, as a worker would after a lost reply."""
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    assert intent_mark_unknown(claim=claim, error="response lost", cause="ambiguous")
    intent.refresh_from_db()
    return intent


def due_now() -> None:
    Intent.objects.filter(status="UNKNOWN").update(next_lookup_at=Now())


def email(n: int) -> dict[str, Any]:
    return {
        "to": f"user{n}@example.test",
        "subject": "Receipt",
        "body": "Thanks",
        "reference": f"mail-{n:03d}",
    }


def reservation(reference: str) -> dict[str, Any]:
    return {"resource": "room-7", "start": "2026-12-24T18:00:00Z", "seats": 2, "reference": reference}


@pytest.fixture
def operator(db: Any) -> Any:
    return UserFactory(username="olga", groups=["operator"])


def test_keyed_provider_effect_found_by_lookup(sandbox: Any) -> None:
    # given: the provider applied the charge but the worker never heard back
    intent = submit()
    httpx.post(
        f"{sandbox.url}/v1/charges",
        json=charge_arguments(),
        headers={"Idempotency-Key": intent.idempotency_key},
    ).raise_for_status()
    intent = unknown(intent)
    # when
    counts = reconcile_unknown()
    # then
    intent.refresh_from_db()
    assert (counts.examined, counts.resolved, intent.status) == (1, 1, "SUCCEEDED")
    outcome = Outcome.objects.get(intent=intent)
    assert outcome.source == "reconciler"
    assert outcome.provider_reference == sandbox.ledger("payments")[0]["id"]
    assert len(sandbox.ledger("payments")) == 1


def test_keyed_provider_authoritative_absence_retries_with_the_same_key(sandbox: Any) -> None:
    # given: the request never reached the provider
    intent = unknown(submit())
    # when
    reconcile_unknown()
    # then: READY with the same key, and the retry makes exactly one charge
    intent.refresh_from_db()
    assert intent.status == "READY"
    assert execute_intent(intent.id) == "succeeded"
    (effect,) = sandbox.ledger("payments")
    assert effect["idempotency_key"] == intent.idempotency_key


def test_email_crash_after_effect_on_10_of_100_gives_100_effects_even_with_lag(sandbox: Any) -> None:
    # given: 100 sends; 10 crash after the provider sent them; the lookup path lags
    sandbox.configure(email_lookup_lag_seconds=60)
    intents = [submit(action="email.send", arguments=email(n), reference=f"mail-{n:03d}") for n in range(100)]
    for n in range(0, 100, 10):
        sandbox.inject("crash_after_effect", product="email", reference=f"mail-{n:03d}")
    labels = [execute_intent(i.id) for i in intents]
    assert labels.count("unknown") == 10 and labels.count("succeeded") == 90
    # when: the first pass sees nothing yet (lag), later passes find them
    first = reconcile_unknown()
    assert first.resolved == 0 and Intent.objects.filter(status="UNKNOWN").count() == 10
    sandbox.configure(email_lookup_lag_seconds=0)  # the read path catches up
    due_now()
    second = reconcile_unknown()
    # then: the lookup turned a naive 110 into 100
    assert second.resolved == 10
    assert Intent.objects.filter(status="SUCCEEDED").count() == 100
    assert len(sandbox.ledger("email")) == 100
    assert sandbox.request_count("email") == 100  # no retry was ever sent


def test_eventual_lookup_never_retries_before_patience_and_escalates(sandbox: Any) -> None:
    # given: an email whose send is unknown and whose lookup keeps lagging
    sandbox.configure(email_lookup_lag_seconds=60)
    sandbox.inject("crash_after_effect", product="email")
    intent = submit(action="email.send", arguments=email(1))
    assert execute_intent(intent.id) == "unknown"
    patience = intent.policy["unknown_patience"]["lookups"]
    # when: the reconciler looks as many times as its patience allows
    outcomes = []
    for _ in range(patience):
        due_now()
        reconcile_unknown()
        intent.refresh_from_db()
        outcomes.append(intent.escalated_at is not None)
    # then: no retry was sent, the intent stays UNKNOWN and is escalated only at the end
    assert sandbox.request_count("email") == 1
    assert intent.status == "UNKNOWN"
    assert outcomes == [False] * (patience - 1) + [True]
    assert Evidence.objects.filter(intent=intent, kind="lookup", result="not_found_yet").count() == patience


def test_withdrawn_item_stays_unknown(sandbox: Any) -> None:
    # given: the provider sent the email but withdrew it from its read path
    sandbox.inject("crash_after_effect", product="email")
    intent = submit(action="email.send", arguments=email(2))
    assert execute_intent(intent.id) == "unknown"
    sandbox.withdraw("email", sandbox.ledger("email")[0]["id"])
    # when
    reconcile_unknown()
    # then
    intent.refresh_from_db()
    assert intent.status == "UNKNOWN"
    assert Evidence.objects.get(intent=intent).result == "withdrawn"


def test_reservation_blind_retry_duplicate_is_compensated(sandbox: Any, operator: Any) -> None:
    # given: a reservation whose outcome is unknown; the reference list is empty only because
    # the request never reached the provider... and an operator retries blind
    sandbox.inject("crash_before_effect", product="reservations")
    intent = submit(action="reservations.create", arguments=reservation("booking-1"), reference="booking-1")
    assert execute_intent(intent.id) == "unknown"
    reconcile_unknown()
    intent.refresh_from_db()
    assert intent.status == "UNKNOWN"  # an empty list is not proof of absence
    # the provider actually made it after all (it was slow), then the blind retry makes another
    httpx.post(f"{sandbox.url}/v1/reservations", json=reservation("booking-1")).raise_for_status()
    resolve_absent(
        intent_id=intent.id, user=operator, reason="customer says nothing booked", accept_duplicate_risk=True
    )
    settled(intent)
    assert execute_intent(intent.id) == "succeeded"
    assert len(sandbox.ledger("reservations")) == 2
    # when: reconciliation checks for duplicates, then the compensation runs
    counts = run_duplicate_checks()
    (compensation,) = Intent.objects.filter(compensates=intent)
    assert counts.found == 1 and compensation.action == "reservations.cancel"
    assert execute_intent(compensation.id) == "succeeded"
    # then: one active reservation remains, and a second check opens nothing new
    active = [r for r in sandbox.ledger("reservations") if r["status"] == "confirmed"]
    assert len(active) == 1
    Intent.objects.filter(id=intent.id).update(next_duplicate_check_at=Now())
    run_duplicate_checks()
    assert Intent.objects.filter(compensates=intent).count() == 1
    assert Evidence.objects.filter(intent=intent, kind="duplicate").exists()


def test_reservation_lookup_finding_two_compensates_one(sandbox: Any) -> None:
    # given: two reservations exist for one UNKNOWN intent
    intent = unknown(
        submit(action="reservations.create", arguments=reservation("booking-2"), reference="booking-2")
    )
    for _ in range(2):
        httpx.post(f"{sandbox.url}/v1/reservations", json=reservation("booking-2")).raise_for_status()
    # when
    reconcile_unknown()
    # then
    intent.refresh_from_db()
    assert intent.status == "SUCCEEDED"
    (compensation,) = Intent.objects.filter(compensates=intent)
    assert execute_intent(compensation.id) == "succeeded"
    assert len([r for r in sandbox.ledger("reservations") if r["status"] == "confirmed"]) == 1


def test_approval_expiry_sweep(sandbox: Any) -> None:
    intent = submit(arguments=charge_arguments(20_000))
    fresh = submit(arguments=charge_arguments(30_000))
    Intent.objects.filter(id=intent.id).update(approval_expires_at=Now())
    assert expire_approvals().moved == 1
    assert Intent.objects.get(id=intent.id).status == "EXPIRED"
    assert Intent.objects.get(id=fresh.id).status == "AWAITING_APPROVAL"


def test_reconcile_pass_records_a_run_with_outbox_lag_warning(sandbox: Any, settings: Any) -> None:
    # given: an outbox row that was never published (its hand-off after commit failed)
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "OUTBOX_LAG_WARNING_SECONDS": 0}
    OutboxMessage.objects.filter(intent=submit()).update(sent_at=None)
    time.sleep(0.05)
    # when
    detail = reconcile_pass()
    # then
    assert detail["outbox_lag_warning"] is True and detail["outbox_lag_seconds"] > 0
    run = ReconciliationRun.objects.get()
    assert run.finished_at is not None and run.detail["outbox_lag_warning"] is True


# --- operator verbs -------------------------------------------------------------------------


def test_confirmed_needs_a_reference_and_verifies_it(sandbox: Any, operator: Any) -> None:
    intent = unknown(submit())
    with pytest.raises(ResolutionRefused, match="provider's reference"):
        resolve_confirmed(
            intent_id=intent.id, user=operator, provider_reference=" ", reason="seen in dashboard"
        )
    with pytest.raises(ResolutionRefused, match="no effect"):
        resolve_confirmed(intent_id=intent.id, user=operator, provider_reference="ch_x", reason="seen")
    assert Intent.objects.get(id=intent.id).status == "UNKNOWN"


def test_confirmed_by_operator(sandbox: Any, operator: Any) -> None:
    # given: the effect exists at a provider without lookup by key
    intent = unknown(submit(action="email.send", arguments=email(3)))
    # when
    resolved = resolve_confirmed(
        intent_id=intent.id,
        user=operator,
        provider_reference="em_123",
        reason="customer forwarded the mail",
        accept_unverified=True,
    )
    # then
    assert resolved.status == "SUCCEEDED"
    outcome = Outcome.objects.get(intent=intent)
    assert (outcome.source, outcome.provider_reference) == ("operator", "em_123")
    record = Evidence.objects.get(intent=intent, kind="resolution")
    assert record.actor == "user:olga" and record.detail["reason"] == "customer forwarded the mail"


def test_resolution_needs_reason_and_permission(sandbox: Any, operator: Any) -> None:
    intent = unknown(submit())
    viewer = UserFactory(groups=["viewer"])
    with pytest.raises(ResolutionRefused, match="reason"):
        resolve_absent(intent_id=intent.id, user=operator, reason="")
    with pytest.raises(ResolutionRefused, match="only operators"):
        resolve_absent(intent_id=intent.id, user=viewer, reason="why not")


def test_absent_without_keys_requires_accepting_duplicate_risk(sandbox: Any, operator: Any) -> None:
    intent = unknown(submit(action="email.send", arguments=email(4)))
    with pytest.raises(ResolutionRefused, match="duplicate risk"):
        resolve_absent(intent_id=intent.id, user=operator, reason="bounced")
    assert Intent.objects.get(id=intent.id).status == "UNKNOWN"
    ready = resolve_absent(intent_id=intent.id, user=operator, reason="bounced", accept_duplicate_risk=True)
    assert ready.status == "READY"
    assert Evidence.objects.get(intent=intent, kind="resolution").detail["accepted_duplicate_risk"] is True


def test_absent_with_keys_needs_no_acknowledgement(sandbox: Any, operator: Any) -> None:
    intent = unknown(submit())
    assert (
        resolve_absent(intent_id=intent.id, user=operator, reason="provider support says no").status
        == "READY"
    )


def test_resolution_refused_when_intent_moved_meanwhile(sandbox: Any, operator: Any) -> None:
    intent = unknown(submit())
    resolve_absent(intent_id=intent.id, user=operator, reason="first operator")
    with pytest.raises(IntentMoved, match="READY"):
        resolve_absent(intent_id=intent.id, user=operator, reason="second operator, stale page")


def test_compensate_opens_refund_and_completes(sandbox: Any, operator: Any, approver: Any) -> None:
    # given: an UNKNOWN charge the reconciler found at the provider before an operator decided
    intent = submit()
    response = httpx.post(
        f"{sandbox.url}/v1/charges",
        json=charge_arguments(),
        headers={"Idempotency-Key": intent.idempotency_key},
    )
    charge_id = response.json()["id"]
    intent = unknown(intent)
    with pytest.raises(ResolutionRefused, match="no lookup has found one"):
        resolve_compensate(intent_id=intent.id, user=operator, reason="customer cancelled")
    # when: the operator names the charge and compensates
    resolved = resolve_compensate(
        intent_id=intent.id, user=operator, reason="cancelled", provider_reference=charge_id
    )
    # then: COMPENSATING with a refund that itself needs approval (payments.refund policy)
    assert resolved.status == "COMPENSATING"
    (refund,) = Intent.objects.filter(compensates=intent)
    assert (refund.action, refund.status) == ("payments.refund", "AWAITING_APPROVAL")
    from operations.services import intent_approve

    intent_approve(intent_id=refund.id, user=approver, request_hash=refund.request_hash)
    assert execute_intent(refund.id) == "succeeded"
    assert Intent.objects.get(id=intent.id).status == "COMPENSATED"


def test_resolve_command(sandbox: Any, operator: Any) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    intent = unknown(submit())
    with pytest.raises(CommandError, match="provider's reference"):
        call_command("resolve", str(intent.id), "--as", "confirmed", "--reason", "x", "--user", "olga")
    out = StringIO()
    call_command(
        "resolve", str(intent.id), "--as", "absent", "--reason", "no charge", "--user", "olga", stdout=out
    )
    assert "is now READY" in out.getvalue()


# --- scale -----------------------------------------------------------------------------------


def test_reconciler_batch_query_uses_the_partial_index_at_100k_unknown(db: Any) -> None:
    # given: 100,000 UNKNOWN intents among others (bulk-inserted)
    template = submit()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO operations_intent (id, tenant, principal, action, action_version, arguments, request_hash,
                client_key, idempotency_key, reference, metadata, policy, risk_rank, status, fence, lease_owner,
                attempt_count, last_error, lookup_count, next_lookup_at,
                created_at, updated_at)
            SELECT gen_random_uuid(), tenant, principal, action, action_version, arguments, request_hash,
                'bulk-' || g, 'el_bulk_' || g, reference, metadata, policy, risk_rank,
                CASE WHEN g %% 10 = 0 THEN 'SUCCEEDED' ELSE 'UNKNOWN' END, 1, '', 1, '', 0,
                now() + interval '1 day' + (g || ' seconds')::interval, now(), now()
            FROM operations_intent, generate_series(1, 111112) AS g WHERE id = %s
            """,
            [template.id],
        )
        cursor.execute("ANALYZE operations_intent")
        # when
        cursor.execute(
            "EXPLAIN SELECT id FROM operations_intent WHERE status = 'UNKNOWN' AND next_lookup_at <= statement_timestamp()"
            " ORDER BY next_lookup_at LIMIT 500 FOR UPDATE SKIP LOCKED"
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    # then
    assert "intent_unknown_q" in plan, plan
    assert Intent.objects.filter(status="UNKNOWN").count() >= 100_000
    assert len(claim_unknown_batch(batch=500)) == 0  # none due yet: all next_lookup_at in the future


def test_stalled_ready_intent_gets_a_fresh_message_but_not_while_one_is_pending(db: Any) -> None:
    from operations.models import OutboxMessage
    from reconciliation.services import redispatch_stalled_ready

    # given: a READY intent whose message was consumed long ago without running (acknowledged
    # by a delivery that died before its claim committed... or lost with the broker's queue)
    intent = submit()
    OutboxMessage.objects.filter(intent=intent).update(sent_at=Now(), acked_at=Now())
    Intent.objects.filter(id=intent.id).update(updated_at=Now() - timedelta(minutes=5))
    # when
    first = redispatch_stalled_ready()
    second = redispatch_stalled_ready()
    # then: one fresh message; none more while it waits for the broker
    assert (first.moved, second.moved) == (1, 0)
    assert OutboxMessage.objects.filter(intent=intent, acked_at__isnull=True).count() == 1


def test_idle_pass_records_no_run_and_old_runs_are_pruned(db: Any, settings: Any) -> None:
    # given: nothing to do, and a run older than the retention
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "RECONCILIATION_RUN_RETENTION_DAYS": 7}
    old = ReconciliationRun.objects.create(started_at=timezone.now() - timedelta(days=8))
    recent = ReconciliationRun.objects.create(started_at=timezone.now() - timedelta(days=1))
    # when
    reconcile_pass()
    # then: no row for the idle pass; the old run is gone, the recent one kept
    assert list(ReconciliationRun.objects.values_list("id", flat=True)) == [recent.id]
    assert not ReconciliationRun.objects.filter(id=old.id).exists()
