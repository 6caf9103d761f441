"""The actions an agent may submit, as ``GET /api/v1/actions`` describes them (issue 15): each
served action its scopes include (``operations.access.scopes``), with the JSON schema of its arguments
per version (the adapters', ``registry.served_argument_schemas``: the same schemas that validate
a submission) and its policy's risk tier and approval rule (``operations.policies.rules``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from operations.access.scopes import action_allowed
from operations.adapters.registry import served_argument_schemas
from operations.models import Agent
from operations.policies.reading import PolicyError
from operations.policies.rules import Policy, policy_for

#: ``ActionDescription.needs_approval``: every intent waits for a person; none does; or it
#: depends on the arguments (an amount above the threshold for its currency, or a currency no
#: money rule of the policy names: ``Policy.needs_approval``). The preview answers it exactly.
NEEDS_APPROVAL_ALWAYS = "always"
NEEDS_APPROVAL_NEVER = "never"
NEEDS_APPROVAL_DEPENDS = "depends_on_arguments"


@dataclass(frozen=True)
class ActionVersion:
    """One served version of an action and the JSON schema (draft 2020-12) of its arguments."""

    action_version: int
    arguments_schema: dict[str, Any]


@dataclass(frozen=True)
class ActionDescription:
    """One action an agent may submit.

    ``needs_approval``: ``NEEDS_APPROVAL_*``. ``approval``: the policy's rule (``never``,
    ``always``, ``above_amount``); ``approval_threshold_minor``: with ``above_amount``, the
    threshold per ISO 4217 currency in minor units (a currency not named always needs approval).
    """

    action: str
    versions: list[ActionVersion]
    risk_tier: str
    needs_approval: str
    approval: str
    approval_threshold_minor: dict[str, int] | None
    approvals_required: int


def _needs_approval(policy: Policy) -> str:
    if policy.approval == "always":
        return NEEDS_APPROVAL_ALWAYS
    money_rules = (
        policy.approval_threshold_minor,
        policy.ceilings.max_amount_minor,
        policy.ceilings.spend_per_day_minor,
    )
    if policy.approval == "above_amount" or any(rule is not None for rule in money_rules):
        # A money rule makes an amount above it, or in a currency it does not name, wait for a
        # person (Policy.needs_approval); an action that moves no money never does.
        return NEEDS_APPROVAL_DEPENDS
    return NEEDS_APPROVAL_NEVER


def agent_actions(agent: Agent) -> list[ActionDescription]:
    """The actions ``agent`` may submit, sorted by name: those this deployment serves (an
    adapter that cannot be loaded serves nothing) matched by one of its action patterns.

    An action whose configured policy is malformed is left out (its submission is refused too);
    the server refuses to start with one (``validate_configured_policies``). Never raises.
    """
    described = []
    for action, versions in served_argument_schemas().items():
        if not action_allowed(agent.actions, action):
            continue
        try:
            policy = policy_for(action)
        except PolicyError:
            continue
        described.append(
            ActionDescription(
                action=action,
                versions=[ActionVersion(v, schema) for v, schema in sorted(versions.items())],
                risk_tier=policy.risk_tier,
                needs_approval=_needs_approval(policy),
                approval=policy.approval,
                approval_threshold_minor=policy.approval_threshold_minor,
                approvals_required=policy.approvals_required,
            )
        )
    return described
