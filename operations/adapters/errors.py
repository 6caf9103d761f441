"""The exceptions of the adapter protocol (``operations.adapters.base``). ``Adapter.execute``
raises these for known cases, and the engine classifies them:

* ``RetryableError``   — failed before the provider's commit point; safe to retry with the same key.
* ``TerminalError``    — a definite refusal (validation, decline, key reused with other
  parameters); stored and never retried.
* ``AmbiguousOutcome`` — the effect may or may not have happened (timeout after send, dropped
  connection, 5xx after send, "request in progress"); the intent goes to UNKNOWN unless the
  provider deduplicates on the key and the retry budget allows a same-key retry ("request in
  progress" waits without spending the budget, within the policy's patience; a timeout's retry
  waits at least the call's deadline: ``in_progress``, ``timed_out``).
* ``NewerAttemptExists`` — an ``AmbiguousOutcome``: the provider refused our fence because it has
  seen a higher one for the key ("stale fence"); the newer attempt may have applied the effect.
  The intent goes to UNKNOWN at once, for a lookup; never FAILED, never a same-key retry.

``ArgumentsInvalid`` is what validating arguments against an action's schema raises, and
``StatementsUnsupported`` what ``Adapter.statement`` raises where statements come by CSV upload.
"""

from __future__ import annotations

from typing import Any


class StatementsUnsupported(Exception):
    """The adapter publishes no statement through an API (its statements come by CSV upload)."""


class AdapterError(Exception):
    """Base class of what ``Adapter.execute`` raises for known cases.

    Attributes:
        detail: a small JSON-safe summary (``code``, ``status``, ...), recorded on the attempt.
        retry_after_seconds: the least delay before the next attempt the provider asked for
            (``Retry-After``, or "in progress"), in seconds; None when it asked for none. The
            engine passes it to ``intent_schedule_retry``, which caps it by the policy.
    """

    def __init__(
        self, message: str, *, detail: dict[str, Any] | None = None, retry_after_seconds: float | None = None
    ) -> None:
        super().__init__(message)
        self.detail = detail or {}
        self.retry_after_seconds = retry_after_seconds


class RetryableError(AdapterError):
    """Failed before the provider's commit point (connection refused, 5xx before effect)."""


class TerminalError(AdapterError):
    """A definite refusal: validation, decline, key reused with other parameters."""


#: ``detail["code"]`` of an ``AmbiguousOutcome`` saying the provider is still processing a
#: request under the same key (``http_classifier`` maps a 409 ``request_in_progress`` or
#: ``idempotency_key_in_use``, and a 409 without a code, to it; draft-ietf-httpapi-idempotency-
#: key-header, "Error Scenarios").
IN_PROGRESS_CODE = "request_in_progress"
#: ``detail["code"]`` of an ``AmbiguousOutcome`` whose call hit its deadline
#: (``ExecutionCall.deadline_seconds``) after the request was sent (``http_support.send``).
DEADLINE_EXCEEDED_CODE = "deadline_exceeded"


class AmbiguousOutcome(AdapterError):
    """The effect may have happened: timeout after send, dropped response, request in progress."""

    @property
    def in_progress(self) -> bool:
        """Whether the provider said a request under this key is still being processed (a
        "wait", not a "no"; ``detail["code"] == IN_PROGRESS_CODE``)."""
        return self.detail.get("code") == IN_PROGRESS_CODE

    @property
    def timed_out(self) -> bool:
        """Whether the call's deadline passed after the request was sent, so the provider may
        still be working on it (``detail["code"] == DEADLINE_EXCEEDED_CODE``)."""
        return self.detail.get("code") == DEADLINE_EXCEEDED_CODE


class NewerAttemptExists(AmbiguousOutcome):
    """The provider has seen a newer attempt under this key (a higher fence) and refused ours,
    applying nothing for it; what the newer attempt did is unknown here.

    After a database restore or a failover the ledger's fence can be lower than one the provider
    already saw, so the newer attempt is one the ledger lost, and it may have applied the effect.
    The engine records UNKNOWN at once (cause ``stale_fence``) and the reconciler looks the key
    up; it never re-sends with the old fence, and never records FAILED. Source: DESIGN.md, "When
    the database goes back in time" (a stale-fence answer means "a newer attempt exists",
    UNKNOWN, never FAILED); issue 22, item 2.
    """


class ArgumentsInvalid(Exception):
    """The arguments fail the action's schema.

    Attributes:
        errors: ``[{"field": "amount", "message": "..."}]``, one per failing field.
    """

    def __init__(self, errors: list[dict[str, str]]) -> None:
        super().__init__("; ".join(f"{e['field']}: {e['message']}" for e in errors))
        self.errors = errors
