"""Intents search (keyset pagination) and the intent detail with its timeline."""

from __future__ import annotations

import uuid

from django.http import HttpResponse
from django.views.decorators.http import require_GET

from console.forms import IntentSearchForm
from console.permissions import console_role_required
from console.views.common import HtmxHttpRequest, keyset_page, page_or_partial, scoped_intent
from operations import selectors
from operations.models import TERMINAL_STATUSES, Intent
from reconciliation.selectors import intents_held_behind, unverified_outcome
from reconciliation.timeline import intent_timeline


@require_GET
@console_role_required
def intent_list(request: HtmxHttpRequest) -> HttpResponse:
    """Search by intent_id, reference, tenant, action, status, principal and date range."""
    form = IntentSearchForm(request.GET or None)
    filters = selectors.IntentFilters()
    if form.is_valid():
        filters = selectors.IntentFilters(**{k: v for k, v in form.cleaned_data.items() if v})
    page = keyset_page(request, selectors.intent_search, filters)
    query = request.GET.copy()
    query.pop("cursor", None)
    context = {"form": form, "page": page, "query": query.urlencode(), "section": "intents"}
    status = 200 if form.is_bound is False or form.is_valid() else 422
    return page_or_partial(request, "console/intents.html", "results", context, status=status)


@require_GET
@console_role_required
def intent_detail(request: HtmxHttpRequest, intent_id: uuid.UUID) -> HttpResponse:
    """The timeline of every audit event, approval, attempt and outcome, the key digest, the
    policy snapshot and compensations, "unverified" when an operator confirmed it with a
    reference the provider could not check, the earlier intent it is held behind and the intents
    held behind it; htmx polls the status while the intent is not final."""
    intent = scoped_intent(request, intent_id, Intent.objects.select_related("compensates", "held_behind"))
    context = {
        "intent": intent,
        "timeline": intent_timeline(intent),
        "compensations": list(intent.compensations.order_by("created_at")),
        "terminal": intent.status in TERMINAL_STATUSES,
        "unverified": unverified_outcome(intent),
        "held_intents": intents_held_behind(intent),
        "section": "intents",
    }
    return page_or_partial(request, "console/intent_detail.html", "status", context)
