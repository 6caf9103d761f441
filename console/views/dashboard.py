"""The dashboard and the Prometheus ``/metrics`` endpoint."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from console.charts import throughput_svg
from console.permissions import console_role_required, on_every_tenant, reader_scope
from console.views.common import HtmxHttpRequest, page_or_partial
from operations import selectors
from operations.metrics import process_counters, render_metrics
from operations.selectors import ledger_gauges
from reconciliation.selectors import decision_counts


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format: counters from every worker process plus ledger gauges.

    With ``EFFECT_LEDGER["METRICS_TOKEN"]`` set, only a request carrying
    ``Authorization: Bearer <that token>`` is served (compared in constant time); any other gets
    401 with ``WWW-Authenticate: Bearer`` (RFC 6750 section 3) and no metrics.
    """
    token = settings.EFFECT_LEDGER["METRICS_TOKEN"]
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            refused = HttpResponse("metrics need the bearer token\n", status=401, content_type="text/plain")
            refused["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return refused
    body, content_type = render_metrics()
    return HttpResponse(body, content_type=content_type)


@require_GET
@console_role_required
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    """Whether execution runs (paused after the database went back in time; the fence epoch,
    the restore guard and the latest recovery runs), counts by state, approvals waiting, UNKNOWN by age, compensations, duplicate findings and
    held intents (likely duplicates among them) waiting for an operator, the oldest held age,
    absorbed duplicates, stale fences, outbox backlog and the last hour's throughput; htmx
    refreshes the figures. Every figure counts the tenants the user may read; those that belong
    to no tenant (counters, outbox, failover and recoveries) are shown to a role on every tenant
    only, except that execution is paused (it stops every tenant's intents)."""
    scope = reader_scope(request.user)
    every_tenant = on_every_tenant(request.user)
    minutes = selectors.throughput_last_hour(scope=scope)
    context = {
        "gauges": ledger_gauges(scope=scope),
        "approvals": selectors.approvals_waiting(scope=scope),
        "unknown_ages": selectors.unknown_by_age(scope=scope),
        "decisions": decision_counts(scope=scope),
        # Figures of no tenant (this machine's counters, the outbox, failover): every tenant only.
        "every_tenant": every_tenant,
        "counters": process_counters() if every_tenant else {},
        "execution": selectors.execution_status(),
        "tenants": None if scope.every else sorted(scope.names),
        "throughput_svg": throughput_svg(minutes),
        "throughput_total": sum(row["succeeded"] + row["failed"] for row in minutes),
        "section": "dashboard",
    }
    return page_or_partial(request, "console/dashboard.html", "stats", context)
