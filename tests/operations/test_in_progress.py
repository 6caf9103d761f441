"""Issue 38, item 4 and case C32: a keyed provider's "request in progress" answer means "wait",
not "no". It is waited out with a same-key retry (after max(Retry-After, backoff)) that does not
spend the attempt budget, within the policy's ``retry.in_progress_patience_seconds``; past it
the intent goes UNKNOWN for the reconciler, never FAILED.

The adapters here are registered through ``settings.EFFECT_LEDGER_ADAPTERS``, answer from a
script and never touch the network (the real sandbox and a real worker are in
``tests/e2e/test_in_progress.py``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import pytest
from django.db.models.functions import Now

from operations.adapters.base import Capabilities, ExecutionCall, ExecutionResult, LookupKind
from operations.adapters.errors import AmbiguousOutcome, RetryableError
from operations.adapters.sandbox import SandboxPaymentsAdapter
from operations.engine.protocol import execute_intent
from operations.models import Attempt, AuditEvent, Intent
from operations.services.budget import attempts_left, attempts_spent, resend_refusal
from tests.factories import submit

pytestmark = pytest.mark.django_db

S = Intent.Status


def in_progress(retry_after: float | None = 1.0) -> AmbiguousOutcome:
    """What ``http_classifier`` raises for a 409 ``request_in_progress``."""
    detail: dict[str, Any] = {"code": "request_in_progress", "status": 409}
    if retry_after is not None:
        detail["retry_after_seconds"] = retry_after
    return AmbiguousOutcome(
        "provider answered 409 request_in_progress: a request with this key may still be in progress",
        detail=detail,
        retry_after_seconds=retry_after,
    )


class ScriptedPayments(SandboxPaymentsAdapter):
    """A keyed payments provider answering from ``script`` (one item per call), then success."""

    script: ClassVar[list[Exception]] = []
    calls: ClassVar[list[ExecutionCall]] = []

    def execute(self, call: ExecutionCall) -> ExecutionResult:
        ScriptedPayments.calls.append(call)
        if ScriptedPayments.script:
            raise ScriptedPayments.script.pop(0)
        return ExecutionResult(provider_reference="ch_scripted", response_digest="a" * 64)


class UnkeyedScriptedPayments(ScriptedPayments):
    """The same answers from a provider that ignores our key: a resend could charge twice."""

    capabilities = Capabilities(idempotency_keys=False, lookup=LookupKind.EVENTUAL)


def use(settings: Any, adapter: type, script: list[Exception], **retry: Any) -> None:
    settings.EFFECT_LEDGER_ADAPTERS = {"payments.charge": f"{__name__}.{adapter.__name__}"}
    settings.EFFECT_LEDGER_POLICIES = {"payments.charge": {"approval": "never", "retry": retry}}
    ScriptedPayments.script = list(script)
    ScriptedPayments.calls = []


def run_until_settled(intent: Intent, *, limit: int = 20) -> list[str]:
    """Run the intent's deliveries as a worker would, skipping each backoff wait (test setup);
    the labels ``execute_intent`` returned."""
    labels = []
    for _ in range(limit):
        Intent.objects.filter(id=intent.id, status=S.READY).update(not_before=Now())
        labels.append(execute_intent(intent.id))
        if labels[-1] != "retry":
            break
    return labels


def test_c32_five_in_progress_answers_then_success_spend_one_attempt(settings: Any) -> None:
    # given: the default budget (5 attempts); the provider answers "in progress" five times
    use(settings, ScriptedPayments, [in_progress() for _ in range(5)])
    intent = submit()
    # when
    labels = run_until_settled(intent)
    # then: SUCCEEDED at the sixth call, with one attempt spent, nobody paged
    intent.refresh_from_db()
    assert labels == ["retry"] * 5 + ["succeeded"]
    assert intent.status == S.SUCCEEDED
    assert (intent.attempt_count, intent.in_progress_waits, attempts_spent(intent)) == (6, 5, 1)
    assert intent.escalated_at is None
    assert not AuditEvent.objects.filter(intent=intent, event__in=["escalated", "outcome_unknown"]).exists()
    assert {call.idempotency_key for call in ScriptedPayments.calls} == {intent.idempotency_key}
    # and each wait is recorded as one, at least as long as the provider asked
    retries = AuditEvent.objects.filter(intent=intent, event="retry_scheduled").order_by("seq")
    assert [event.data["in_progress_wait"] for event in retries] == [True] * 5
    assert all(event.data["backoff_seconds"] >= 1.0 for event in retries)
    waited = Attempt.objects.filter(intent=intent, result=Attempt.Result.RETRY).order_by("attempt_no")
    assert [a.attempt_no for a in waited] == [1, 2, 3, 4, 5]
    assert all(a.detail["in_progress_wait"] and a.detail["code"] == "request_in_progress" for a in waited)
    assert all("not counted against the attempt budget" in a.error for a in waited)
    assert intent.in_progress_since is not None


def test_i38_4_the_budget_counts_attempts_spent_not_in_progress_waits(settings: Any) -> None:
    # given: a budget of 2; six claims, four of them answered "in progress" and waited out
    use(settings, ScriptedPayments, [], max_attempts=2)
    intent = submit()
    Intent.objects.filter(id=intent.id).update(attempt_count=6, in_progress_waits=4, status=S.UNKNOWN)
    intent.refresh_from_db()
    # when / then: two attempts spent, none left, and the refusal says why with both numbers
    assert (attempts_spent(intent), attempts_left(intent)) == (2, 0)
    assert resend_refusal(intent) == (
        'the attempt budget is spent (2 of 2 attempts made, besides 4 "request in progress" answer(s) '
        "waited out)"
    )
    # and with one wait more, one attempt is left
    Intent.objects.filter(id=intent.id).update(in_progress_waits=5)
    intent.refresh_from_db()
    assert (attempts_spent(intent), attempts_left(intent), resend_refusal(intent)) == (1, 1, None)


def test_i38_4_an_in_progress_answer_waits_even_when_it_came_on_the_last_attempt(settings: Any) -> None:
    # given: a budget of one attempt, answered "in progress"
    use(settings, ScriptedPayments, [in_progress()], max_attempts=1)
    intent = submit()
    # when
    labels = run_until_settled(intent)
    # then: waited out and sent again with the same key (it was UNKNOWN before: budget spent)
    intent.refresh_from_db()
    assert (labels, intent.status, attempts_spent(intent)) == (["retry", "succeeded"], S.SUCCEEDED, 1)


def test_i38_4_real_failures_still_spend_the_budget_around_in_progress_waits(settings: Any) -> None:
    # given: a budget of 2: a failure before the commit point, an in-progress answer, a failure
    not_sent = RetryableError("not sent", detail={"code": "not_sent"})
    use(settings, ScriptedPayments, [not_sent, in_progress(), not_sent], max_attempts=2)
    intent = submit()
    # when
    labels = run_until_settled(intent)
    # then: the two failures spent the budget, the wait did not; FAILED as before (nothing applied)
    intent.refresh_from_db()
    assert labels == ["retry", "retry", "failed"]
    assert (intent.status, intent.attempt_count, intent.in_progress_waits) == (S.FAILED, 3, 1)
    assert "retry budget spent" in intent.last_error


def test_i38_4_past_the_patience_an_in_progress_answer_goes_unknown_never_failed(settings: Any) -> None:
    # given: the provider first said "in progress" 601 s ago (patience 600 s) and says it again
    use(settings, ScriptedPayments, [in_progress(), in_progress()])
    intent = submit()
    assert run_until_settled(intent, limit=1) == ["retry"]
    Intent.objects.filter(id=intent.id).update(in_progress_since=Now() - timedelta(seconds=601))
    # when
    labels = run_until_settled(intent)
    # then: UNKNOWN for the reconciler, this attempt counted (it was not waited out)
    intent.refresh_from_db()
    assert (labels, intent.status) == (["unknown"], S.UNKNOWN)
    assert (intent.attempt_count, intent.in_progress_waits) == (2, 1)
    assert intent.next_lookup_at is not None
    event = AuditEvent.objects.get(intent=intent, event="outcome_unknown")
    assert event.data["cause"] == "in_progress"
    assert "patience is 600 s (retry.in_progress_patience_seconds)" in intent.last_error


def test_i38_4_within_the_patience_the_first_answer_time_is_kept(settings: Any) -> None:
    # given: the first "in progress" answer 599 s ago (patience 600 s)
    use(settings, ScriptedPayments, [in_progress(), in_progress()])
    intent = submit()
    assert run_until_settled(intent, limit=1) == ["retry"]
    Intent.objects.filter(id=intent.id).update(in_progress_since=Now() - timedelta(seconds=599))
    first = Intent.objects.values_list("in_progress_since", flat=True).get(id=intent.id)
    # when
    labels = run_until_settled(intent, limit=1)
    # then: waited again; the patience is still measured from the first answer
    intent.refresh_from_db()
    assert (labels, intent.status, intent.in_progress_waits) == (["retry"], S.READY, 2)
    assert intent.in_progress_since == first


def test_i38_4_a_patience_of_zero_never_waits(settings: Any) -> None:
    # given
    use(settings, ScriptedPayments, [in_progress()], in_progress_patience_seconds=0)
    intent = submit()
    # when
    labels = run_until_settled(intent)
    # then
    intent.refresh_from_db()
    assert (labels, intent.status, intent.in_progress_waits) == (["unknown"], S.UNKNOWN, 0)


def test_i38_4_past_the_retry_deadline_an_in_progress_answer_goes_unknown(settings: Any) -> None:
    # given: submitted 700 s ago (retry deadline 600 s)
    use(settings, ScriptedPayments, [in_progress()])
    intent = submit()
    Intent.objects.filter(id=intent.id).update(created_at=Now() - timedelta(seconds=700))
    # when
    labels = run_until_settled(intent)
    # then
    intent.refresh_from_db()
    assert (labels, intent.status, intent.in_progress_waits) == (["unknown"], S.UNKNOWN, 0)
    assert "the retry deadline has passed" in intent.last_error


def test_i38_4_a_provider_without_keys_answering_in_progress_is_not_sent_again(settings: Any) -> None:
    # given: a provider that ignores our key says "in progress": a resend could charge twice
    use(settings, UnkeyedScriptedPayments, [in_progress()])
    intent = submit()
    # when
    labels = run_until_settled(intent)
    # then: UNKNOWN at once, as before (counted), for the reconciler's lookup
    intent.refresh_from_db()
    assert (labels, intent.status, intent.in_progress_waits) == (["unknown"], S.UNKNOWN, 0)
    assert len(ScriptedPayments.calls) == 1
