"""May user U act as role R on tenant T? The one rule, for the services that act (approval,
resolution) and the console that shows (issue 18 item 5).

A console user holds a role through its group (``viewer``, ``approver``, ``operator``,
``admin``, or a policy's own approver group) and holds it *where* its ``RoleGrant`` rows say:
named tenants, or every tenant (``ALL_TENANTS``). Membership without a grant is the role on no
tenant (fail closed: nothing widens silently); a grant without membership is nothing (removing
someone from a group still revokes that role everywhere at once). Superusers hold every role on
every tenant. Inactive and anonymous users hold nothing.

Nothing here is cached: a service asks again inside its transaction, so a grant revoked a moment
ago is honoured. The console caches one answer per request (``console.permissions``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet

from operations.models import ALL_TENANTS, RoleGrant

#: The console's roles, in the order the console lists them (each one a group).
ROLES = ("viewer", "operator", "approver", "admin")


@dataclass(frozen=True)
class TenantScope:
    """A set of tenants: every tenant (``every``), or exactly ``names`` (possibly none)."""

    every: bool
    names: frozenset[str] = frozenset()

    def allows(self, tenant: str) -> bool:
        """Whether ``tenant`` is in the scope."""
        return self.every or tenant in self.names

    @property
    def empty(self) -> bool:
        return not self.every and not self.names

    def q(self, field: str = "tenant") -> Q:
        """A filter keeping rows whose ``field`` (a tenant column, through joins if needed:
        ``intent__tenant``) is in the scope; matches nothing for an empty scope."""
        return Q() if self.every else Q(**{f"{field}__in": sorted(self.names)})

    def union(self, other: TenantScope) -> TenantScope:
        if self.every or other.every:
            return EVERY_TENANT
        return TenantScope(every=False, names=self.names | other.names)


EVERY_TENANT = TenantScope(every=True)
NO_TENANT = TenantScope(every=False)


def role_scope(user: Any, roles: Iterable[str]) -> TenantScope:
    """The tenants on which ``user`` holds at least one of ``roles`` (group names).

    One query: the user's grants for those roles whose group the user is also in.
    """
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return NO_TENANT
    if user.is_superuser:
        return EVERY_TENANT
    tenants = set(
        RoleGrant.objects.filter(user=user, role__in=list(roles), user__groups__name=F("role"))
        .values_list("tenant", flat=True)
        .distinct()
    )
    if ALL_TENANTS in tenants:
        return EVERY_TENANT
    return TenantScope(every=False, names=frozenset(tenants))


def users_holding(roles: Iterable[str], tenant: str) -> QuerySet[Any]:
    """The active users who hold at least one of ``roles`` on ``tenant``: the other direction of
    ``role_scope`` (a grant on the tenant or on every tenant, with the group's membership; or a
    superuser), as one query. ``may_act(u, roles, tenant)`` is true exactly for these."""
    granted = RoleGrant.objects.filter(
        user=OuterRef("pk"),
        role__in=list(roles),
        tenant__in=[tenant, ALL_TENANTS],
        user__groups__name=F("role"),
    )
    return get_user_model().objects.filter(Q(is_superuser=True) | Q(Exists(granted)), is_active=True)


def may_act(user: Any, roles: Iterable[str], tenant: str) -> bool:
    """Whether ``user`` holds one of ``roles`` on ``tenant`` (``role_scope``)."""
    return role_scope(user, roles).allows(tenant)


def console_scope(user: Any) -> TenantScope:
    """The tenants whose intents, findings and audit events ``user`` may read: those on which
    it holds any console role (every role reads, docs/how-to/add-approvers.md)."""
    return role_scope(user, ROLES)


def roles_on_every_tenant(user: Any) -> list[str]:
    """The console roles ``user`` holds on every tenant, in ``ROLES`` order."""
    return [role for role in ROLES if role_scope(user, [role]).every]


def role_grants_set(*, user: Any, roles: Iterable[str], tenants: Iterable[str] | None) -> None:
    """Grant ``user`` each of ``roles`` on ``tenants`` (None: on every tenant), replacing any
    grant of those roles it had; its group memberships are the caller's (``console.accounts``).

    Raises:
        ValueError: an empty or over-long tenant name, or ``*`` named as a tenant (say every
            tenant with ``tenants=None``).
    """
    names = [ALL_TENANTS] if tenants is None else list(dict.fromkeys(t.strip() for t in tenants))
    if tenants is not None:
        if not names:
            raise ValueError("name at least one tenant, or grant every tenant")
        for name in names:
            if not name or name == ALL_TENANTS or len(name) > 100:
                raise ValueError(f"tenant {name!r}: a tenant name is 1 to 100 characters and not '*'")
    roles = list(dict.fromkeys(roles))
    with transaction.atomic():
        RoleGrant.objects.filter(user=user, role__in=roles).delete()
        RoleGrant.objects.bulk_create(
            [RoleGrant(user=user, role=role, tenant=tenant) for role in roles for tenant in names]
        )
