"""Domain errors of the ledger. The API maps each to an RFC 9457 problem (see ``api_support``)."""

from __future__ import annotations

from typing import Any


class LedgerError(Exception):
    """Base class. ``status`` is the HTTP status the API answers with; ``code`` a stable slug."""

    status = 400
    code = "ledger-error"
    title = "Request refused"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class InvalidTransition(LedgerError):
    """The state machine does not allow moving from ``current`` to ``target``."""

    status = 409
    code = "invalid-transition"
    title = "Transition not allowed"

    def __init__(self, *, intent_id: Any, current: str, target: str) -> None:
        super().__init__(
            f"intent {intent_id} is {current}; it cannot become {target}", current_status=current
        )
        self.current = current
        self.target = target


class IntentMoved(LedgerError):
    """A compare-and-swap touched no row: somebody else moved the intent first."""

    status = 409
    code = "intent-moved"
    title = "The intent changed meanwhile"

    def __init__(self, *, intent_id: Any, expected: str, current: str) -> None:
        super().__init__(
            f"intent {intent_id} was expected in {expected} but is {current}; reload and decide again",
            current_status=current,
        )
        self.current = current


class ClientKeyInvalid(LedgerError):
    """The Idempotency-Key header is missing or not 1-255 printable ASCII characters."""

    status = 400
    code = "idempotency-key-invalid"
    title = "Idempotency-Key missing or malformed"


class IdempotencyKeyReused(LedgerError):
    """The client key was already used for a request with a different request_hash
    (draft-ietf-httpapi-idempotency-key-header, section 2.7: 422)."""

    status = 422
    code = "idempotency-key-reused"
    title = "Idempotency-Key reused with a different request"


class ValidationFailed(LedgerError):
    """The action, its version or its arguments are invalid; nothing was stored."""

    status = 422
    code = "validation-failed"
    title = "Invalid intent"


class ApprovalRefused(LedgerError):
    """An approval or rejection was refused (hash mismatch, expired, permission, four eyes)."""

    status = 403
    code = "approval-refused"
    title = "Approval refused"


class ApprovalRequestLapsed(ApprovalRefused):
    """A decision was refused because the intent's approval request had expired (database
    clock). The refusing transaction expires the intent before this is raised to the caller
    (``operations.services.approvals``), so the answer and the intent's state agree (issue 35
    item 5)."""


class ResolutionRefused(LedgerError):
    """An operator's resolution was refused (missing reference, duplicate risk not accepted...)."""

    status = 409
    code = "resolution-refused"
    title = "Resolution refused"


class ResendRefused(ResolutionRefused):
    """An UNKNOWN intent shown to be absent must not be sent again: its attempt budget is spent
    or this deployment does not serve its action or version (``why``, for operators)."""

    code = "resend-refused"
    title = "Not sent again"

    def __init__(self, detail: str, *, why: str) -> None:
        super().__init__(detail, why=why)
        self.why = why


class ActionNotAllowed(LedgerError):
    """An agent asked for an action its scopes do not include (``Agent.actions``, issue 18)."""

    status = 403
    code = "action-not-allowed"
    title = "Action not allowed for this agent"


class CancelRefused(LedgerError):
    """A cancel was refused for who asked (an agent cannot cancel a compensation intent, which
    operators and the reconciler open to undo an effect)."""

    status = 403
    code = "cancel-refused"
    title = "Cancel refused"


class CancelTooLate(CancelRefused):
    """A cancel of an intent that was already sent to its provider: its effect may exist (an
    answer lost, a retry or a wait for "in progress" pending), so it cannot be ended as if it
    had none (issue 38); it ends by the provider's answer, a lookup or an operator."""

    status = 409
    code = "cancel-too-late"
    title = "Too late to cancel: the intent was sent"


class CallbackRefused(LedgerError):
    """An agent's callback URL is refused (``operations.notifications.callback_urls``); nothing was changed."""

    status = 422
    code = "callback-url-refused"
    title = "Callback URL refused"


class WebhookResendRefused(LedgerError):
    """A webhook delivery cannot be re-sent: it is pending already (it goes out when due)."""

    status = 409
    code = "delivery-pending"
    title = "Delivery pending"


class WaitInvalid(LedgerError):
    """``GET /api/v1/intents/{id}?wait=...``: ``wait`` is not a number of seconds in (0, 30], or
    ``status`` names no status (``operations.api.waiting.wait_request``)."""

    status = 400
    code = "wait-invalid"
    title = "Invalid wait"
