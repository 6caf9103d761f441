"""An operator's "I'm on it" on an item of the operators' queue, and taking one over from
another operator (issue 16 item 4; ``operations.services.assignment``).

Plain form posts answered with a redirect back to the item's page (no JavaScript needed): the
page then shows who is on it and since when; a refusal ("otto is on it since …; take it over
first") is shown there as a message.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from console.forms import AssignForm, first_error
from console.permissions import can_resolve, console_role_required
from console.views.common import HtmxHttpRequest, record_refusal, scoped_intent
from operations import services
from operations.exceptions import IntentMoved, ResolutionRefused
from operations.models import Intent


def assignment_context(intent: Intent) -> dict[str, Any]:
    """What the item pages need to show who is on ``intent`` (``templates/console/_assignment.html``):
    whether it is in the operators' queue at all, and how long an assignment lasts."""
    return {
        "in_queue": Intent.objects.filter(services.ASSIGNABLE, id=intent.id).exists(),
        "assignment_seconds": services.assignment_seconds(),
    }


def _item_page(intent: Intent) -> HttpResponse:
    """The page an operator decides on ``intent`` from: the held page for a HELD intent."""
    page = "held-detail" if intent.status == Intent.Status.HELD else "unknown-detail"
    return redirect(page, intent_id=intent.id)


@require_POST
@console_role_required
def intent_assign_view(request: HtmxHttpRequest, intent_id: uuid.UUID) -> HttpResponse:
    """Assign the item to the signed-in operator, or (``take_over_from`` and the confirmation
    ticked) take it over; back to the item's page with what happened, or why not."""
    intent = scoped_intent(request, intent_id)
    form = AssignForm(request.POST)
    if not form.is_valid():
        problem = first_error(form)
        record_refusal(
            request, intent.id, "take over" if request.POST.get("take_over_from") else "assign", problem
        )
        messages.error(request, f"Refused: {problem}.")
        return _item_page(intent)
    owner = form.cleaned_data["take_over_from"]
    try:
        assignment = services.intent_assign(
            intent_id=intent.id,
            user=request.user,  # type: ignore[arg-type]
            take_over_from=owner,
            reason=form.cleaned_data["reason"],
        )
    except (ResolutionRefused, IntentMoved) as exc:
        if not can_resolve(request.user, intent.tenant):  # a reader of the tenant, not an operator there
            return render(
                request, "console/forbidden.html", {"message": f"Refused: {exc.detail}."}, status=403
            )
        messages.error(request, f"Refused: {exc.detail}.")
        return _item_page(intent)
    since = f"{assignment.since:%H:%M:%S} UTC"
    messages.success(
        request, f"You took it over from {owner} at {since}." if owner else f"You are on it since {since}."
    )
    return _item_page(intent)
