"""The engine's classification table against the real sandbox provider process: each fault
maps to its documented next state (operations/engine/classification.py), and a stale worker is fenced.
``test_i22_2_*``: a provider's stale-fence answer means "a newer attempt exists" (issue 22, item 2)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from django.db.models.functions import Now

from operations import metrics
from operations.adapters.base import ExecutionResult
from operations.adapters.registry import get_adapter
from operations.engine.calls import provider_call
from operations.engine.protocol import execute_intent
from operations.models import Attempt, AuditEvent, Intent, Outcome
from operations.services import intent_claim, intent_record_success, intent_take_over_lease
from reconciliation.lookups import reconcile_intent
from tests.factories import charge_arguments, submit

pytestmark = pytest.mark.django_db

EMAIL = {"to": "ada@example.test", "subject": "Your receipt", "body": "Thanks"}


def make_due(intent: Intent) -> None:
    """Skip the backoff wait (test setup): the next claim may run now."""
    Intent.objects.filter(id=intent.id).update(not_before=Now())


def counter(metric: Any, **labels: str) -> float:
    sample = metric.labels(**labels) if labels else metric
    return float(sample._value.get())


@pytest.mark.parametrize(
    ("action", "arguments", "fault", "expected_status", "expected_label", "effects"),
    [
        ("payments.charge", charge_arguments(), None, "SUCCEEDED", "succeeded", 1),
        ("payments.charge", charge_arguments(), "crash_before_effect", "READY", "retry", 0),
        ("payments.charge", charge_arguments(), "crash_after_effect", "READY", "retry", 1),
        ("payments.charge", charge_arguments(), "error_500_before_effect", "READY", "retry", 0),
        ("payments.charge", charge_arguments(), "error_500_after_effect", "READY", "retry", 1),
        ("payments.charge", charge_arguments(), "in_progress", "READY", "retry", 0),
        ("payments.charge", charge_arguments(), "delay_after_effect", "READY", "retry", 1),
        ("payments.charge", charge_arguments(customer="cus_declined"), None, "FAILED", "failed", 0),
        ("email.send", EMAIL, None, "SUCCEEDED", "succeeded", 1),
        ("email.send", EMAIL, "crash_before_effect", "UNKNOWN", "unknown", 0),
        ("email.send", EMAIL, "crash_after_effect", "UNKNOWN", "unknown", 1),
        ("email.send", EMAIL, "error_500_after_effect", "UNKNOWN", "unknown", 1),
        ("email.send", EMAIL, "delay_after_effect", "UNKNOWN", "unknown", 1),
    ],
)
def test_fault_maps_to_documented_next_state(
    sandbox: Any,
    settings: Any,
    action: str,
    arguments: dict[str, Any],
    fault: str | None,
    expected_status: str,
    expected_label: str,
    effects: int,
) -> None:
    # given
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "PROVIDER_TIMEOUT_SECONDS": 1.0}
    intent = submit(action=action, arguments=arguments)
    if fault:
        sandbox.inject(fault, delay_seconds=2.0 if fault == "delay_after_effect" else None)
    # when
    label = execute_intent(intent.id)
    # then
    intent.refresh_from_db()
    assert (intent.status, label) == (expected_status, expected_label), intent.last_error
    if fault == "delay_after_effect":
        import time

        time.sleep(2.5)  # the provider applies it late, after our deadline
    assert len(sandbox.ledger()) == effects


def test_same_key_retry_after_crash_after_effect_gives_one_charge(sandbox: Any) -> None:
    # given: the provider applies the charge but the response is lost
    intent = submit()
    sandbox.inject("crash_after_effect", product="payments")
    assert execute_intent(intent.id) == "retry"
    # when: the retry runs with the same key
    make_due(intent)
    assert execute_intent(intent.id) == "succeeded"
    # then: one charge, and both attempts sent the identical key
    (effect,) = sandbox.ledger("payments")
    assert effect["idempotency_key"] == intent.idempotency_key
    assert Attempt.objects.filter(intent=intent).count() == 2
    outcome = Outcome.objects.get(intent=intent)
    assert outcome.provider_reference == effect["id"] and outcome.detail["replayed"] is True


def test_provider_key_reuse_with_other_parameters_is_terminal(sandbox: Any) -> None:
    # given: the provider already holds this key for another amount (an edited order, C07)
    intent = submit(arguments=charge_arguments(4990))
    httpx.post(
        f"{sandbox.url}/v1/charges",
        json=charge_arguments(49_900),
        headers={"Idempotency-Key": intent.idempotency_key},
    ).raise_for_status()
    # when
    label = execute_intent(intent.id)
    # then: FAILED and never retried
    intent.refresh_from_db()
    assert (label, intent.status) == ("failed", "FAILED")
    assert "idempotency_key_reused" in intent.last_error or "reused" in intent.last_error
    assert execute_intent(intent.id) == "duplicate"
    assert len(sandbox.ledger("payments")) == 1


def test_provider_unreachable_retries_then_fails_when_budget_spent(sandbox: Any, settings: Any) -> None:
    # given: nothing listens on the provider's port (the request is never sent)
    settings.SANDBOX_PROVIDER_URL = "http://127.0.0.1:9"
    intent = submit()
    labels = []
    # when
    for _ in range(intent.policy["retry"]["max_attempts"]):
        labels.append(execute_intent(intent.id))
        make_due(intent)
    # then
    intent.refresh_from_db()
    assert labels == ["retry"] * 4 + ["failed"]
    assert intent.status == "FAILED" and "retry budget spent" in intent.last_error


def test_backoff_grows_and_is_bounded(sandbox: Any, settings: Any) -> None:
    from operations.services.execution import backoff_seconds

    delays = [backoff_seconds(attempt_no=n, base=0.25, cap=8.0) for n in range(1, 10)]
    assert 0.125 <= delays[0] <= 0.25 and 0.25 <= delays[1] <= 0.5 and 0.5 <= delays[2] <= 1.0
    assert all(d <= 8.0 for d in delays) and delays[-1] >= 4.0


def test_stale_worker_write_is_refused_and_newer_outcome_kept(sandbox: Any) -> None:
    # given: worker A claims (fence 1), its lease expires, the reconciler takes over, and
    # worker B claims (fence 2) and records its outcome
    intent = submit()
    claim_a = intent_claim(intent_id=intent.id, worker="A", lease_seconds=30)
    assert claim_a is not None and claim_a.fence == 1
    Intent.objects.filter(id=intent.id).update(lease_expires_at=Now())
    assert intent_take_over_lease(intent_id=intent.id, fence=1, provider_deduplicates=True) == "READY"
    claim_b = intent_claim(intent_id=intent.id, worker="B", lease_seconds=30)
    assert claim_b is not None and claim_b.fence == 2
    assert intent_record_success(claim=claim_b, result=ExecutionResult("ch_new", "d" * 64))
    before = counter(metrics.STALE_FENCES_REJECTED)
    # when: A wakes up and tries to record
    recorded = intent_record_success(claim=claim_a, result=ExecutionResult("ch_old", "e" * 64))
    # then
    assert recorded is False
    assert counter(metrics.STALE_FENCES_REJECTED) == before + 1
    assert list(Outcome.objects.filter(intent=intent).values_list("provider_reference", flat=True)) == [
        "ch_new"
    ]
    assert Attempt.objects.get(intent=intent, fence=1).result == "fenced_out"


def test_live_lease_is_never_taken_over(sandbox: Any) -> None:
    intent = submit()
    claim = intent_claim(intent_id=intent.id, worker="A", lease_seconds=30)
    assert claim is not None
    assert intent_take_over_lease(intent_id=intent.id, fence=claim.fence, provider_deduplicates=True) is None
    assert Intent.objects.get(id=intent.id).status == "RUNNING"


def test_duplicate_delivery_is_counted_and_does_nothing(sandbox: Any) -> None:
    intent = submit()
    assert execute_intent(intent.id) == "succeeded"
    before = counter(metrics.DUPLICATE_DELIVERIES)
    assert execute_intent(intent.id) == "duplicate"
    assert counter(metrics.DUPLICATE_DELIVERIES) == before + 1
    assert len(sandbox.ledger()) == 1


def test_i18_3_a_ceiling_reached_waits_for_an_approver_before_any_request(
    sandbox: Any, settings: Any
) -> None:
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"approval": "never", "ceilings": {"effects_per_day": 1}},
    }
    first, second = submit(), submit()
    assert execute_intent(first.id) == "succeeded"
    assert execute_intent(second.id) == "awaiting_approval"
    second.refresh_from_db()
    assert second.status == "AWAITING_APPROVAL" and second.wait_reason == "ceiling"
    assert not second.attempts.exists()  # the claim was rolled back: no attempt spent
    assert sandbox.request_count("payments") == 1


# --- issue 22, item 2: a stale-fence answer means "a newer attempt exists" -------------------------


def charged_by_a_lost_newer_attempt(intent: Intent) -> str:
    """The provider charged ``intent`` under its key with fence 2 (its second attempt, after the
    backup point); the restore lost that attempt, so the ledger's next claim takes fence 1.
    Returns the charge's id."""
    call = provider_call(intent, fence=2, attempt_no=2, deadline_seconds=5.0)
    return get_adapter(intent.action).execute(call).provider_reference


