"""An intent and its history: the ``Intent`` row, its ``Attempt``s and ``Outcome``s, and the
table of the moves its status may make (``ALLOWED_TRANSITIONS``).

An ``Intent`` changes state only through ``operations.services`` (one function per transition,
each a conditional UPDATE plus its ``AuditEvent``). ``Attempt`` rows are insert-only history.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.indexes import OpClass
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Upper

STATUS_VALUES = [
    "AWAITING_APPROVAL",
    "READY",
    "RUNNING",
    "SUCCEEDED",
    "FAILED",
    "UNKNOWN",
    "COMPENSATING",
    "COMPENSATED",
    "REJECTED",
    "EXPIRED",
    "CANCELLED",
    "HELD",
]

#: The states an intent passes through on its way to an end (``OPEN_STATUSES``): few rows at any
#: moment, so the dashboard and ``/metrics`` count them exactly, over the partial index
#: ``intent_open_status``. The others (``SETTLED_STATUS_VALUES``: SUCCEEDED and the terminal
#: states) grow with every intent ever made and are counted by the status rollup.
OPEN_STATUS_VALUES = ["AWAITING_APPROVAL", "READY", "RUNNING", "UNKNOWN", "COMPENSATING", "HELD"]
SETTLED_STATUS_VALUES = [status for status in STATUS_VALUES if status not in OPEN_STATUS_VALUES]


class Intent(models.Model):
    """One logical action a principal wants done, executed at most once at the provider."""

    class Status(models.TextChoices):
        AWAITING_APPROVAL = "AWAITING_APPROVAL", "Awaiting approval"
        READY = "READY", "Ready"
        RUNNING = "RUNNING", "Running"
        SUCCEEDED = "SUCCEEDED", "Succeeded"
        FAILED = "FAILED", "Failed"
        UNKNOWN = "UNKNOWN", "Unknown"
        COMPENSATING = "COMPENSATING", "Compensating"
        COMPENSATED = "COMPENSATED", "Compensated"
        REJECTED = "REJECTED", "Rejected"
        EXPIRED = "EXPIRED", "Expired"
        CANCELLED = "CANCELLED", "Cancelled"
        HELD = "HELD", "Held behind an earlier intent for the same business action"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.CharField(max_length=100)
    principal = models.CharField(max_length=200, help_text="agent:<name> or user:<username>")
    action = models.CharField(max_length=100)
    action_version = models.PositiveIntegerField(default=1)
    arguments = models.JSONField(help_text="canonical arguments; money in integer minor units")
    request_hash = models.CharField(
        max_length=64, help_text="sha256 hex of the canonical request fingerprint (fingerprint_version)"
    )
    forgotten_changes = models.BooleanField(
        default=False,
        db_default=False,
        help_text="a recovery found that a timeline the database forgot (a restore, a failover) changed this "
        "intent after the restore point (cancelled? approved? sent?): before it is sent, the restore guard looks "
        "it up and holds it for a person when nothing is found (issue 22)",
    )
    fingerprint_version = models.PositiveSmallIntegerField(
        default=2,
        db_default=2,
        help_text="what request_hash covers: 2 = {tenant, action, version, arguments, reference}; "
        "1 = the same without reference (intents submitted before migration 0014)",
    )
    client_key = models.CharField(max_length=255, help_text="the caller's Idempotency-Key")
    idempotency_key = models.CharField(max_length=200, unique=True, help_text="the key sent to the provider")
    reference = models.CharField(max_length=200, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True, help_text="stored, never hashed")
    policy = models.JSONField(help_text="the policy in force at submission")
    risk_rank = models.PositiveSmallIntegerField(default=0, help_text="1 low .. 4 critical, from the policy")
    status = models.CharField(max_length=20, choices=Status.choices)
    fence = models.BigIntegerField(default=0, help_text="incremented on every claim")
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    not_before = models.DateTimeField(null=True, blank=True, help_text="earliest next claim (backoff)")
    attempt_count = models.PositiveIntegerField(default=0)
    in_progress_waits = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text='attempts the provider answered "request in progress" and that were waited out with a '
        "same-key retry: they do not spend the attempt budget (attempts spent = attempt_count - this; "
        "operations.services.budget, issue 38)",
    )
    in_progress_since = models.DateTimeField(
        null=True,
        blank=True,
        help_text='when (database clock) the provider first answered "request in progress"; the policy\'s '
        "retry.in_progress_patience_seconds is measured from it, never reset",
    )
    approval_expires_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True, help_text="UNKNOWN handed to operators")
    lookup_count = models.PositiveIntegerField(default=0, help_text="reconciler lookups while UNKNOWN")
    next_lookup_at = models.DateTimeField(null=True, blank=True, help_text="earliest next reconciler lookup")
    next_duplicate_check_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="earliest next duplicate check (sent more than once to a provider without keys)",
    )
    duplicate_check_until = models.DateTimeField(
        null=True, blank=True, help_text="duplicate checks go on until the lookup's consistency window ends"
    )
    last_error = models.TextField(blank=True, default="")
    business_key = models.CharField(
        max_length=64,
        blank=True,
        default="",
        db_default="",
        help_text="sha256 of (tenant, action, business identity); blank when the intent names none",
    )
    held_behind = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="held_intents",
        help_text="the earlier intent for the same business action this one waits for",
    )
    hold_reason = models.TextField(
        blank=True,
        default="",
        db_default="",
        help_text="why a HELD intent waits for a person rather than for an earlier intent "
        "(e.g. its action version is no longer served); blank for a business-action hold",
    )
    wait_reason = models.CharField(
        max_length=20,
        blank=True,
        default="",
        db_default="",
        help_text="why an AWAITING_APPROVAL intent waits for a person: blank for its policy's approval, "
        "'ceiling' when a spend or effects ceiling was reached at claim, 'approval_lapsed' when its "
        "approval expired before a worker ran it (issue 18)",
    )
    ceiling_override = models.BooleanField(
        default=False,
        db_default=False,
        help_text="an approver let this one intent exceed its ceilings (after wait_reason 'ceiling')",
    )
    approval_round = models.PositiveSmallIntegerField(
        default=0,
        db_default=0,
        help_text="raised each time the intent goes back to its approvers (a ceiling, a lapsed approval): "
        "only decisions of the current round count",
    )
    compensates = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="compensations"
    )
    assigned_to = models.CharField(
        max_length=150,
        blank=True,
        default="",
        db_default="",
        help_text="username of the operator who said \"I'm on it\" for this item of the operators' queue "
        "(operations.services.assignment); blank when nobody is. Ends on any change of status",
    )
    assigned_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when assigned_to took it; the assignment lapses EFFECT_LEDGER_ASSIGNMENT_SECONDS later",
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="the console user who asked (a user:<username> principal); four eyes compares this "
        "id, since a username can change. Null for agents and the system",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "principal", "client_key"], name="intent_client_key_unique"
            ),
            models.CheckConstraint(condition=Q(fence__gte=0), name="intent_fence_non_negative"),
            models.CheckConstraint(
                condition=Q(status__in=STATUS_VALUES),
                name="intent_status_valid",
            ),
            models.CheckConstraint(
                condition=Q(fingerprint_version__in=[1, 2]), name="intent_fingerprint_version_known"
            ),
            # An in-progress wait is an attempt made (claimed) that did not spend the budget.
            models.CheckConstraint(
                condition=Q(in_progress_waits__lte=F("attempt_count")),
                name="intent_in_progress_waits_within_attempts",
            ),
        ]
        indexes = [
            # The queues workers and reconcilers poll, each a partial index.
            models.Index(fields=["not_before"], condition=Q(status="READY"), name="intent_ready_q"),
            models.Index(
                fields=["lease_expires_at"], condition=Q(status="RUNNING"), name="intent_running_lease_q"
            ),
            models.Index(fields=["next_lookup_at"], condition=Q(status="UNKNOWN"), name="intent_unknown_q"),
            models.Index(fields=["updated_at"], condition=Q(status="UNKNOWN"), name="intent_unknown_age"),
            models.Index(
                fields=["next_duplicate_check_at"],
                condition=Q(next_duplicate_check_at__isnull=False),
                name="intent_duplicate_check_q",
            ),
            models.Index(
                fields=["approval_expires_at"],
                condition=Q(status="AWAITING_APPROVAL"),
                name="intent_awaiting_q",
            ),
            models.Index(fields=["status", "-created_at", "id"], name="intent_status_created"),
            # The approvals inbox: highest risk, then newest, as a top-N index scan.
            models.Index(
                fields=["-risk_rank", "-created_at", "id"],
                condition=Q(status="AWAITING_APPROVAL"),
                name="intent_approvals_inbox",
            ),
            models.Index(fields=["tenant", "reference"], name="intent_reference"),
            # One open intent per business action: the guard at submission looks here.
            models.Index(
                fields=["business_key", "created_at"],
                condition=~Q(business_key=""),
                name="intent_business_key",
            ),
            models.Index(fields=["created_at"], condition=Q(status="HELD"), name="intent_held_q"),
            # The console's search by reference has no tenant: (tenant, reference) cannot serve it.
            models.Index(fields=["reference"], name="intent_reference_any_tenant"),
            # The console's lists match a reference in any case, whole or by its start
            # (``UPPER(reference) = 'X'`` / ``LIKE 'X%'``): text_pattern_ops makes the prefix a
            # range of the index whatever the database's collation (issue 16 item 3).
            models.Index(OpClass(Upper("reference"), name="text_pattern_ops"), name="intent_reference_upper"),
            models.Index(fields=["-created_at", "id"], name="intent_created"),
            # Exact counts of the open states for the dashboard and /metrics, as one index-only
            # scan of the few open rows (the settled ones are the status rollup's).
            models.Index(
                fields=["status"], condition=Q(status__in=OPEN_STATUS_VALUES), name="intent_open_status"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.id} [{self.status}]"


class Attempt(models.Model):
    """One try to execute an intent under one lease (insert-only, then finished once)."""

    class Result(models.TextChoices):
        PENDING = "pending", "Pending"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed"
        RETRY = "retry", "Retry scheduled"
        UNKNOWN = "unknown", "Unknown"
        ABANDONED = "abandoned", "Abandoned (lease expired)"
        FENCED_OUT = "fenced_out", "Fenced out (a newer attempt took over; its write was refused)"
        SKIPPED = "skipped", "Not sent (re-check refused)"

    intent = models.ForeignKey(Intent, on_delete=models.PROTECT, related_name="attempts")
    attempt_no = models.PositiveIntegerField()
    fence = models.BigIntegerField()
    worker = models.CharField(max_length=200)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.CharField(max_length=20, choices=Result.choices, default=Result.PENDING)
    error = models.TextField(blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["intent", "attempt_no"], name="attempt_no_unique"),
            models.UniqueConstraint(fields=["intent", "fence"], name="attempt_fence_unique"),
        ]
        indexes = [
            # The health page's provider call statistics read the last hour of attempts as a
            # range scan of this index (operations.selectors.provider_calls.provider_call_stats).
            models.Index(fields=["started_at"], name="attempt_started"),
        ]


class Outcome(models.Model):
    """Evidence that an intent's effect exists (or was compensated), and where it came from."""

    class Source(models.TextChoices):
        PROVIDER = "provider", "Provider"
        PROVIDER_EVENT = "provider_event", "Provider event"
        RECONCILER = "reconciler", "Reconciler"
        OPERATOR = "operator", "Operator"

    intent = models.ForeignKey(Intent, on_delete=models.PROTECT, related_name="outcomes")
    attempt = models.ForeignKey(Attempt, null=True, blank=True, on_delete=models.PROTECT)
    source = models.CharField(max_length=20, choices=Source.choices)
    provider_reference = models.CharField(max_length=200, blank=True, default="")
    response_digest = models.CharField(max_length=64, blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # The operators' queue lists the recent operator confirmations, newest first
            # (reconciliation.selectors.recently_unverified): the few operator outcomes, not
            # one per intent ever run (issue 37).
            models.Index(
                fields=["-created_at", "-id"], condition=Q(source="operator"), name="outcome_operator_recent"
            ),
        ]


