"""The operators' queue (UNKNOWN intents, held intents, compensations that need a decision,
duplicate findings, unverified confirmations), the evidence page and the operator's
resolutions."""

from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.contrib import messages
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from console.forms import (
    ReasonForm,
    ResolveAbsentForm,
    ResolveCompensateForm,
    ResolveConfirmedForm,
    UnknownFilterForm,
    filters_of,
    first_error,
)
from console.permissions import can_resolve, console_role_required, reader_scope
from console.views.assignment import assignment_context
from console.views.common import (
    HtmxHttpRequest,
    capped,
    list_query,
    page_or_partial,
    record_refusal,
    scoped_intent,
)
from console.views.rows import UNKNOWN_COLUMNS, unknown_rows
from operations import selectors, services
from operations.adapters.registry import ActionUnavailable, capabilities_for, serving_problem
from operations.exceptions import IntentMoved, ResolutionRefused
from operations.models import Intent
from reconciliation import resolution
from reconciliation import selectors as queue
from reconciliation.decision_checks import inapplicable_verbs
from reconciliation.lookup_groups import group_lookups, lookup_tally
from reconciliation.models import Evidence
from reconciliation.timeline import intent_timeline

DETAIL = "console/unknown_detail.html"
#: The partial every action on the page answers with: the whole page under its back link, so a
#: decision updates the header, the summary and the evidence with the resolution (issue 39
#: item 4), and a refusal shows the intent as it is now.
PAGE = "page"
QUEUE_LIMIT = 200
#: Resolutions of an UNKNOWN intent.
UNKNOWN_FORMS: dict[str, type[forms.Form]] = {
    "confirmed": ResolveConfirmedForm,
    "absent": ResolveAbsentForm,
    "compensate": ResolveCompensateForm,
}
#: Decisions on an escalated COMPENSATING intent (its compensation ended without effect).
COMPENSATION_FORMS: dict[str, type[forms.Form]] = {
    "reopen": ReasonForm,
    "compensated": ReasonForm,
    "kept": ReasonForm,
}
RESOLUTION_FORMS = {**UNKNOWN_FORMS, **COMPENSATION_FORMS}
#: (verb, title, what it does, button) for the escalated-compensation forms.
COMPENSATION_CHOICES = [
    (
        "reopen",
        "Reopen",
        "Open a new compensation intent (its own key) for the same effect.",
        "Reopen the compensation",
    ),
    (
        "compensated",
        "Compensated",
        "The effect was undone outside the ledger. The intent becomes COMPENSATED.",
        "Settle as compensated",
    ),
    ("kept", "Kept", "The effect stands. The intent becomes SUCCEEDED.", "Settle as kept"),
]
LOOKUP_RESULTS = {
    "resolved": "the provider answered; the intent is resolved.",
    "retry": "the provider shows no effect; the intent is retried with the same key.",
    "waiting": "inconclusive; the intent stays UNKNOWN and the reconciler keeps looking.",
    "escalated": "inconclusive; the intent stays UNKNOWN and waits for an operator.",
    "moved": "the intent moved meanwhile; nothing was done.",
}


@require_GET
@console_role_required
def unknown_queue(request: HtmxHttpRequest) -> HttpResponse:
    """The operators' queue, oldest first in each section, with ages; htmx polls the sections.
    The UNKNOWN section is narrowed and sorted by the filters in the URL (kept by the polls); a
    filter or sort that does not validate is named in a message (422) and left out.

    Every section is read here, before rendering: a failed query is an error response (which
    the console marks stale), never an empty section."""
    scope = reader_scope(request.user)
    form = UnknownFilterForm(request.GET or None)  # the UNKNOWN section's filters and sort
    filters = selectors.ListFilters(**filters_of(form))
    sections = {
        # Only the columns its rows print (console.views.rows.unknown_rows).
        "intents": (
            "UNKNOWN intents",
            queue.unknown_queue(scope=scope, filters=filters).only(*UNKNOWN_COLUMNS),
        ),
        "held": ("held intents", queue.held_queue(scope=scope)),
        "compensations": ("compensations", queue.escalated_compensations(scope=scope)),
        "findings": ("duplicate findings", queue.open_duplicate_findings(scope=scope)),
        "unverified": ("unverified confirmations", queue.recently_unverified(scope=scope)),
    }
    context: dict[str, Any] = {"form": form, "query": list_query(request), "section": "unknown"}
    capped_sections = []
    for key, (label, rows) in sections.items():
        context[key], more = capped(rows, QUEUE_LIMIT)
        if more:
            capped_sections.append(label)
    context["capped"] = {"limit": QUEUE_LIMIT, "sections": capped_sections}
    # Each UNKNOWN row's cells computed once here, not by a filter per cell (issue 37).
    context["intents"] = unknown_rows(context["intents"])
    status = 422 if form.is_bound and not form.is_valid() else 200
    return page_or_partial(request, "console/unknown.html", "rows", context, status=status)


