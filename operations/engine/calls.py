"""The one factory for the ``ExecutionCall`` sent to a provider, for an attempt and for a
lookup; the two differ only in the arguments named here."""

from __future__ import annotations

import logging

from django.conf import settings

from operations.adapters.base import ExecutionCall, LookupResult, LookupStatus
from operations.adapters.bounds import clean_text, storable_lookup
from operations.adapters.registry import get_adapter
from operations.models import Intent

logger = logging.getLogger("operations.engine.calls")


def provider_call(intent: Intent, *, fence: int, attempt_no: int, deadline_seconds: float) -> ExecutionCall:
    """The call describing ``intent`` to its provider.

    Args:
        fence: the fencing token to send (an attempt's own claim; for a lookup the intent's
            current fence).
        attempt_no: 1-based attempt number (for a lookup, the last attempt's).
        deadline_seconds: the adapter gives up within this many seconds.
    """
    return ExecutionCall(
        intent_id=str(intent.id),
        action=intent.action,
        action_version=intent.action_version,
        arguments=intent.arguments,
        idempotency_key=intent.idempotency_key,
        fence=fence,
        attempt_no=attempt_no,
        deadline_seconds=deadline_seconds,
        reference=intent.reference,
    )


def lookup_call(intent: Intent) -> ExecutionCall:
    """The call a lookup describes: the intent as its last attempt sent it, with the configured
    provider timeout (``EFFECT_LEDGER["PROVIDER_TIMEOUT_SECONDS"]``) as the deadline."""
    return provider_call(
        intent,
        fence=intent.fence,
        attempt_no=intent.attempt_count,
        deadline_seconds=float(settings.EFFECT_LEDGER["PROVIDER_TIMEOUT_SECONDS"]),
    )


def lookup_settle_seconds() -> float:
    """How long an intent sent back to READY (a lookup's authoritative absence, an operator's
    ``absent``) waits before a worker may claim it: the lookup deadline plus a 2 s margin for
    recording. A lookup that was already in flight when the intent left UNKNOWN ends within its
    deadline, so its evidence is recorded before any re-send and a found effect wins
    (``reconciliation.lookups.record_lookup``; issue 21 item 9).
    """
    return float(settings.EFFECT_LEDGER["PROVIDER_TIMEOUT_SECONDS"]) + 2.0


def provider_lookup(intent: Intent) -> LookupResult:
    """Ask ``intent``'s provider whether its effect exists; never raises.

    The one way the reconciler and operators' resolutions look an intent up: the answer is
    made storable (``operations.adapters.bounds.storable_lookup``); an adapter that raises (or an action
    whose adapter cannot be loaded) yields INCONCLUSIVE with the error in the detail.
    """
    try:
        result = get_adapter(intent.action).lookup(lookup_call(intent))
    except Exception as exc:  # a lookup error is evidence of nothing
        logger.warning("lookup failed", extra={"intent_id": str(intent.id), "error": repr(exc)[:200]})
        return LookupResult(status=LookupStatus.INCONCLUSIVE, detail={"error": clean_text(repr(exc), 500)})
    return storable_lookup(result)
