"""Issue 21, item 7: one attempt budget across every path that can send again, patience that
never resets, and versioned actions that survive an upgrade.

The adapters here are registered through ``settings.EFFECT_LEDGER_ADAPTERS`` and never touch
the network. ``payments.charge`` v2 renamed ``customer`` to ``customer_id``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import pytest
from django.db.models.functions import Now

from operations.adapters.base import (
    ExecutionCall,
    ExecutionResult,
    LookupResult,
    LookupStatus,
)
from operations.adapters.sandbox import SandboxPaymentsAdapter
from operations.adapters.sandbox.common import CHARGE_SCHEMA, REFUND_SCHEMA
from operations.engine.protocol import execute_intent
from operations.exceptions import ResolutionRefused, ValidationFailed
from operations.models import Attempt, AuditEvent, Intent
from operations.services import (
    intent_claim,
    intent_mark_unknown,
    intent_resolve_absent,
    intent_submit,
)
from reconciliation import resolution
from reconciliation.lookups import reconcile_intent
from reconciliation.services import reconcile_pass, take_over_expired_leases
from tests.factories import UserFactory, charge_arguments, submit

pytestmark = pytest.mark.django_db

S = Intent.Status
CHARGE_V2_SCHEMA: dict[str, Any] = {
    **CHARGE_SCHEMA,
    "properties": {
        **{k: v for k, v in CHARGE_SCHEMA["properties"].items() if k != "customer"},
        "customer_id": {"type": "string", "minLength": 1},
    },
    "required": ["amount", "currency", "customer_id"],
}


class Sent:
    """How often an adapter here was asked to execute, and what its lookup answers."""

    executes = 0
    lookup = LookupResult(status=LookupStatus.ABSENT)


class BuggyPayments(SandboxPaymentsAdapter):
    """An upgrade gone wrong: reads ``customer_id`` from arguments that have ``customer``."""

    def execute(self, call: ExecutionCall) -> ExecutionResult:
        Sent.executes += 1
        return ExecutionResult(provider_reference=call.arguments["customer_id"], response_digest="a" * 64)

    def lookup(self, call: ExecutionCall) -> LookupResult:
        return Sent.lookup


class PaymentsV2(BuggyPayments):
    """The new contract, declared: ``payments.charge`` serves version 2 only."""

    versions: ClassVar[dict[str, tuple[int, ...]]] = {"payments.charge": (2,), "payments.refund": (1,)}
    argument_schemas: ClassVar[dict[str, dict[str, Any]]] = {
        "payments.charge": CHARGE_V2_SCHEMA,
        "payments.refund": REFUND_SCHEMA,
    }


class PaymentsV1AndV2(PaymentsV2):
    """The roll-out step: both versions served, each with its own schema."""

    versions: ClassVar[dict[str, tuple[int, ...]]] = {"payments.charge": (1, 2), "payments.refund": (1,)}

    def argument_schema_for(self, action: str, version: int) -> dict[str, Any]:
        return (
            CHARGE_SCHEMA
            if (action, version) == ("payments.charge", 1)
            else super().argument_schema_for(action, version)
        )

    def execute(self, call: ExecutionCall) -> ExecutionResult:
        Sent.executes += 1
        customer = call.arguments["customer" if call.action_version == 1 else "customer_id"]
        return ExecutionResult(provider_reference=f"ch_{customer}", response_digest="a" * 64)


def use(settings: Any, adapter: type, *, max_attempts: int = 5) -> None:
    settings.EFFECT_LEDGER_ADAPTERS = {"payments.charge": f"{__name__}.{adapter.__name__}"}
    settings.EFFECT_LEDGER_POLICIES = {
        "payments.charge": {"approval": "never", "retry": {"max_attempts": max_attempts}}
    }
    Sent.executes, Sent.lookup = 0, LookupResult(status=LookupStatus.ABSENT)


def unknown(intent: Intent) -> Intent:
    claim = intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    assert intent_mark_unknown(claim=claim, error="timeout after send", cause="ambiguous")
    intent.refresh_from_db()
    return intent


def test_i21_7_an_adapter_bug_looping_through_the_reconciler_stops_within_the_budget(settings: Any) -> None:
    # given: a budget of one, an adapter that raises KeyError, a lookup that proves absence
    use(settings, BuggyPayments, max_attempts=1)
    intent = submit()
    # when: a worker runs it, then the reconciler and the workers go round twenty times
    assert execute_intent(intent.id) == "unknown"
    for _ in range(20):
        Intent.objects.filter(id=intent.id, status=S.UNKNOWN).update(next_lookup_at=Now())
        reconcile_pass()
        if Intent.objects.filter(id=intent.id, status=S.READY).exists():
            execute_intent(intent.id)
    # then: one attempt, in front of operators with the reason, never sent again
    intent.refresh_from_db()
    assert (intent.status, intent.attempt_count, Sent.executes) == (S.UNKNOWN, 1, 1)
    assert intent.escalated_at is not None
    escalation = AuditEvent.objects.get(intent=intent, event="escalated")
    assert "attempt budget is spent (1 of 1" in escalation.reason
    assert Attempt.objects.filter(intent=intent).count() == 1


def test_i21_7_a_lease_takeover_over_budget_goes_unknown_not_ready(settings: Any) -> None:
    # given: the only attempt's worker died mid-call at a provider that deduplicates on the key
    use(settings, BuggyPayments, max_attempts=1)
    intent = submit()
    assert intent_claim(intent_id=intent.id, worker="dead", lease_seconds=30) is not None
    Intent.objects.filter(id=intent.id).update(lease_expires_at=Now() - timedelta(seconds=1))
    # when
    take_over_expired_leases()
    # then: not sent again; the reconciler looks it up
    intent.refresh_from_db()
    assert intent.status == S.UNKNOWN
    event = AuditEvent.objects.get(intent=intent, event="lease_taken_over")
    assert "not sent again: the attempt budget is spent" in event.reason


def test_i21_7_patience_is_not_reset_by_a_round_trip_through_ready(settings: Any) -> None:
    # given: an UNKNOWN intent already looked up three times, found absent, sent again
    use(settings, BuggyPayments)
    intent = unknown(submit())
    Intent.objects.filter(id=intent.id).update(lookup_count=3)
    intent_resolve_absent(intent_id=intent.id, actor="reconciler", reason="absent")
    # when: it comes back UNKNOWN
    intent = unknown(intent)
    # then: the lookups so far still count
    assert intent.lookup_count == 3


def test_i21_7_operator_absent_over_budget_ends_failed_without_a_resend(settings: Any) -> None:
    # given
    use(settings, BuggyPayments, max_attempts=1)
    intent = unknown(submit())
    operator = UserFactory(username="olga", groups=["operator"])
    # when
    resolved = resolution.resolve_absent(intent_id=intent.id, user=operator, reason="support says no charge")
    # then
    assert resolved.status == S.FAILED
    assert "not sent again: the attempt budget is spent" in resolved.last_error
    assert resolved.attempt_count == 1


def test_i21_7_submission_takes_the_served_versions_from_the_adapter(settings: Any) -> None:
    # given: the new adapter serves version 2 only
    use(settings, PaymentsV2)
    v2 = {"amount": 100, "currency": "EUR", "customer_id": "cus_1"}
    # when / then: version 2 is accepted, version 1 refused with 422
    created = intent_submit(
        tenant="acme",
        principal="agent:a",
        client_key="k-2",
        action="payments.charge",
        arguments=v2,
        action_version=2,
    )
    assert created.intent.action_version == 2
    with pytest.raises(ValidationFailed) as refused:
        intent_submit(
            tenant="acme",
            principal="agent:a",
            client_key="k-1",
            action="payments.charge",
            arguments=charge_arguments(),
            action_version=1,
        )
    assert refused.value.status == 422 and "supported: [2]" in refused.value.detail


def test_i21_7_an_intent_of_a_version_no_longer_served_is_held_for_a_person(settings: Any) -> None:
    # given: v1 intents submitted before the upgrade; the upgrade serves v2 only
    use(settings, BuggyPayments)
    ready = submit()
    use(settings, PaymentsV2)
    operator = UserFactory(username="olga", groups=["operator"])
    # when
    label = execute_intent(ready.id)
    # then: HELD with the reason, nothing sent, no attempt spent, in front of operators
    ready.refresh_from_db()
    assert (label, ready.status, ready.attempt_count, Sent.executes) == ("held", S.HELD, 0, 0)
    assert ready.held_behind_id is None and ready.escalated_at is not None
    assert "payments.charge version 1 is no longer served" in ready.hold_reason
    # and a release is refused while v1 is not served
    with pytest.raises(ResolutionRefused, match="cannot run here"):
        resolution.release_held(intent_id=ready.id, user=operator, reason="go", accept_duplicate_risk=True)
    # when the roll-out serves both versions, the release runs it under v1
    use(settings, PaymentsV1AndV2)
    released = resolution.release_held(
        intent_id=ready.id, user=operator, reason="v1 served again", accept_duplicate_risk=True
    )
    assert (released.status, released.hold_reason) == (S.READY, "")
    assert execute_intent(ready.id) == "succeeded"
    assert Sent.executes == 1


def test_i21_7_an_unknown_intent_of_an_unserved_version_found_absent_is_escalated_not_resent(
    settings: Any,
) -> None:
    # given: an UNKNOWN v1 intent; the upgrade serves v2 only; the provider shows no effect
    use(settings, BuggyPayments)
    intent = unknown(submit())
    use(settings, PaymentsV2)
    # when
    result = reconcile_intent(intent.id)
    # then
    intent.refresh_from_db()
    assert (result, intent.status) == ("escalated", S.UNKNOWN)
    escalation = AuditEvent.objects.get(intent=intent, event="escalated")
    assert "version 1 is no longer served" in escalation.reason
