"""Reconciliation's own records: passes of the reconciler and the evidence they gathered."""

from __future__ import annotations

from django.db import models


class ReconciliationRun(models.Model):
    """One pass of the periodic reconciler, for the console and auditors."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    examined = models.PositiveIntegerField(default=0)
    resolved = models.PositiveIntegerField(default=0)
    escalated = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        indexes = [models.Index(fields=["-started_at"], name="recon_run_started")]

    def __str__(self) -> str:
        return f"reconciliation run {self.pk} at {self.started_at:%Y-%m-%d %H:%M:%S}"


class Evidence(models.Model):
    """What the reconciler (or an operator) learned about an intent's effect (insert-only).

    ``kind`` is ``lookup`` (a provider read), ``duplicate`` (two or more effects for one intent)
    or ``resolution`` (an operator's decision with what they were shown).
    """

    class Kind(models.TextChoices):
        LOOKUP = "lookup", "Lookup"
        DUPLICATE = "duplicate", "Duplicate found"
        RESOLUTION = "resolution", "Operator resolution"

    intent = models.ForeignKey("operations.Intent", on_delete=models.PROTECT, related_name="evidence")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    result = models.CharField(max_length=30, help_text="lookup status, or the resolution verb")
    provider_references = models.JSONField(default=list, blank=True)
    actor = models.CharField(max_length=200, default="reconciler")
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["intent", "-created_at"], name="evidence_intent")]

    def __str__(self) -> str:
        return f"{self.kind} {self.result} for {self.intent_id}"


class DuplicateFinding(models.Model):
    """A second (or further) effect at the provider for one intent, found by a duplicate check
    at a provider without idempotency keys. One row per extra effect (unique), kept for good.

    ``state``: ``compensating`` while its compensation intent runs; ``open`` when it needs an
    operator (the action has no compensation, e.g. an email, or the compensation failed, was
    rejected, expired or was cancelled); ``resolved`` once compensated or acknowledged.
    """

    class State(models.TextChoices):
        COMPENSATING = "compensating", "Compensation running"
        OPEN = "open", "Needs an operator"
        RESOLVED = "resolved", "Resolved"

    intent = models.ForeignKey(
        "operations.Intent", on_delete=models.PROTECT, related_name="duplicate_findings"
    )
    provider_reference = models.CharField(max_length=200, help_text="the extra effect at the provider")
    kept_reference = models.CharField(max_length=200, help_text="the effect the intent keeps")
    state = models.CharField(max_length=20, choices=State.choices)
    compensation = models.ForeignKey(
        "operations.Intent", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    note = models.TextField(blank=True, default="", help_text="why it is in this state")
    resolved_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["intent", "provider_reference"], name="duplicate_finding_unique"),
        ]
        indexes = [
            models.Index(fields=["created_at"], condition=models.Q(state="open"), name="duplicate_open_q"),
            models.Index(
                fields=["updated_at"],
                condition=models.Q(state="compensating"),
                name="duplicate_compensating_q",
            ),
        ]

    def __str__(self) -> str:
        return f"duplicate {self.provider_reference} of {self.intent_id} [{self.state}]"


class ProviderEvent(models.Model):
    """A signed event a provider sent to ``POST /providers/<source>/events``, stored once per
    provider event id (a redelivery finds the row and changes nothing); the row is kept for good.

    ``source`` names the adapter's event source (``sandbox-payments``, a generic HTTP action's
    ``events.name``). What the event says is parsed into the matching fields when it is stored;
    ``payload`` keeps the verified JSON body. ``result`` says what processing made of it:
    ``pending`` until the outbox task ran, then ``applied`` (it ended an UNKNOWN or
    lease-expired intent SUCCEEDED), ``recorded`` (evidence on the intent's timeline, nothing
    moved), ``duplicate`` (a duplicate finding), ``orphan`` (no intent: an orphan finding) or
    ``ignored`` (a type that proves nothing about an effect).

    The body is not kept for good: ``RAW_BODY_RETENTION_DAYS`` after it was processed, the
    pruning pass (``reconciliation.pruning``) empties ``payload``, keeping its digest
    (``body_sha256``), the parsed fields and the row; ``body_removed_at`` says when (issue 36).
    """

    class Result(models.TextChoices):
        PENDING = "pending", "Not processed yet"
        APPLIED = "applied", "Resolved the intent"
        RECORDED = "recorded", "Recorded as evidence"
        DUPLICATE = "duplicate", "Duplicate effect"
        ORPHAN = "orphan", "No matching intent"
        IGNORED = "ignored", "Proves nothing"

    source = models.CharField(max_length=60, help_text="the event source (adapter) it came through")
    event_id = models.CharField(max_length=200, help_text="the provider's id of the event")
    event_type = models.CharField(max_length=100)
    occurred_at = models.DateTimeField(null=True, blank=True, help_text="when the provider says it happened")
    received_at = models.DateTimeField(auto_now_add=True)
    payload = models.JSONField(default=dict)
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    reference = models.CharField(max_length=200, blank=True, default="")
    provider_reference = models.CharField(max_length=200, blank=True, default="")
    amount = models.BigIntegerField(
        null=True, blank=True, help_text="minor units, when the effect moves money"
    )
    currency = models.CharField(max_length=3, blank=True, default="")
    intent = models.ForeignKey(
        "operations.Intent", null=True, blank=True, on_delete=models.PROTECT, related_name="provider_events"
    )
    result = models.CharField(max_length=20, choices=Result.choices, default=Result.PENDING)
    processed_at = models.DateTimeField(null=True, blank=True)
    detail = models.JSONField(default=dict, blank=True)
    body_sha256 = models.CharField(
        max_length=64,
        blank=True,
        db_default="",
        help_text="hex SHA-256 of the payload's RFC 8785 canonical JSON, taken when the body was removed",
    )
    body_removed_at = models.DateTimeField(
        null=True, blank=True, help_text="when the payload was emptied (retention); null: kept"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "event_id"], name="provider_event_once"),
        ]
        indexes = [
            models.Index(fields=["intent", "occurred_at"], name="provider_event_intent"),
            models.Index(fields=["-received_at"], name="provider_event_received"),
            models.Index(
                fields=["received_at"],
                condition=models.Q(processed_at__isnull=True),
                name="provider_event_pending",
            ),
            # The pruning's queue: processed events whose body is still kept, oldest first.
            models.Index(
                fields=["processed_at"],
                condition=models.Q(processed_at__isnull=False, body_removed_at__isnull=True),
                name="provider_event_body_kept",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.source} event {self.event_id} ({self.event_type}) [{self.result}]"


class StatementMapping(models.Model):
    """The saved column mapping of one source's CSV statements: which CSV header holds each
    statement field (``{"provider_reference": "Charge ID", "amount": "Amount", ...}``)."""

    source = models.CharField(max_length=60, unique=True)
    columns = models.JSONField(default=dict)
    updated_by = models.CharField(max_length=200, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"statement mapping of {self.source}"


class StatementRun(models.Model):
    """One two-way reconciliation of a provider's statement for one day with the ledger.

    ``origin`` is ``api`` (fetched from the provider) or ``upload`` (a CSV an operator uploaded).
    The counts are what the run found; each non-matched result is a ``ProviderFinding``.
    """

    class Origin(models.TextChoices):
        API = "api", "Provider API"
        UPLOAD = "upload", "CSV upload"

    source = models.CharField(max_length=60)
    statement_date = models.DateField()
    origin = models.CharField(max_length=10, choices=Origin.choices)
    actor = models.CharField(max_length=200, default="reconciler")
    filename = models.CharField(max_length=255, blank=True, default="")
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    lines = models.PositiveIntegerField(default=0)
    matched = models.PositiveIntegerField(default=0)
    missing_at_provider = models.PositiveIntegerField(default=0)
    extra_at_provider = models.PositiveIntegerField(default=0)
    amount_mismatches = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    scheduled = models.BooleanField(
        default=False, help_text="made by the beat's daily job (one finished run per source and day)"
    )

    class Meta:
        indexes = [models.Index(fields=["source", "-statement_date"], name="statement_run_source_date")]
        # One scheduled run per source and day, even when two beats trigger the job at once
        # (issue 35, C27); a run that stored only an error does not count, so the next period
        # tries the day again. Runs an operator starts (upload, command) are not limited.
        constraints = [
            models.UniqueConstraint(
                fields=["source", "statement_date"],
                condition=models.Q(scheduled=True, error=""),
                name="statement_run_one_scheduled",
            )
        ]

    def __str__(self) -> str:
        return f"statement of {self.source} for {self.statement_date} ({self.origin})"


class StatementLine(models.Model):
    """One line of a provider's statement as it was read (insert-only), with the intent it was
    matched to, if any, and what the run made of it (``result``; "" on lines stored before it was
    kept). Money in minor units by the currency's ISO 4217 exponent."""

    class Result(models.TextChoices):
        MATCHED = "matched", "Matched"
        AMOUNT_MISMATCH = "amount_mismatch", "Amount mismatch"
        EXTRA = "extra", "Extra at the provider"
        REPEAT = "repeat", "Repeats an earlier line"

    run = models.ForeignKey(StatementRun, on_delete=models.PROTECT, related_name="statement_lines")
    line_no = models.PositiveIntegerField()
    provider_reference = models.CharField(max_length=200, blank=True, default="")
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    reference = models.CharField(max_length=200, blank=True, default="")
    amount = models.BigIntegerField(null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True, default="")
    raw = models.JSONField(default=dict, blank=True)
    intent = models.ForeignKey(
        "operations.Intent", null=True, blank=True, on_delete=models.PROTECT, related_name="statement_lines"
    )
    result = models.CharField(max_length=20, choices=Result.choices, blank=True, db_default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "line_no"], name="statement_line_once")]

    def __str__(self) -> str:
        return f"line {self.line_no} of run {self.run_id}: {self.provider_reference}"


