"""Intents search (keyset pagination) and the intent detail with its timeline."""

from __future__ import annotations

import uuid

from django.http import Http404, HttpResponse
from django.views.decorators.http import require_GET

from console.forms import IntentSearchForm, filters_of
from console.permissions import console_role_required
from console.views.archive import archived_matches, archived_or_404, render_archived_notice
from console.views.common import HtmxHttpRequest, keyset_page, list_query, page_or_partial, scoped_intent
from console.views.rows import intent_rows
from operations import selectors
from operations.models import TERMINAL_STATUSES, Intent
from reconciliation.selectors import intents_held_behind, unverified_outcome
from reconciliation.timeline import intent_timeline


@require_GET
@console_role_required
def intent_list(request: HtmxHttpRequest) -> HttpResponse:
    """Search by intent_id (or its first hex digits), reference (any case, or its start),
    tenant, action, status, principal and date range, newest or oldest first. A field that does
    not validate is named in a message (422) and left out; the others still filter.

    The search box also looks in the archive (issue 36): archived intents of the user's tenants
    whose id, reference or Idempotency-Key is the text exactly are listed below the live ones,
    each with the file and segment that hold it."""
    form = IntentSearchForm(request.GET or None)
    filters = selectors.IntentFilters(**filters_of(form))
    page = keyset_page(request, selectors.intent_search, filters)
    archived, more_archived = archived_matches(request, filters.q) if filters.q.strip() else ([], False)
    context = {
        "form": form,
        "page": page,
        # Each row's cells computed once here, not by a filter per cell (issue 37).
        "rows": intent_rows(page.rows),
        "query": list_query(request),
        "archived": archived,
        "more_archived": more_archived,
        "section": "intents",
    }
    status = 422 if form.is_bound and not form.is_valid() else 200
    return page_or_partial(request, "console/intents.html", "results", context, status=status)


@require_GET
@console_role_required
def intent_detail(request: HtmxHttpRequest, intent_id: uuid.UUID) -> HttpResponse:
    """The timeline of every audit event, approval, attempt and outcome, the key digest, the
    policy snapshot and compensations, "unverified" when an operator confirmed it with a
    reference the provider could not check, the earlier intent it is held behind and the intents
    held behind it; htmx polls the status while the intent is not final. An intent that is
    archived (issue 36) is not live any more: the page says which archive file holds it."""
    try:
        intent = scoped_intent(
            request, intent_id, Intent.objects.select_related("compensates", "held_behind")
        )
    except Http404:
        return render_archived_notice(request, archived_or_404(request, intent_id))
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
