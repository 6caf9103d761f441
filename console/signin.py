"""Sign-in protection, on django-axes with its database handler.

Every login form (the console's ``/login/`` and the admin's ``/admin/login/``) authenticates
through ``django.contrib.auth.authenticate``, where ``axes.backends.AxesStandaloneBackend``
refuses a locked sign-in before any password is checked. Failures are rows of
``axes.AccessAttempt`` in PostgreSQL, so a lock holds across web processes and restarts.

Two limits, both over ``AXES_COOLOFF_TIME`` (15 minutes by default):

* ``AXES_FAILURE_LIMIT`` (5) failures for one account from one address lock that pair;
* ``EFFECT_LEDGER_SIGNIN_ADDRESS_FAILURES`` (20) failures from one address, whatever the usernames, lock the
  address (one address spraying a password over many accounts).

The account is named the way Django's login form reaches it: ``AbstractBaseUser.normalize_username``
(Unicode NFKC) of the stripped input, the normalisation ``UsernameField`` applies before
``authenticate``. Locking also ignores case, so ``" operator"``, ``"ｏｐｅｒａｔｏｒ"`` (fullwidth)
and ``"Operator"`` count against one lock (case C14).
"""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Callable
from typing import Any

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_cool_off
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.forms import AuthenticationForm
from django.db import DatabaseError
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from operations.services.leases import lease_acquire, lease_release


def address_failure_limit() -> int:
    """Failures from one address, over any usernames, that lock the address (default 20)."""
    return int(settings.EFFECT_LEDGER_SIGNIN_ADDRESS_FAILURES)


def lockout_key(raw_username: object) -> str:
    """The name a sign-in is counted under: stripped, NFKC-normalised (as Django's
    ``AbstractBaseUser.normalize_username`` and the login form's ``UsernameField`` do) and
    case-folded. ``" Operator"`` and ``"ｏｐｅｒａｔｏｒ"`` give ``"operator"``."""
    key = AbstractBaseUser.normalize_username(str(raw_username or "").strip()).casefold()
    # Case folding may lengthen a name (a 150-character username can fold to 450 code points);
    # axes stores 255.
    return key[:255]


def lockout_username(request: HttpRequest, credentials: dict[str, Any] | None) -> str:
    """``AXES_USERNAME_CALLABLE``: the lockout key of the username being tried (from the
    credentials ``authenticate`` received, else the POSTed form field)."""
    field = get_user_model().USERNAME_FIELD
    if credentials and credentials.get(field) is not None:
        return lockout_key(credentials[field])
    return lockout_key(request.POST.get(field, ""))


def client_ip(request: HttpRequest) -> str | None:
    """``AXES_CLIENT_IP_CALLABLE``: the address a sign-in came from (``None`` when the server
    gave none, e.g. a test client's ``force_login``).

    With ``EFFECT_LEDGER_PROXY_COUNT`` = 0 (the default) it is the connection's peer,
    ``REMOTE_ADDR``, and ``X-Forwarded-For`` is ignored: any client can write that header. With N
    trusted reverse proxies in front, each appending the address it received from, the client is
    the N-th entry from the right of ``X-Forwarded-For`` (entries left of it were written by the
    client and are not believed). A header with fewer entries, or an entry that is not an IP
    address (after dropping a port), falls back to ``REMOTE_ADDR`` (a request that did not pass
    all the proxies), which puts it behind the proxy's one address: make the proxies write bare
    addresses.
    """
    peer = request.META.get("REMOTE_ADDR") or None
    proxies = int(settings.EFFECT_LEDGER_PROXY_COUNT)
    if proxies <= 0:
        return peer
    hops = [hop.strip() for hop in str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",")]
    if len(hops) < proxies or not hops[-proxies]:
        return peer
    return _address(hops[-proxies]) or peer


def _address(entry: str) -> str | None:
    """The IP address in one ``X-Forwarded-For`` entry, or None: a port some proxies append
    (``192.0.2.1:1234``, ``[2001:db8::1]:443``) is dropped and an IPv4-mapped IPv6 address
    (``::ffff:192.0.2.1``) is the IPv4 address it maps, so one client has one lock."""
    host = entry
    if host.startswith("[") and "]" in host:
        host = host[1 : host.index("]")]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def address_failures(ip_address: str | None) -> int:
    """Failed sign-ins from ``ip_address`` within the cool-off window, over every username."""
    cool_off = get_cool_off()
    attempts = AccessAttempt.objects.filter(ip_address=ip_address)
    if cool_off is not None:
        attempts = attempts.filter(attempt_time__gte=timezone.now() - cool_off)
    return int(attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0)


