"""The ledger's tables.

An ``Intent`` changes state only through ``operations.services`` (one function per transition,
each a conditional UPDATE plus its ``AuditEvent``). ``Attempt`` and ``AuditEvent`` rows are
insert-only history.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.indexes import OpClass
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now, Upper

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
            # range scan of this index (operations.selectors.health.provider_call_stats).
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


class Approval(models.Model):
    """A human decision bound to (intent, request_hash), valid until ``expires_at``, used once."""

    class Decision(models.TextChoices):
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"

    intent = models.ForeignKey(Intent, on_delete=models.PROTECT, related_name="approvals")
    request_hash = models.CharField(max_length=64)
    approver = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    decision = models.CharField(max_length=10, choices=Decision.choices)
    reason = models.TextField(blank=True, default="")
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)
    round = models.PositiveSmallIntegerField(
        default=0, db_default=0, help_text="the intent's approval_round this decision belongs to"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # Four eyes: one decision per approver per intent and approval round.
            models.UniqueConstraint(fields=["intent", "approver", "round"], name="approval_one_per_approver"),
        ]


class SpendWindow(models.Model):
    """What the intents of one (tenant, action, currency) reserved in one calendar day (UTC).

    Ceilings are reservations against these rows (``operations.services.ceilings``): a claim adds
    its amount and one effect with one conditional ``UPDATE`` that refuses to pass the cap, so
    concurrent claims are counted one after the other under the row lock. ``currency`` is blank
    on the row that counts effects of every currency (``effects_per_day``).
    """

    tenant = models.CharField(max_length=100)
    action = models.CharField(max_length=100)
    currency = models.CharField(max_length=3, blank=True)
    day = models.DateField(help_text="the calendar day in UTC")
    spent_minor = models.BigIntegerField(default=0, help_text="minor units of currency reserved")
    effects = models.IntegerField(default=0, help_text="effects reserved (on the blank-currency row)")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "action", "currency", "day"], name="spend_window_key"),
            models.CheckConstraint(
                condition=Q(spent_minor__gte=0) & Q(effects__gte=0), name="spend_window_non_negative"
            ),
        ]


class Reservation(models.Model):
    """One intent's share of one ``SpendWindow``, held while its effect may exist and released
    (``released_at``) when it surely does not."""

    intent = models.ForeignKey(Intent, on_delete=models.PROTECT, related_name="reservations")
    tenant = models.CharField(max_length=100)
    action = models.CharField(max_length=100)
    currency = models.CharField(max_length=3, blank=True)
    day = models.DateField()
    spent_minor = models.BigIntegerField(default=0)
    effects = models.IntegerField(default=0)
    over_ceiling = models.BooleanField(default=False, help_text="taken past the cap with an approval")
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # An intent holds at most one share of a window at a time.
            models.UniqueConstraint(
                fields=["intent", "currency", "day"],
                condition=Q(released_at__isnull=True),
                name="reservation_one_open_per_window",
            ),
        ]
        indexes = [
            models.Index(fields=["intent"], condition=Q(released_at__isnull=True), name="reservation_open")
        ]


class OutboxMessage(models.Model):
    """A message written in the same transaction as a state change, handed to the broker after
    commit and acknowledged by the claim that consumes it (``operations.workers.outbox``).

    ``id`` is the message id and ``body`` the frozen, byte-identical payload on every re-send
    (shared/cases C08). ``due_at`` keeps a delay in the database: the relay publishes the row
    no earlier than ``operations.workers.delivery.MAX_COUNTDOWN_SECONDS`` before it (shared/cases C15).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    intent = models.ForeignKey(Intent, null=True, blank=True, on_delete=models.PROTECT, related_name="outbox")
    task = models.CharField(max_length=200)
    body = models.TextField(help_text="canonical JSON, frozen at write time")
    created_at = models.DateTimeField(auto_now_add=True)
    due_at = models.DateTimeField(
        db_default=Now(),
        help_text="when the message may be delivered: the intent's not_before, or the time it was written",
    )
    sent_at = models.DateTimeField(
        null=True, blank=True, help_text="when last handed to the broker (after commit, or by the relay)"
    )
    publish_count = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    acked_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="when a claim consumed it (or the relay found its intent no longer READY)",
    )

    class Meta:
        indexes = [
            # The relay's queue: rows never handed over, by due time.
            models.Index(
                fields=["due_at"],
                condition=Q(sent_at__isnull=True, acked_at__isnull=True),
                name="outbox_due_q",
            ),
            # Handed over, not yet consumed: the relay re-publishes those past the stalled bound.
            models.Index(
                fields=["sent_at"],
                condition=Q(sent_at__isnull=False, acked_at__isnull=True),
                name="outbox_unacked",
            ),
        ]


