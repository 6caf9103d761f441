"""Bearer-token authentication for agents (``Authorization: Bearer <token>``).

Tokens are random 32-byte url-safe strings minted by ``manage.py create_agent``; only their
sha256 is stored. An agent is a principal of one tenant; it can never approve or resolve.

A verified token is kept in the web process for ``EFFECT_LEDGER["TOKEN_CACHE_SECONDS"]`` (5 s by
default), so a submission costs no separate read of the agent (issue 13): a token revoked or an
agent deactivated is refused by every process within that many seconds. Unknown tokens are
never cached (each is looked up, so a new agent works at once).
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

from django.conf import settings
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from operations.idempotency import sha256_hex
from operations.models import Agent


def agent_create(*, name: str, tenant: str) -> tuple[Agent, str]:
    """Create an agent and return it with its token, which is shown once and never stored.

    Raises:
        django.db.IntegrityError: an agent with that name already exists in the tenant.
    """
    token = "elk_" + secrets.token_urlsafe(32)
    agent = Agent.objects.create(name=name, tenant=tenant, token_digest=sha256_hex(token.encode()))
    return agent, token


#: token digest -> (monotonic time it expires, the agent); at most ``_CACHE_MAX`` entries.
_verified: dict[str, tuple[float, Agent]] = {}
_CACHE_MAX = 10_000
_cache_lock = threading.Lock()


def agent_for_token(token: str) -> Agent | None:
    """The active agent whose token this is, or None; from this process's cache when it was
    verified less than ``TOKEN_CACHE_SECONDS`` ago (the bound on how long a revocation takes)."""
    digest = sha256_hex(token.encode())
    ttl = float(settings.EFFECT_LEDGER["TOKEN_CACHE_SECONDS"])
    now = time.monotonic()
    cached = _verified.get(digest)
    if cached is not None and cached[0] > now:
        return cached[1]
    agent = Agent.objects.filter(token_digest=digest, is_active=True).first()
    with _cache_lock:
        if agent is None or ttl <= 0:
            _verified.pop(digest, None)
        else:
            if len(_verified) >= _CACHE_MAX:
                _verified.clear()
            _verified[digest] = (now + ttl, agent)
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
            raise exceptions.AuthenticationFailed("unknown or revoked token")
        return agent, token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword
