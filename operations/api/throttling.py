"""Rate limits of the API (issue 18, item 7; one round trip since issue 37): per agent and per
tenant, so one agent cannot flood the ledger and starve every other tenant.

``LedgerRateThrottle`` is DRF's throttle for every authenticated API request: it asks
``operations.api.rate_windows.windows_check`` for the agent's limit then the tenant's, in one
statement (PostgreSQL) or one script call (Redis when ``EFFECT_LEDGER_CACHE_URL`` names one),
shared by every web process. The first refusal ends the check, so a request refused by its
agent's own limit is not counted against its colleagues' tenant limit. A refused request is
answered ``429`` with ``Retry-After`` (``operations.api.support.problem_exception_handler``).

Counting is exact under concurrency (a row lock or Redis's single thread serializes the
requests of one key); the window is a sliding-window counter (``rate_windows``), so a burst
across a window's edge cannot pass twice the limit.

Rates come from ``EFFECT_LEDGER["RATE_AGENT"]`` and ``["RATE_TENANT"]`` (``"600/min"``; None:
no limit), read on each request (so a test or a lab can change them), validated at start-up
(``rate_parse``).
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from operations.api.rate_windows import Limit, windows_check
from operations.api.rates import rate_parse
from operations.idempotency import sha256_hex
from operations.models import Agent

#: The limiter's clock (Unix seconds); a module attribute so a test can set it.
clock = time.time


def limits_of(agent: Agent) -> list[Limit]:
    """The limits a request of ``agent`` counts against, in the order they are checked: its own
    (``RATE_AGENT``), then its tenant's (``RATE_TENANT``); a limit set to None is left out. A
    key names the period too, so changing a rate's period starts a fresh window."""
    limits = []
    for scope, setting, ident in (
        ("agent", "RATE_AGENT", str(agent.pk)),
        # a tenant is free text (spaces, any character): its digest makes a safe key
        ("tenant", "RATE_TENANT", sha256_hex(agent.tenant.encode())),
    ):
        rate = settings.EFFECT_LEDGER[setting]
        parsed = rate_parse(rate) if rate is not None else None
        if parsed is not None:
            requests, period = parsed
            limits.append(Limit(f"{scope}:{ident}:{period}", requests, period))
    return limits


class LedgerRateThrottle(BaseThrottle):
    """At most ``EFFECT_LEDGER_RATE_AGENT`` requests of one agent and ``EFFECT_LEDGER_RATE_TENANT``
    of all of its tenant's agents together, across every web process. An unauthenticated
    request is not limited here: it is refused with 401 before throttling."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def allow_request(self, request: Request, view: Any) -> bool:
        """Count the request under each limit that serves it; False (and ``wait``) on a refusal."""
        agent = request.user
        if not isinstance(agent, Agent):
            return True
        verdict = windows_check(limits_of(agent), now=clock())
        self.seconds = verdict.retry_after
        return verdict.refused is None

    def wait(self) -> float:
        """Seconds until the refusing limit would serve the request (``Retry-After``)."""
        return self.seconds
