"""Bearer-token authentication for agents (``Authorization: Bearer <token>``).

Tokens are random 32-byte url-safe strings minted by ``manage.py create_agent``; only their
sha256 is stored. An agent is a principal of one tenant; it can never approve or resolve.
"""

from __future__ import annotations

import secrets
from typing import Any

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
        agent = Agent.objects.filter(token_digest=sha256_hex(token.encode()), is_active=True).first()
        if agent is None:
            raise exceptions.AuthenticationFailed("unknown or revoked token")
        return agent, token

    def authenticate_header(self, request: Any) -> str:
        return self.keyword
