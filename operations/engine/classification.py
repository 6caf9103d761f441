"""Steps 6-7 of the execution protocol (``operations.engine.protocol``): the adapter's answer
recorded under the claim's fence, and the intent's next state:

==========================  ==============================================================
adapter outcome             next state
==========================  ==============================================================
ExecutionResult             SUCCEEDED (outcome source ``provider``); UNKNOWN, escalated at
                            once with its sha256, length and prefix, when its provider
                            reference cannot be stored faithfully (over 200 characters,
                            NUL, not text: ``operations.adapters.bounds.reference_problem``)
TerminalError               FAILED, stored, never retried
RetryableError              READY with backoff and the same key, within the retry budget;
                            FAILED when the budget or deadline is spent (nothing was applied)
NewerAttemptExists          UNKNOWN at once, cause ``stale_fence``: the provider has seen a
(409 ``stale_fence``)       higher fence for the key, so a newer attempt (perhaps one a
                            database restore lost) may have applied the effect; the
                            reconciler looks the key up. Never FAILED, never a same-key retry
                            (DESIGN.md, "When the database goes back in time"; issue 22)
AmbiguousOutcome            READY with the same key when the provider deduplicates on it and
                            the budget allows (after a timeout, not sooner than the attempt's
                            deadline: issue 38, item 6); otherwise UNKNOWN
"request in progress"       at a provider that deduplicates on the key: READY with the same
(``AmbiguousOutcome``,      key after max(Retry-After, backoff), not counted against the
``request_in_progress``)    attempt budget, within ``retry.in_progress_patience_seconds``
                            from the first such answer (and the retry deadline); after it,
                            UNKNOWN (counted). Never FAILED (issue 38, item 4; case C32)
any other exception         UNKNOWN (an adapter bug must never be read as "did not happen")
==========================  ==============================================================

Every text and JSON value a provider sends is made storable before it is recorded
(``operations.adapters.bounds``): NUL characters and lone surrogates, length, nesting, ``NaN``.
"""

from __future__ import annotations

import logging

from operations.adapters.base import Adapter, ExecutionResult
from operations.adapters.bounds import reference_problem
from operations.adapters.errors import AmbiguousOutcome, NewerAttemptExists, RetryableError, TerminalError
from operations.engine.backoff import after_timeout_floor_seconds
from operations.engine.errors import answer_evidence, describe
from operations.services import claims
from operations.services import execution as svc

# The protocol's logger: one name for everything a delivery logs.
logger = logging.getLogger("operations.engine.protocol")

#: Why an intent is UNKNOWN after a provider's stale-fence answer (its ``last_error`` begins so).
STALE_FENCE_REASON = "the provider has seen a newer attempt (stale_fence): reconcile"