class AuditEvent(models.Model):
    """Append-only, hash-chained record of a transition (a PostgreSQL trigger refuses UPDATE and
    DELETE). Each intent's events form one chain: ``prev_hash`` is the previous event's ``hash``.
    """

    intent = models.ForeignKey(
        Intent, null=True, blank=True, on_delete=models.PROTECT, related_name="audit_events"
    )
    seq = models.PositiveIntegerField(help_text="1-based position in the intent's chain")
    event = models.CharField(max_length=50)
    from_status = models.CharField(max_length=20, blank=True, default="")
    to_status = models.CharField(max_length=20, blank=True, default="")
    actor = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [
            # Two writers can never fork one chain: the second insert of a seq fails.
            models.UniqueConstraint(fields=["intent", "seq"], name="audit_chain_seq_unique"),
        ]
        indexes = [
            models.Index(fields=["-created_at", "-id"], name="audit_created"),
            # The audit log filtered by actor, newest first (issue 16 item 3): one actor's
            # events as an index range in page order, however rare they are in the log.
            models.Index(fields=["actor", "-created_at", "-id"], name="audit_actor"),
        ]


class AuditCheckpoint(models.Model):
    """A signed checkpoint of the whole audit log (operations/audit/checkpoints.py): every chain's
    head (intent, last seq, last hash) at one moment, summarised by an RFC 9162 Merkle tree
    head and signed with Ed25519 by a key kept outside the database. Append-only like the
    events (a trigger refuses UPDATE, DELETE and TRUNCATE, migration 0013); checkpoints chain
    to each other through ``prev_hash`` and gap-free ``number``s.
    """

    number = models.PositiveBigIntegerField(unique=True, help_text="1-based position in the series")
    created_at = models.DateTimeField()
    chains = models.PositiveBigIntegerField(help_text="chains (intents) covered: the Merkle tree size")
    events = models.PositiveBigIntegerField(help_text="events covered: the sum of the heads' seqs")
    root = models.CharField(max_length=64, help_text="RFC 9162 Merkle tree hash of the heads, hex")
    prev_hash = models.CharField(max_length=64, help_text="sha256 of the previous checkpoint's statement")
    key_id = models.CharField(max_length=64, help_text="sha256 hex of the raw Ed25519 public key")
    signature = models.CharField(max_length=128, help_text="Ed25519 signature of the statement, hex")
    heads = models.BinaryField(help_text="zlib-compressed JSON [[intent_id, seq, hash], ...] in leaf order")
    accepted = models.JSONField(
        null=True,
        blank=True,
        help_text="faults an operator acknowledged to sign this checkpoint anyway (audit_checkpoint "
        "--accept-faults): {faults: [text], omitted: n, reason: text}; part of the signed statement",
    )


