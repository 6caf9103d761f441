"""When an intent needs duplicate checks: the one rule every path that ends an intent uses.

An intent sent more than once (a retry, a lease takeover followed by another attempt, an
operator's ``absent``) to a provider that does not deduplicate on our key may have left two
effects. Whatever path ended it — the worker, the reconciler, an operator — schedules checks
from now until its lookup's consistency window has passed (DESIGN.md "Reconciliation": list by
our reference over the consistency window). ``reconciliation.duplicates`` runs them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models.functions import Now

from operations.adapters.registry import ActionUnavailable, capabilities_for


def duplicate_check_updates(*, action: str, attempts: int) -> dict[str, Any]:
    """Columns that schedule duplicate checks for an intent of ``action`` that ends now after
    ``attempts`` attempts; empty when no duplicate is possible (one attempt, or a provider
    that deduplicates on our key).

    Returns:
        ``{"next_duplicate_check_at": now, "duplicate_check_until": now + window}`` (database
        time; window = the action's ``consistency_window_seconds``), or ``{}``.
    """
    try:
        capabilities = capabilities_for(action)
    except ActionUnavailable:
        return {}
    if attempts <= 1 or not capabilities.duplicates_possible:
        return {}
    return {
        "next_duplicate_check_at": Now(),
        "duplicate_check_until": Now() + timedelta(seconds=capabilities.consistency_window_seconds),
    }
