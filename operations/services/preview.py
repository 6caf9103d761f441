"""The dry run of a would-be intent: validated and described, nothing stored or sent."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from operations.adapters.base import Preview
from operations.adapters.registry import get_adapter
from operations.exceptions import ValidationFailed
from operations.idempotency import FINGERPRINT_VERSION, CanonicalizationError, request_hash
from operations.policies.rules import Policy, policy_for
from operations.services.request_checks import business_reference, check_storable, validate_request


@dataclass(frozen=True)
class PreviewResult:
    """The dry run of a would-be intent: the adapter's preview plus what the policy decides."""

    action: str
    request_hash: str
    needs_approval: bool
    preview: Preview
    policy: Policy


def intent_preview(
    *,
    tenant: str,
    action: str,
    arguments: Any,
    action_version: int = 1,
    reference: str = "",
    policy: Policy | None = None,
) -> PreviewResult:
    """Validate and describe an intent without persisting anything or calling the provider.

    Args:
        reference: the request's business reference (part of the request_hash); the one in the
            arguments is used when it is blank, as at submission.
        policy: the policy to judge by: a submitted intent's snapshot
            (``Policy.from_snapshot(intent.policy)``); by default the policy in force for
            ``action`` now, which is what a new submission would get.

    Raises:
        ValidationFailed: unknown action or version, or arguments failing the schema.
    """
    check_storable(arguments=arguments)
    validate_request(action, action_version, arguments)
    try:
        digest = request_hash(
            tenant=tenant,
            action=action,
            action_version=action_version,
            arguments=arguments,
            reference=business_reference(reference, arguments),
            fingerprint_version=FINGERPRINT_VERSION,
        )
    except CanonicalizationError as exc:
        raise ValidationFailed(f"arguments cannot be canonicalised: {exc}") from exc
    if policy is None:
        policy = policy_for(action)
    preview = get_adapter(action).preview(action, arguments)
    gated = policy.needs_approval(arguments)
    checks = [
        {"check": "schema", "ok": True, "detail": f"arguments match {action} v{action_version}"},
        {
            "check": "approval",
            "ok": True,
            "detail": f"needs {policy.approvals_required} approver(s) from '{policy.approver_group}'"
            if gated
            else "executes automatically under the policy",
        },
        *preview.checks,
    ]
    preview = Preview(**{**preview.__dict__, "checks": checks})
    return PreviewResult(
        action=action, request_hash=digest, needs_approval=gated, preview=preview, policy=policy
    )