class Agent(models.Model):
    """A machine principal (an AI agent or program) authenticating with bearer tokens
    (``AgentToken``: only their sha256 is stored; two are valid at once during a rotation).

    Its reach (issue 18, item 6): it may submit only the actions its ``actions`` patterns match,
    and it reads, lists and cancels its own intents (``Scope.OWN``) or its whole tenant's
    (``Scope.TENANT``). It can never approve or resolve anything.
    """

    class Scope(models.TextChoices):
        OWN = "own", "Its own intents"
        TENANT = "tenant", "Every intent of its tenant"

    name = models.CharField(max_length=100)
    tenant = models.CharField(max_length=100)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    actions = models.JSONField(
        default=list,
        blank=True,
        help_text='action patterns it may submit and preview: "payments.*", "email.send", "*" '
        "(operations.access.scopes.action_allowed); empty: none",
    )
    scope = models.CharField(
        max_length=10,
        choices=Scope.choices,
        default=Scope.OWN,
        help_text="which intents it reads, lists and cancels: its own, or its whole tenant's",
    )
    callback_url = models.CharField(
        max_length=2000,
        blank=True,
        default="",
        db_default="",
        help_text="where signed webhooks of its intents' terminal states are POSTed "
        "(operations.notifications.callback_urls); blank: none",
    )
    callback_secret = models.CharField(
        max_length=100,
        blank=True,
        default="",
        db_default="",
        help_text="the Standard Webhooks signing secret (whsec_<base64>), made when a URL is first set; "
        "stored as is, since HMAC signing needs it",
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="agent_name_unique")]

    def __str__(self) -> str:
        return f"{self.principal}@{self.tenant}"

    @property
    def principal(self) -> str:
        """The principal string stored on intents, ``agent:<name>``."""
        return f"agent:{self.name}"

    @property
    def is_authenticated(self) -> bool:
        """DRF treats an authenticated agent like a user for permission checks."""
        return True


class AgentToken(models.Model):
    """One bearer token of an agent (only its sha256). Several may be valid at once: a rotation
    (``manage.py rotate_agent_token``) mints a new one and leaves the old valid until its
    ``expires_at``, so there is no moment without a valid token."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="tokens")
    digest = models.CharField(max_length=64, unique=True, help_text="sha256 hex of the token")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="refused from then on; empty: never")
    revoked_at = models.DateTimeField(null=True, blank=True, help_text="refused from then on")

    def __str__(self) -> str:
        return f"token {self.digest[:8]}… of {self.agent_id}"


class WebhookDelivery(models.Model):
    """One signed webhook to an agent: the outbox of callbacks (``operations.services.webhooks``).

    Written in the transaction of the terminal transition (or escalation) it announces, claimed
    by the delivery task, POSTed outside any transaction, retried with backoff. ``message_id``
    (the ``webhook-id`` header) and ``body`` never change once written: the body is frozen at
    the first attempt, so every attempt and every re-send carries the same bytes (Standard
    Webhooks, "Idempotency"). Not ``OutboxMessage``: the relay reads a row with an intent as an
    ``execute_intent`` message.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        DELIVERED = "delivered", "Delivered"
        FAILED = "failed", "Failed after the last attempt"

    message_id = models.CharField(max_length=40, unique=True, help_text="msg_<32 hex>: the webhook-id header")
    intent = models.ForeignKey(Intent, on_delete=models.PROTECT, related_name="webhook_deliveries")
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="webhook_deliveries")
    tenant = models.CharField(max_length=100, help_text="the intent's tenant (console lists filter on it)")
    event_type = models.CharField(
        max_length=40, help_text="intent.succeeded, intent.failed, ... intent.escalated"
    )
    status = models.CharField(max_length=20, help_text="the intent's status the event records")
    audit_seq = models.PositiveIntegerField(
        help_text="the audit event it announces: its seq in the intent's chain"
    )
    event_at = models.DateTimeField(help_text="when the event happened (its audit event's time)")
    body = models.TextField(blank=True, default="", help_text="canonical JSON, frozen at the first attempt")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(
        null=True, blank=True, help_text="when it is due (a claim pushes it forward as its lease)"
    )
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    history = models.JSONField(
        default=list, blank=True, help_text="per attempt: {at, status_code, error, duration_ms, url}"
    )
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["pending", "delivered", "failed"]), name="webhook_state_valid"
            ),
            # One delivery per announced audit event: a retried transaction cannot announce twice.
            models.UniqueConstraint(fields=["intent", "audit_seq", "agent"], name="webhook_event_unique"),
        ]
        indexes = [
            # The delivery task's queue.
            models.Index(fields=["next_attempt_at"], condition=Q(state="pending"), name="webhook_pending_q"),
            models.Index(fields=["tenant", "-created_at", "-id"], name="webhook_tenant_created"),
            models.Index(fields=["-created_at", "-id"], name="webhook_created"),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} {self.event_type} [{self.state}]"


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


