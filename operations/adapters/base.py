"""The adapter protocol: what Effect Ledger needs from a provider integration.

One adapter class per provider contract, registered per action (see ``registry.py``). An
adapter is pure I/O against its provider: it never touches the ledger's tables. The engine
calls ``execute`` outside any database transaction and classifies what it raises (the
exceptions, and what each means, are ``operations.adapters.errors``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any, ClassVar

from operations.adapters.errors import StatementsUnsupported
from operations.adapters.events import EventFacts, parse_event_body, verify_standard_webhook
from operations.adapters.validation import validate_arguments


class LookupKind(enum.StrEnum):
    """How far a provider's read path can be trusted to answer "did it happen?"."""

    AUTHORITATIVE = "authoritative"  # found / absent are both definite
    EVENTUAL = "eventual"  # found is definite; absent may just be lag
    NONE = "none"  # no lookup by our key or reference


@dataclass(frozen=True)
class Capabilities:
    """What a provider contract guarantees for one action: the one place the engine, the
    reconciler, operators' resolutions and the console read it from (``capabilities_for``).

    Attributes:
        idempotency_keys: the provider deduplicates requests on our idempotency key.
        lookup: how the provider answers a lookup by our key / reference.
        consistency_window_seconds: how long the provider's read path may miss an effect that
            exists (0 for a read-your-writes lookup). Duplicate checks keep looking this long
            after an intent ends; an empty answer inside it proves nothing.
        list_by_reference: the provider can list effects by our business reference
            (used to find duplicates where it cannot deduplicate).
        compensation_action: the action that undoes or offsets this one (e.g. ``payments.refund``),
            or None when the effect cannot be undone (an email).
        fences: the provider refuses a request whose fencing token is lower than the highest
            it has seen for the key.
    """

    idempotency_keys: bool
    lookup: LookupKind
    consistency_window_seconds: float = 0.0
    list_by_reference: bool = False
    compensation_action: str | None = None
    fences: bool = False

    @property
    def same_key_retry_safe(self) -> bool:
        """Whether sending the same request again (same key) can never create a second effect.

        True only where the provider deduplicates on our key (Stripe-style idempotency keys:
        a replay returns the stored answer). Everything that may send again — a retry after an
        ambiguous outcome, a lease takeover, an operator's ``absent`` — asks this.
        """
        return self.idempotency_keys

    @property
    def absence_is_proof(self) -> bool:
        """Whether a lookup's ABSENT proves the effect never happened (a keyed provider whose
        lookup by key is authoritative); anything else that finds nothing proves nothing."""
        return self.idempotency_keys and self.lookup == LookupKind.AUTHORITATIVE

    @property
    def duplicates_possible(self) -> bool:
        """Whether one intent can leave two effects at the provider (no key deduplication), so
        an intent that was sent more than once needs a duplicate check."""
        return not self.idempotency_keys


@dataclass(frozen=True)
class ExecutionCall:
    """One attempt to apply an intent at the provider.

    Attributes:
        intent_id: the intent's UUID as text.
        action: e.g. ``payments.charge``.
        action_version: the integer version of the action's argument schema.
        arguments: the canonical arguments (money in integer minor units).
        idempotency_key: the stored provider key; identical on every attempt.
        fence: the fencing token of this attempt's lease.
        attempt_no: 1-based attempt number.
        deadline_seconds: the adapter must give up (and raise ``AmbiguousOutcome`` when the
            request may have been sent) within this many seconds; shorter than the lease.
        reference: the caller's business reference, if any.
    """

    intent_id: str
    action: str
    action_version: int
    arguments: dict[str, Any]
    idempotency_key: str
    fence: int
    attempt_no: int
    deadline_seconds: float
    reference: str = ""


@dataclass(frozen=True)
class ExecutionResult:
    """The provider accepted the effect.

    Attributes:
        provider_reference: the provider's id for the effect (charge id, message id, ...).
        response_digest: sha256 hex of the provider's response body, as evidence.
        replayed: the provider answered from its idempotency cache (the effect already existed).
        detail: a small JSON-safe summary of the response (never secrets).
    """

    provider_reference: str
    response_digest: str
    replayed: bool = False
    detail: dict[str, Any] = field(default_factory=dict)


