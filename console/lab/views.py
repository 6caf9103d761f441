"""The Drills page: crash-lab and acceptance evidence, and starting a drill (admins only)."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from console.lab.selectors import drill_runs
from console.lab.services import drill_request, drills_unavailable_reason
from console.permissions import console_role_required, every_tenant_only, on_every_tenant
from console.views.common import HtmxHttpRequest, page_or_partial


@require_GET
@console_role_required
def drills(request: HtmxHttpRequest) -> HttpResponse:
    """Every drill with its table or checks, when it ran and who asked; refreshes while one runs.
    Drills belong to no tenant (they run the lab's own): a role on every tenant reads them, an
    admin on every tenant starts one."""
    if not on_every_tenant(request.user):
        return every_tenant_only(request, "The drills page")
    runs = drill_runs()
    context = {
        "runs": runs,
        "running": any(run.outcome == "running" for run in runs),
        "can_start": on_every_tenant(request.user, "admin"),
        # The configured broker cannot run drills (the filesystem transport): buttons disabled.
        "unavailable": drills_unavailable_reason(),
        "section": "drills",
    }
    return page_or_partial(request, "console/drills.html", "runs", context)


@require_POST
@console_role_required
def drill_start(request: HtmxHttpRequest) -> HttpResponse:
    """Queue a drill against the sandbox provider (admins of every tenant only)."""
    kind = request.POST.get("kind", "")
    if not on_every_tenant(request.user, "admin"):
        if not on_every_tenant(request.user):
            return every_tenant_only(request, "The drills page")
        messages.error(request, "Only admins of every tenant can start a drill.")
        return redirect("drills")
    try:
        drill_request(kind=kind, requested_by=f"user:{request.user.get_username()}")
    except ValueError as exc:
        messages.error(request, str(exc))
        return redirect("drills")
    messages.success(request, f"The {kind} drill is queued; it appears below when a worker starts it.")
    return redirect("drills")