class ExecutionControl(models.Model):
    """The one row (``id = 1``) that every claim reads in its own UPDATE: the fence epoch, the
    execution pause and the restore guard (issue 22, "When the database goes back in time").

    * ``fence_epoch``: a claim's fence is at least ``fence_epoch * FENCE_EPOCH_STRIDE`` + 1, so
      after a recovery raises the epoch every fence is above any a provider saw before, even
      one a restored database forgot. Never lowered.
    * ``paused_at``: while set, no claim succeeds (nothing is sent); submissions, approvals and
      lookups go on. Set by the restore check when the database is behind the outward
      checkpoint file, and by ``recover`` while it runs.
    * ``guard_started_at`` .. ``guard_until``: the restore guard. A claim in this interval at a
      provider that cannot deduplicate on our key looks the effect up before sending
      (``operations.restore_guard``).
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    fence_epoch = models.BigIntegerField(default=0)
    paused_at = models.DateTimeField(null=True, blank=True)
    pause_reason = models.TextField(blank=True, default="")
    paused_by = models.CharField(max_length=200, blank=True, default="")
    guard_started_at = models.DateTimeField(null=True, blank=True)
    guard_until = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=Now)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(id=1), name="execution_control_single_row"),
            models.CheckConstraint(
                condition=Q(fence_epoch__gte=0), name="execution_control_epoch_non_negative"
            ),
        ]

    def __str__(self) -> str:
        state = f"paused since {self.paused_at:%Y-%m-%d %H:%M:%S}" if self.paused_at else "running"
        return f"execution {state}, fence epoch {self.fence_epoch}"


#: A fence epoch's width: epoch ``e`` issues fences from ``e * FENCE_EPOCH_STRIDE + 1``. 2**21
#: claims per intent per epoch; the epoch is the recovery's Unix time in seconds (about 2**31),
#: so fences stay below 2**53 and exact in every JSON reader.
FENCE_EPOCH_STRIDE = 2**21


class RecoveryRun(models.Model):
    """One recovery after a restore or a failover (``manage.py recover``, or started by the
    restore check): what it found, what it changed, and whether it finished.

    ``counts`` maps what was done to how many intents (``ready_redispatched``,
    ``unknown_looked_up``, ``duplicate_checks``, ``running``, ``awaiting``, ...). ``error`` is
    set when it stopped early (execution then stays paused).
    """

    started_at = models.DateTimeField(default=Now)
    finished_at = models.DateTimeField(null=True, blank=True)
    since = models.DateTimeField(
        help_text="the restore point given (or the newest checkpoint the database kept)"
    )
    margin_seconds = models.FloatField(default=0.0)
    trigger = models.CharField(max_length=20, help_text="operator or detector")
    actor = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")
    fence_epoch_before = models.BigIntegerField(default=0)
    fence_epoch_after = models.BigIntegerField(default=0)
    guard_until = models.DateTimeField(null=True, blank=True)
    checkpoint_number = models.PositiveIntegerField(null=True, blank=True)
    counts = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["-started_at"], name="recovery_run_started")]

    def __str__(self) -> str:
        return f"recovery {self.pk} at {self.started_at:%Y-%m-%d %H:%M:%S}"


class IntentWaiter(models.Model):
    """A request waiting for ``intent_id``'s status to change (``operations.api.waiting``): while a
    row names an intent, the status trigger of migration 0028 sends ``pg_notify`` for it; an
    intent nobody waits for costs its writers one index probe and no NOTIFY (whose commit takes
    a server-wide lock). Rows live for one wait; ``expires_at`` lets a crashed web process's
    rows be swept. An UNLOGGED table: nothing in it needs to survive a crash.
    """

    id = models.BigAutoField(primary_key=True)
    intent_id = models.UUIDField(db_index=True)
    expires_at = models.DateTimeField(db_index=True)


class StatusRollup(models.Model):
    """How many intents of one tenant were in one settled state (``SETTLED_STATUS_VALUES``) when
    they were last counted: one row per (tenant, state), rewritten together by
    ``operations.services.status_rollup_refresh`` (the beat, every ``STATUS_ROLLUP_PERIOD_SECONDS``).
    The dashboard and ``/metrics`` sum these counts over the tenants a reader may see, with their
    age, instead of counting a million rows on every request (issue 18 item 5: per tenant).
    """

    tenant = models.CharField(max_length=100)
    status = models.CharField(max_length=20)
    count = models.BigIntegerField()
    computed_at = models.DateTimeField(help_text="database time of the statement that counted")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "status"], name="status_rollup_tenant_status"),
            models.CheckConstraint(
                condition=Q(status__in=SETTLED_STATUS_VALUES), name="status_rollup_settled_status"
            ),
            models.CheckConstraint(condition=Q(count__gte=0), name="status_rollup_count_non_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant} {self.status}: {self.count} at {self.computed_at:%Y-%m-%d %H:%M:%S}"


#: A ``RoleGrant.tenant`` meaning every tenant, present and future (never a tenant's name).
ALL_TENANTS = "*"


class RoleGrant(models.Model):
    """Where a console user holds a role: ``role`` (a group's name: ``viewer``, ``approver``,
    ``operator``, ``admin`` or a policy's own approver group) on ``tenant``, or on every tenant
    when ``tenant`` is ``ALL_TENANTS``.

    The group says *that* the user holds the role, the grants say *where*: membership without a
    grant gives that role on no tenant, a grant without membership gives nothing. Superusers hold
    every role on every tenant. ``operations.access.tenants`` is the one rule that reads them.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="role_grants")
    role = models.CharField(max_length=150, help_text="the group this grant scopes")
    tenant = models.CharField(max_length=100, help_text="a tenant, or * for every tenant")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "role", "tenant"], name="role_grant_unique"),
            models.CheckConstraint(condition=~Q(role=""), name="role_grant_role_named"),
            models.CheckConstraint(condition=~Q(tenant=""), name="role_grant_tenant_named"),
        ]

    def __str__(self) -> str:
        where = "every tenant" if self.tenant == ALL_TENANTS else self.tenant
        return f"{self.role} on {where}"


