"""Test data built through the same functions users go through (services), plus factory_boy
factories for people and agents."""

from __future__ import annotations

import uuid
from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models.functions import Now

from operations.access.tenants import role_grants_set
from operations.api.authentication import agent_create
from operations.models import Agent, Intent, OutboxMessage
from operations.services import intent_submit


class UserFactory(factory.django.DjangoModelFactory):
    """A console user; pass ``groups=["approver"]`` to put them in role groups, held on every
    tenant unless ``tenants=["acme"]`` names some (``RoleGrant``)."""

    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.test")
    password = factory.PostGenerationMethodCall("set_password", "correct horse battery")

    @factory.post_generation
    def groups(self, create: bool, extracted: list[str] | None, **kwargs: Any) -> None:
        if create and extracted:
            self.groups.set([Group.objects.get_or_create(name=name)[0] for name in extracted])
        self.save()

    @factory.post_generation
    def tenants(self, create: bool, extracted: list[str] | None, **kwargs: Any) -> None:
        """Where the groups' roles hold: ``tenants=["acme"]``; every tenant when not given."""
        if create:
            roles = list(self.groups.values_list("name", flat=True))
            role_grants_set(user=self, roles=roles, tenants=extracted)


def make_agent(name: str = "agent-1", tenant: str = "acme", **options: Any) -> tuple[Agent, str]:
    """Create an agent through ``agent_create`` (``options``: its ``actions``, ``scope``,
    ``expires_in``); returns (agent, token)."""
    return agent_create(name=name, tenant=tenant, **options)


def charge_arguments(amount: int = 4990, **overrides: Any) -> dict[str, Any]:
    """Valid ``payments.charge`` arguments (amount in cents)."""
    return {"amount": amount, "currency": "EUR", "customer": "cus_42", **overrides}


def settled(intent: Intent) -> Intent:
    """Skip the wait after an operator's ``absent`` at a provider without keys: the intent (and
    its outbox message) is due ``lookup_settle_seconds`` later so a lookup in flight can record
    first (issue 21 item 9). For tests that race no lookup; returns ``intent``."""
    Intent.objects.filter(id=intent.id, status=Intent.Status.READY).update(not_before=Now())
    OutboxMessage.objects.filter(intent_id=intent.id, sent_at__isnull=True).update(due_at=Now())
    return intent


def user_named(username: str) -> Any:
    """The console user called ``username``, created (no groups) when there is none."""
    return get_user_model().objects.filter(username=username).first() or UserFactory(username=username)


def submit(
    *,
    tenant: str = "acme",
    principal: str = "agent:agent-1",
    action: str = "payments.charge",
    arguments: dict[str, Any] | None = None,
    client_key: str | None = None,
    reference: str = "",
) -> Intent:
    """Submit an intent through ``intent_submit`` and return it. A ``user:<username>`` principal
    is asked for by that account (created when missing), as the console does."""
    requested_by = user_named(principal.removeprefix("user:")) if principal.startswith("user:") else None
    return intent_submit(
        tenant=tenant,
        principal=principal,
        requested_by=requested_by,
        client_key=client_key or str(uuid.uuid4()),
        action=action,
        arguments=arguments if arguments is not None else charge_arguments(),
        reference=reference,
    ).intent
