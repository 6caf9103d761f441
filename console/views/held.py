"""A held intent (a second intent for the same business action, waiting behind the earlier
one) beside its earlier intent, and the operator's decision on it: ``release`` (the duplicate
risk accepted) or ``reject``."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.contrib import messages
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from console.forms import ReasonForm, ReleaseHeldForm, first_error
from console.permissions import can_resolve, console_role_required
from console.presentation import payload_diff
from console.views.assignment import assignment_context
from console.views.common import HtmxHttpRequest, page_or_partial, record_refusal, scoped_intent
from operations import selectors
from operations.exceptions import IntentMoved, ResolutionRefused
from operations.models import Intent
from reconciliation import resolution
from reconciliation import selectors as queue

DETAIL = "console/held_detail.html"
#: The decisions on a HELD intent and their forms.
HELD_FORMS: dict[str, type[forms.Form]] = {"release": ReleaseHeldForm, "reject": ReasonForm}


def _intent(request: HtmxHttpRequest, intent_id: uuid.UUID) -> Intent:
    return scoped_intent(request, intent_id, Intent.objects.select_related("held_behind"))


def held_context(request: HtmxHttpRequest, intent: Intent, **extra: Any) -> dict[str, Any]:
    """The held intent, the earlier intent it waits behind (arguments, status, outcomes), what
    changed between their arguments, why it is a likely duplicate, and the two forms."""
    earlier = intent.held_behind
    context: dict[str, Any] = {
        "intent": intent,
        "earlier": earlier,
        "earlier_outcomes": selectors.intent_outcomes(earlier) if earlier else [],
        "diff": payload_diff(earlier.arguments, intent.arguments) if earlier else [],
        "likely_duplicate": queue.likely_duplicate_event(intent),
        "can_resolve": can_resolve(request.user, intent.tenant),
        "forms": {verb: form_class() for verb, form_class in HELD_FORMS.items()},
        "seen_seq": selectors.last_audit_seq(intent.id),
        "section": "unknown",
        **assignment_context(intent),
    }
    context.update(extra)
    return context


@require_GET
@console_role_required
def held_detail(request: HtmxHttpRequest, intent_id: uuid.UUID) -> HttpResponse:
    """Both intents side by side, the payload diff and the decision forms (for a HELD intent)."""
    intent = _intent(request, intent_id)
    return page_or_partial(request, DETAIL, "decision", held_context(request, intent))


def _decide(verb: str, intent: Intent, user: Any, data: dict[str, Any]) -> Intent:
    """Call the ``reconciliation.resolution`` service for ``verb`` with the form's data."""
    if verb == "release":
        return resolution.release_held(
            intent_id=intent.id,
            user=user,
            reason=data["reason"],
            accept_duplicate_risk=data["accept_duplicate_risk"],
            seen_seq=data["seen_seq"],
        )
    return resolution.reject_held(
        intent_id=intent.id, user=user, reason=data["reason"], seen_seq=data["seen_seq"]
    )


@require_POST
@console_role_required
@transaction.atomic  # an error while answering rolls the decision back (no 500 with a moved intent)
def held_resolve(request: HtmxHttpRequest, intent_id: uuid.UUID, verb: str) -> HttpResponse:
    """Release a HELD intent (a reason and the duplicate risk accepted) or reject it (a reason)
    through ``reconciliation.resolution``; refusals (no permission, no reason, risk not
    accepted, not HELD any more) are shown in place."""
    form_class = HELD_FORMS.get(verb)
    if form_class is None:
        raise Http404("unknown decision")
    intent = _intent(request, intent_id)
    form = form_class(request.POST)

    def refuse(message: str, status: int, *, audited: bool = False) -> HttpResponse:
        if not audited:  # the service audits its own refusals
            record_refusal(request, intent.id, f"{verb} held", message)
        context = held_context(request, _intent(request, intent_id), error=message, failed_verb=verb)
        context["forms"][verb] = form
        return page_or_partial(request, DETAIL, "decision", context, status=status)

    if not can_resolve(request.user, intent.tenant):
        return refuse("Only operators and admins can release or reject held intents.", 403)
    if not form.is_valid():
        return refuse(first_error(form), 422)
    try:
        decided = _decide(verb, intent, request.user, form.cleaned_data)
    except (ResolutionRefused, IntentMoved) as exc:
        return refuse(exc.detail, exc.status, audited=True)
    done = f"{'Released' if verb == 'release' else 'Rejected'}. The intent is {decided.status}."
    if request.htmx:
        return page_or_partial(
            request, DETAIL, "decision", held_context(request, _intent(request, intent_id), success=done)
        )
    messages.success(request, done)
    return redirect("intent-detail", intent_id=decided.id)
