"""Bearer-token authentication for agents (``Authorization: Bearer <token>``).

Tokens are random 32-byte url-safe strings minted by ``manage.py create_agent`` (and
``rotate_agent_token``); only their sha256 is stored, one ``AgentToken`` row each. A token is
valid until its ``expires_at`` (none: never) or its ``revoked_at``, while its agent is active.
An agent is a principal of one tenant; it can never approve or resolve.

A verified token is kept in the web process for ``EFFECT_LEDGER["TOKEN_CACHE_SECONDS"]`` (5 s by
default), so a submission costs no separate read of the agent (issue 13): a token revoked or an
agent deactivated (or its scopes changed) is refused, or seen, by every process within that many
seconds. A token that expires sooner is kept only until its expiry (measured on the database's
clock, like every expiry): the cache never extends a token's life. Unknown tokens are never
cached (each is looked up, so a new agent works at once).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Now
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from operations.access.scopes import ALL_ACTIONS
from operations.idempotency import sha256_hex
from operations.models import Agent, AgentToken


def _new_token() -> str:
    return "elk_" + secrets.token_urlsafe(32)


def _database_time_in(delta: timedelta) -> ExpressionWrapper[Any]:
    """``now() + delta`` on the database's clock (expiries use database time)."""
    return ExpressionWrapper(Now() + Value(delta, output_field=DurationField()), output_field=DateTimeField())


#: The longest a token may live, and an old token be kept after a rotation: ten years of 366
#: days. A duration is added to the database clock and the timestamp read back by Python, whose
#: dates end at year 9999; a longer one was written, then could not be read (the token never
#: printed, the agent's admin page a 500).
TOKEN_LIFETIME_MAX = timedelta(days=10 * 366)


def duration_problem(name: str, value: timedelta | None, *, zero_allowed: bool = False) -> str | None:
    """Why ``value`` cannot be a token duration named ``name``, or None when it can: positive
    (or zero when ``zero_allowed``: a rotation that revokes the old tokens now) and at most
    ``TOKEN_LIFETIME_MAX``. None (never expires) is always allowed."""
    if value is None:
        return None
    if value < timedelta(0) or (value == timedelta(0) and not zero_allowed):
        return f"{name} must be {'zero or more' if zero_allowed else 'positive'}"
    if value > TOKEN_LIFETIME_MAX:
        return f"{name} must be at most {TOKEN_LIFETIME_MAX.days} days"
    return None


def _token_add(agent: Agent, token: str, expires_in: timedelta | None) -> AgentToken:
    return AgentToken.objects.create(
        agent=agent,
        digest=sha256_hex(token.encode()),
        expires_at=_database_time_in(expires_in) if expires_in is not None else None,
    )


def agent_create(
    *,
    name: str,
    tenant: str,
    actions: Iterable[str] = ALL_ACTIONS,
    scope: str = Agent.Scope.OWN,
    expires_in: timedelta | None = None,
) -> tuple[Agent, str]:
    """Create an agent and return it with its token, which is shown once and never stored.

    Args:
        actions: the action patterns it may submit (``operations.access.scopes``); every action by default.
        scope: ``own`` (the default: it reads and cancels only its own intents) or ``tenant``.
        expires_in: the token is refused after this long (database time); None: never.

    Raises:
        ValueError: ``tenant`` is blank, over 100 characters or ``*`` (which means "every tenant"
            in console role grants, ``operations.access.tenants``); ``expires_in`` is not
            positive or longer than ``TOKEN_LIFETIME_MAX``. Nothing is written.
        django.db.IntegrityError: an agent with that name already exists in the tenant.
    """
    if not tenant.strip() or tenant == "*" or len(tenant) > 100:
        raise ValueError(f"tenant {tenant!r}: a tenant name is 1 to 100 characters and not '*'")
    if problem := duration_problem("a token's lifetime", expires_in):
        raise ValueError(problem)
    token = _new_token()
    with transaction.atomic():
        agent = Agent.objects.create(name=name, tenant=tenant, actions=list(actions), scope=scope)
        _token_add(agent, token, expires_in)
    return agent, token