class SignInLockHandler(AxesDatabaseHandler):
    """django-axes' database handler plus the per-address limit (``address_failure_limit``)."""

    def is_locked(self, request: Any, credentials: dict[str, Any] | None = None) -> bool:
        """Locked for the (account, address) pair, or for the address alone."""
        if super().is_locked(request, credentials):
            return True
        return address_failures(client_ip(request)) >= address_failure_limit()

    def user_login_failed(
        self, sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any
    ) -> None:
        """Record the failure (axes), then flag the request for the lockout answer when the
        address reached its limit too (axes flags only its own per-pair limit)."""
        super().user_login_failed(sender, credentials, request, **kwargs)
        if request is None or getattr(request, "axes_locked_out", False):
            return
        if address_failures(client_ip(request)) >= address_failure_limit():
            request.axes_locked_out = True
            request.axes_credentials = credentials


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: Any = None
) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the sign-in page again, with HTTP 429 and when to retry."""
    cool_off = get_cool_off(request)
    minutes = int(cool_off.total_seconds() // 60) if cool_off else 15
    response = render(
        request,
        "console/login.html",
        {
            "form": AuthenticationForm(request),
            "throttled": f"Too many failed sign-ins. Try again in up to {minutes} minutes.",
        },
        status=429,
    )
    response["Retry-After"] = str(int(cool_off.total_seconds()) if cool_off else 900)
    return response


#: Seconds a sign-in's lease lasts: far longer than a password check; a web process that dies
#: mid-sign-in holds up that (username, address) pair for at most this long.
SIGNIN_LEASE_SECONDS = 30.0
#: Longest a sign-in waits for the one before it of the same (username, address) pair (seconds);
#: past it the answer is 429 with Retry-After, never a request that hangs.
SIGNIN_WAIT_SECONDS = 60.0


class SignInSerializationMiddleware:
    """Runs the sign-ins of one (username, address) pair one at a time.

    django-axes checks the lock before the password and records a failure after it; a password
    check takes a few hundred milliseconds (PBKDF2), so forty guesses sent at once would all pass
    the check before the first failure is counted, and one could sign in past the limit. Each
    POST to a login form (the console's and the admin's) holds a lease
    (``operations.services.leases``: a row with an expiry, ``SIGNIN_LEASE_SECONDS``) named after
    its lockout key and address until its answer is ready: the sixth concurrent guess sees five
    failures. A lease, not a session advisory lock: behind PgBouncer in transaction mode the
    unlock ran on another server connection and the lock stayed on a pooled one, and later
    sign-ins of that pair hung for ever (issue 35). A waiting sign-in holds no transaction (nor a pooled server connection) and
    waits at most ``SIGNIN_WAIT_SECONDS``, then answers 429 with Retry-After. Guesses for other
    names or from other addresses do not wait. If the lease cannot be taken (the database is
    down) the request goes on unserialised and the view answers as it would.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method != "POST" or request.path not in _login_paths():
            return self.get_response(request)
        key = f"sign-in|{lockout_username(request, None)}|{client_ip(request)}"
        try:
            held = lease_acquire(
                name=key[:600], ttl_seconds=SIGNIN_LEASE_SECONDS, wait_seconds=SIGNIN_WAIT_SECONDS
            )
        except DatabaseError:
            return self.get_response(request)
        if held is None:
            response = HttpResponse("Another sign-in for this name is running; try again.", status=429)
            response["Retry-After"] = "5"
            return response
        try:
            return self.get_response(request)
        finally:
            with contextlib.suppress(DatabaseError):
                lease_release(held)  # if this fails, the lease expires on its own


def _login_paths() -> frozenset[str]:
    """The console's and the admin's login URLs (reversed per request: cheap, and right under
    a test's URL overrides)."""
    return frozenset({reverse("login"), reverse("admin:login")})