def detail_context(request: HtmxHttpRequest, intent: Intent, **extra: Any) -> dict[str, Any]:
    """Every piece of evidence about ``intent`` (its lookups grouped: ``reconciliation.lookup_groups``),
    its compensations, the resolution form and the resolutions that cannot apply, with why."""
    evidence = queue.intent_evidence(intent)
    try:
        capabilities = capabilities_for(intent.action)
    except ActionUnavailable:
        capabilities = None
    lookup_groups = group_lookups([row for row in evidence if row.kind == Evidence.Kind.LOOKUP])
    unknown = intent.status == Intent.Status.UNKNOWN
    context: dict[str, Any] = {
        "intent": intent,
        "section": "unknown",
        "attempts": selectors.attempts_with_timings(intent),
        "outcomes": selectors.intent_outcomes(intent),
        "unverified": queue.unverified_outcome(intent),
        "compensations": queue.compensations_of(intent),
        # Consecutive alike lookups as one group that opens on each (issue 39 item 4).
        "lookup_groups": lookup_groups,
        "lookup_tally": lookup_tally(lookup_groups),
        "lookup_count": sum(group.count for group in lookup_groups),
        "duplicates": [row for row in evidence if row.kind == Evidence.Kind.DUPLICATE],
        "resolutions": [row for row in evidence if row.kind == Evidence.Kind.RESOLUTION],
        "audit_events": list(intent.audit_events.order_by("seq")),
        "timeline": intent_timeline(intent),
        "seen_seq": selectors.last_audit_seq(intent.id),
        "capabilities": capabilities,
        "needs_risk_ack": capabilities is not None and not capabilities.same_key_retry_safe,
        # Issue 21: why it cannot be sent again (then ``absent`` ends it FAILED), and why this
        # deployment cannot serve it, shown before anyone decides.
        "cannot_resend": services.resend_refusal(intent) if unknown else None,
        # The resolutions that cannot apply, with why: not offered, and refused if posted.
        "refused_verbs": inapplicable_verbs(intent) if unknown else {},
        "serving_problem": serving_problem(intent.action, intent.action_version),
        "can_resolve": can_resolve(request.user, intent.tenant),
        "forms": {verb: form_class() for verb, form_class in RESOLUTION_FORMS.items()},
        "compensation_choices": COMPENSATION_CHOICES,
        **assignment_context(intent),
    }
    context.update(extra)
    return context


@require_GET
@console_role_required
def unknown_detail(request: HtmxHttpRequest, intent_id: uuid.UUID) -> HttpResponse:
    """The evidence summary and the decision that fits the intent's state at the top (only the
    resolutions that can apply: ``reconciliation.decision_checks.inapplicable_verbs``), then
    attempts with fences and timings, provider answers, reconciler lookups (alike ones
    grouped), compensations, duplicates and the timeline. An htmx request gets the page's
    ``PAGE`` partial."""
    intent = scoped_intent(request, intent_id)
    return page_or_partial(request, DETAIL, PAGE, detail_context(request, intent))