class LookupStatus(enum.StrEnum):
    """What a lookup proved."""

    FOUND = "found"
    ABSENT = "absent"  # authoritative absence: the provider never applied it
    NOT_FOUND_YET = "not_found_yet"  # nothing seen, but the read path may lag
    WITHDRAWN = "withdrawn"  # the provider knows the item but hides it
    INCONCLUSIVE = "inconclusive"  # error or a read path that cannot tell
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class LookupResult:
    """Evidence from ``Adapter.lookup``.

    Attributes:
        status: see ``LookupStatus``.
        provider_references: every effect the provider holds for this intent (two or more
            means duplicates for a provider that cannot deduplicate).
        detail: a small JSON-safe summary of what the provider answered.
    """

    status: LookupStatus
    provider_references: tuple[str, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Preview:
    """The dry run: what exactly would happen, computed without side effects.

    Attributes:
        summary: one human sentence, e.g. "Charge 120.00 EUR to cus_42".
        target: who or what is affected (customer, recipient, resource).
        amount_minor: the amount in minor units, when the action moves money.
        currency: ISO 4217 code, when the action moves money.
        scope: what else is touched (e.g. "one charge on the customer's default card").
        checks: policy checks as ``[{"check": str, "ok": bool, "detail": str}]``.
    """

    summary: str
    target: str
    amount_minor: int | None = None
    currency: str | None = None
    scope: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class StatementEntry:
    """One line of a provider's statement of a day (what the provider says it settled).

    Attributes:
        provider_reference: the provider's id of the effect (``ch_…``; a refund has its own).
        idempotency_key: our key as the provider recorded it ("" when it keeps none).
        reference: our business reference as the provider recorded it ("" when none).
        amount: minor units by the currency's ISO 4217 exponent; None for an effect that moves
            no money (an email, a reservation).
        currency: ISO 4217 code, upper case ("" when no money moves).
    """

    provider_reference: str
    idempotency_key: str = ""
    reference: str = ""
    amount: int | None = None
    currency: str = ""


class Adapter:
    """Base class for provider adapters.

    Subclasses set ``actions`` (the action names they serve), ``capabilities``,
    ``argument_schemas`` (JSON Schema, draft 2020-12, per action) and ``versions`` (the
    ``action_version`` values they serve, per action), and implement the I/O methods.

    Versions: an intent runs with the version it was submitted under (``ExecutionCall.
    action_version``). An adapter that changes an action's arguments serves a new version
    beside the old one (``versions = {"payments.charge": (1, 2)}``, branching on
    ``call.action_version`` and overriding ``argument_schema_for``) until no intent of the
    old one is open; an intent whose version is no longer served waits for a person (HELD,
    ``operations.adapters.registry.serving_problem``), it is never sent to a contract that
    would misread it.
    """

    actions: ClassVar[tuple[str, ...]] = ()
    capabilities: ClassVar[Capabilities]
    argument_schemas: ClassVar[dict[str, dict[str, Any]]] = {}
    #: ``action_version`` values served, per action; an action not named here serves ``(1,)``.
    versions: ClassVar[dict[str, tuple[int, ...]]] = {}
    #: Argument fields that hold money in minor units; floats there are refused.
    money_fields: ClassVar[tuple[str, ...]] = ("amount",)
    #: The argument naming who or what an action affects (a customer, a charge, a recipient,
    #: a resource), per action: the "customer/target" column of the console's lists reads it
    #: through ``target_for`` (issue 16 item 3). An action not named here shows no target.
    target_fields: ClassVar[dict[str, str]] = {}
    #: The slug of the provider evidence source this adapter declares (``sandbox-payments``):
    #: its events arrive at ``POST /providers/<slug>/events`` and its statements are read under
    #: that name (issue 19). "" declares none.
    evidence_source: ClassVar[str] = ""
    #: Event type -> the action whose effect that type proves exists; other types prove nothing.
    proving_event_types: ClassVar[dict[str, str]] = {}
    #: Every event type the source sends -> the ``data.object`` it carries ("" = any); a type
    #: not listed is refused (400). Empty: any type is accepted.
    event_types: ClassVar[dict[str, str]] = {}

    @property
    def test_endpoint(self) -> bool:
        """Whether this adapter talks to a provider's test mode, where sending a request twice
        costs nothing (default False): ``manage.py provider_probe`` refuses any other."""
        return False

    def capabilities_for(self, action: str) -> Capabilities:
        """The capabilities of ``action`` (default: the class's ``capabilities``; an adapter
        serving several actions overrides this where they differ, e.g. a refund has no
        compensation of its own)."""
        return self.capabilities

    def versions_for(self, action: str) -> tuple[int, ...]:
        """The ``action_version`` values of ``action`` this adapter serves (default ``(1,)``)."""
        return self.versions.get(action, (1,))

    def target_for(self, action: str, arguments: dict[str, Any]) -> str:
        """Who or what ``arguments`` of ``action`` affect, as text (``"cus_42"``), read from the
        argument ``target_fields`` names; ``""`` when the action declares none or the stored
        arguments lack it (a text or an integer counts; anything else is not shown)."""
        name = self.target_fields.get(action)
        if name is None or not isinstance(arguments, dict):
            return ""
        value = arguments.get(name)
        if isinstance(value, bool) or not isinstance(value, str | int):
            return ""
        return str(value)

    def argument_schema_for(self, action: str, version: int) -> dict[str, Any]:
        """The JSON schema of ``action``'s arguments at ``version`` (default: the action's one
        schema in ``argument_schemas``; an adapter serving two versions overrides this)."""
        return self.argument_schemas[action]

    def validate(self, action: str, arguments: dict[str, Any], *, version: int = 1) -> None:
        """Check ``arguments`` against the JSON schema of ``action`` at ``version``.

        Raises:
            ArgumentsInvalid: listing every failing field.
        """
        schema = self.argument_schema_for(action, version)
        validate_arguments(schema, arguments, money_fields=self.money_fields)

    def preview(self, action: str, arguments: dict[str, Any]) -> Preview:
        """Describe what ``execute`` would do, without any side effect."""
        raise NotImplementedError

    def execute(self, call: ExecutionCall) -> ExecutionResult:
        """Apply the effect at the provider once.

        Raises:
            RetryableError, TerminalError, AmbiguousOutcome: see ``operations.adapters.errors``.
        """
        raise NotImplementedError

    def lookup(self, call: ExecutionCall) -> LookupResult:
        """Ask the provider whether the effect of ``call`` exists (by key or by reference)."""
        return LookupResult(status=LookupStatus.UNSUPPORTED)

    def compensation_arguments(
        self, action: str, arguments: dict[str, Any], provider_reference: str
    ) -> dict[str, Any]:
        """Arguments of the compensation intent that undoes ``provider_reference``.

        Raises:
            NotImplementedError: the action has no compensation.
        """
        raise NotImplementedError

    def statement_actions(self) -> tuple[str, ...]:
        """The actions whose effects are lines of this adapter's statement (default: every action
        it serves; a cancellation that changes an effect rather than making one is left out)."""
        return self.actions

    def statement(self, day: date, *, deadline_seconds: float = 30.0) -> list[StatementEntry]:
        """The provider's statement of ``day`` (UTC, by the effect's creation time): every
        effect of this adapter's evidence source, in the provider's order.

        Raises:
            StatementsUnsupported: no statement API (default): statements come by CSV upload.
            AdapterError: the provider could not be read (``RetryableError``/``AmbiguousOutcome``
                from the transport) or answered something unreadable.
        """
        raise StatementsUnsupported(f"{type(self).__name__} publishes no statement API; upload a CSV")

    def receives_events(self) -> bool:
        """Whether this adapter's source takes provider events at ``POST /providers/<source>/events``
        (default: it declares the event types it sends, or which types prove an effect); a source
        with statements only has no inbox (404)."""
        return bool(self.event_types or self.proving_event_types)

    def event_secret(self) -> str:
        """The secret this source's events are signed with: by default
        ``settings.EFFECT_LEDGER_PROVIDER_EVENT_SECRETS[evidence_source]`` ("" when unset: every
        event is refused)."""
        from django.conf import settings

        secrets = getattr(settings, "EFFECT_LEDGER_PROVIDER_EVENT_SECRETS", {}) or {}
        return str(secrets.get(self.evidence_source, ""))

    def verify_event(self, body: bytes, headers: Mapping[str, str]) -> str:
        """Verify the signature of a raw event ``body`` before anything reads it; returns the
        signed message id. Default: Standard Webhooks with ``event_secret()`` and a 5-minute
        tolerance (``operations.adapters.events.verify_standard_webhook``); an adapter whose
        provider signs another way overrides this.

        Raises:
            EventSignatureInvalid: missing, wrong or stale signature.
        """
        return verify_standard_webhook(self.event_secret(), body, headers)

    def parse_event(self, body: bytes, *, webhook_id: str) -> EventFacts:
        """Read a verified event body into ``EventFacts`` (the shape in
        ``operations.adapters.events``; ``proving_event_types`` says which types prove an effect,
        ``event_types`` which types the source sends at all and their objects).

        Raises:
            EventInvalid: the body is not such an event (or of a type the source never sends).
        """
        return parse_event_body(
            body, webhook_id=webhook_id, proving=self.proving_event_types, types=self.event_types
        )
