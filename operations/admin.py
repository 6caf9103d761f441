"""The Django admin site's view of role grants (``RoleGrant``): where each console role holds."""

from __future__ import annotations

from django.contrib import admin

from operations.models import RoleGrant


@admin.register(RoleGrant)
class RoleGrantAdmin(admin.ModelAdmin):  # type: ignore[type-arg]  # not subscriptable at run time
    """Add, list and remove an account's grants: role (a group's name) and tenant (``*``: every tenant)."""

    list_display = ("user", "role", "tenant", "created_at")
    list_filter = ("role", "tenant")
    search_fields = ("user__username", "role", "tenant")
    readonly_fields = ("created_at",)
