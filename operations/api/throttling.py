"""Rate limits of the API (issue 18, item 7): per agent and per tenant, so one agent cannot
flood the ledger and starve every other tenant.

DRF's ``SimpleRateThrottle`` (a sliding window: the times of the requests of the last period,
kept in a cache) with two scopes, ``agent`` and ``tenant``, both applied to every authenticated
API request. The window lives in the ``throttle`` cache (``THROTTLE_CACHE``), which every web
process shares: Redis when ``EFFECT_LEDGER_CACHE_URL`` names one, else the database's cache table
(migration 0021). A request over either limit is answered ``429`` with ``Retry-After``
(``operations.api.support.problem_exception_handler``).

The window is read and written back without a lock (DRF's design): requests that arrive at the
same moment in several processes can each see the same count, so a burst can pass a few
requests beyond the limit; the limit is a guard against floods, not an exact quota.

Rates come from ``EFFECT_LEDGER["RATE_AGENT"]`` and ``["RATE_TENANT"]`` (``"600/min"``; None:
no limit), read on each request, validated at start-up (``rate_parse``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.cache import caches
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from operations.api.rates import rate_parse
from operations.idempotency import sha256_hex
from operations.models import Agent

#: The cache alias the windows live in (console/settings.py ``CACHES``).
THROTTLE_CACHE = "throttle"


class _LedgerRateThrottle(SimpleRateThrottle):
    """A ``SimpleRateThrottle`` on the shared ``throttle`` cache whose rate is read from
    ``EFFECT_LEDGER[setting]`` on each request (so a test or a lab can change it)."""

    setting = ""

    def __init__(self) -> None:
        self.cache = caches[THROTTLE_CACHE]
        super().__init__()

    def get_rate(self) -> str | None:
        rate: str | None = settings.EFFECT_LEDGER[self.setting]
        return rate

    def parse_rate(self, rate: str | None) -> tuple[int | None, int | None]:
        parsed = rate_parse(rate) if rate is not None else None
        return parsed if parsed is not None else (None, None)

    def key_of(self, agent: Agent) -> str:
        raise NotImplementedError

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        """The window's key for an authenticated agent; None (no limit here) otherwise: an
        unauthenticated request is refused with 401 before throttling."""
        agent = request.user
        if not isinstance(agent, Agent):
            return None
        return self.cache_format % {"scope": self.scope, "ident": self.key_of(agent)}


class AgentRateThrottle(_LedgerRateThrottle):
    """At most ``EFFECT_LEDGER_RATE_AGENT`` requests of one agent, across every web process."""

    scope = "agent"
    setting = "RATE_AGENT"

    def key_of(self, agent: Agent) -> str:
        return str(agent.pk)


class TenantRateThrottle(_LedgerRateThrottle):
    """At most ``EFFECT_LEDGER_RATE_TENANT`` requests of all of one tenant's agents together."""

    scope = "tenant"
    setting = "RATE_TENANT"

    def key_of(self, agent: Agent) -> str:
        # A tenant is free text (spaces, any character): its digest makes a safe cache key.
        return sha256_hex(agent.tenant.encode())


class FirstRefusalThrottling:
    """View mixin: throttles are checked in order (agent, then tenant) and the first refusal
    ends the check. DRF's own ``check_throttles`` asks every throttle, so a request the agent's
    limit refused was still recorded in the tenant's window, and one agent hammering past its
    own limit used up its colleagues' tenant limit (found in review). A request refused by
    its agent's limit is now recorded nowhere else."""

    def check_throttles(self, request: Request) -> None:
        for throttle in self.get_throttles():  # type: ignore[attr-defined]
            if not throttle.allow_request(request, self):
                self.throttled(request, throttle.wait())  # type: ignore[attr-defined]