def _resolve(verb: str, intent: Intent, user: Any, data: dict[str, Any]) -> Intent:
    """Call the ``reconciliation.resolution`` service for ``verb`` with the form's data."""
    if verb == "confirmed":
        return resolution.resolve_confirmed(
            intent_id=intent.id,
            user=user,
            provider_reference=data["provider_reference"],
            reason=data["reason"],
            accept_unverified=data["accept_unverified"],
            seen_seq=data["seen_seq"],
        )
    if verb == "absent":
        return resolution.resolve_absent(
            intent_id=intent.id,
            user=user,
            reason=data["reason"],
            accept_duplicate_risk=data["accept_duplicate_risk"],
            seen_seq=data["seen_seq"],
        )
    if verb == "compensate":
        return resolution.resolve_compensate(
            intent_id=intent.id,
            user=user,
            reason=data["reason"],
            provider_reference=data["provider_reference"],
            seen_seq=data["seen_seq"],
        )
    return resolution.resolve_failed_compensation(
        intent_id=intent.id, user=user, verb=verb, reason=data["reason"], seen_seq=data["seen_seq"]
    )


@require_POST
@console_role_required
@transaction.atomic  # no row lock is taken before ``confirmed``'s lookup: only its last step locks
def unknown_resolve(request: HtmxHttpRequest, intent_id: uuid.UUID, verb: str) -> HttpResponse:
    """Resolve an UNKNOWN intent as ``confirmed``, ``absent`` or ``compensate``, or decide on an
    escalated COMPENSATING intent: ``reopen``, ``compensated`` or ``kept`` (a reason is always
    required), through ``reconciliation.resolution``. An htmx post is answered with the whole
    page (``PAGE``), showing the intent's new state or the refusal with what was typed; one
    without JavaScript is redirected to the intent's page."""
    form_class = RESOLUTION_FORMS.get(verb)
    if form_class is None:
        raise Http404("unknown resolution")
    intent = scoped_intent(request, intent_id)
    form = form_class(request.POST)

    def refuse(message: str, status: int, *, audited: bool = False) -> HttpResponse:
        if not audited:  # the service audits its own refusals
            record_refusal(request, intent.id, f"resolve {verb}", message)
        intent.refresh_from_db()
        context = detail_context(request, intent, error=message, failed_verb=verb)
        context["forms"][verb] = form
        # What the operator typed stays in the form they retry from.
        context["posted"] = {name: request.POST.get(name, "") for name in ("reason", "provider_reference")}
        return page_or_partial(request, DETAIL, PAGE, context, status=status)

    if not can_resolve(request.user, intent.tenant):
        return refuse(
            "Only operators and admins can resolve UNKNOWN intents or decide on compensations.", 403
        )
    if not form.is_valid():
        return refuse(first_error(form), 422)
    try:
        resolved = _resolve(verb, intent, request.user, form.cleaned_data)
    except (ResolutionRefused, IntentMoved) as exc:
        return refuse(exc.detail, exc.status, audited=True)
    done = f"Resolved as {verb}. The intent is {resolved.status}."
    if request.htmx:
        return page_or_partial(request, DETAIL, PAGE, detail_context(request, resolved, success=done))
    messages.success(request, done)
    return redirect("intent-detail", intent_id=resolved.id)


@require_POST
@console_role_required
def unknown_lookup(request: HtmxHttpRequest, intent_id: uuid.UUID) -> HttpResponse:
    """Look an UNKNOWN intent up at its provider now (``reconciliation.resolution.lookup_now``)
    and show what came of it; refusals are shown in place. Not one transaction with its
    answer, unlike the decisions: the provider call must not run inside one, and what the
    lookup found is recorded in its own transaction, true whatever happens to the page."""
    intent = scoped_intent(request, intent_id)

    def answer(status: int = 200, **extra: Any) -> HttpResponse:
        intent.refresh_from_db()
        return page_or_partial(request, DETAIL, PAGE, detail_context(request, intent, **extra), status=status)

    if not can_resolve(request.user, intent.tenant):
        return answer(403, error="Only operators and admins can look an intent up.", failed_verb="look up")
    try:
        result = resolution.lookup_now(intent_id=intent.id, user=request.user)  # type: ignore[arg-type]
    except (ResolutionRefused, IntentMoved) as exc:
        return answer(exc.status, error=exc.detail, failed_verb="look up")
    done = f"Looked up now: {result} — {LOOKUP_RESULTS.get(result, '')}".rstrip(" —")
    if request.htmx:
        return answer(success=done, lookup_result=result)
    messages.success(request, done)
    return redirect("unknown-detail", intent_id=intent.id)