def classify_answer(
    claim: claims.Claim,
    adapter: Adapter,
    answer: ExecutionResult | Exception,
    context: dict[str, object],
    *,
    deadline_seconds: float,
) -> str:
    """Steps 6-7: record the answer under the claim's fence; the label of what happened.

    ``deadline_seconds`` is the deadline the call was given (``ExecutionCall.deadline_seconds``):
    a same-key retry after a timeout waits at least that long
    (``backoff.after_timeout_floor_seconds``; issue 38, item 6)."""
    intent = claim.intent
    if isinstance(answer, TerminalError):
        failed = svc.intent_record_failure(claim=claim, error=describe(answer), detail=answer.detail)
        return "failed" if failed else "stale"
    if isinstance(answer, RetryableError):
        if svc.retry_allowed(intent):
            return (
                "retry"
                if svc.intent_schedule_retry(
                    claim=claim,
                    error=describe(answer),
                    detail=answer.detail,
                    min_delay_seconds=answer.retry_after_seconds,
                )
                else "stale"
            )
        error = f"retry budget spent; last error before the provider's commit point: {describe(answer)}"
        return (
            "failed" if svc.intent_record_failure(claim=claim, error=error, detail=answer.detail) else "stale"
        )
    if isinstance(answer, NewerAttemptExists):
        # Not a same-key retry: our fence is below one the provider has seen, so a resend may be
        # refused again while it spends the budget; only a lookup by key can tell what the newer
        # attempt did (DESIGN.md, "When the database goes back in time").
        marked = svc.intent_mark_unknown(
            claim=claim,
            error=f"{STALE_FENCE_REASON}; {describe(answer)}",
            cause="stale_fence",
            detail=answer.detail,
        )
        return "unknown" if marked else "stale"
    if isinstance(answer, AmbiguousOutcome):
        same_key_retry_safe = adapter.capabilities_for(intent.action).same_key_retry_safe
        if same_key_retry_safe and answer.in_progress:
            return wait_in_progress(claim, answer)
        if same_key_retry_safe and svc.retry_allowed(intent):
            # Safe: the provider deduplicates on the key, so a same-key retry cannot double-apply.
            # After a timeout it waits at least the deadline: the first may still be in flight.
            return (
                "retry"
                if svc.intent_schedule_retry(
                    claim=claim,
                    error=describe(answer),
                    detail=answer.detail,
                    min_delay_seconds=answer.retry_after_seconds,
                    not_sooner_than_seconds=after_timeout_floor_seconds(
                        answer, deadline_seconds=deadline_seconds
                    ),
                )
                else "stale"
            )
        marked = svc.intent_mark_unknown(
            claim=claim, error=describe(answer), cause="ambiguous", detail=answer.detail
        )
        return "unknown" if marked else "stale"
    if isinstance(answer, Exception):
        logger.error(
            "adapter raised an unexpected error; treating the outcome as unknown",
            extra=context,
            exc_info=answer,
        )
        marked = svc.intent_mark_unknown(claim=claim, error=repr(answer), cause="adapter_error")
        return "unknown" if marked else "stale"
    problem = reference_problem(answer.provider_reference)
    if problem:
        # The effect happened, but its id cannot be stored faithfully (too long, NUL, not text):
        # UNKNOWN with the evidence (sha256, length, prefix), at once in front of operators.
        logger.warning("provider reference cannot be stored", extra={**context, "problem": problem})
        marked = svc.intent_mark_unknown(
            claim=claim,
            error=f"the provider accepted the effect but {problem}",
            cause="reference_unstorable",
            detail={"provider_answer": answer_evidence(answer)},
            escalate=(
                f"the provider accepted the effect but {problem}: confirm it with the provider "
                "(its sha256 and prefix are in the evidence)"
            ),
        )
        return "unknown" if marked else "stale"
    return "succeeded" if svc.intent_record_success(claim=claim, result=answer) else "stale"


def wait_in_progress(claim: claims.Claim, answer: AmbiguousOutcome) -> str:
    """A provider that deduplicates on our key answered "request in progress": it holds a
    request under this key and will answer a same-key retry with that request's outcome. That
    is "wait", not "no" (issue 38, item 4; case C32), so:

    * within the policy's patience (``budget.in_progress_wait_refusal``): READY with the same
      key after max(``Retry-After`` or the classifier's 1 s, backoff), capped by
      ``retry.cap_seconds``; the attempt is not counted against the attempt budget;
    * after it: UNKNOWN, cause ``in_progress`` (the reconciler looks the key up), counted like
      any ambiguous attempt. Never FAILED: the provider never said the effect will not happen.
    """
    refusal = svc.in_progress_wait_refusal(claim.intent)
    if refusal is None:
        scheduled = svc.intent_schedule_retry(
            claim=claim,
            error=f"{describe(answer)}; waiting (not counted against the attempt budget)",
            detail=answer.detail,
            min_delay_seconds=answer.retry_after_seconds,
            in_progress=True,
        )
        return "retry" if scheduled else "stale"
    marked = svc.intent_mark_unknown(
        claim=claim,
        error=f"{describe(answer)}; not waited out any longer: {refusal}",
        cause="in_progress",
        detail=answer.detail,
    )
    return "unknown" if marked else "stale"
