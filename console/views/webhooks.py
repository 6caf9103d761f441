"""The webhook deliveries to agents (``operations.services.webhooks``): state, event, intent,
agent, attempts, last error and next attempt, for the tenants the user reads; operators re-send
a delivered or failed one (same message id, same body)."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from console.permissions import can_resolve, console_role_required, reader_scope
from console.views.common import HtmxHttpRequest, capped, page_or_partial
from operations import services
from operations.exceptions import WebhookResendRefused
from operations.models import WebhookDelivery
from operations.policies.approval_validity import user_principal
from operations.selectors.webhooks import STATES, webhook_deliveries

TEMPLATE = "console/webhooks.html"
#: Rows shown at most (newest first); the notice says when more wait.
LIMIT = 200


def _context(request: HtmxHttpRequest, **extra: object) -> dict[str, object]:
    state = request.GET.get("state", "")
    rows, more = capped(webhook_deliveries(scope=reader_scope(request.user), state=state), LIMIT)
    user = request.user
    return {
        "rows": rows,
        "resendable": {row.id for row in rows if row.state != "pending" and can_resolve(user, row.tenant)},
        "capped": {"limit": LIMIT, "sections": ["the deliveries"] if more else []},
        "states": STATES,
        "state": state if state in STATES else "",
        "section": "webhooks",
        **extra,
    }


@require_GET
@console_role_required
def webhook_list(request: HtmxHttpRequest) -> HttpResponse:
    """The deliveries, newest first, optionally of one state (``?state=failed``)."""
    return page_or_partial(request, TEMPLATE, "deliveries", _context(request))


@require_POST
@console_role_required
def webhook_resend_view(request: HtmxHttpRequest, delivery_id: int) -> HttpResponse:
    """Re-send a delivered or failed delivery now (operators and admins of its tenant): the
    same message id and body (``services.webhook_resend``). Refusals are shown in place."""
    scope = reader_scope(request.user).q()
    delivery = WebhookDelivery.objects.filter(scope, id=delivery_id).first()
    if delivery is None:
        raise Http404("no such delivery in your tenants")
    status = 200
    if not can_resolve(request.user, delivery.tenant):
        note, status = "Only operators and admins can re-send webhooks.", 403
    else:
        try:
            services.webhook_resend(delivery_id=delivery.id, actor=user_principal(request.user), scope=scope)  # type: ignore[arg-type]
            note = f"{delivery.message_id} is pending again: it is sent now, with the same id and body."
        except WebhookResendRefused as exc:
            note, status = exc.detail, exc.status
    if request.htmx:
        key = "success" if status == 200 else "error"
        return page_or_partial(
            request, TEMPLATE, "deliveries", _context(request, **{key: note}), status=status
        )
    (messages.success if status == 200 else messages.error)(request, note)
    return redirect("webhooks")