class StatementUpload(models.Model):
    """A CSV statement an operator uploaded, imported by a background task a batch of lines per
    transaction (``reconciliation.statement_uploads``; issue 39 item 10).

    ``status``: ``queued`` until a worker starts it, ``running`` while batches commit
    (``lines_done`` of ``total_lines``; the counts are on ``run``), then ``done`` or ``failed``
    (``error``). ``message_id`` is the outbox message whose delivery may import the next
    lines: a stale or repeated delivery changes nothing. ``data`` (the file as uploaded, read
    with ``columns``) is emptied once the import is done; ``sha256`` (hex, of the file) stays:
    the same file of the same source and day is taken once, unless its upload failed.
    """

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Importing"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    run = models.OneToOneField(StatementRun, on_delete=models.PROTECT, related_name="upload")
    source = models.CharField(max_length=60)
    statement_date = models.DateField()
    sha256 = models.CharField(max_length=64)
    data = models.BinaryField(help_text="the file as uploaded; emptied once imported")
    columns = models.JSONField(help_text="the column mapping the file was checked with ({field: header})")
    total_lines = models.PositiveIntegerField()
    lines_done = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.QUEUED)
    message_id = models.UUIDField(help_text="the outbox message allowed to import the next lines")
    failures = models.PositiveSmallIntegerField(default=0, help_text="slices that raised so far")
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # The same file twice (a second click, an upload repeated after a proxy's 504) is
            # one import; a failed upload may be tried again.
            models.UniqueConstraint(
                fields=["source", "statement_date", "sha256"],
                condition=~models.Q(status="failed"),
                name="statement_upload_once",
            )
        ]

    def __str__(self) -> str:
        return f"upload of {self.source} for {self.statement_date} [{self.status}]"