def agent_token_rotate(
    *, agent: Agent, keep_old_for: timedelta, expires_in: timedelta | None = None
) -> tuple[AgentToken, str]:
    """Mint a new token for ``agent`` and let its other valid tokens run out ``keep_old_for``
    from now (database time; sooner when they already expire sooner; zero revokes them now), so
    the agent's deployments can switch without a moment where no token is valid.

    Args:
        keep_old_for: how long the old tokens stay valid (a non-negative duration).
        expires_in: the new token's lifetime; None: it never expires.

    Returns the new token's row and the token itself (shown once, never stored).

    Raises:
        ValueError: ``keep_old_for`` negative, or either duration longer than
            ``TOKEN_LIFETIME_MAX`` (``expires_in`` also when not positive). Nothing is written.
    """
    for problem in (
        duration_problem("keep_old_for", keep_old_for, zero_allowed=True),
        duration_problem("a token's lifetime", expires_in),
    ):
        if problem:
            raise ValueError(problem)
    token = _new_token()
    with transaction.atomic():
        valid = AgentToken.objects.select_for_update().filter(agent=agent, revoked_at__isnull=True)
        valid = valid.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=Now()))
        if keep_old_for == timedelta(0):
            valid.update(revoked_at=Now())
        else:
            until = _database_time_in(keep_old_for)
            valid.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=until)).update(expires_at=until)
        row = _token_add(agent, token, expires_in)
        row.refresh_from_db(fields=["expires_at", "created_at"])
    return row, token


#: token digest -> (monotonic time it expires, the agent); at most ``_CACHE_MAX`` entries.
_verified: dict[str, tuple[float, Agent]] = {}
_CACHE_MAX = 10_000
_cache_lock = threading.Lock()


def agent_for_token(token: str) -> Agent | None:
    """The active agent whose valid (not expired, not revoked) token this is, or None; from this
    process's cache when it was verified less than ``TOKEN_CACHE_SECONDS`` ago (the bound on how
    long a revocation takes) and before the token's own expiry (never beyond it)."""
    digest = sha256_hex(token.encode())
    ttl = float(settings.EFFECT_LEDGER["TOKEN_CACHE_SECONDS"])
    now = time.monotonic()
    cached = _verified.get(digest)
    if cached is not None and cached[0] > now:
        return cached[1]
    # One query: the token, its agent, and how long it has left by the database's clock.
    found = (
        AgentToken.objects.select_related("agent")
        .filter(digest=digest, revoked_at__isnull=True, agent__is_active=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=Now()))
        .annotate(left=ExpressionWrapper(F("expires_at") - Now(), output_field=DurationField()))
        .first()
    )
    agent = found.agent if found is not None else None
    keep = ttl
    if found is not None and found.left is not None:
        keep = min(ttl, found.left.total_seconds())
    with _cache_lock:
        if agent is None or keep <= 0:
            _verified.pop(digest, None)
        else:
            if len(_verified) >= _CACHE_MAX:
                _verified.clear()
            _verified[digest] = (now + keep, agent)
    return agent


def forget_verified_tokens() -> None:
    """Empty this process's token cache (tests; after a revocation done in this process)."""
    with _cache_lock:
        _verified.clear()


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """DRF authentication: ``request.user`` becomes the ``Agent``."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Agent, str] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("malformed Authorization header; use 'Bearer <token>'")
        try:
            token = header[1].decode("ascii")
        except UnicodeDecodeError as exc:
            raise exceptions.AuthenticationFailed("the token must be ASCII") from exc
        agent = agent_for_token(token)
        if agent is None:
            raise exceptions.AuthenticationFailed("unknown, expired or revoked token")
        return agent, token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword
