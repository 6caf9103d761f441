"""A duplicate finding (an extra effect at a provider without keys) and the operator's
decision on it: ``acknowledge`` or ``compensate``."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from console.forms import FindingDecisionForm, first_error
from console.permissions import can_resolve, console_role_required, reader_scope
from console.views.common import HtmxHttpRequest, page_or_partial, record_refusal
from operations.adapters.registry import ActionUnavailable, capabilities_for
from operations.exceptions import IntentMoved, ResolutionRefused
from reconciliation.models import DuplicateFinding
from reconciliation.resolution import resolve_duplicate_finding
from reconciliation.selectors import duplicate_finding

DETAIL = "console/duplicate_detail.html"
VERBS = ("acknowledge", "compensate")


def _finding(request: HtmxHttpRequest, finding_id: int) -> DuplicateFinding:
    """The finding if its intent belongs to a tenant the user may read; else 404, the same
    answer as for a finding that does not exist (issue 18 item 5)."""
    finding = duplicate_finding(finding_id, scope=reader_scope(request.user))
    if finding is None:
        raise Http404("no such duplicate finding")
    return finding


def finding_context(request: HtmxHttpRequest, finding: DuplicateFinding, **extra: Any) -> dict[str, Any]:
    """The finding, its intent, the intent's compensation action (None: compensate is not
    offered) and the two forms."""
    try:
        compensation_action = capabilities_for(finding.intent.action).compensation_action
    except ActionUnavailable:
        compensation_action = None
    context: dict[str, Any] = {
        "finding": finding,
        "intent": finding.intent,
        "compensation_action": compensation_action,
        "can_resolve": can_resolve(request.user, finding.intent.tenant),
        "forms": {verb: FindingDecisionForm() for verb in VERBS},
        "section": "unknown",
    }
    context.update(extra)
    return context


@require_GET
@console_role_required
def duplicate_detail(request: HtmxHttpRequest, finding_id: int) -> HttpResponse:
    """The extra and the kept reference, the finding's state and note, and the decision forms."""
    finding = _finding(request, finding_id)
    return page_or_partial(request, DETAIL, "decision", finding_context(request, finding))


@require_POST
@console_role_required
@transaction.atomic  # an error while answering rolls the decision back (no 500 with a moved intent)
def duplicate_resolve(request: HtmxHttpRequest, finding_id: int, verb: str) -> HttpResponse:
    """Decide on an open finding through ``reconciliation.resolution.resolve_duplicate_finding``
    (a reason is required); refusals (no permission, not open any more, no compensation for
    the action) are shown in place."""
    if verb not in VERBS:
        raise Http404("unknown decision")
    finding = _finding(request, finding_id)
    form = FindingDecisionForm(request.POST)

    def refuse(message: str, status: int, *, audited: bool = False) -> HttpResponse:
        if not audited:  # the service audits its own refusals
            record_refusal(request, finding.intent_id, f"decide duplicate {verb}", message)
        context = finding_context(request, _finding(request, finding_id), error=message, failed_verb=verb)
        context["forms"][verb] = form
        return page_or_partial(request, DETAIL, "decision", context, status=status)

    if not can_resolve(request.user, finding.intent.tenant):
        return refuse("Only operators and admins can decide on duplicate findings.", 403)
    if not form.is_valid():
        return refuse(first_error(form), 422)
    try:
        resolve_duplicate_finding(
            finding_id=finding.id,
            user=request.user,  # type: ignore[arg-type]
            verb=verb,
            reason=form.cleaned_data["reason"],
        )
    except (ResolutionRefused, IntentMoved) as exc:
        return refuse(exc.detail, exc.status, audited=True)
    decided = _finding(request, finding_id)
    done = f"Decided: {verb}. The finding is {decided.get_state_display().lower()}."
    if request.htmx:
        return page_or_partial(request, DETAIL, "decision", finding_context(request, decided, success=done))
    messages.success(request, done)
    return redirect("duplicate-detail", finding_id=decided.id)