S = Intent.Status

#: Every allowed (from, to) move of an intent. ``operations.services`` is the only writer and
#: consults this table before each compare-and-swap; anything else is ``InvalidTransition``.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    # AWAITING_APPROVAL / HELD / READY -> UNKNOWN: a recovery found that a timeline the database
    # forgot changed the intent after the restore point (approved and sent? cancelled?): nobody
    # knows whether its effect exists until a lookup says so (issue 22).
    S.AWAITING_APPROVAL: frozenset({S.READY, S.REJECTED, S.EXPIRED, S.CANCELLED, S.UNKNOWN}),
    # HELD: behind an earlier intent for the same business action; released when it ended
    # without effect (or by a person accepting the duplicate risk), rejected by a person.
    S.HELD: frozenset({S.READY, S.AWAITING_APPROVAL, S.REJECTED, S.CANCELLED, S.UNKNOWN}),
    # READY -> HELD: this deployment cannot run it (its action or version is not served); a
    # person decides (issue 21). Nothing was sent.
    # READY -> SUCCEEDED: a lookup still in flight when the intent was sent back to READY found
    # the effect before any worker re-sent it (evidence wins; issue 21 item 9).
    # READY -> AWAITING_APPROVAL: the claim would have passed a spend or effects ceiling; an
    # approver decides (issue 18). Nothing was claimed or sent.
    S.READY: frozenset({S.RUNNING, S.CANCELLED, S.HELD, S.SUCCEEDED, S.UNKNOWN, S.AWAITING_APPROVAL}),
    # RUNNING -> HELD: the re-check right before the provider call found that the stored
    # request no longer hashes to its request_hash (issue 11 item 2); nothing was sent and a
    # person decides.
    # RUNNING -> AWAITING_APPROVAL: the approval lapsed before a worker ran the intent (C22);
    # nothing was sent and the approvers decide again.
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.READY, S.UNKNOWN, S.HELD, S.AWAITING_APPROVAL}),
    # UNKNOWN -> FAILED: an operator says "absent" for an intent that cannot be sent again
    # (attempt budget spent, action or version not served): it ends without effect (issue 21).
    S.UNKNOWN: frozenset({S.SUCCEEDED, S.READY, S.COMPENSATING, S.FAILED}),
    S.SUCCEEDED: frozenset({S.COMPENSATING}),
    # COMPENSATING -> SUCCEEDED: an operator keeps the effect after its compensation failed.
    S.COMPENSATING: frozenset({S.COMPENSATED, S.SUCCEEDED}),
    # FAILED / REJECTED / EXPIRED / CANCELLED -> SUCCEEDED: the ledger said "no effect", and
    # later evidence (a found lookup, a provider's signed event, a statement line) proves the
    # provider has one (issue 38: ``operations.services.late_effect``). The only way out of
    # these states; nothing is ever sent from them.
    S.FAILED: frozenset({S.SUCCEEDED}),
    S.COMPENSATED: frozenset(),
    S.REJECTED: frozenset({S.SUCCEEDED}),
    S.EXPIRED: frozenset({S.SUCCEEDED}),
    S.CANCELLED: frozenset({S.SUCCEEDED}),
}

#: The states an intent ends in: nothing is ever sent from them, and an agent waiting on the
#: intent stops there. Only late evidence of an effect (issue 38) moves one of those that
#: ended without effect to SUCCEEDED.
TERMINAL_STATUSES = frozenset({S.FAILED, S.COMPENSATED, S.REJECTED, S.EXPIRED, S.CANCELLED})

#: States in which an intent may still cause (or be) an effect: a second intent for the same
#: business action waits (HELD) while one of these exists (issue "One business action").
OPEN_STATUSES = frozenset(S(status) for status in OPEN_STATUS_VALUES)

#: Terminal states in which the intent left no effect at the provider (by its own account): a
#: compensation that ends here undid nothing, and an intent that ends here needs no duplicate check.
ENDED_WITHOUT_EFFECT = frozenset({S.FAILED, S.REJECTED, S.EXPIRED, S.CANCELLED})
