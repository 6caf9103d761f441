"""Operator console views (the pages grow with the console issue) and ``/metrics``."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from operations.metrics import render_metrics
from operations.selectors_metrics import ledger_gauges


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text format: counters from every worker process plus ledger gauges."""
    body, content_type = render_metrics()
    return HttpResponse(body, content_type=content_type)


@require_GET
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """Counts by state and the outbox backlog."""
    return render(request, "console/dashboard.html", {"gauges": ledger_gauges()})
