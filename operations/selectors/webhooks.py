"""Reads of the webhook deliveries (the console's list) and of an agent's callback URL."""

from __future__ import annotations

from django.db.models import QuerySet

from operations.access.tenants import TenantScope
from operations.models import Agent, WebhookDelivery

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


def agent_callback(*, agent_id: int) -> tuple[str, str]:
    """The stored callback URL and signing secret of agent ``agent_id`` (``("", "")``: none),
    read now: not from a request's Agent, which may be cached since authentication.

    Raises:
        Agent.DoesNotExist: no such agent.
    """
    return Agent.objects.values_list("callback_url", "callback_secret").get(id=agent_id)
