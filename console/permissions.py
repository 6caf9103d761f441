"""Console roles: the groups ``viewer``, ``operator``, ``approver`` and ``admin``, each held on
named tenants or on every tenant (``operations.access.tenants``, issue 18 item 5).

* viewer: reads every page, for the tenants it holds a role on.
* approver: a viewer who may approve or reject intents whose policy names the ``approver``
  group, on the tenants it holds that role for (``operations.policies.approval_validity`` decides for the
  page and the service alike).
* operator: a viewer who may resolve UNKNOWN intents (``confirmed``, ``absent``, ``compensate``)
  on the tenants it holds that role for.
* admin: everything above.

Whatever a user may read is filtered by ``reader_scope`` (the tenants where it holds any console
role); another tenant's intent, finding or audit event is a 404. Figures that belong to no
tenant (the outbox, this machine's counters, failover, the audit chains' verification, drills)
need a role on every tenant.

Agents (API bearer tokens) are not Django users, so they never hold a console session: the
console authenticates with Django's session login only.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django_htmx.http import HttpResponseClientRedirect

from operations.access.tenants import ROLES, TenantScope, console_scope, role_scope
from reconciliation.decision_checks import can_resolve as service_can_resolve

__all__ = ["ROLES", "can_resolve", "console_role_required", "reader_scope", "roles_of"]

AnyUser = AbstractBaseUser | AnonymousUser


def reader_scope(user: Any) -> TenantScope:
    """The tenants ``user`` may read in the console (any console role there), asked once per
    request (cached on the user object, which lives as long as the request)."""
    cached = getattr(user, "_console_scope", None)
    if cached is None:
        cached = console_scope(user)
        user._console_scope = cached
    return cached


def roles_of(user: Any) -> list[str]:
    """The console roles ``user`` holds on at least one tenant, in ``ROLES`` order
    (superusers hold every role on every tenant; the console names them ``admin``)."""
    if not user.is_authenticated or not user.is_active:
        return []
    if getattr(user, "is_superuser", False):
        return ["admin"]
    return [role for role in ROLES if not role_scope(user, [role]).empty]


def on_every_tenant(user: Any, *roles: str) -> bool:
    """Whether ``user`` holds one of ``roles`` (default: any console role) on every tenant."""
    return role_scope(user, roles or ROLES).every


def has_console_access(user: Any) -> bool:
    """True when ``user`` is an active, signed-in user holding a console role on some tenant."""
    return bool(user.is_authenticated) and not reader_scope(user).empty


def can_resolve(user: Any, tenant: str) -> bool:
    """True when ``user`` may resolve UNKNOWN intents of ``tenant``; the rule lives with the
    resolution services (``reconciliation.decision_checks.can_resolve``), which re-check it."""
    return bool(user.is_authenticated) and service_can_resolve(user, tenant)


def every_tenant_only(request: HttpRequest, what: str) -> HttpResponse:
    """The visible 403 for a page that covers every tenant, asked for by a user whose roles are
    on named tenants only."""
    return render(
        request,
        "console/forbidden.html",
        {"message": f"{what} covers every tenant: it needs a console role on every tenant."},
        status=403,
    )


def console_role_required(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Require a signed-in user with a console role; others get a visible 403 page."""

    signed_in_view = login_required(view)

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not request.user.is_authenticated:
            if getattr(request, "htmx", False):
                # An expired session during a poll or an action: reload the whole page on the
                # sign-in form instead of swapping it into a fragment.
                here = request.htmx.current_url_abs_path or "/"  # type: ignore[attr-defined]
                return HttpResponseClientRedirect(f"{settings.LOGIN_URL}?{urlencode({'next': here})}")
            return signed_in_view(request, *args, **kwargs)
        if not has_console_access(request.user):
            return render(
                request,
                "console/forbidden.html",
                {
                    "message": "Your account has no console role (viewer, operator, approver or admin) on any tenant."
                },
                status=403,
            )
        return view(request, *args, **kwargs)

    return wrapper
