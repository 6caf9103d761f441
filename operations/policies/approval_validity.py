"""May this approval be used? One answer for every place that asks (DESIGN.md, Approvals).

The console explains with it (why the decision forms are not offered), the approval service
decides with it (whether a decision may be recorded, and whether the approvals on record let
the intent run) and the worker decides with it again right before acting (execution step 4).
Every rule reads the intent's policy snapshot, never the policy in force now, and judges
expiry by the database clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from django.contrib.auth.models import User
from django.db.models import Count, Q
from django.db.models.functions import Now

from operations.access.tenants import may_act
from operations.models import Approval, Intent
from operations.policies.rules import Policy


class Verdict(StrEnum):
    """Why an approval may or may not be used (``Validity.verdict``)."""

    APPROVED = "approved"  # enough unexpired approvals on the current request_hash
    NOT_NEEDED = "not_needed"  # the intent's policy needs no approval for these arguments
    MAY_DECIDE = "may_decide"  # this approver may record a decision now
    MISSING = "missing"  # nobody has approved yet
    EXPIRED = "expired"  # the approval (or the request for one) has expired
    OTHER_HASH = "other_hash"  # given (or about to be given) for another payload
    TOO_FEW = "too_few"  # fewer different approvers than the policy requires (critical: two)
    REJECTED = "rejected"  # an approver rejected the intent
    NO_PERMISSION = "no_permission"  # not in the policy's approver group (nor admin)
    OWN_REQUEST = "own_request"  # four eyes: the requester never approves their own intent
    ALREADY_DECIDED = "already_decided"  # this approver already approved or rejected it
    NOT_AWAITING = "not_awaiting"  # the intent is no longer AWAITING_APPROVAL

    @property
    def usable(self) -> bool:
        return self in (Verdict.APPROVED, Verdict.NOT_NEEDED, Verdict.MAY_DECIDE)


@dataclass(frozen=True)
class Validity:
    """The answer: ``usable``, a ``reason`` a person can act on (empty when usable), and the
    count of valid approvals against the number the policy requires."""

    verdict: Verdict
    reason: str
    given: int  # different approvers whose unexpired approval is on the current request_hash
    required: int  # the policy snapshot's approvals_required

    @property
    def usable(self) -> bool:
        return self.verdict.usable


def user_principal(user: User) -> str:
    """The principal string of a console user, ``user:<username>``."""
    return f"user:{user.get_username()}"


def is_own_request(intent: Intent, user: User) -> bool:
    """Whether ``user`` asked for ``intent`` (four eyes), judged by user id, never by name: a
    renamed account is still the account that asked (issue 11 item 5).

    ``intent.requested_by`` is recorded at submission for every ``user:`` principal. Only an
    intent written before that field existed whose username matched no account when migration
    0012 filled it in has a ``user:`` principal without one; for it the name is the only evidence
    left, so it is still compared (refusing the account that now holds that name). Agents
    (``agent:<name>``) and the system never hold a console account, so never match.
    """
    if intent.requested_by_id is not None:
        return bool(intent.requested_by_id == user.pk)
    return intent.principal.startswith("user:") and intent.principal == user_principal(user)


def can_approve(user: User, intent: Intent, policy: Policy) -> bool:
    """Whether ``user`` holds the permission ``policy`` (the intent's parsed snapshot) names, its
    approver group or the admin group, on the intent's tenant (``operations.access.tenants``),
    or is a superuser."""
    return may_act(user, [policy.approver_group, "admin"], intent.tenant)


def approval_required(intent: Intent, policy: Policy) -> bool:
    """Whether ``intent`` may run only on approvals: its policy needs one for its arguments, or
    it was sent back to its approvers (a ceiling reached, an approval lapsed: issue 18, C22), in
    which case the decision of the current round must be given and unexpired like any approval,
    so an override cannot be used after it lapsed."""
    return intent.approval_round > 0 or policy.needs_approval(intent.arguments)


def approval_validity(
    intent: Intent,
    *,
    policy: Policy | None = None,
    approver: User | None = None,
    request_hash: str | None = None,
) -> Validity:
    """May this intent's approval be used?

    Without ``approver``: do the approvals on record let the intent execute now? Usable when
    its policy snapshot needs no approval for its arguments, or when at least
    ``approvals_required`` different approvers approved its *current* request_hash and their
    approvals have not expired (shared/cases C10); after a rejection, never.

    With ``approver`` and ``request_hash`` (the hash the approver was shown): may this person
    record a decision on that payload now? Refused, in this order, without the approver
    group's permission, on their own request (four eyes), once the intent has left
    AWAITING_APPROVAL, for a hash that is not the intent's current one, after the request
    expired (database clock), or when they already decided.

    Args:
        intent: the intent as read (lock its row first where the answer guards a write).
        policy: its policy snapshot already parsed (``Policy.from_snapshot(intent.policy)``),
            so a caller that asks more than once parses it once (issue 34 item 4); parsed here
            when None. The snapshot never changes after submission, so a value parsed from
            an earlier read of the same intent is the same value.
        approver: a console user; None asks about the approvals on record.
        request_hash: with ``approver``, the 64-hex sha256 the approver reviewed.
    """
    if policy is None:
        policy = Policy.from_snapshot(intent.policy)
    if approver is None and not approval_required(intent, policy):
        # The worker's re-check of an intent that needs no approval reads nothing (issue 13).
        return Validity(verdict=Verdict.NOT_NEEDED, reason="", given=0, required=policy.approvals_required)
    approved = Q(decision=Approval.Decision.APPROVED)
    current = approved & Q(request_hash=intent.request_hash)
    # Only the current approval round counts: a ceiling reached or an approval lapsed sends the
    # intent back to its approvers for a new decision (issue 18, C22).
    counts = Approval.objects.filter(intent=intent, round=intent.approval_round).aggregate(
        given=Count("approver", distinct=True, filter=current & Q(expires_at__gt=Now())),
        expired=Count("id", filter=current & Q(expires_at__lte=Now())),
        other_hash=Count("id", filter=approved & ~Q(request_hash=intent.request_hash)),
        rejected=Count("id", filter=Q(decision=Approval.Decision.REJECTED)),
    )
    given = int(counts["given"])
    if approver is not None:
        verdict, reason = _decision_refusal(intent, policy, approver, request_hash) or (
            Verdict.MAY_DECIDE,
            "",
        )
    else:
        verdict, reason = _record_verdict(intent, policy, counts, given)
    return Validity(verdict=verdict, reason=reason, given=given, required=policy.approvals_required)


def _record_verdict(
    intent: Intent, policy: Policy, counts: dict[str, Any], given: int
) -> tuple[Verdict, str]:
    required = policy.approvals_required
    if not approval_required(intent, policy):
        return Verdict.NOT_NEEDED, ""
    if counts["rejected"]:
        return Verdict.REJECTED, "the intent was rejected by an approver"
    if given >= required:
        return Verdict.APPROVED, ""
    if given:
        return Verdict.TOO_FEW, (
            f"{given} of {required} required approvals for the current request_hash "
            f"(the {policy.risk_tier} tier needs {required} different approvers)"
        )
    if counts["expired"]:
        return Verdict.EXPIRED, "the approval for the current request_hash has expired"
    if counts["other_hash"]:
        return Verdict.OTHER_HASH, (
            "the approval was given for another payload (its request_hash differs from the intent's current one)"
        )
    return Verdict.MISSING, "no approval has been given for the current request_hash"


def _decision_refusal(
    intent: Intent, policy: Policy, approver: User, request_hash: str | None
) -> tuple[Verdict, str] | None:
    if not can_approve(approver, intent, policy):
        return (
            Verdict.NO_PERMISSION,
            f"You are not in the '{policy.approver_group}' group for {intent.action} on tenant {intent.tenant}.",
        )
    if policy.four_eyes and is_own_request(intent, approver):
        return Verdict.OWN_REQUEST, "You requested this intent; someone else must approve it (four eyes)."
    if intent.status != Intent.Status.AWAITING_APPROVAL:
        return Verdict.NOT_AWAITING, f"The intent is {intent.status}, no longer awaiting approval."
    if request_hash != intent.request_hash:
        return Verdict.OTHER_HASH, (
            "The payload you reviewed is not this intent's current payload (request_hash differs); "
            "reload and review it again."
        )
    if Intent.objects.filter(id=intent.id, approval_expires_at__lte=Now()).exists():
        return Verdict.EXPIRED, "This approval request has expired; the agent must submit again."
    if Approval.objects.filter(intent=intent, approver=approver, round=intent.approval_round).exists():
        return Verdict.ALREADY_DECIDED, "You already decided on this intent; another approver is needed."
    return None