class WorkerHeartbeat(models.Model):
    """A Celery worker's own record that it is alive: upserted by the worker every
    ``EFFECT_LEDGER["WORKER_HEARTBEAT_SECONDS"]`` (``operations.workers.heartbeat``), one row per worker
    node name. ``beat_at`` is database time; ``stopped_at`` is set on a warm shutdown, so a
    worker that stopped cleanly is told apart from one that died (its beats just stop).
    """

    hostname = models.CharField(max_length=255, unique=True, help_text="the worker's node name (name@host)")
    pid = models.IntegerField(help_text="the worker's main process")
    queues = models.JSONField(default=list, blank=True, help_text="the queue names it consumes")
    concurrency = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField(help_text="when this worker process started beating")
    beat_at = models.DateTimeField(help_text="its last beat (database time)")
    stopped_at = models.DateTimeField(null=True, blank=True, help_text="set on a warm shutdown")

    class Meta:
        indexes = [models.Index(fields=["-beat_at"], name="worker_heartbeat_beat")]

    def __str__(self) -> str:
        return f"worker {self.hostname}"


class PeriodicJobRun(models.Model):
    """The last run of a periodic job (the outbox relay, the reconciler): one row per job,
    upserted at the end of every run (``operations.services.periodic_job_record``)."""

    name = models.CharField(max_length=100, primary_key=True, help_text="the Celery task name")
    last_started_at = models.DateTimeField()
    last_finished_at = models.DateTimeField(help_text="database time")
    last_duration_ms = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="", help_text="empty when the last run succeeded")
    last_succeeded_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"periodic job {self.name}"