@pytest.mark.parametrize("action", ["payments.charge", "acme.transfer"], ids=["sandbox payments", "generic"])
def test_i22_2_a_stale_fence_answer_ends_unknown_and_a_lookup_finds_the_one_charge(
    sandbox: Any, settings: Any, action: str
) -> None:
    # given: the generic adapter pointed at the same key- and fence-honouring charges endpoint
    settings.EFFECT_LEDGER_GENERIC_HTTP = {
        "acme.transfer": {
            "url": f"{sandbox.url}/v1/charges",
            "lookup_url": f"{sandbox.url}/v1/charges?idempotency_key={{idempotency_key}}",
            "fence_header": "X-Fencing-Token",
        }
    }
    intent = submit(action=action, arguments=charge_arguments())
    charge = charged_by_a_lost_newer_attempt(intent)
    unknown_before = counter(metrics.UNKNOWN_OUTCOMES, cause="stale_fence")

    # when: the ledger sends fence 1; the provider answers 409 stale_fence and applies nothing
    label = execute_intent(intent.id)

    # then: UNKNOWN for the reconciler (never FAILED, no same-key retry with the old fence)
    intent.refresh_from_db()
    assert (label, intent.status) == ("unknown", "UNKNOWN"), intent.last_error
    assert "newer attempt (stale_fence): reconcile" in intent.last_error
    assert Attempt.objects.get(intent=intent).detail["code"] == "stale_fence"
    event = AuditEvent.objects.get(intent=intent, event="outcome_unknown")
    assert event.data["cause"] == "stale_fence"
    assert counter(metrics.UNKNOWN_OUTCOMES, cause="stale_fence") == unknown_before + 1
    assert execute_intent(intent.id) == "duplicate"  # nothing to claim: not re-sent
    # and the reconciler's keyed lookup finds the charge: SUCCEEDED with exactly one effect
    assert reconcile_intent(intent.id) == "resolved"
    intent.refresh_from_db()
    assert intent.status == "SUCCEEDED"
    assert Outcome.objects.get(intent=intent).provider_reference == charge
    assert [effect["id"] for effect in sandbox.ledger("payments")] == [charge]
    assert sandbox.request_count("payments") == 2  # the lost attempt and ours; lookups are GETs


