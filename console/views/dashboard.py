"""The dashboard and the Prometheus ``/metrics`` endpoint."""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from console.charts import throughput_svg
from console.permissions import console_role_required, on_every_tenant, reader_scope, roles_of
from console.views.common import HtmxHttpRequest, page_or_partial
from operations import selectors
from operations.access.tenants import EVERY_TENANT
from operations.archive.selectors import storage_sizes
from operations.metrics import process_counters, render_metrics
from operations.selectors import ledger_gauges
from reconciliation.models import ProviderFinding
from reconciliation.provider_selectors import compensating_findings_by_kind, open_findings_by_kind
from reconciliation.waiting_for_people import EXPIRING_SOON, Waiting, waiting_for_people

#: ``reconciliation.waiting_for_people`` key -> (what the dashboard calls it, where it is decided,
#: the id of its count). A provider finding kind's row is built from its label.
WAITING_ROWS: dict[str, tuple[str, str, str]] = {
    "unknown_escalated": ("UNKNOWN intents escalated to operators", "/unknown/", "unknown-escalated"),
    "approvals_expiring": (
        f"Approval requests expiring within {EXPIRING_SOON.seconds // 60} minutes",
        "/approvals/?sort=expiry",
        "approvals-expiring",
    ),
    "compensations": (
        "Compensations that need a decision",
        "/unknown/#compensations",
        "escalated-compensations",
    ),
    "duplicate_findings": ("Open duplicate findings", "/unknown/#duplicates", "open-duplicate-findings"),
    "held_after_restore": (
        "Held by the restore guard after a failover or restore",
        "/unknown/#held",
        "held-after-restore",
    ),
    "held_request_mismatch": (
        "Held: changed in the database after submission (request_hash mismatch), never sent",
        "/unknown/#held",
        "held-request-mismatch",
    ),
    "held_likely_duplicates": (
        "Held as likely duplicates of an earlier intent",
        "/unknown/#held",
        "held-likely-duplicates",
    ),
    "held_unserved": (
        "Held: not served by this deployment (action or version)",
        "/unknown/#held",
        "held-unserved",
    ),
    "approvals": ("Other approval requests waiting", "/approvals/", "approvals-waiting"),
    "unknown_looking": ("UNKNOWN intents the reconciler is still looking up", "/unknown/", "unknown-looking"),
    "held_behind": (
        "Held behind an earlier intent for the same business action, until it ends",
        "/unknown/#held",
        "held-behind",
    ),
    "provider_findings_compensating": (
        "Provider findings being compensated",
        "/findings/?state=compensating",
        "compensating-provider-findings",
    ),
}


#: The rows any approver may decide (a policy may name its own approver group, so they are
#: offered to every role); every other row is a resolution, which operators and admins make
#: (``reconciliation.decision_checks.can_resolve``).
APPROVAL_ROWS = frozenset({"approvals_expiring", "approvals"})


def resolver(user: Any) -> bool:
    """Whether ``user`` holds a role that resolves (operator or admin) on some tenant."""
    return bool({"operator", "admin"} & set(roles_of(user)))


def waiting_rows(waiting: list[Waiting], *, resolves: bool = True) -> list[dict[str, Any]]:
    """``waiting_for_people``'s answer as the dashboard's rows, in its order: ``{"label", "url",
    "id", "count", "since", "due", "needs_person", "for_user"}``; ``for_user`` False for a
    resolution when the reader does not resolve (``resolves``): it waits for an operator, not
    for them."""
    rows = []
    for item in waiting:
        kind = item.key.removeprefix("provider_findings:")
        if kind != item.key:
            label = f"Open provider findings: {ProviderFinding.Kind(kind).label.lower()}"
            url, element_id = f"/findings/?state=open&kind={kind}", f"open-provider-findings-{kind}"
        else:
            label, url, element_id = WAITING_ROWS[item.key]
        rows.append(
            {
                "label": label,
                "url": url,
                "id": element_id,
                "count": item.count,
                "since": item.since,
                "due": item.due,
                "needs_person": item.needs_person,
                "for_user": resolves or item.key in APPROVAL_ROWS,
            }
        )
    return rows


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
    return HttpResponse(body + provider_findings_metrics(), content_type=content_type)


