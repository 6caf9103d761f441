"""The typed policy: defaults in one place, overrides merged key by key, validated at start-up,
snapshotted onto the intent at submission and read back from old snapshots."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from operations.policies.reading import PolicyError
from operations.policies.rules import Ceilings, Policy, RetryPolicy, UnknownPatience, policy_for
from tests.factories import charge_arguments, submit

#: The shape of ``Intent.policy`` that rows already in the database have (before the typed policy).
SNAPSHOT_KEYS = {
    "risk_tier",
    "approval",
    "approval_threshold_minor",
    "approval_ttl_seconds",
    "approver_group",
    "four_eyes",
    "approvals_required",
    "retry",
    "ceilings",
    "unknown_patience",
    # issue 20: one business action at a time
    "business_identity_fields",
    "reference_required",
    "after_success",
    # issue 38 item 5: the reuse window after an effect
    "reuse_window_seconds",
}


def test_defaults_are_the_dataclass_defaults() -> None:
    # when
    policy = Policy()
    # then
    assert (policy.risk_tier, policy.approval, policy.approval_ttl_seconds) == ("medium", "never", 600)
    assert (policy.approver_group, policy.four_eyes, policy.approvals_required) == ("approver", True, 1)
    assert policy.retry == RetryPolicy(
        max_attempts=5, base_seconds=0.25, cap_seconds=8.0, deadline_seconds=600
    )
    assert policy.ceilings == Ceilings(max_amount_minor=None, effects_per_day=None, spend_per_day_minor=None)
    assert policy.unknown_patience == UnknownPatience(lookups=5, seconds=300)


def test_an_unconfigured_action_gets_the_defaults(settings: Any) -> None:
    settings.EFFECT_LEDGER_POLICIES = {}
    assert policy_for("payments.charge") == Policy()


def test_override_merges_key_by_key_into_nested_sections(settings: Any) -> None:
    # given
    settings.EFFECT_LEDGER_POLICIES = {
        "payments.charge": {
            "risk_tier": "high",
            "retry": {"max_attempts": 2},
            "ceilings": {"effects_per_day": 3},
        }
    }
    # when
    policy = policy_for("payments.charge")
    # then: the configured keys change, every other key (in the same section too) keeps its default
    assert policy.risk_tier == "high" and policy.approval == "never"
    assert policy.retry == RetryPolicy(max_attempts=2)
    assert policy.ceilings == Ceilings(effects_per_day=3)
    assert policy.unknown_patience == UnknownPatience()


def test_critical_tier_always_needs_two_approvers() -> None:
    policy = Policy.from_config("payments.refund", {"risk_tier": "critical", "approval": "never"})
    assert (policy.approval, policy.approvals_required) == ("always", 2)
    assert policy.risk_rank == 4 and policy.needs_approval({})


def test_above_amount_needs_approval_strictly_above_the_threshold() -> None:
    policy = Policy.from_config(
        "payments.charge", {"approval": "above_amount", "approval_threshold_minor": {"EUR": 100}}
    )
    assert not policy.needs_approval(charge_arguments(100))
    assert policy.needs_approval(charge_arguments(101))
    assert not policy.needs_approval({"to": "a@b.c"})  # no amount: nothing to compare


@pytest.mark.parametrize(
    ("configured", "field"),
    [
        ({"risk_tier": "extreme"}, "risk_tier"),
        ({"approval": "sometimes"}, "approval"),
        ({"approval": "above_amount"}, "approval_threshold_minor"),
        ({"approval_ttl_seconds": "600"}, "approval_ttl_seconds"),
        ({"approvals_required": 0}, "approvals_required"),
        ({"approval_ttl_seconds": 0}, "approval_ttl_seconds"),  # a request that expires at once
        ({"four_eyes": "yes"}, "four_eyes"),
        ({"approver_group": ""}, "approver_group"),
        ({"aproval": "always"}, "aproval"),  # a typo is not silently ignored
        ({"retry": "fast"}, "retry"),
        ({"retry": {"max_attempts": 0}}, "retry.max_attempts"),
        ({"retry": {"base_seconds": -1}}, "retry.base_seconds"),
        ({"retry": {"base_seconds": 10, "cap_seconds": 1}}, "retry.cap_seconds"),
        ({"retry": {"jitter": "full"}}, "retry.jitter"),
        ({"ceilings": {"effects_per_day": "10"}}, "ceilings.effects_per_day"),
        ({"unknown_patience": {"lookups": True}}, "unknown_patience.lookups"),
        # numbers a stored snapshot cannot keep exactly (issue 11: jsonb and RFC 8785)
        ({"retry": {"deadline_seconds": 1e16}}, "retry.deadline_seconds"),
        ({"unknown_patience": {"seconds": float("inf")}}, "unknown_patience.seconds"),
        ({"unknown_patience": {"seconds": float("nan")}}, "unknown_patience.seconds"),
        ({"ceilings": {"spend_per_day_minor": 10**16}}, "ceilings.spend_per_day_minor"),
    ],
)
def test_a_malformed_policy_is_refused_naming_action_and_field(
    configured: dict[str, Any], field: str
) -> None:
    # when
    with pytest.raises(PolicyError) as refused:
        Policy.from_config("payments.charge", configured)
    # then
    assert (refused.value.action, refused.value.field) == ("payments.charge", field)
    assert str(refused.value).startswith(f"policy for payments.charge: {field} ")


def test_start_up_validates_every_configured_policy(settings: Any) -> None:
    # given: one good and one malformed action
    settings.EFFECT_LEDGER_POLICIES = {
        "email.send": {"approval": "never"},
        "payments.charge": {"retry": {"max_attempts": "five"}},
    }
    # when / then: the app refuses to start and says where
    with pytest.raises(
        ImproperlyConfigured, match=r"payments\.charge: retry\.max_attempts must be an integer"
    ):
        apps.get_app_config("operations").ready()


def test_start_up_refuses_a_policy_for_an_action_nobody_serves(settings: Any) -> None:
    # given: a misspelt action, which would leave payments.charge on the defaults
    settings.EFFECT_LEDGER_POLICIES = {"payment.charge": {"approval": "never"}}
    # when / then
    with pytest.raises(ImproperlyConfigured, match=r"payment\.charge: \(action\) names no known action"):
        apps.get_app_config("operations").ready()


def test_start_up_accepts_the_shipped_policies() -> None:
    apps.get_app_config("operations").ready()  # console/settings_ledger.py as shipped


def test_from_snapshot_fills_what_an_old_snapshot_misses() -> None:
    # given: a snapshot written before some fields existed, with a key this version dropped
    old = {"risk_tier": "high", "approval": "always", "retry": {"max_attempts": 2}, "legacy_flag": True}
    # when
    policy = Policy.from_snapshot(old)
    # then
    assert (policy.risk_tier, policy.approval, policy.approval_ttl_seconds) == ("high", "always", 600)
    assert policy.retry == RetryPolicy(max_attempts=2)
    assert policy.ceilings == Ceilings() and policy.unknown_patience == UnknownPatience()
    assert Policy.from_snapshot({}) == Policy()


def test_from_snapshot_keeps_what_the_snapshot_says_even_if_config_now_refuses_it() -> None:
    # an above_amount snapshot without threshold (never gated) stays readable
    assert Policy.from_snapshot({"approval": "above_amount"}).needs_approval(charge_arguments(10**9)) is False


def test_from_snapshot_refuses_a_wrong_type_naming_the_field() -> None:
    with pytest.raises(PolicyError, match=r"snapshot: unknown_patience\.seconds must be a number"):
        Policy.from_snapshot({"unknown_patience": {"seconds": "soon"}})


def test_snapshot_round_trip_is_json_safe_and_keeps_todays_shape(settings: Any) -> None:
    for action in settings.EFFECT_LEDGER_POLICIES:
        # given
        policy = policy_for(action)
        # when
        stored = json.loads(json.dumps(policy.to_snapshot()))
        # then
        assert set(stored) == SNAPSHOT_KEYS
        assert set(stored["retry"]) == {
            "max_attempts",
            "base_seconds",
            "cap_seconds",
            "deadline_seconds",
            "in_progress_patience_seconds",
        }
        assert set(stored["ceilings"]) == {"max_amount_minor", "effects_per_day", "spend_per_day_minor"}
        assert set(stored["unknown_patience"]) == {"lookups", "seconds"}
        assert Policy.from_snapshot(stored) == policy


@pytest.mark.django_db
def test_submission_snapshots_the_policy_in_force(settings: Any) -> None:
    # given
    settings.EFFECT_LEDGER_POLICIES = {
        **settings.EFFECT_LEDGER_POLICIES,
        "payments.charge": {"approval": "never", "retry": {"max_attempts": 3}},
    }
    # when
    intent = submit(arguments=charge_arguments(5_000))
    intent.refresh_from_db()
    # then
    assert intent.policy == policy_for("payments.charge").to_snapshot()
    assert intent.policy["retry"]["max_attempts"] == 3
    assert intent.risk_rank == Policy.from_snapshot(intent.policy).risk_rank == 2


@pytest.mark.parametrize(
    "value",
    [None, -1, "600", True, 1e16, float("inf"), float("nan")],
    ids=["none", "negative", "text", "bool", "too-large", "inf", "nan"],
)
def test_c32_in_progress_patience_must_be_a_number_of_seconds(value: Any) -> None:
    # given: a configuration whose wait on "request in progress" answers is not a number of
    # seconds (None would mean waiting forever on a provider that never finishes)
    configured = {"retry": {"in_progress_patience_seconds": value}}
    # when
    with pytest.raises(PolicyError) as refused:
        Policy.from_config("payments.charge", configured)
    # then: refused, naming the action and the field, saying what it must be
    assert refused.value.field == "retry.in_progress_patience_seconds"
    assert str(refused.value).startswith(
        "policy for payments.charge: retry.in_progress_patience_seconds must be a number of seconds"
    )


def test_c32_in_progress_patience_defaults_and_old_snapshots_read_it_as_the_default() -> None:
    # given: a snapshot written before the field existed, and a configured one
    old_snapshot = {"retry": {"max_attempts": 5, "base_seconds": 0.25, "cap_seconds": 8.0}}
    # when
    old = Policy.from_snapshot(old_snapshot)
    configured = Policy.from_config("payments.charge", {"retry": {"in_progress_patience_seconds": 30}})
    # then
    assert old.retry.in_progress_patience_seconds == RetryPolicy().in_progress_patience_seconds == 600
    assert configured.retry.in_progress_patience_seconds == 30.0
    assert configured.retry.max_attempts == 5  # the other retry fields keep their defaults
