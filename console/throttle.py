"""Login throttling: a small counter of failed sign-ins in Django's cache.

Keys are (username, client IP) and the client IP alone, so one address cannot try many
passwords for one account, nor spray one password over many accounts. With the default
``locmem`` cache the counters live in one web process; behind several processes or machines,
configure a shared cache (``CACHES``) so they add up.
"""

from __future__ import annotations

import hashlib

from django.core.cache import cache
from django.http import HttpRequest

MAX_FAILURES_PER_ACCOUNT = 5
MAX_FAILURES_PER_ADDRESS = 20
WINDOW_SECONDS = 15 * 60


def client_ip(request: HttpRequest) -> str:
    """The peer address (``REMOTE_ADDR``); a proxy in front must set it correctly."""
    return str(request.META.get("REMOTE_ADDR", "unknown"))


def _keys(username: str, ip: str) -> tuple[str, str]:
    account = hashlib.sha256(f"{username.lower()}|{ip}".encode()).hexdigest()[:32]
    return f"console:login-fail:acct:{account}", f"console:login-fail:ip:{ip}"


def is_locked(*, username: str, ip: str) -> bool:
    """True when too many sign-ins failed in the last ``WINDOW_SECONDS`` for this pair or IP."""
    account_key, ip_key = _keys(username, ip)
    return (
        int(cache.get(account_key, 0)) >= MAX_FAILURES_PER_ACCOUNT
        or int(cache.get(ip_key, 0)) >= MAX_FAILURES_PER_ADDRESS
    )


def record_failure(*, username: str, ip: str) -> None:
    """Count one failed sign-in; the window starts at the first failure."""
    for key in _keys(username, ip):
        cache.add(key, 0, WINDOW_SECONDS)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, WINDOW_SECONDS)


def record_success(*, username: str, ip: str) -> None:
    """Forget the account's failures after a successful sign-in (the IP count stays)."""
    cache.delete(_keys(username, ip)[0])
