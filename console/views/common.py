"""What every console view shares: typed htmx requests and the answer to a refused action."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django_htmx.middleware import HtmxDetails

from console.permissions import reader_scope
from operations import selectors
from operations.models import Intent
from operations.selectors import InvalidCursor, Page
from operations.services import intent_record_refusal, user_principal

FRAGMENT_HEADER = "X-Console-Fragment"

#: The posted fields that say what a decision's page showed; at most this many characters of
#: each are kept with a refusal (a tampered form can post anything).
SHOWN_FIELDS = ("request_hash", "seen_seq")
SHOWN_MAX_CHARS = 128


class HtmxHttpRequest(HttpRequest):
    """An ``HttpRequest`` with django-htmx's ``request.htmx``."""

    htmx: HtmxDetails


def page_or_partial(
    request: HtmxHttpRequest, template: str, partial: str, context: dict[str, Any], *, status: int = 200
) -> HttpResponse:
    """Render the whole page, or only ``template#partial`` for an htmx request.

    Fragments carry ``X-Console-Fragment: 1``: ``static/console/console.js`` swaps such a
    fragment in place even when its status is 4xx (a refusal with its reason), and shows any
    other failed response (a CSRF failure, a 500) as a notice instead of swapping it in.
    """
    if request.htmx:
        response = render(request, f"{template}#{partial}", context, status=status)
        response[FRAGMENT_HEADER] = "1"
        return response
    return render(request, template, context, status=status)


def record_refusal(request: HttpRequest, intent_id: uuid.UUID, decision: str, reason: str) -> None:
    """Audit a decision the view refused before reaching its service (no permission, an
    invalid form): who tried (``request.user``), what the page showed (``SHOWN_FIELDS`` as
    posted, cut to ``SHOWN_MAX_CHARS``) and why (``reason``). Refusals raised by the services
    are audited there (``operations.services.refusals``)."""
    shown = {name: request.POST[name][:SHOWN_MAX_CHARS] for name in SHOWN_FIELDS if name in request.POST}
    intent_record_refusal(
        intent_id=intent_id,
        actor=user_principal(request.user),  # type: ignore[arg-type]
        decision=decision,
        reason=reason,
        shown=shown,
        given_reason=request.POST.get("reason", ""),
    )


def scoped_intent(
    request: HttpRequest, intent_id: uuid.UUID, queryset: QuerySet[Intent] | None = None
) -> Intent:
    """The intent ``intent_id`` if it belongs to a tenant the user may read; else 404, the same
    answer as for an intent that does not exist (issue 18 item 5)."""
    queryset = Intent.objects.all() if queryset is None else queryset
    return get_object_or_404(queryset.filter(reader_scope(request.user).q()), id=intent_id)


def list_query(request: HttpRequest) -> str:
    """The request's query string without its ``cursor``: the filters and sort of a list, for
    its links and its htmx refresh (``hx-get``), so a refreshed or shared list shows the same
    rows (issue 16 item 3)."""
    query = request.GET.copy()
    query.pop("cursor", None)
    return query.urlencode()


def keyset_page(request: HttpRequest, search: Callable[..., Page], filters: Any) -> Page:
    """The page the request's ``cursor`` names, of the tenants the user may read; the first page, with a message saying so, when
    the cursor was not one the list wrote (edited, cut short, from another list: issue 12)."""
    scope = reader_scope(request.user)
    try:
        return search(filters, scope=scope, cursor=request.GET.get("cursor"), limit=selectors.PAGE_SIZE)
    except InvalidCursor:
        messages.warning(request, "That page link is malformed or out of date: showing the first page.")
        return search(filters, scope=scope, cursor=None, limit=selectors.PAGE_SIZE)


def capped(rows: Any, limit: int) -> tuple[list[Any], bool]:
    """The first ``limit`` of ``rows`` (a queryset, in its order) and whether more exist: one
    row more is read, so a list that shows ``limit`` rows can say that others wait rather than
    hide them silently (``_capped_notice.html``)."""
    found = list(rows[: limit + 1])
    return found[:limit], len(found) > limit