class Notification(models.Model):
    """A notice to people, written in the same transaction as the event it reports (an outbox
    row: if the event commits, so does its notice; if it rolls back, nothing is queued).

    Recipients are resolved when it is fanned out (``operations.services.notifications``),
    not here: the event's transaction writes one row and reads nothing, and whoever holds the
    role when the notice goes out receives it (a grant revoked meanwhile is honoured).
    """

    class Kind(models.TextChoices):
        APPROVAL_REQUESTED = "approval_requested", "Approval requested"
        APPROVAL_EXPIRING = "approval_expiring", "Approval about to expire"
        ESCALATED = "escalated", "Escalated to operators"
        EFFECT_FOUND_LATE = "effect_found_late", "Effect found after the intent ended"

    kind = models.CharField(max_length=30, choices=Kind.choices)
    intent = models.ForeignKey(Intent, on_delete=models.PROTECT, related_name="+")
    approval_round = models.PositiveSmallIntegerField(
        default=0,
        db_default=0,
        help_text="the intent's approval_round the notice is about (approval notices)",
    )
    created_at = models.DateTimeField(db_default=Now())
    fanned_out_at = models.DateTimeField(
        null=True, blank=True, help_text="when its deliveries (one per recipient) were written"
    )
    outcome = models.CharField(
        max_length=20,
        blank=True,
        default="",
        db_default="",
        help_text="after fan-out: 'delivering', 'obsolete' (the intent moved on first) or 'no_recipient'",
    )

    class Meta:
        constraints = [
            # One approval notice of each kind per approval round: a second write is a no-op
            # (ON CONFLICT DO NOTHING), so the expiry scan may find the same intent every pass.
            models.UniqueConstraint(
                fields=["intent", "kind", "approval_round"],
                condition=Q(kind__in=["approval_requested", "approval_expiring"]),
                name="notification_once_per_round",
            ),
        ]
        indexes = [
            # The fan-out's queue.
            models.Index(
                fields=["id"], condition=Q(fanned_out_at__isnull=True), name="notification_fan_out_q"
            ),
        ]


class NotificationRecipient(models.Model):
    """One address notices go to: an email address, or ``slack`` (the webhook URL is a secret
    and stays in the settings). Carries the rate limit: nothing is sent to it before
    ``due_at`` (the last message plus ``NOTIFY_INTERVAL_SECONDS``, or a failure's backoff)."""

    class Channel(models.TextChoices):
        EMAIL = "email", "Email"
        SLACK = "slack", "Slack-compatible webhook"

    channel = models.CharField(max_length=10, choices=Channel.choices)
    address = models.CharField(max_length=254, help_text="the email address; 'slack' for the webhook")
    due_at = models.DateTimeField(
        db_default=Now(), help_text="no message before this time (rate limit, backoff)"
    )
    failures = models.PositiveIntegerField(default=0, help_text="failed sends in a row (backoff)")
    lease_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="a sender claimed it until then (the send runs outside the transaction)",
    )
    last_sent_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["channel", "address"], name="notification_recipient_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.channel}:{self.address}"


class NotificationDelivery(models.Model):
    """One notice for one recipient: pending until a message carrying it was sent (then
    ``sent``), or ``dropped`` when the intent moved on before it went out."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        SENT = "sent", "Sent"
        DROPPED = "dropped", "Dropped as obsolete"

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="deliveries")
    recipient = models.ForeignKey(NotificationRecipient, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0, help_text="messages that carried it and failed")
    created_at = models.DateTimeField(db_default=Now())
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["notification", "recipient"], name="notification_delivery_unique"
            ),
        ]
        indexes = [
            # A recipient's pending notices: what its next message carries.
            models.Index(
                fields=["recipient", "id"], condition=Q(status="pending"), name="notification_pending_q"
            ),
        ]
