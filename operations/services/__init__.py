"""Every write to the ledger: one function per state transition (see ``transitions``)."""

from __future__ import annotations

from operations.audit.trail import REFUSAL_EVENT
from operations.policies.approval_validity import user_principal
from operations.services.approvals import (
    intent_approve,
    intent_expire_approval,
    intent_reject,
)
from operations.services.assignment import (
    ASSIGNABLE,
    AssignmentRefused,
    assignment_active,
    assignment_seconds,
    intent_assign,
    refuse_if_assigned_elsewhere,
)
from operations.services.budget import resend_refusal
from operations.services.business import (
    business_key,
    intent_hold_for_a_person,
    intent_hold_unserved,
    intent_reject_held,
    intent_reject_likely_duplicate,
    intent_release_held,
    likely_duplicate_reason,
)
from operations.services.cancellation import intent_cancel
from operations.services.claims import Claim, intent_claim
from operations.services.compensation import (
    COMPENSATION_DEAD_ENDS,
    complete_compensated_original,
    intent_begin_compensation,
    intent_open_compensation,
    intent_reopen_compensation,
    intent_settle_compensation,
    next_compensation_generation,
    own_live_compensations,
)
from operations.services.duplicates import duplicate_check_updates
from operations.services.execution import (
    intent_hold_mismatch,
    intent_mark_unknown,
    intent_record_failure,
    intent_record_success,
    intent_schedule_retry,
)
from operations.services.health import (
    periodic_job_record,
    periodic_job_run,
    worker_heartbeat_record,
    worker_heartbeat_stopped,
)
from operations.services.late_effect import intent_found_after_ending
from operations.services.preview import PreviewResult, intent_preview
from operations.services.recovery import intent_redispatch, intent_take_over_lease
from operations.services.refusals import agent_record_refusal, intent_record_refusal, refusals_audited
from operations.services.resolution import (
    intent_end_absent,
    intent_escalate,
    intent_resolve_absent,
    intent_resolve_found,
)
from operations.services.schedules import (
    intent_end_duplicate_checks,
    intent_note_duplicate,
    intent_schedule_duplicate_check,
    intent_schedule_lookup,
    intents_claim_due_duplicate_checks,
    intents_claim_due_lookups,
)
from operations.services.status_rollup import status_rollup_refresh
from operations.services.submission import SubmitResult, intent_submit
from operations.services.transitions import check_allowed, transition
from operations.services.webhook_delivery import webhook_resend, webhooks_deliver_due
from operations.services.webhooks import agent_callback_clear, agent_callback_set

__all__ = [
    "agent_callback_clear",
    "agent_callback_set",
    "webhook_resend",
    "webhooks_deliver_due",
    "periodic_job_record",
    "periodic_job_run",
    "worker_heartbeat_record",
    "worker_heartbeat_stopped",
    "REFUSAL_EVENT",
    "ASSIGNABLE",
    "AssignmentRefused",
    "assignment_active",
    "assignment_seconds",
    "intent_assign",
    "refuse_if_assigned_elsewhere",
    "agent_record_refusal",
    "intent_record_refusal",
    "refusals_audited",
    "business_key",
    "likely_duplicate_reason",
    "intent_hold_for_a_person",
    "intent_reject_held",
    "intent_reject_likely_duplicate",
    "intent_release_held",
    "intent_end_duplicate_checks",
    "intent_note_duplicate",
    "intent_schedule_duplicate_check",
    "intent_schedule_lookup",
    "intents_claim_due_duplicate_checks",
    "intents_claim_due_lookups",
    "COMPENSATION_DEAD_ENDS",
    "duplicate_check_updates",
    "intent_reopen_compensation",
    "intent_settle_compensation",
    "next_compensation_generation",
    "own_live_compensations",
    "Claim",
    "SubmitResult",
    "check_allowed",
    "complete_compensated_original",
    "intent_begin_compensation",
    "intent_end_absent",
    "intent_hold_unserved",
    "intent_hold_mismatch",
    "resend_refusal",
    "intent_escalate",
    "intent_found_after_ending",
    "intent_open_compensation",
    "intent_resolve_absent",
    "intent_resolve_found",
    "intent_approve",
    "intent_cancel",
    "intent_claim",
    "intent_expire_approval",
    "intent_mark_unknown",
    "intent_preview",
    "PreviewResult",
    "intent_record_failure",
    "intent_record_success",
    "intent_redispatch",
    "intent_reject",
    "intent_schedule_retry",
    "intent_submit",
    "intent_take_over_lease",
    "status_rollup_refresh",
    "transition",
    "user_principal",
]
