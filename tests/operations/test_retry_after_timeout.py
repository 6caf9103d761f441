"""Issue 38, item 6: after an ambiguous timeout (the attempt's deadline passed after the request
was sent), the next same-key attempt is not due sooner than that deadline, so it does not meet
the first request still at the provider (``operations.engine.backoff.after_timeout_floor_seconds``).

Times are the database's: ``not_before`` and the ``retry_scheduled`` event's ``created_at`` are
written by the same statement (``operations.services.transitions.transition``), after the
timeout, so ``not_before - created_at`` is the delay and no longer than the real wait.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from operations.adapters.base import ExecutionCall, ExecutionResult
from operations.adapters.errors import AmbiguousOutcome
from operations.adapters.sandbox import SandboxPaymentsAdapter
from operations.engine.backoff import after_timeout_floor_seconds
from operations.engine.protocol import execute_intent, provider_deadline_seconds
from operations.models import AuditEvent, Intent
from tests.factories import submit

pytestmark = pytest.mark.django_db


def timed_out() -> AmbiguousOutcome:
    """What ``http_support.send`` raises when the deadline passes after the request was sent."""
    return AmbiguousOutcome(
        "POST /v1/charges: no complete answer within the 2.0 s deadline", detail={"code": "deadline_exceeded"}
    )


class TimingOutPayments(SandboxPaymentsAdapter):
    """A keyed payments provider whose calls time out (``answers``, one per call), then succeed."""

    answers: ClassVar[list[Exception]] = []
    calls: ClassVar[list[ExecutionCall]] = []

    def execute(self, call: ExecutionCall) -> ExecutionResult:
        TimingOutPayments.calls.append(call)
        if TimingOutPayments.answers:
            raise TimingOutPayments.answers.pop(0)
        return ExecutionResult(provider_reference="ch_late", response_digest="a" * 64)


def use(settings: Any, answers: list[Exception], *, timeout_seconds: float, cap_seconds: float = 8.0) -> None:
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "PROVIDER_TIMEOUT_SECONDS": timeout_seconds}
    settings.EFFECT_LEDGER_ADAPTERS = {"payments.charge": f"{__name__}.{TimingOutPayments.__name__}"}
    settings.EFFECT_LEDGER_POLICIES = {
        "payments.charge": {"approval": "never", "retry": {"cap_seconds": cap_seconds}}
    }
    TimingOutPayments.answers = list(answers)
    TimingOutPayments.calls = []


def scheduled_delay(intent: Intent) -> tuple[float, AuditEvent]:
    """Seconds from the timeout's record (database clock) to the retry's ``not_before``."""
    event = AuditEvent.objects.filter(intent=intent, event="retry_scheduled").latest("seq")
    intent.refresh_from_db()
    assert intent.not_before is not None
    return (intent.not_before - event.created_at).total_seconds(), event


@pytest.mark.parametrize("timeout_seconds", [2.0, 12.0])
def test_i38_6_the_retry_after_a_timeout_is_not_due_before_the_attempts_deadline(
    settings: Any, timeout_seconds: float
) -> None:
    # given: a keyed provider that does not answer within the deadline; the policy's backoff
    # cap (8 s) is below the larger deadline (12 s, with a 30 s lease)
    use(settings, [timed_out()], timeout_seconds=timeout_seconds)
    deadline = provider_deadline_seconds()
    intent = submit()
    # when
    label = execute_intent(intent.id)
    # then: a same-key retry, due no sooner than the deadline the worker gave the call
    delay, event = scheduled_delay(intent)
    assert (label, intent.status) == ("retry", Intent.Status.READY)
    assert TimingOutPayments.calls[0].deadline_seconds == deadline == timeout_seconds
    assert delay >= deadline
    assert event.data["not_sooner_than_seconds"] == deadline


def test_i38_6_other_ambiguous_answers_keep_the_plain_backoff(settings: Any) -> None:
    # given: a 502 (the provider answered: nothing of ours is still in flight)
    answer = AmbiguousOutcome("provider answered 502 http_502", detail={"code": "http_502", "status": 502})
    use(settings, [answer], timeout_seconds=10.0, cap_seconds=1.0)
    intent = submit()
    # when
    assert execute_intent(intent.id) == "retry"
    # then: the backoff of a first attempt (0.125-0.25 s), no floor
    delay, event = scheduled_delay(intent)
    assert delay <= 0.25
    assert "not_sooner_than_seconds" not in event.data


def test_i38_6_the_floor_is_the_deadline_only_for_a_timeout() -> None:
    # the one rule, directly
    assert after_timeout_floor_seconds(timed_out(), deadline_seconds=2.0) == 2.0
    assert (
        after_timeout_floor_seconds(
            AmbiguousOutcome("x", detail={"code": "connection_dropped"}), deadline_seconds=2.0
        )
        is None
    )
    assert after_timeout_floor_seconds(RuntimeError("x"), deadline_seconds=2.0) is None


def test_i38_6_against_the_sandbox_a_held_request_is_not_met_by_an_early_retry(
    sandbox: Any, settings: Any
) -> None:
    # given: the real sandbox holds the request past our 0.5 s deadline (and applies nothing)
    settings.EFFECT_LEDGER = {**settings.EFFECT_LEDGER, "PROVIDER_TIMEOUT_SECONDS": 0.5}
    deadline = provider_deadline_seconds()
    sandbox.inject("hold_before_effect", product="payments", delay_seconds=1.0)
    intent = submit()
    # when
    label = execute_intent(intent.id)
    # then: a same-key retry, not due before the deadline after the timeout was recorded
    delay, event = scheduled_delay(intent)
    assert (label, intent.status) == ("retry", Intent.Status.READY)
    assert event.data["code"] == "deadline_exceeded"
    assert delay >= deadline == 0.5
