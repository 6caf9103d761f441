"""Reads of the ledger (no writes here)."""

from __future__ import annotations

import uuid
from datetime import datetime

from django.db.models import QuerySet

from operations.models import Intent, Outcome


def intent_get(*, tenant: str, intent_id: uuid.UUID) -> Intent | None:
    """The tenant's intent with ``intent_id``, or None (another tenant's intent is invisible)."""
    return Intent.objects.filter(tenant=tenant, id=intent_id).first()


def intent_list(
    *,
    tenant: str,
    status: str | None = None,
    action: str | None = None,
    reference: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> QuerySet[Intent]:
    """The tenant's intents, filtered; newest first (callers paginate by cursor)."""
    queryset = Intent.objects.filter(tenant=tenant)
    if status:
        queryset = queryset.filter(status=status)
    if action:
        queryset = queryset.filter(action=action)
    if reference:
        queryset = queryset.filter(reference=reference)
    if created_after:
        queryset = queryset.filter(created_at__gte=created_after)
    if created_before:
        queryset = queryset.filter(created_at__lt=created_before)
    return queryset


def intent_latest_outcome(intent: Intent) -> Outcome | None:
    """The newest outcome recorded for ``intent`` (provider, reconciler or operator)."""
    return intent.outcomes.order_by("-created_at", "-id").first()
