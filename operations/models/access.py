"""Where a console user holds a role (``RoleGrant``)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

#: A ``RoleGrant.tenant`` meaning every tenant, present and future (never a tenant's name).
ALL_TENANTS = "*"


class RoleGrant(models.Model):
    """Where a console user holds a role: ``role`` (a group's name: ``viewer``, ``approver``,
    ``operator``, ``admin`` or a policy's own approver group) on ``tenant``, or on every tenant
    when ``tenant`` is ``ALL_TENANTS``.

    The group says *that* the user holds the role, the grants say *where*: membership without a
    grant gives that role on no tenant, a grant without membership gives nothing. Superusers hold
    every role on every tenant. ``operations.access.tenants`` is the one rule that reads them.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="role_grants")
    role = models.CharField(max_length=150, help_text="the group this grant scopes")
    tenant = models.CharField(max_length=100, help_text="a tenant, or * for every tenant")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "role", "tenant"], name="role_grant_unique"),
            models.CheckConstraint(condition=~Q(role=""), name="role_grant_role_named"),
            models.CheckConstraint(condition=~Q(tenant=""), name="role_grant_tenant_named"),
        ]

    def __str__(self) -> str:
        where = "every tenant" if self.tenant == ALL_TENANTS else self.tenant
        return f"{self.role} on {where}"
