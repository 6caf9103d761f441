"""Console roles: the groups ``viewer``, ``operator``, ``approver`` and ``admin``.

* viewer: reads every page (dashboard, approvals, UNKNOWN queue, intents, audit).
* approver: a viewer who may approve or reject intents whose policy names the ``approver``
  group (``operations.approval_validity`` decides for the page and the service alike).
* operator: a viewer who may resolve UNKNOWN intents (``confirmed``, ``absent``, ``compensate``).
* admin: everything above.

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
from django.http import HttpRequest, HttpResponseBase
from django.shortcuts import render
from django_htmx.http import HttpResponseClientRedirect

from reconciliation.resolution import can_resolve as service_can_resolve

ROLES = ("viewer", "operator", "approver", "admin")

AnyUser = AbstractBaseUser | AnonymousUser


def _group_names(user: Any) -> set[str]:
    cached = getattr(user, "_console_groups", None)
    if cached is None:
        cached = set(user.groups.values_list("name", flat=True)) if user.is_authenticated else set()
        user._console_groups = cached
    return cached


def roles_of(user: Any) -> list[str]:
    """The console roles ``user`` holds, in ``ROLES`` order (superusers hold ``admin``)."""
    if not user.is_authenticated or not user.is_active:
        return []
    if getattr(user, "is_superuser", False):
        return ["admin"]
    names = _group_names(user)
    return [role for role in ROLES if role in names]


def has_console_access(user: Any) -> bool:
    """True when ``user`` is an active, signed-in user holding at least one console role."""
    return bool(roles_of(user))


def can_resolve(user: Any) -> bool:
    """True when ``user`` may resolve UNKNOWN intents; the rule lives with the resolution
    services (``reconciliation.resolution.can_resolve``), which re-check it."""
    return bool(user.is_authenticated) and service_can_resolve(user)


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
                {"message": "Your account has no console role (viewer, operator, approver or admin)."},
                status=403,
            )
        return view(request, *args, **kwargs)

    return wrapper
