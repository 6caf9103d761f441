"""The audit log: filters, CSV export, and the hash chains' verification status."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import Any

from django.core.cache import cache
from django.http import HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.utils import timezone
from django.views.decorators.http import require_GET

from console.forms import AuditFilterForm
from console.permissions import console_role_required, every_tenant_only, on_every_tenant, reader_scope
from console.views.common import HtmxHttpRequest, keyset_page, page_or_partial
from operations import selectors
from operations.api.support import PROBLEM_CONTENT_TYPE, problem
from operations.audit.chain_checks import audit_verify, export_line
from operations.audit.keys import AuditKeyError, public_key_load
from operations.audit.verification import checkpoint_verify
from operations.models import AuditCheckpoint, AuditEvent

VERIFY_CACHE_KEY = "console:audit-verify"
VERIFY_CACHE_SECONDS = 60
VERIFY_MAX_BREAKS = 50
CSV_COLUMNS = [
    "id",
    "intent_id",
    "seq",
    "created_at",
    "event",
    "from_status",
    "to_status",
    "actor",
    "reason",
    "data",
    "prev_hash",
    "hash",
    "verified",
]
# A spreadsheet runs a cell that starts with one of these as a formula (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _filters(form: AuditFilterForm) -> selectors.AuditFilters:
    if not form.is_valid():
        return selectors.AuditFilters()
    return selectors.AuditFilters(**{k: v for k, v in form.cleaned_data.items() if v})


@require_GET
@console_role_required
def audit_log(request: HtmxHttpRequest) -> HttpResponse:
    """Audit events newest first, filtered, one keyset page at a time."""
    form = AuditFilterForm(request.GET or None)
    page = keyset_page(request, selectors.audit_search, _filters(form))
    query = request.GET.copy()
    query.pop("cursor", None)
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "section": "audit",
        "can_verify": on_every_tenant(request.user),
    }
    status = 422 if form.is_bound and not form.is_valid() else 200
    return page_or_partial(request, "console/audit.html", "results", context, status=status)


class _Echo:
    def write(self, value: str) -> str:
        return value


def _verified(data: Any) -> str:
    """``true`` / ``false`` for an event that says whether the provider verified the outcome
    (``outcome_found`` after an operator's confirmation), blank for every other event."""
    value = data.get("verified") if isinstance(data, dict) else None
    return "" if value is None else str(bool(value)).lower()


def neutralised(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: a string starting with ``=``, ``+``, ``-``, ``@``,
    tab or carriage return gets a leading single quote (the OWASP "CSV Injection" rule), so
    ``=HYPERLINK(...)`` in a reason is not run as a formula. Other values are returned as they
    are. The raw value stays in the database, whose hashes ``verify_audit`` checks; in an export,
    a cell that starts with a quote and then one of those characters had that one quote added."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def _csv_rows(events: Any) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for event in events.iterator(chunk_size=2000):
        yield writer.writerow(
            neutralised(cell)
            for cell in [
                event.id,
                event.intent_id or "",
                event.seq,
                event.created_at.isoformat(),
                event.event,
                event.from_status,
                event.to_status,
                event.actor,
                event.reason,
                json.dumps(event.data, sort_keys=True),
                event.prev_hash,
                event.hash,
                _verified(event.data),
            ]
        )


def _jsonl_rows(events: Any) -> Iterator[str]:
    for event in events.iterator(chunk_size=2000):
        yield export_line(event) + "\n"


def _export(request: HtmxHttpRequest, rows: Any, content_type: str, extension: str) -> HttpResponseBase:
    """Stream the events matching the request's filters through ``rows``, or answer 400
    ``application/problem+json`` (RFC 9457) naming the invalid fields: ignoring a filter the
    caller asked for would export more than meant."""
    form = AuditFilterForm(request.GET or None)
    if form.is_bound and not form.is_valid():
        body = problem(
            400,
            "Invalid audit filter",
            "the export was not made: correct the filters and ask again",
            "invalid_filter",
            errors=[
                {"field": name, "message": item["message"]}
                for name, items in form.errors.get_json_data().items()
                for item in items
            ],
        )
        return JsonResponse(body, status=400, content_type=PROBLEM_CONTENT_TYPE)
    events = selectors.audit_queryset(_filters(form), scope=reader_scope(request.user))
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response = StreamingHttpResponse(rows(events), content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.{extension}"'
    return response


@require_GET
@console_role_required
def audit_export(request: HtmxHttpRequest) -> HttpResponseBase:
    """The filtered audit log as CSV, streamed (every matching row, newest first). The ``data``
    column holds each event's data as JSON; ``verified`` repeats its ``verified`` flag so an
    operator's unverified confirmation stands out in a spreadsheet. Cells that would start a
    spreadsheet formula are neutralised (``neutralised``); ``audit_export_jsonl`` carries the
    raw values. An invalid filter answers 400 (``_export``).
    """
    return _export(request, _csv_rows, "text/csv; charset=utf-8", "csv")


@require_GET
@console_role_required
def audit_export_jsonl(request: HtmxHttpRequest) -> HttpResponseBase:
    """The filtered audit log as JSON Lines (one ``operations.audit.chain_checks.export_line`` record per
    event, newest first): the raw values exactly as hashed, which ``manage.py
    verify_audit_export`` re-checks away from the database (shared/cases C12). An invalid
    filter answers 400 (``_export``)."""
    return _export(request, _jsonl_rows, "application/jsonl; charset=utf-8", "jsonl")


def _checkpoint_status() -> dict[str, Any]:
    """The latest checkpoint's verification: ``{"exists", "ok", "number", "created_at", "chains",
    "events", "faults" (at most VERIFY_MAX_BREAKS), "omitted", "rebaselines", "error"}``; ``error`` says why it
    could not be checked (no public key)."""
    if not AuditCheckpoint.objects.exists():
        return {"exists": False, "ok": False}
    try:
        report = checkpoint_verify(public_key=public_key_load(), limit=VERIFY_MAX_BREAKS)
    except AuditKeyError as exc:
        return {"exists": True, "ok": False, "error": str(exc)}
    statement = report.checkpoint.statement if report.checkpoint else {}
    return {
        "exists": True,
        "ok": report.ok,
        "number": statement.get("number"),
        "created_at": statement.get("created_at"),
        "chains": statement.get("chains"),
        "events": statement.get("events"),
        "faults": report.faults,
        "omitted": report.omitted,
        "rebaselines": [
            {
                "number": number,
                "faults": len(accepted.get("faults", [])) + int(accepted.get("omitted", 0)),
                "reason": accepted.get("reason", ""),
            }
            for number, accepted in report.accepted
        ],
    }


def verification_status(*, refresh: bool = False) -> dict[str, Any]:
    """Walk every chain with ``operations.audit.chain_checks.audit_verify`` and check the log against the
    latest signed checkpoint (cached for a minute, since it reads the whole table):
    ``{"ok", "breaks", "events", "checked_at", "checkpoint"}`` (see ``_checkpoint_status``)."""
    result: dict[str, Any] | None = None if refresh else cache.get(VERIFY_CACHE_KEY)
    if result is None:
        breaks = []
        for chain_break in audit_verify():
            breaks.append(chain_break)
            if len(breaks) >= VERIFY_MAX_BREAKS:
                break
        result = {
            "ok": not breaks,
            "breaks": breaks,
            "events": AuditEvent.objects.count(),
            "checked_at": timezone.now(),
            "checkpoint": _checkpoint_status(),
        }
        cache.set(VERIFY_CACHE_KEY, result, VERIFY_CACHE_SECONDS)
    return result


@require_GET
@console_role_required
def audit_verify_view(request: HtmxHttpRequest) -> HttpResponse:
    """The chain verification result (loaded by htmx after the audit page, or on its own).

    It walks every tenant's chains and the checkpoint that signs them all, so it names counts,
    chains and breaks of every tenant: shown to a role on every tenant only (issue 18 item 5)."""
    if not on_every_tenant(request.user):
        return every_tenant_only(request, "The audit chains' verification")
    context = {"verification": verification_status(refresh="refresh" in request.GET), "section": "audit"}
    return page_or_partial(request, "console/audit_verify.html", "verification", context)
