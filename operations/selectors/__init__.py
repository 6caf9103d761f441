"""Every read of the ledger (no writes here), in one package: intents, the audit log, keyset
pagination and the gauges ``/metrics`` and the dashboard share. Reconciliation's own records
(evidence, findings, runs) are read in ``reconciliation.selectors``."""

from __future__ import annotations

from operations.selectors.audit import (
    AuditFilters,
    audit_queryset,
    audit_search,
    last_audit_seq,
    throughput_last_hour,
)
from operations.selectors.failover import ExecutionStatus, execution_status
from operations.selectors.gauges import (
    UNKNOWN_AGE_BUCKETS,
    held_age_buckets,
    ledger_gauges,
    unknown_age_buckets,
    unknown_by_age,
)
from operations.selectors.intents import (
    IntentFilters,
    approvals_inbox,
    approvals_waiting,
    attempts_with_timings,
    intent_get,
    intent_latest_outcome,
    intent_list,
    intent_outcomes,
    intent_search,
    intent_search_queryset,
    previous_with_reference,
    wait_note,
)
from operations.selectors.list_filters import (
    APPROVAL_DEFAULT_SORT,
    APPROVAL_SORTS,
    INTENT_DEFAULT_SORT,
    INTENT_SORTS,
    UNKNOWN_DEFAULT_SORT,
    UNKNOWN_SORTS,
    InvalidFilter,
    ListFilters,
    Sort,
    intent_id_range,
    intent_target,
    intents_filtered,
    principal_names,
    sort_choices,
    sorted_by,
)
from operations.selectors.pagination import PAGE_SIZE, InvalidCursor, Page, decode_cursor, encode_cursor
from operations.selectors.status_counts import StatusCount, StatusCounts, intent_status_counts

__all__ = [
    "APPROVAL_DEFAULT_SORT",
    "APPROVAL_SORTS",
    "INTENT_DEFAULT_SORT",
    "INTENT_SORTS",
    "UNKNOWN_DEFAULT_SORT",
    "UNKNOWN_SORTS",
    "InvalidFilter",
    "ListFilters",
    "Sort",
    "intent_id_range",
    "intent_target",
    "intents_filtered",
    "principal_names",
    "sort_choices",
    "sorted_by",
    "PAGE_SIZE",
    "ExecutionStatus",
    "execution_status",
    "UNKNOWN_AGE_BUCKETS",
    "AuditFilters",
    "IntentFilters",
    "Page",
    "approvals_inbox",
    "approvals_waiting",
    "attempts_with_timings",
    "audit_queryset",
    "audit_search",
    "last_audit_seq",
    "InvalidCursor",
    "decode_cursor",
    "encode_cursor",
    "held_age_buckets",
    "intent_get",
    "intent_latest_outcome",
    "intent_list",
    "intent_outcomes",
    "intent_search",
    "intent_search_queryset",
    "intent_status_counts",
    "StatusCount",
    "StatusCounts",
    "ledger_gauges",
    "previous_with_reference",
    "wait_note",
    "throughput_last_hour",
    "unknown_age_buckets",
    "unknown_by_age",
]
