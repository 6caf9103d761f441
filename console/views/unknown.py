"""The UNKNOWN queue, its evidence page and the operator's resolutions."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_GET, require_POST

from console import selectors
from console.forms import ResolveAbsentForm, ResolveCompensateForm, ResolveConfirmedForm, first_error
from console.permissions import can_resolve, console_role_required
from console.views.common import HtmxHttpRequest, page_or_partial
from operations.adapters.registry import UnknownAction, get_adapter
from operations.exceptions import IntentMoved, ResolutionRefused
from operations.models import Intent
from reconciliation.models import Evidence

DETAIL = "console/unknown_detail.html"
RESOLUTION_FORMS: dict[str, type[forms.Form]] = {
    "confirmed": ResolveConfirmedForm,
    "absent": ResolveAbsentForm,
    "compensate": ResolveCompensateForm,
}


@require_GET
@console_role_required
def unknown_queue(request: HtmxHttpRequest) -> HttpResponse:
    """Escalated and recent UNKNOWN intents, oldest first, with their age; htmx polls the rows."""
    from reconciliation.selectors import unknown_queue as queue

    context = {"intents": queue()[:200], "section": "unknown"}
    return page_or_partial(request, "console/unknown.html", "rows", context)


def detail_context(request: HtmxHttpRequest, intent: Intent, **extra: Any) -> dict[str, Any]:
    """Every piece of evidence about ``intent`` and the three resolution forms."""
    from reconciliation.selectors import intent_evidence

    evidence = intent_evidence(intent)
    try:
        capabilities = get_adapter(intent.action).capabilities
    except UnknownAction:
        capabilities = None
    context: dict[str, Any] = {
        "intent": intent,
        "section": "unknown",
        "attempts": selectors.attempts_with_timings(intent),
        "outcomes": selectors.intent_outcomes(intent),
        "lookups": [row for row in evidence if row.kind == Evidence.Kind.LOOKUP],
        "duplicates": [row for row in evidence if row.kind == Evidence.Kind.DUPLICATE],
        "resolutions": [row for row in evidence if row.kind == Evidence.Kind.RESOLUTION],
        "audit_events": list(intent.audit_events.order_by("seq")),
        "capabilities": capabilities,
        "needs_risk_ack": capabilities is not None and not capabilities.idempotency_keys,
        "can_resolve": can_resolve(request.user),
        "forms": {verb: form_class() for verb, form_class in RESOLUTION_FORMS.items()},
    }
    context.update(extra)
    return context


@require_GET
@console_role_required
def unknown_detail(request: HtmxHttpRequest, intent_id: uuid.UUID) -> HttpResponse:
    """Attempts with fences and timings, provider answers, reconciler lookups, duplicates."""
    intent = get_object_or_404(Intent, id=intent_id)
    return page_or_partial(request, DETAIL, "resolution", detail_context(request, intent))


@require_POST
@console_role_required
def unknown_resolve(request: HtmxHttpRequest, intent_id: uuid.UUID, verb: str) -> HttpResponse:
    """Resolve an UNKNOWN intent as ``confirmed``, ``absent`` or ``compensate`` (a reason is
    required) through ``reconciliation.resolution``; refusals are shown in place."""
    from reconciliation import resolution

    form_class = RESOLUTION_FORMS.get(verb)
    if form_class is None:
        raise Http404("unknown resolution")
    intent = get_object_or_404(Intent, id=intent_id)
    form = form_class(request.POST)

    def refuse(message: str, status: int) -> HttpResponse:
        intent.refresh_from_db()
        context = detail_context(request, intent, error=message, failed_verb=verb)
        context["forms"][verb] = form
        return page_or_partial(request, DETAIL, "resolution", context, status=status)

    if not can_resolve(request.user):
        return refuse("Only operators and admins can resolve UNKNOWN intents.", 403)
    if not form.is_valid():
        return refuse(first_error(form), 422)
    data = form.cleaned_data
    user: Any = request.user
    try:
        if verb == "confirmed":
            resolved = resolution.resolve_confirmed(
                intent_id=intent.id,
                user=user,
                provider_reference=data["provider_reference"],
                reason=data["reason"],
            )
        elif verb == "absent":
            resolved = resolution.resolve_absent(
                intent_id=intent.id,
                user=user,
                reason=data["reason"],
                accept_duplicate_risk=data["accept_duplicate_risk"],
            )
        else:
            resolved = resolution.resolve_compensate(
                intent_id=intent.id,
                user=user,
                reason=data["reason"],
                provider_reference=data["provider_reference"],
            )
    except (ResolutionRefused, IntentMoved) as exc:
        return refuse(exc.detail, exc.status)
    done = f"Resolved as {verb}. The intent is {resolved.status}."
    if request.htmx:
        return page_or_partial(request, DETAIL, "resolution", detail_context(request, resolved, success=done))
    messages.success(request, done)
    return redirect("intent-detail", intent_id=resolved.id)
