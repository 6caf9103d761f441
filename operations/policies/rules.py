"""Policies per action: risk tier, approval rule, retries, ceilings, reconciliation patience.

A policy is a frozen ``Policy`` whose field defaults are the only defaults there are.
``settings.EFFECT_LEDGER_POLICIES[action]`` overrides them key by key (nested sections key by
key too); every configured action is validated when the ``operations`` app starts, so a typo
or a wrong type stops the process with the action and the field named.

The resolved policy is snapshotted onto the intent at submission (``Intent.policy``, the JSON
of ``Policy.to_snapshot()``), so a later configuration change never alters an intent in
flight: everything that governs an intent reads ``Policy.from_snapshot(intent.policy)``.
Defaults follow the risk decision table of shared/seeds/004: irreversible money movement above
a threshold needs a human; a ``critical`` tier always needs two different approvers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from operations.money import Money
from operations.policies.reading import ANY_CURRENCY, MAX_POLICY_SECONDS, PolicyError, PolicyReader

RISK_TIERS = ("low", "medium", "high", "critical")


def amount_rule(rules: Mapping[str, int] | None, currency: str) -> int | None:
    """The amount ``rules`` set for ``currency`` (a legacy snapshot's ``ANY_CURRENCY`` rule
    applies to every currency); None when the currency is not named."""
    if rules is None:
        return None
    if currency in rules:
        return rules[currency]
    return rules.get(ANY_CURRENCY)


AFTER_SUCCESS_RULES = ("ask", "reject")
#: ``reuse_window_seconds`` left unset: how long after an earlier intent for the same business
#: identity made its effect a new one is still a likely duplicate. 24 hours for an intent that
#: moves money (a payment API keeps an idempotency key about as long: Stripe prunes keys after
#: at least 24 hours); one hour for the others (an email, a reservation), whose repeats on one
#: reference are more often wanted, while the usual duplicate (an agent restarted and running
#: its plan again) comes within minutes.
DEFAULT_REUSE_WINDOW_MONEY_SECONDS = 86_400
DEFAULT_REUSE_WINDOW_OTHER_SECONDS = 3_600
APPROVAL_RULES = ("never", "always", "above_amount")


@dataclass(frozen=True)
class RetryPolicy:
    """The attempt budget and the backoff between attempts (``execution.backoff_seconds``).

    ``in_progress_patience_seconds`` (issue 38, item 4): how long, in seconds by the database
    clock from the intent's first "request in progress" answer, a provider that deduplicates on
    our key may keep answering so before the intent goes UNKNOWN (for the reconciler) instead of
    waiting again. Answers waited out within it do not spend ``max_attempts``
    (``operations.services.budget``). 0: never wait on such an answer. It cannot be None: a
    provider that says "in progress" forever must not hold an intent forever.
    """

    max_attempts: int = 5  # attempts in all, the first included
    base_seconds: float = 0.25  # backoff: base * 2**(n-1), capped, with equal jitter
    cap_seconds: float = 8.0
    deadline_seconds: float | None = 600  # no new attempt this long after submission
    in_progress_patience_seconds: float = 600  # waiting on "request in progress" answers, at most

    @classmethod
    def _read(cls, reader: PolicyReader) -> RetryPolicy:
        reader.check_keys(cls)
        defaults = cls()
        base = reader.seconds("base_seconds", defaults.base_seconds)
        cap = reader.seconds("cap_seconds", defaults.cap_seconds)
        if reader.strict and cap < base:
            raise reader.error("cap_seconds", f"must be >= base_seconds ({cap!r} < {base!r})")
        return cls(
            max_attempts=reader.integer("max_attempts", defaults.max_attempts, minimum=1),
            base_seconds=base,
            cap_seconds=cap,
            deadline_seconds=reader.optional_seconds("deadline_seconds", defaults.deadline_seconds),
            in_progress_patience_seconds=reader.seconds(
                "in_progress_patience_seconds", defaults.in_progress_patience_seconds
            ),
        )


@dataclass(frozen=True)
class Ceilings:
    """Limits held as reservations at claim (``operations.services.ceilings``); None: no limit.

    Amounts are per ISO 4217 currency, in its minor units. The day is the calendar day in UTC.
    A ceiling reached sends the intent back to its approvers (never FAILED).
    """

    max_amount_minor: dict[str, int] | None = None  # one effect above this needs a person
    effects_per_day: int | None = None  # effects per tenant and action per UTC day, any currency
    spend_per_day_minor: dict[str, int] | None = None  # amounts per tenant, action and currency per UTC day

    @classmethod
    def _read(cls, reader: PolicyReader) -> Ceilings:
        reader.check_keys(cls)
        return cls(
            max_amount_minor=reader.amounts_by_currency("max_amount_minor"),
            effects_per_day=reader.optional_integer("effects_per_day", None),
            spend_per_day_minor=reader.amounts_by_currency("spend_per_day_minor"),
        )

    @property
    def reserves(self) -> bool:
        """Whether a claim must reserve against a ``SpendWindow``."""
        return self.effects_per_day is not None or self.spend_per_day_minor is not None


@dataclass(frozen=True)
class UnknownPatience:
    """How long the reconciler looks an UNKNOWN intent up before operators see it."""

    lookups: int = 5  # lookups before an UNKNOWN intent is escalated to operators
    seconds: float | None = 300  # or this age, whichever comes first

    @classmethod
    def _read(cls, reader: PolicyReader) -> UnknownPatience:
        reader.check_keys(cls)
        defaults = cls()
        return cls(
            lookups=reader.integer("lookups", defaults.lookups),
            seconds=reader.optional_seconds("seconds", defaults.seconds),
        )


@dataclass(frozen=True)
class Policy:
    """The policy that governs one action (and, snapshotted, one intent)."""

    risk_tier: str = "medium"  # low | medium | high | critical
    approval: str = "never"  # never | always | above_amount
    # with above_amount: approval when the amount is above this, per ISO 4217 currency (minor units)
    approval_threshold_minor: dict[str, int] | None = None
    approval_ttl_seconds: int = 600  # how long a request waits for a decision, and an approval stays valid
    approver_group: str = "approver"
    four_eyes: bool = True  # the requester never approves their own intent
    approvals_required: int = 1  # raised to 2 for the critical tier
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    ceilings: Ceilings = field(default_factory=Ceilings)
    unknown_patience: UnknownPatience = field(default_factory=UnknownPatience)
    # One business action at a time (issue "One business action"): the identity of the business
    # object is the intent's reference, or these argument fields when named; while an intent
    # with the same identity is open, a new one is HELD behind it.
    business_identity_fields: tuple[str, ...] = ()
    reference_required: bool = False  # refuse (422) an intent that names no business identity
    # When the earlier intent SUCCEEDED, a held one is a likely duplicate: "ask" a person (it
    # stays HELD, escalated, until released or rejected) or "reject" it outright.
    after_success: str = "ask"
    # The reuse window (issue 38 item 5): a new intent submitted within this many seconds after
    # an earlier one with the same identity made its effect (its first outcome was recorded) is
    # a likely duplicate as well, decided by after_success at once. 0 turns it off; None: the
    # default for the intent's arguments (``reuse_window_for``).
    reuse_window_seconds: int | None = None

    @classmethod
    def from_config(cls, action: str, configured: Mapping[str, Any]) -> Policy:
        """The defaults overridden by ``configured`` (one entry of ``EFFECT_LEDGER_POLICIES``).

        Unknown keys are refused; ``above_amount`` needs ``approval_threshold_minor``; the
        ``critical`` tier forces ``approval = always`` and at least two approvers.

        Raises:
            PolicyError: naming ``action`` and the field.
        """
        return cls._read(PolicyReader(configured, action=action, prefix="", strict=True))

    @classmethod
    def from_snapshot(cls, snapshot: Mapping[str, Any]) -> Policy:
        """The policy stored on an intent at submission (``Intent.policy``).

        Tolerant of snapshots written before a field existed (the default fills it) and of
        keys this version no longer knows (ignored).

        Raises:
            PolicyError: a stored value has the wrong type (the action is named "snapshot").
        """
        return cls._read(PolicyReader(snapshot, action="snapshot", prefix="", strict=False))

    @classmethod
    def _read(cls, reader: PolicyReader) -> Policy:
        reader.check_keys(cls)
        defaults = cls()
        tier = reader.choice("risk_tier", defaults.risk_tier, RISK_TIERS)
        approval = reader.choice("approval", defaults.approval, APPROVAL_RULES)
        threshold = reader.amounts_by_currency("approval_threshold_minor")
        if reader.strict and approval == "above_amount" and threshold is None:
            raise reader.error("approval_threshold_minor", "is required when approval is above_amount")
        # An approval request that expires at once could never be decided.
        ttl = reader.integer(
            "approval_ttl_seconds", defaults.approval_ttl_seconds, minimum=1, maximum=MAX_POLICY_SECONDS
        )
        required = reader.integer("approvals_required", defaults.approvals_required, minimum=1)
        if tier == "critical":  # seeds/004: a critical action always needs two different people
            approval, required = "always", max(2, required)
        return cls(
            risk_tier=tier,
            approval=approval,
            approval_threshold_minor=threshold,
            approval_ttl_seconds=ttl,
            approver_group=reader.text("approver_group", defaults.approver_group),
            four_eyes=reader.flag("four_eyes", defaults.four_eyes),
            approvals_required=required,
            retry=RetryPolicy._read(reader.section("retry")),
            ceilings=Ceilings._read(reader.section("ceilings")),
            unknown_patience=UnknownPatience._read(reader.section("unknown_patience")),
            business_identity_fields=reader.names(
                "business_identity_fields", defaults.business_identity_fields
            ),
            reference_required=reader.flag("reference_required", defaults.reference_required),
            after_success=reader.choice("after_success", defaults.after_success, AFTER_SUCCESS_RULES),
            reuse_window_seconds=reader.optional_integer(
                "reuse_window_seconds", defaults.reuse_window_seconds, maximum=MAX_POLICY_SECONDS
            ),
        )

    def to_snapshot(self) -> dict[str, Any]:
        """The JSON-safe dict stored in ``Intent.policy`` (nested sections as nested dicts)."""
        snapshot = dataclasses.asdict(self)
        snapshot["business_identity_fields"] = list(self.business_identity_fields)  # JSON has no tuples
        return snapshot

    @property
    def risk_rank(self) -> int:
        """The risk tier as a number for ordering: 1 low, 2 medium, 3 high, 4 critical."""
        return RISK_TIERS.index(self.risk_tier) + 1

    def reuse_window_for(self, arguments: Any) -> int:
        """Seconds after an earlier intent for the same business identity made its effect during
        which a new intent with ``arguments`` is held (or rejected) as a likely duplicate; 0: never.

        ``reuse_window_seconds`` when set; else ``DEFAULT_REUSE_WINDOW_MONEY_SECONDS`` for
        arguments that move money (an integer ``amount`` beside a ``currency``: ``Money.of``, the
        rule every money check of the ledger uses, generic HTTP actions included), else
        ``DEFAULT_REUSE_WINDOW_OTHER_SECONDS``.
        """
        if self.reuse_window_seconds is not None:
            return self.reuse_window_seconds
        if Money.of(arguments) is not None:
            return DEFAULT_REUSE_WINDOW_MONEY_SECONDS
        return DEFAULT_REUSE_WINDOW_OTHER_SECONDS

    def needs_approval(self, arguments: Any) -> bool:
        """Whether an intent with ``arguments`` must wait for a human under this policy.

        ``always``: yes. ``above_amount``: when the amount is strictly above the threshold for
        its currency. Fail safe (issue 18): an amount in a currency that a money rule of the
        policy (approval threshold, per-effect or daily spend ceiling) does not name needs
        approval, whatever the rule, since nobody said what is too much in it.
        """
        if self.approval == "always":
            return True
        money = Money.of(arguments)
        if money is None:
            return False
        rules = [
            rule
            for rule in (
                self.approval_threshold_minor,
                self.ceilings.max_amount_minor,
                self.ceilings.spend_per_day_minor,
            )
            if rule is not None
        ]
        if any(amount_rule(rule, money.currency) is None for rule in rules):
            return True
        if self.approval == "above_amount":
            threshold = amount_rule(self.approval_threshold_minor, money.currency)
            return threshold is not None and money.amount_minor > threshold
        return False


def configured_policies() -> dict[str, Any]:
    """``settings.EFFECT_LEDGER_POLICIES``: action -> overrides (empty when unset). The policies
    of the sandbox provider's actions are left out where the sandbox is off (issue 33 item 6:
    the shipped settings configure them, and a deployment without the sandbox serves none)."""
    from operations.adapters.registry import SANDBOX_ADAPTERS, sandbox_enabled

    configured = dict(getattr(settings, "EFFECT_LEDGER_POLICIES", {}) or {})
    if sandbox_enabled():
        return configured
    explicit = getattr(settings, "EFFECT_LEDGER_ADAPTERS", {}) or {}
    return {a: p for a, p in configured.items() if a not in SANDBOX_ADAPTERS or a in explicit}


def policy_for(action: str) -> Policy:
    """The policy in force now for ``action``: the defaults with its configured overrides.

    Raises:
        PolicyError: the configured overrides are malformed (names the action and the field).
    """
    return Policy.from_config(action, configured_policies().get(action, {}))


def validate_configured_policies() -> None:
    """Resolve every configured action's policy once (called when the app starts).

    Raises:
        PolicyError: the first malformed policy, naming the action and the field, or a policy
            configured for an action no adapter serves.
    """
    from operations.adapters.registry import known_actions

    known = set(known_actions())
    for action in configured_policies():
        if action not in known:
            # A misspelt action would leave the real one on the defaults without a word.
            raise PolicyError(
                action=action,
                field="(action)",
                problem=f"names no known action; known: {', '.join(sorted(known))}",
            )
        policy_for(action)
