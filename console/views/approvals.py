"""Approvals inbox and detail; approve and reject post the request_hash the page displayed."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.db import transaction
from django.db.models.fields.json import KeyTransform
from django.http import HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_GET, require_POST

from console.forms import ApprovalsFilterForm, ApproveForm, RejectForm, filters_of, first_error
from console.permissions import console_role_required, reader_scope
from console.presentation import payload_diff
from console.views.common import (
    HtmxHttpRequest,
    capped,
    list_query,
    page_or_partial,
    record_refusal,
    scoped_intent,
)
from console.views.rows import APPROVAL_COLUMNS, approval_rows
from operations import selectors
from operations.audit.request_integrity import stored_fingerprint, stored_request_problem
from operations.exceptions import ApprovalRefused, IntentMoved, ValidationFailed
from operations.idempotency import CanonicalizationError, canonical_json
from operations.models import Intent
from operations.policies.approval_validity import approval_validity
from operations.policies.rules import Policy
from operations.selectors.duplicate_risk import duplicate_risk_of, duplicate_risks
from operations.services import intent_approve, intent_preview, intent_reject

DETAIL = "console/approval_detail.html"
INBOX_LIMIT = 200


@require_GET
@console_role_required
def approvals_inbox(request: HtmxHttpRequest) -> HttpResponse:
    """What awaits a decision, highest risk and newest first (or as ``sort`` says), narrowed by
    the filters in the URL; htmx polls the rows with the same filters. A filter or sort that
    does not validate is named in a message (422) and left out."""
    form = ApprovalsFilterForm(request.GET or None)
    filters = selectors.ListFilters(**filters_of(form))
    inbox = selectors.approvals_inbox(scope=reader_scope(request.user), filters=filters)
    # Only the columns the rows print (the policy snapshot is read for one number).
    inbox = inbox.only(*APPROVAL_COLUMNS).annotate(
        approvals_required=KeyTransform("approvals_required", "policy")
    )
    intents, more = capped(inbox, INBOX_LIMIT)
    context = {
        # One query for every row's duplicate risk (a badge linking the other intents); each
        # row's cells computed once here, not by a filter per cell (issue 37).
        "rows": approval_rows(intents, duplicate_risks(intents)),
        "form": form,
        "query": list_query(request),
        "capped": {"limit": INBOX_LIMIT, "sections": ["intents awaiting a decision"] if more else []},
        "section": "approvals",
    }
    status = 422 if form.is_bound and not form.is_valid() else 200
    return page_or_partial(request, "console/approvals.html", "rows", context, status=status)


def detail_context(request: HtmxHttpRequest, intent: Intent, policy: Policy, **extra: Any) -> dict[str, Any]:
    """Everything the approval page shows: preview, canonical payload, hash, diff, approvals.

    ``policy`` is the intent's policy snapshot, parsed once by the caller
    (``Policy.from_snapshot(intent.policy)``: the policy that governs this intent, not the one
    in force now)."""
    context: dict[str, Any] = {"intent": intent, "policy": policy, "section": "approvals"}
    try:
        context["preview"] = intent_preview(
            tenant=intent.tenant,
            action=intent.action,
            arguments=intent.arguments,
            action_version=intent.action_version,
            reference=intent.reference,
            policy=policy,
        )
    except ValidationFailed as exc:
        context["preview_error"] = exc.detail
    try:
        context["canonical"] = canonical_json(stored_fingerprint(intent)).decode()
    except CanonicalizationError as exc:  # stored before numbers were checked (issue 11 item 3)
        context["canonical_error"] = str(exc)
    # The same check the approval service refuses with: the stored request re-hashed.
    context["integrity_problem"] = stored_request_problem(intent)
    previous = selectors.previous_with_reference(intent)
    context["previous"] = previous
    context["wait_note"] = selectors.wait_note(intent)  # back for a ceiling or a lapsed approval
    context["diff"] = payload_diff(previous.arguments, intent.arguments) if previous else []
    # The same question the approval service asks under its lock: approving may duplicate these.
    context["duplicate_risks"] = duplicate_risk_of(intent)
    context["approvals"] = list(intent.approvals.select_related("approver").order_by("created_at"))
    # The same answer the service enforces: approvals that count (unexpired, on this payload)
    # against those required, and why this user cannot decide (empty when they can).
    validity = approval_validity(
        intent,
        policy=policy,
        approver=request.user,  # type: ignore[arg-type]
        request_hash=intent.request_hash,
    )
    context["approvals_given"] = validity.given
    context["approvals_required"] = validity.required
    context["why_not"] = validity.reason
    context["approve_form"] = ApproveForm(initial={"request_hash": intent.request_hash})
    context["reject_form"] = RejectForm(initial={"request_hash": intent.request_hash})
    context.update(extra)
    return context


@require_GET
@console_role_required
def approval_detail(request: HtmxHttpRequest, intent_id: uuid.UUID) -> HttpResponse:
    """The preview, the full canonical payload and its request_hash, and the decision forms."""
    intent = scoped_intent(request, intent_id)
    policy = Policy.from_snapshot(intent.policy)
    return page_or_partial(request, DETAIL, "decision", detail_context(request, intent, policy))


def _decide(request: HtmxHttpRequest, intent_id: uuid.UUID, *, approve: bool) -> HttpResponse:
    intent = scoped_intent(request, intent_id)
    # Parsed once for the whole request and handed to every step (issue 34 item 4): the
    # snapshot is fixed at submission, so the locked row the service reads holds the same one.
    policy = Policy.from_snapshot(intent.policy)
    form = (ApproveForm if approve else RejectForm)(request.POST)
    if not form.is_valid():
        record_refusal(request, intent.id, "approve" if approve else "reject", first_error(form))
        # "The payload changed" only for a well-formed hash that is not the current one; a
        # missing or malformed hash is the form's own error.
        stale = "request_hash" not in form.errors and request.POST.get("request_hash") != intent.request_hash
        context = detail_context(request, intent, policy, error=first_error(form), stale=stale)
        return page_or_partial(request, DETAIL, "decision", context, status=422)
    try:
        if isinstance(form, ApproveForm):
            decided = intent_approve(
                intent_id=intent.id,
                user=request.user,  # type: ignore[arg-type]
                request_hash=form.cleaned_data["request_hash"],
                reason=form.cleaned_data["reason"],
                accepted_duplicates=form.accepted_duplicates(),
                policy=policy,
            )
        else:
            decided = intent_reject(
                intent_id=intent.id,
                user=request.user,  # type: ignore[arg-type]
                request_hash=form.cleaned_data["request_hash"],
                reason=form.cleaned_data["reason"],
                policy=policy,
            )
    except (ApprovalRefused, IntentMoved) as exc:
        intent.refresh_from_db()
        # A refusal must never hand back forms carrying a hash the operator has not reviewed.
        stale = form.cleaned_data["request_hash"] != intent.request_hash
        context = detail_context(request, intent, policy, error=exc.detail, stale=stale)
        return page_or_partial(request, DETAIL, "decision", context, status=exc.status)
    if decided.status == Intent.Status.READY:
        done = "Approved. The intent is READY and its dispatch is queued in the outbox."
    elif decided.status == Intent.Status.AWAITING_APPROVAL:
        done = "Your approval is recorded. This intent needs another approver before it runs."
    else:
        done = f"Decision recorded. The intent is {decided.status}."
    if request.htmx:
        return page_or_partial(
            request, DETAIL, "decision", detail_context(request, decided, policy, success=done)
        )
    messages.success(request, done)
    return redirect("intent-detail", intent_id=decided.id)


@require_POST
@console_role_required
@transaction.atomic
def approval_approve(request: HtmxHttpRequest, intent_id: uuid.UUID) -> HttpResponse:
    """Approve the payload whose hash the page displayed (decision and dispatch commit together;
    the whole request is one transaction, so an error while answering leaves nothing changed)."""
    return _decide(request, intent_id, approve=True)


@require_POST
@console_role_required
@transaction.atomic
def approval_reject(request: HtmxHttpRequest, intent_id: uuid.UUID) -> HttpResponse:
    """Reject the intent (a reason is required)."""
    return _decide(request, intent_id, approve=False)
