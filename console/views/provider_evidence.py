"""Provider evidence in the console (issue 19): the findings operators work (an orphan event, an
effect extra at the provider, an intent missing there, an amount mismatch), statement runs, and
a statement's CSV upload with its source's saved column mapping."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from console.permissions import console_role_required, every_tenant_only, on_every_tenant, reader_scope
from console.views.common import HtmxHttpRequest, page_or_partial
from operations.access.tenants import role_scope
from operations.adapters.registry import evidence_sources
from operations.exceptions import ResolutionRefused
from reconciliation.decision_checks import RESOLVER_GROUPS
from reconciliation.finding_compensation import compensation_action_for
from reconciliation.findings import VERBS, can_work, resolve_provider_finding
from reconciliation.models import ProviderFinding
from reconciliation.provider_selectors import (
    provider_finding,
    provider_findings,
    statement_runs,
    statement_uploads_active,
)
from reconciliation.statement_csv import (
    DEFAULT_COLUMNS,
    FIELDS,
    MAX_UPLOAD_BYTES,
    StatementFileError,
    mapping_of,
    save_mapping,
)
from reconciliation.statement_sources import StatementRefused, api_sources, statement_day
from reconciliation.statement_uploads import statement_upload_accept

DETAIL = "console/provider_finding.html"
STATEMENTS = "console/statements.html"


def _finding(request: HtmxHttpRequest, finding_id: int) -> ProviderFinding:
    """The finding if the user may read it (its intent's tenant; one without an intent on every
    tenant only); else 404, as for one that does not exist."""
    finding = provider_finding(finding_id, scope=reader_scope(request.user))
    if finding is None:
        raise Http404("no such provider finding")
    return finding


@require_GET
@console_role_required
def provider_findings_list(request: HtmxHttpRequest) -> HttpResponse:
    """Findings newest first, filtered by ``state`` (default open) and ``kind``."""
    state = request.GET.get("state", "open")
    kind = request.GET.get("kind", "")
    state = state if state in ProviderFinding.State.values or state == "all" else "open"
    kind = kind if kind in ProviderFinding.Kind.values else ""
    rows = provider_findings(
        scope=reader_scope(request.user), state="" if state == "all" else state, kind=kind
    )
    context = {
        "rows": list(rows),
        "state": state,
        "kind": kind,
        "states": [*ProviderFinding.State.choices, ("all", "All")],
        "kinds": ProviderFinding.Kind.choices,
        "section": "findings",
    }
    return page_or_partial(request, "console/provider_findings.html", "findings", context)


def finding_context(request: HtmxHttpRequest, finding: ProviderFinding, **extra: Any) -> dict[str, Any]:
    """The finding, its intent's compensation action (None: compensate not offered), whether
    the user may work it, and what was posted (kept after a refusal)."""
    compensation_action = compensation_action_for(finding)
    context: dict[str, Any] = {
        "finding": finding,
        "intent": finding.intent,
        "linkable": finding.kind
        in (ProviderFinding.Kind.EXTRA_AT_PROVIDER, ProviderFinding.Kind.ORPHAN_EVENT),
        "compensation_action": compensation_action,
        "can_work": can_work(request.user, finding),  # type: ignore[arg-type]
        "posted": {},
        "section": "findings",
    }
    context.update(extra)
    return context


@require_GET
@console_role_required
def provider_finding_detail(request: HtmxHttpRequest, finding_id: int) -> HttpResponse:
    """One finding: the evidence (line, event, run), the intent, and the decision forms."""
    finding = _finding(request, finding_id)
    return page_or_partial(request, DETAIL, "decision", finding_context(request, finding))


@require_POST
@console_role_required
def provider_finding_resolve(request: HtmxHttpRequest, finding_id: int, verb: str) -> HttpResponse:
    """Link, compensate or close an open finding (``reconciliation.findings``, which checks the
    permission, the reason and the state under the row lock and audits the decision or its
    refusal); a refusal is shown in place and changes nothing."""
    if verb not in VERBS:
        raise Http404("unknown decision")
    _finding(request, finding_id)
    posted = {"reason": request.POST.get("reason", ""), "intent_id": request.POST.get("intent_id", "")}
    try:
        if any("\x00" in value for value in posted.values()):  # as Django's form fields refuse it
            raise ResolutionRefused("Null characters are not allowed.")
        resolve_provider_finding(
            finding_id=finding_id,
            user=request.user,  # type: ignore[arg-type]
            verb=verb,
            reason=posted["reason"][:2000],
            intent_id=posted["intent_id"][:100],
        )
    except ResolutionRefused as exc:
        status = 403 if "only operators" in exc.detail else 422
        context = finding_context(
            request, _finding(request, finding_id), error=exc.detail, failed_verb=verb, posted=posted
        )
        return page_or_partial(request, DETAIL, "decision", context, status=status)
    decided = _finding(request, finding_id)
    done = f"Decided: {verb}. The finding is {decided.get_state_display().lower()}."
    if request.htmx:
        return page_or_partial(request, DETAIL, "decision", finding_context(request, decided, success=done))
    messages.success(request, done)
    return redirect("provider-finding-detail", finding_id=decided.id)


def _may_upload(request: HtmxHttpRequest) -> bool:
    """Statements span tenants: uploads and mappings are for operators and admins of every tenant."""
    return role_scope(request.user, RESOLVER_GROUPS).every


def statements_context(request: HtmxHttpRequest, **extra: Any) -> dict[str, Any]:
    """The statements page: recent runs (with their upload's progress), the upload form and the
    column mapping form, both open on ``mapping_source`` (or ``?source=``; else the first
    source), so a refused upload shows the mapping of the source it was for (issue 39 item 6).
    A source without a saved mapping shows the default one (``DEFAULT_COLUMNS``)."""
    sources = sorted(evidence_sources())
    mapping_source = extra.pop("mapping_source", "") or request.GET.get("source", "")
    if mapping_source not in sources:  # an unknown or malformed ?source= shows the first
        mapping_source = sources[0] if sources else ""
    saved = mapping_of(mapping_source)
    mapping = saved if saved is not None else DEFAULT_COLUMNS
    context: dict[str, Any] = {
        "runs": list(statement_runs()),
        "active": statement_uploads_active(),
        "sources": sources,
        "api_sources": api_sources(),
        "mapping_source": mapping_source,
        "mapping_saved": saved is not None,
        "mapping_fields": [(field, mapping.get(field, "")) for field in FIELDS],
        "may_upload": _may_upload(request),
        "max_upload_bytes": MAX_UPLOAD_BYTES,
        "today": timezone.now().astimezone(dt.UTC).date(),  # the latest statement day
        "posted": {"source": mapping_source},
        "section": "statements",
    }
    context.update(extra)
    return context


@require_GET
@console_role_required
def statements_page(request: HtmxHttpRequest) -> HttpResponse:
    """Recent statement runs with their counts and their upload's progress, the CSV upload form
    and the column mappings. Runs span tenants: shown with a role on every tenant only. An htmx
    request gets the runs alone (``activity``), which refresh themselves while an upload is
    queued or importing."""
    if not on_every_tenant(request.user):
        return every_tenant_only(request, "The statements page")
    return page_or_partial(request, STATEMENTS, "activity", statements_context(request))


def _refuse(request: HtmxHttpRequest, message: str, status: int, **extra: Any) -> HttpResponse:
    return page_or_partial(
        request, STATEMENTS, "runs", statements_context(request, error=message, **extra), status=status
    )


@require_POST
@console_role_required
def statement_upload(request: HtmxHttpRequest) -> HttpResponse:
    """Check an uploaded CSV statement (source, date, file) and queue its import
    (``reconciliation.statement_uploads``); the answer does not wait for the import, whose
    progress the page shows. A bad file, a date not ``YYYY-MM-DD`` or after today (UTC), or a
    file uploaded before, is refused (its line and column named) and nothing is stored; the
    refusal shows the column mapping of the source it was for."""
    if not on_every_tenant(request.user):
        return every_tenant_only(request, "Statements")
    posted = {"source": request.POST.get("source", ""), "date": request.POST.get("date", "")}
    refused = {"posted": posted, "mapping_source": posted["source"]}
    if not _may_upload(request):
        return _refuse(
            request, "Only operators and admins of every tenant can upload statements.", 403, **refused
        )
    try:
        day = statement_day(posted["date"])  # YYYY-MM-DD, not after today (UTC)
    except ValueError as exc:
        return _refuse(request, f"{exc}.", 422, **refused)
    upload = request.FILES.get("file")
    if upload is None:
        return _refuse(request, "Choose the statement's CSV file.", 422, **refused)
    if upload.size is not None and upload.size > MAX_UPLOAD_BYTES:
        return _refuse(
            request,
            f"the file is too large: {upload.size} bytes, at most {MAX_UPLOAD_BYTES}",
            422,
            **refused,
        )
    try:
        accepted = statement_upload_accept(
            source=posted["source"],
            day=day,
            data=upload.read(MAX_UPLOAD_BYTES + 1),
            filename=upload.name or "",
            actor=f"user:{request.user.get_username()}",
        )
    except (StatementRefused, StatementFileError) as exc:
        return _refuse(request, str(exc), 422, **refused)
    done = (
        f"Accepted the statement of {accepted.source} for {accepted.statement_date}: "
        f"{accepted.total_lines} lines, imported in the background (progress below)."
    )
    if request.htmx:
        return page_or_partial(
            request, STATEMENTS, "runs", statements_context(request, success=done, **refused)
        )
    messages.success(request, done)
    return redirect(f"/statements/?source={accepted.source}")


@require_POST
@console_role_required
def statement_mapping(request: HtmxHttpRequest) -> HttpResponse:
    """Save a source's CSV column mapping (which header holds each statement field)."""
    if not on_every_tenant(request.user):
        return every_tenant_only(request, "Statements")
    source = request.POST.get("source", "")
    if not _may_upload(request):
        return _refuse(request, "Only operators and admins of every tenant can change column mappings.", 403)
    if source not in evidence_sources():
        return _refuse(request, f"unknown statement source {source[:60]!r}", 422)
    columns = {field: request.POST.get(field, "") for field in FIELDS}
    try:
        save_mapping(source=source, columns=columns, actor=f"user:{request.user.get_username()}")
    except StatementFileError as exc:
        return _refuse(request, str(exc), 422, mapping_source=source)
    done = f"Saved the column mapping of {source}."
    if request.htmx:
        return page_or_partial(
            request, STATEMENTS, "runs", statements_context(request, success=done, mapping_source=source)
        )
    messages.success(request, done)
    return redirect(f"/statements/?source={source}")