class ProviderFinding(models.Model):
    """A disagreement between the provider's evidence and the ledger, for an operator to work.

    Kinds: ``orphan_event`` (a provider event matching no intent), ``missing_at_provider`` (a
    SUCCEEDED intent with no statement line), ``extra_at_provider`` (a statement line with no
    intent, or a second line for one intent), ``amount_mismatch`` (amount or currency differ),
    ``effect_after_ending`` (an intent ended without effect, and evidence arriving later proves
    the provider has one; issue 38).
    ``fingerprint`` makes each finding once however often the same evidence is seen again.
    ``state``: ``open`` until an operator links it to an intent, opens a compensation
    (``compensating`` while it runs) or closes it with a reason (``resolved``); every step audited.
    """

    class Kind(models.TextChoices):
        ORPHAN_EVENT = "orphan_event", "Event with no intent"
        MISSING_AT_PROVIDER = "missing_at_provider", "Missing at the provider"
        EXTRA_AT_PROVIDER = "extra_at_provider", "Extra at the provider"
        AMOUNT_MISMATCH = "amount_mismatch", "Amount mismatch"
        EFFECT_AFTER_ENDING = "effect_after_ending", "Ended without effect, but the provider has it"

    class State(models.TextChoices):
        OPEN = "open", "Needs an operator"
        COMPENSATING = "compensating", "Compensation running"
        RESOLVED = "resolved", "Resolved"

    fingerprint = models.CharField(max_length=400, unique=True)
    kind = models.CharField(max_length=30, choices=Kind.choices)
    source = models.CharField(max_length=60)
    state = models.CharField(max_length=20, choices=State.choices, default=State.OPEN)
    intent = models.ForeignKey(
        "operations.Intent", null=True, blank=True, on_delete=models.PROTECT, related_name="provider_findings"
    )
    event = models.ForeignKey(
        ProviderEvent, null=True, blank=True, on_delete=models.PROTECT, related_name="findings"
    )
    run = models.ForeignKey(
        StatementRun, null=True, blank=True, on_delete=models.PROTECT, related_name="findings"
    )
    line = models.ForeignKey(
        StatementLine, null=True, blank=True, on_delete=models.PROTECT, related_name="findings"
    )
    provider_reference = models.CharField(max_length=200, blank=True, default="")
    amount = models.BigIntegerField(null=True, blank=True, help_text="the provider's amount, minor units")
    currency = models.CharField(max_length=3, blank=True, default="")
    expected_amount = models.BigIntegerField(
        null=True, blank=True, help_text="the intent's amount, minor units"
    )
    expected_currency = models.CharField(max_length=3, blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)
    compensation = models.ForeignKey(
        "operations.Intent", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    resolution = models.CharField(
        max_length=20, blank=True, default="", help_text="linked, compensated or closed"
    )
    note = models.TextField(blank=True, default="")
    resolved_by = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["created_at"], condition=models.Q(state="open"), name="provider_finding_open_q"
            ),
            models.Index(fields=["source", "kind", "state"], name="provider_finding_kind"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.provider_reference or self.intent_id} [{self.state}]"
