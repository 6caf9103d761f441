"""The health page: are the workers alive, how deep is the queue, when did the relay and the
reconciler last run, how do the providers answer (issue 16 item 5)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.http import require_GET

from console.permissions import console_role_required, on_every_tenant, reader_scope
from console.views.common import HtmxHttpRequest, page_or_partial
from operations.selectors.health import system_health


@require_GET
@console_role_required
def health(request: HtmxHttpRequest) -> HttpResponse:
    """Red, amber or green per signal, with the figures behind it; htmx refreshes it. Read-only
    for every role. Provider calls count the tenants the user may read (attempts belong to
    intents); workers, broker, outbox and periodic jobs belong to no tenant and are shown to a
    role on every tenant only, as on the dashboard. Not ``/healthz`` (the load balancer's probe)."""
    every_tenant = on_every_tenant(request.user)
    scope = reader_scope(request.user)
    context = {
        "health": system_health(scope=scope, system_wide=every_tenant),
        "every_tenant": every_tenant,
        "tenants": None if scope.every else sorted(scope.names),
        "thresholds": settings.EFFECT_LEDGER,
        "section": "health",
    }
    return page_or_partial(request, "console/health.html", "signals", context)
