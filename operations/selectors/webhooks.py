"""Reads of the webhook deliveries (the console's list)."""

from __future__ import annotations

from django.db.models import QuerySet

from operations.models import WebhookDelivery
from operations.tenant_access import TenantScope

#: The states a list can be narrowed to.
STATES = [state for state, _ in WebhookDelivery.State.choices]


def webhook_deliveries(*, scope: TenantScope, state: str = "") -> QuerySet[WebhookDelivery]:
    """Deliveries of the tenants in ``scope``, newest first, with their intent and agent;
    only those in ``state`` when it is one of ``STATES`` (served by ``webhook_tenant_created``
    or ``webhook_created``)."""
    rows = WebhookDelivery.objects.filter(scope.q()).select_related("intent", "agent")
    if state in STATES:
        rows = rows.filter(state=state)
    return rows.order_by("-created_at", "-id")