def test_i22_2_a_stale_workers_stale_fence_answer_is_still_refused_by_the_ledger(
    sandbox: Any, monkeypatch: Any
) -> None:
    # given: while worker A (fence 1) calls, its lease is taken over and worker B (fence 2)
    # charges and records SUCCEEDED; A's own request then reaches the sandbox with fence 1
    from operations.adapters.sandbox import SandboxPaymentsAdapter

    send = SandboxPaymentsAdapter.execute
    intent = submit()

    def frozen_worker_a(adapter: SandboxPaymentsAdapter, call: Any) -> ExecutionResult:
        Intent.objects.filter(id=intent.id).update(lease_expires_at=Now())
        assert intent_take_over_lease(intent_id=intent.id, fence=1, provider_deduplicates=True) == "READY"
        claim_b = intent_claim(intent_id=intent.id, worker="B", lease_seconds=30)
        assert claim_b is not None and claim_b.fence == 2
        fresh = Intent.objects.get(id=intent.id)
        result_b = send(adapter, provider_call(fresh, fence=2, attempt_no=2, deadline_seconds=5.0))
        assert intent_record_success(claim=claim_b, result=result_b)
        return send(adapter, call)  # A's fence 1: 409 stale_fence

    monkeypatch.setattr(SandboxPaymentsAdapter, "execute", frozen_worker_a)
    stale_before = counter(metrics.STALE_FENCES_REJECTED)

    # when
    label = execute_intent(intent.id, worker="A")

    # then: A's "a newer attempt exists" is refused by the ledger like any stale write (the
    # crash lab's stale-worker drill); B's outcome stands, one charge
    intent.refresh_from_db()
    assert (label, intent.status) == ("stale", "SUCCEEDED")
    assert counter(metrics.STALE_FENCES_REJECTED) == stale_before + 1
    attempt_a = Attempt.objects.get(intent=intent, fence=1)
    assert attempt_a.result == "fenced_out"
    assert attempt_a.detail["would_have_become"] == "UNKNOWN"
    assert attempt_a.detail["provider_answer"]["code"] == "stale_fence"
    assert len(sandbox.ledger("payments")) == 1
