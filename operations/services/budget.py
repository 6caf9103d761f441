"""The one attempt budget every path that can send an intent again spends (issue 21, item 7).

An attempt is a claim (``Intent.attempt_count``, incremented by ``intent_claim``). Every path
that sends an intent again asks here first, so the budget is one number whatever the path:

==============================  =====================================================
path                            when the budget (or the deployment) refuses
==============================  =====================================================
worker retry (engine)           RetryableError: FAILED; ambiguous: UNKNOWN
                                (``retry_allowed``: attempts and the retry deadline)
lease takeover                  UNKNOWN instead of READY (the reconciler looks it up)
lookup's authoritative absence  stays UNKNOWN, escalated to operators with the reason
operator's ``absent``           ends FAILED: no effect, and it cannot be sent again
==============================  =====================================================

Nothing resets the budget: an intent over it goes to a person, it never loops.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models.functions import Now

from operations.adapters.registry import serving_problem
from operations.models import Intent
from operations.policies import Policy


def attempts_left(intent: Intent) -> int:
    """Attempts ``intent`` may still make: its policy's ``retry.max_attempts`` (the first
    attempt included) minus the claims made so far; never negative."""
    return max(Policy.from_snapshot(intent.policy).retry.max_attempts - intent.attempt_count, 0)


def retry_allowed(intent: Intent) -> bool:
    """True while the attempt budget and the retry deadline (``retry.deadline_seconds`` after
    submission, by the database clock) allow the worker another attempt."""
    if not attempts_left(intent):
        return False
    deadline = Policy.from_snapshot(intent.policy).retry.deadline_seconds
    if deadline is None:
        return True
    return Intent.objects.filter(id=intent.id, created_at__gt=Now() - timedelta(seconds=deadline)).exists()


def resend_refusal(intent: Intent) -> str | None:
    """Why ``intent`` must not be sent again by a takeover, a lookup's absence or an operator's
    ``absent``, or None when it may: its attempt budget is spent, or this deployment does not
    serve its action at its version (``serving_problem``). Read ``intent`` fresh: the answer
    depends on its ``attempt_count``."""
    if not attempts_left(intent):
        limit = Policy.from_snapshot(intent.policy).retry.max_attempts
        return f"the attempt budget is spent ({intent.attempt_count} of {limit} attempts made)"
    return serving_problem(intent.action, intent.action_version)
