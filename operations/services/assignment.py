"""Operators' assignments: "I'm on it" on an item of the operators' queue (issue 16 item 4).

Not a worker's lease claim (``claims.intent_claim``): an assignment only tells the other
operators who is working on an UNKNOWN intent, a HELD intent or a COMPENSATING intent whose
compensation ended without effect, and since when, so that two of them do not work the same
item without knowing it.

The rules:

* An operator (role ``operator`` or ``admin`` on the intent's tenant,
  ``operations.access.tenants``) assigns an item to themself (``intent_assign``): one conditional
  UPDATE, which succeeds when nobody holds the item, when its assignment lapsed, or when the
  same operator holds it (renewed). Two operators pressing "I'm on it" at once: exactly one
  wins; the other is told who has it. Audit event ``assigned``.
* Another operator takes it over explicitly (``take_over_from``): the UPDATE is conditional on
  the item still being that operator's, so a take-over based on an out-of-date page changes
  nothing. Audit event ``assignment_taken_over`` with both names.
* An assignment lapses ``EFFECT_LEDGER_ASSIGNMENT_SECONDS`` (default 1800) after it was taken:
  computed when read (``assignment_active``), nothing sweeps it.
* It is released by any change of status (``transitions.transition`` clears it: every
  resolution, the reconciler's too) and by reopening a compensation (the item leaves the queue).
* While someone holds it, every other operator's decision on it is refused in place
  (``refuse_if_assigned_elsewhere``, called by the resolution services, held release and
  reject, and ``reconciliation.resolution`` before anything is asked of a provider): "otto is on
  it since 23:29:27 UTC; take it over first". Refused like any decision (``decision_refused`` in
  the audit chain); nothing changes. The reconciler and the workers are not operators: an
  effect found by a lookup still ends the intent.

Assignment events are not changes of the intent: ``selectors.last_audit_seq`` ignores them, so
pressing "I'm on it" never makes a colleague's page out of date.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from operations.access.tenants import console_scope, role_scope
from operations.audit.trail import ASSIGNED_EVENT, ASSIGNMENT_TAKEN_OVER_EVENT, audit_append
from operations.exceptions import ResolutionRefused
from operations.models import Intent
from operations.services.refusals import refusals_audited

#: Roles that may assign themselves (the ones that may resolve: ``reconciliation.resolution``).
ASSIGNER_ROLES = ("operator", "admin")

#: The items of the operators' queue an operator can be on.
ASSIGNABLE = Q(status__in=[Intent.Status.UNKNOWN, Intent.Status.HELD]) | Q(
    status=Intent.Status.COMPENSATING, escalated_at__isnull=False
)

#: The columns that end an assignment, for an UPDATE.
RELEASED = {"assigned_to": "", "assigned_at": None}


class AssignmentRefused(ResolutionRefused):
    """An assignment, a take-over, or a decision on an item another operator is on, refused."""

    code = "assignment-refused"
    title = "Assignment refused"


@dataclass(frozen=True)
class Assignment:
    """Who is on an item (a username) and since when (UTC)."""

    username: str
    since: datetime


def assignment_seconds() -> int:
    """How long an assignment lasts, in seconds (``EFFECT_LEDGER_ASSIGNMENT_SECONDS``)."""
    return int(settings.EFFECT_LEDGER.get("ASSIGNMENT_SECONDS", 1800))


def assignment_active(intent: Intent, *, now: datetime | None = None) -> Assignment | None:
    """The assignment of ``intent`` if it holds now (not lapsed), else None. Read-time rule:
    ``assigned_at + assignment_seconds() > now`` (``now`` defaults to ``timezone.now()``)."""
    if not intent.assigned_to or intent.assigned_at is None:
        return None
    if intent.assigned_at + timedelta(seconds=assignment_seconds()) <= (now or timezone.now()):
        return None
    return Assignment(intent.assigned_to, intent.assigned_at)


def _held_now() -> Q:
    """An assignment that has not lapsed, by the database clock."""
    return ~Q(assigned_to="") & Q(assigned_at__gt=Now() - timedelta(seconds=assignment_seconds()))


def _on_it(assignment: Assignment) -> str:
    return f"{assignment.username} is on it since {assignment.since:%H:%M:%S} UTC"


def _username(actor: str) -> str | None:
    return actor.removeprefix("user:") if actor.startswith("user:") else None


def refuse_if_assigned_elsewhere(*, intent_id: uuid.UUID, actor: str, lock: bool = True) -> None:
    """Refuse a decision by ``actor`` on an item another operator is on (not lapsed).

    With ``lock`` (the services' check) it takes the intent's row lock (call inside the
    decision's transaction), so a take-over cannot slip between this check and the decision;
    without it, an early read that holds no lock (before a provider is asked anything). Actors
    that are not console users (``reconciler``, ``worker:…``) are never refused.

    Raises:
        AssignmentRefused: "otto is on it since 23:29:27 UTC; take it over first".
    """
    username = _username(actor)
    if username is None:
        return
    rows = Intent.objects.select_for_update() if lock else Intent.objects.all()
    row = (
        rows.filter(_held_now(), id=intent_id)
        .exclude(assigned_to=username)
        .values_list("assigned_to", "assigned_at")
        .first()
    )
    if row is not None and row[1] is not None:
        raise AssignmentRefused(f"{_on_it(Assignment(row[0], row[1]))}; take it over first")


def _check_assigner(user: User, intent: Intent) -> None:
    """Only operators and admins of the intent's tenant; another tenant's intent is not named."""
    if not console_scope(user).allows(intent.tenant):
        raise AssignmentRefused(f"no intent {intent.id}")
    if not role_scope(user, ASSIGNER_ROLES).allows(intent.tenant):
        raise AssignmentRefused(f"only operators and admins of tenant {intent.tenant} can take its items")


@refusals_audited("assign")
def intent_assign(
    *, intent_id: uuid.UUID, user: User, take_over_from: str = "", reason: str = ""
) -> Assignment:
    """Assign an item of the operators' queue to ``user`` ("I'm on it"), or take it over.

    Args:
        take_over_from: the username the page showed as being on it: the take-over succeeds
            only while it is still theirs (lapsed or not); empty for a plain assignment, which
            succeeds only while nobody else holds the item.
        reason: why, for a take-over (optional; recorded in the audit event).

    Returns:
        The new assignment (``user``'s username, since now by the database clock).

    Raises:
        AssignmentRefused: no such intent in ``user``'s tenants, not an operator or admin there,
            not in the operators' queue, someone else is on it (a plain assignment), or it is
            no longer ``take_over_from``'s (a take-over).
    """
    username = user.get_username()
    with transaction.atomic():
        intent = Intent.objects.filter(id=intent_id).first()
        if intent is None:
            raise AssignmentRefused(f"no intent {intent_id}")
        _check_assigner(user, intent)
        if take_over_from:
            condition = Q(assigned_to=take_over_from) & ~Q(assigned_to=username)
        else:
            condition = ~_held_now() | Q(assigned_to=username)
        # The race this stops: two operators pressing "I'm on it" (or taking over) at once. The
        # second UPDATE waits for the first's row lock, then matches nothing: one winner.
        updated = Intent.objects.filter(ASSIGNABLE, condition, id=intent_id).update(
            assigned_to=username, assigned_at=Now()
        )
        if not updated:
            raise AssignmentRefused(_why_not(intent_id, username, take_over_from))
        intent.refresh_from_db(fields=["assigned_to", "assigned_at", "status"])
        assert intent.assigned_at is not None
        if take_over_from:
            audit_append(
                intent_id=intent_id,
                event=ASSIGNMENT_TAKEN_OVER_EVENT,
                actor=f"user:{username}",
                reason=reason,
                data={"from": take_over_from, "to": username, "status": intent.status},
            )
        else:
            audit_append(
                intent_id=intent_id,
                event=ASSIGNED_EVENT,
                actor=f"user:{username}",
                reason=reason,
                data={
                    "assigned_to": username,
                    "lapses_after_seconds": assignment_seconds(),
                    "status": intent.status,
                },
            )
    return Assignment(username, intent.assigned_at)


def _why_not(intent_id: uuid.UUID, username: str, take_over_from: str) -> str:
    """Why a conditional assignment UPDATE matched nothing, read afresh."""
    intent = Intent.objects.get(id=intent_id)
    if not Intent.objects.filter(ASSIGNABLE, id=intent_id).exists():
        return f"this intent is {intent.status} now, not in the operators' queue: nothing to be on"
    current = assignment_active(intent)
    if take_over_from:
        if intent.assigned_to == username and current is not None:
            return "you are on it already"
        if take_over_from == username:
            return "you cannot take it over from yourself"
        if current is None:
            return f'{take_over_from} is not on it: nobody is; press "I\'m on it" instead'
        return f"it is not {take_over_from}'s: {_on_it(current)}; reload the page"
    if current is not None:
        return f"{_on_it(current)}; take it over first"
    return "it changed meanwhile: reload the page"
