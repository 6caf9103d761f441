"""The one attempt budget every path that can send an intent again spends (issue 21, item 7).

An attempt is a claim (``Intent.attempt_count``, incremented by ``intent_claim``). Every path
that sends an intent again asks here first, so the budget is one number whatever the path:

==============================  =====================================================
path                            when the budget (or the deployment) refuses
==============================  =====================================================
worker retry (engine)           RetryableError: FAILED; ambiguous: UNKNOWN
                                (``retry_allowed``: attempts and the retry deadline)
"request in progress" (engine)  never the budget: UNKNOWN once the policy's patience
                                or the retry deadline has passed
                                (``in_progress_wait_refusal``)
lease takeover                  UNKNOWN instead of READY (the reconciler looks it up)
lookup's authoritative absence  stays UNKNOWN, escalated to operators with the reason
operator's ``absent``           ends FAILED: no effect, and it cannot be sent again
==============================  =====================================================

A keyed provider's "request in progress" answer (issue 38, item 4) says "wait", not "no": the
provider holds the first request under our key and will answer a same-key retry with its
outcome. Such an attempt, waited out with a same-key retry, is counted in
``Intent.in_progress_waits`` and does not spend the budget (``attempts_spent``); the wait is
bounded instead by ``retry.in_progress_patience_seconds`` from the first such answer (and by
``retry.deadline_seconds``). An in-progress answer that is not waited out (patience spent)
ends the attempt UNKNOWN and counts like any other ambiguous attempt, so the reconciler's
lookup-absent-resend round trip stays bounded by the budget.

Nothing resets the budget: an intent over it goes to a person, it never loops.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models.functions import Now

from operations.adapters.registry import serving_problem
from operations.models import Intent
from operations.policies.rules import Policy


def attempts_spent(intent: Intent) -> int:
    """Attempts that count against the budget: the claims made (``attempt_count``) minus the
    attempts a keyed provider answered "request in progress" and that were waited out
    (``in_progress_waits``); never negative."""
    return max(intent.attempt_count - intent.in_progress_waits, 0)


def attempts_left(intent: Intent) -> int:
    """Attempts ``intent`` may still make: its policy's ``retry.max_attempts`` (the first
    attempt included) minus ``attempts_spent``; never negative."""
    return max(Policy.from_snapshot(intent.policy).retry.max_attempts - attempts_spent(intent), 0)


def retry_allowed(intent: Intent) -> bool:
    """True while the attempt budget and the retry deadline (``retry.deadline_seconds`` after
    submission, by the database clock) allow the worker another attempt."""
    if not attempts_left(intent):
        return False
    deadline = Policy.from_snapshot(intent.policy).retry.deadline_seconds
    if deadline is None:
        return True
    return Intent.objects.filter(id=intent.id, created_at__gt=Now() - timedelta(seconds=deadline)).exists()


def in_progress_wait_refusal(intent: Intent) -> str | None:
    """Why the provider's "request in progress" answer to the current attempt must not be
    waited out with another same-key attempt, or None when it may (issue 38, item 4).

    The attempt budget is not consulted: an attempt waited out does not spend it. The bounds,
    by the database clock:

    * ``retry.in_progress_patience_seconds`` (seconds) measured from the intent's first
      in-progress answer (``Intent.in_progress_since``; this answer when it is the first):
      refused once that much time has passed (at once for a patience of 0);
    * ``retry.deadline_seconds`` after submission, as for any retry.

    Only for a provider whose same-key retry is safe (it deduplicates on our key, so the retry
    is answered with the first request's outcome; draft-ietf-httpapi-idempotency-key-header,
    "Error Scenarios": 409 while the first request is outstanding); the caller checks that.
    """
    retry = Policy.from_snapshot(intent.policy).retry
    now, since, created = (
        Intent.objects.filter(id=intent.id)
        .annotate(db_now=Now())
        .values_list("db_now", "in_progress_since", "created_at")
        .get()
    )
    waited = (now - since).total_seconds() if since is not None else 0.0
    if waited >= retry.in_progress_patience_seconds:
        return (
            f'the provider has answered "request in progress" for {waited:.0f} s, the policy\'s '
            f"patience is {retry.in_progress_patience_seconds:g} s (retry.in_progress_patience_seconds)"
        )
    if retry.deadline_seconds is not None and (now - created).total_seconds() >= retry.deadline_seconds:
        return (
            f"the retry deadline has passed ({retry.deadline_seconds:g} s after submission, "
            "retry.deadline_seconds)"
        )
    return None


def resend_refusal(intent: Intent) -> str | None:
    """Why ``intent`` must not be sent again by a takeover, a lookup's absence or an operator's
    ``absent``, or None when it may: its attempt budget is spent, or this deployment does not
    serve its action at its version (``serving_problem``). Read ``intent`` fresh: the answer
    depends on its ``attempt_count`` and ``in_progress_waits``."""
    if not attempts_left(intent):
        limit = Policy.from_snapshot(intent.policy).retry.max_attempts
        waits = intent.in_progress_waits
        besides = f', besides {waits} "request in progress" answer(s) waited out' if waits else ""
        return f"the attempt budget is spent ({attempts_spent(intent)} of {limit} attempts made{besides})"
    return serving_problem(intent.action, intent.action_version)