def provider_findings_metrics() -> bytes:
    """Prometheus text of ``effect_ledger_provider_findings_open{kind}`` (open provider findings
    per kind, every tenant; issue 19) and ``effect_ledger_provider_findings_compensating{kind}``
    (those whose compensation has not ended: neither open nor resolved yet). Two families rather
    than a ``state`` label, so the open family's series stay as they were. Appended to ``render_metrics``'s families here, in the
    console, because the ledger's metrics module may not read reconciliation's tables."""
    # Imported here, after ``operations.metrics`` chose the multiprocess mode (it must be imported
    # first: prometheus_client reads PROMETHEUS_MULTIPROC_DIR on import).
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    registry = CollectorRegistry()

    class FindingsCollector:
        def collect(self) -> Any:
            family = GaugeMetricFamily(
                "effect_ledger_provider_findings_open",
                "Open provider findings (orphan events, statement lines extra or missing, amount mismatches) by kind",
                labels=["kind"],
            )
            for kind, count in open_findings_by_kind(scope=EVERY_TENANT).items():
                family.add_metric([kind], count)
            yield family
            compensating = GaugeMetricFamily(
                "effect_ledger_provider_findings_compensating",
                "Provider findings whose compensation intent has not ended yet, by kind",
                labels=["kind"],
            )
            for kind, count in compensating_findings_by_kind(scope=EVERY_TENANT).items():
                compensating.add_metric([kind], count)
            yield compensating

    registry.register(FindingsCollector())
    return generate_latest(registry)


@require_GET
@console_role_required
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    """What waits for a person, only the kinds with something waiting, most urgent first
    (``reconciliation.waiting_for_people``, issue 39 item 5), whether execution runs (paused
    after the database went back in time; the fence epoch, the restore guard and the latest
    recovery runs), counts by state, UNKNOWN by age, the oldest held age, absorbed duplicates,
    stale fences, outbox backlog, the live database's size and the archive's (issue 36) and the
    last hour's throughput; htmx
    refreshes the figures. Every figure counts the tenants the user may read; those that belong
    to no tenant (counters, outbox, failover and recoveries, storage) are shown to a role on every tenant
    only, except that execution is paused (it stops every tenant's intents)."""
    scope = reader_scope(request.user)
    every_tenant = on_every_tenant(request.user)
    minutes = selectors.throughput_last_hour(scope=scope)
    # Issue 39 item 5: only the kinds with something waiting, most urgent first; those the
    # ledger is still handling apart, below.
    waiting = waiting_rows(waiting_for_people(scope=scope), resolves=resolver(request.user))
    context = {
        "gauges": ledger_gauges(scope=scope),
        "unknown_ages": selectors.unknown_by_age(scope=scope),
        "waiting_now": [row for row in waiting if row["needs_person"] and row["for_user"]],
        "waiting_operators": [row for row in waiting if row["needs_person"] and not row["for_user"]],
        "in_hand": [row for row in waiting if not row["needs_person"]],
        # Figures of no tenant (this machine's counters, the outbox, failover): every tenant only.
        "every_tenant": every_tenant,
        "counters": process_counters() if every_tenant else {},
        "storage": storage_sizes() if every_tenant else None,
        "execution": selectors.execution_status(),
        "tenants": None if scope.every else sorted(scope.names),
        "throughput_svg": throughput_svg(minutes),
        "throughput_total": sum(row["succeeded"] + row["failed"] for row in minutes),
        "section": "dashboard",
    }
    return page_or_partial(request, "console/dashboard.html", "stats", context)
