"""Policies per action: risk tier, approval rule, retries, ceilings, reconciliation patience.

``settings.EFFECT_LEDGER_POLICIES[action]`` overrides ``DEFAULT_POLICY`` key by key. The
resolved policy is snapshotted onto the intent at submission (``Intent.policy``), so a later
configuration change never alters an intent in flight. Defaults follow the risk decision table
of shared/seeds/004: irreversible money movement above a threshold needs a human; a
``critical`` tier always needs two different approvers.
"""

from __future__ import annotations

import copy
from typing import Any

from django.conf import settings

DEFAULT_POLICY: dict[str, Any] = {
    "risk_tier": "medium",  # low | medium | high | critical
    "approval": "never",  # never | always | above_amount
    "approval_threshold_minor": None,  # with above_amount: approval when amount > this (minor units)
    "approval_ttl_seconds": 600,  # how long a request waits for a decision, and an approval stays valid
    "approver_group": "approver",
    "four_eyes": True,  # the requester never approves their own intent
    "approvals_required": 1,  # raised to 2 for the critical tier
    "retry": {
        "max_attempts": 5,  # attempts in all, the first included
        "base_seconds": 0.25,  # backoff: base * 2**(n-1), capped, with full jitter
        "cap_seconds": 8.0,
        "deadline_seconds": 600,  # no new attempt this long after submission
    },
    "ceilings": {
        "max_amount_minor": None,  # refuse a single effect above this
        "effects_per_day": None,  # accepted effects per tenant and action in 24 h
        "spend_per_day_minor": None,  # sum of amounts per tenant and action in 24 h
    },
    "unknown_patience": {
        "lookups": 5,  # lookups before an UNKNOWN intent is escalated to operators
        "seconds": 300,  # or this age, whichever comes first
    },
}

RISK_TIERS = ("low", "medium", "high", "critical")


def risk_rank(policy: dict[str, Any]) -> int:
    """The policy's risk tier as a number for ordering: 1 low, 2 medium, 3 high, 4 critical."""
    tier = policy.get("risk_tier")
    return RISK_TIERS.index(tier) + 1 if tier in RISK_TIERS else 0


APPROVAL_RULES = ("never", "always", "above_amount")


class PolicyError(ValueError):
    """A configured policy is malformed (names the action and the field)."""


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def policy_for(action: str) -> dict[str, Any]:
    """Return the resolved policy for ``action`` (a fresh, JSON-safe dict).

    Raises:
        PolicyError: an unknown risk tier or approval rule is configured.
    """
    configured = getattr(settings, "EFFECT_LEDGER_POLICIES", {}).get(action, {})
    policy = _merge(DEFAULT_POLICY, configured)
    if policy["risk_tier"] not in RISK_TIERS:
        raise PolicyError(f"{action}: risk_tier must be one of {RISK_TIERS}")
    if policy["approval"] not in APPROVAL_RULES:
        raise PolicyError(f"{action}: approval must be one of {APPROVAL_RULES}")
    if policy["risk_tier"] == "critical":
        policy["approvals_required"] = max(2, int(policy["approvals_required"]))
        policy["approval"] = "always"
    return policy


def needs_approval(policy: dict[str, Any], arguments: dict[str, Any]) -> bool:
    """Whether an intent with ``arguments`` must wait for a human under ``policy``.

    ``above_amount`` compares ``arguments["amount"]`` (integer minor units) with
    ``approval_threshold_minor``: strictly above needs approval.
    """
    rule = policy["approval"]
    if rule == "always":
        return True
    if rule == "above_amount":
        amount = arguments.get("amount")
        threshold = policy.get("approval_threshold_minor")
        return isinstance(amount, int) and threshold is not None and amount > threshold
    return False
