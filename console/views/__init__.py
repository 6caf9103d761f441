"""Operator console views, one module per page family, plus ``/metrics``."""

from __future__ import annotations

from console.views.approvals import approval_approve, approval_detail, approval_reject, approvals_inbox
from console.views.archive import archived_intent_detail
from console.views.assignment import intent_assign_view
from console.views.audit import audit_export, audit_export_jsonl, audit_log, audit_verify_view
from console.views.auth import login_view
from console.views.dashboard import dashboard, metrics
from console.views.duplicates import duplicate_detail, duplicate_resolve
from console.views.health import health
from console.views.held import held_detail, held_resolve
from console.views.intents import intent_detail, intent_list
from console.views.provider_events import provider_event_inbox, provider_event_list
from console.views.provider_evidence import (
    provider_finding_detail,
    provider_finding_resolve,
    provider_findings_list,
    statement_mapping,
    statement_upload,
    statements_page,
)
from console.views.unknown import unknown_detail, unknown_lookup, unknown_queue, unknown_resolve
from console.views.webhooks import webhook_list, webhook_resend_view

__all__ = [
    "approval_approve",
    "approval_detail",
    "approval_reject",
    "approvals_inbox",
    "archived_intent_detail",
    "audit_export",
    "audit_export_jsonl",
    "audit_log",
    "audit_verify_view",
    "dashboard",
    "duplicate_detail",
    "duplicate_resolve",
    "health",
    "held_detail",
    "intent_assign_view",
    "held_resolve",
    "intent_detail",
    "intent_list",
    "login_view",
    "metrics",
    "provider_finding_detail",
    "provider_finding_resolve",
    "provider_findings_list",
    "statement_mapping",
    "statement_upload",
    "statements_page",
    "provider_event_inbox",
    "provider_event_list",
    "unknown_detail",
    "unknown_lookup",
    "unknown_queue",
    "unknown_resolve",
    "webhook_list",
    "webhook_resend_view",
]
