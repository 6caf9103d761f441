"""Provider events: the inbox a provider POSTs its signed events to
(``POST /providers/<source>/events``), and the console's list of what arrived.

The inbox is thin: ``reconciliation.event_inbox.receive_provider_event`` verifies the signature on
the raw body, reads and stores the event; errors are RFC 9457 problem details, as in the API.
"""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET

from console.permissions import console_role_required, reader_scope
from console.views.common import HtmxHttpRequest, capped, page_or_partial
from operations.adapters.events import EventInvalid, EventSignatureInvalid
from operations.api.support import PROBLEM_CONTENT_TYPE, problem
from reconciliation.event_inbox import UnknownEventSource, receive_provider_event
from reconciliation.models import ProviderEvent
from reconciliation.selectors import provider_events
from reconciliation.timeline import body_removed_note

TEMPLATE = "console/provider_events.html"
#: Rows shown at most (newest first); the notice says when more wait.
LIMIT = 200


def _problem(status: int, title: str, detail: str, code: str) -> JsonResponse:
    return JsonResponse(
        problem(status, title, detail, code), status=status, content_type=PROBLEM_CONTENT_TYPE
    )


@csrf_exempt
def provider_event_inbox(request: HttpRequest, source: str) -> HttpResponse:
    """Receive one signed provider event for ``source``.

    Answers: 200 ``{"id", "stored"}`` (``stored`` false for a redelivery: nothing changed); 404
    for an unknown source; 401 for a missing, wrong or stale signature (Standard Webhooks, 5
    minutes' tolerance); 400 for a signed body that is not an event (a type the source does not
    send, a negative amount, ``created`` outside 2000..2100 UTC, a NUL or non-UTF-8 text, ...);
    413 past the body limit; 405 with ``Allow: POST`` for any other method. All refusals are
    RFC 9457 problem details and store nothing. No session or CSRF token: the signature is the
    only authentication (``reconciliation.event_inbox``).
    """
    if request.method != "POST":
        refused = _problem(
            405,
            "Method not allowed",
            f"{request.method} is not allowed here; POST an event",
            "method-not-allowed",
        )
        refused["Allow"] = "POST"
        return refused
    try:
        body = request.body
    except RequestDataTooBig:
        return _problem(413, "Payload too large", "the event body is too large", "payload-too-large")
    try:
        received = receive_provider_event(source=source, body=body, headers=request.headers)
    except UnknownEventSource as exc:
        return _problem(404, "Unknown event source", str(exc), "unknown-event-source")
    except EventSignatureInvalid as exc:
        return _problem(401, "Signature refused", str(exc), "event-signature-invalid")
    except EventInvalid as exc:
        return _problem(400, "Not an event", str(exc), "event-invalid")
    return JsonResponse({"id": received.event_pk, "stored": received.created})


def _context(request: HtmxHttpRequest) -> dict[str, object]:
    result = request.GET.get("result", "")
    rows, more = capped(provider_events(scope=reader_scope(request.user), result=result), LIMIT)
    return {
        "rows": rows,
        "capped": {"limit": LIMIT, "sections": ["the events"] if more else []},
        "results": ProviderEvent.Result.choices,
        "result": result if result in ProviderEvent.Result.values else "",
        "section": "provider-events",
        "body_removed": body_removed_note(),
    }


@require_GET
@console_role_required
def provider_event_list(request: HtmxHttpRequest) -> HttpResponse:
    """Provider events newest first, optionally of one result (``?result=orphan``)."""
    return page_or_partial(request, TEMPLATE, "events", _context(request))
