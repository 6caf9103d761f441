"""Refused decisions leave a trace in the audit log (issue 11 item 4).

A decision somebody tried and the ledger refused (a self-approval, a stale or tampered hash, an
expired request, a missing permission, a page that no longer matches the intent, a race lost to
another operator, an agent's cancel of a running intent) is evidence an auditor wants: who
tried, what they were shown, and why it was refused. Each refusal appends one
``decision_refused`` event to the intent's chain, in its own transaction, after the refused
decision's transaction has rolled back, so nothing else of the decision is kept.

A refusal is not a change of the intent: ``last_audit_seq`` and the "changed since the page was
loaded" check ignore these events, so a refused attempt never makes another operator's page
stale.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from django.contrib.auth.models import User
from django.db import transaction

from operations.adapters.bounds import clean_json, clean_text
from operations.audit.trail import REFUSAL_EVENT, audit_append, audit_append_unattached
from operations.exceptions import ApprovalRefused, CancelRefused, IntentMoved, ResolutionRefused
from operations.models import Agent, AuditEvent, Intent
from operations.policies.approval_validity import user_principal

#: What a refused decision raises; anything else (a bug, a lost database) is not a refusal.
REFUSALS = (ApprovalRefused, CancelRefused, IntentMoved, ResolutionRefused)

#: The arguments of a decision that say what its author was shown (the approval page's
#: ``request_hash``, the resolution pages' ``seen_seq``).
SHOWN_ARGUMENTS = ("request_hash", "seen_seq")

P = ParamSpec("P")
R = TypeVar("R")


def actor_of(who: User | str) -> str:
    """The principal string of ``who``: ``user:<name>`` for a console user, else as given."""
    return who if isinstance(who, str) else user_principal(who)


def intent_record_refusal(
    *,
    intent_id: uuid.UUID,
    actor: str,
    decision: str,
    reason: str,
    shown: dict[str, Any] | None = None,
    given_reason: str = "",
) -> AuditEvent | None:
    """Append a ``decision_refused`` event to the intent's chain and return it.

    Args:
        decision: what was refused (``approve``, ``reject``, ``cancel``, ``resolve confirmed``,
            ``release held`` ...).
        reason: why, as the person or agent was told.
        shown: what the decision was based on, as sent (``request_hash`` the approval page
            displayed, ``seen_seq`` of a resolution page), as sent: made storable and
            hashable by ``bounds.clean_json`` (a tampered form can post anything).
        given_reason: the reason the person or agent gave for the decision they tried, if any.

    Returns None when no such intent exists (there is no chain to append to; the caller
    answers 404). Takes the intent's row lock, like every append, for at most one INSERT.
    """
    with transaction.atomic():
        current = (
            Intent.objects.select_for_update().filter(id=intent_id).values("status", "request_hash").first()
        )
        if current is None:
            return None
        return audit_append(
            intent_id=intent_id,
            event=REFUSAL_EVENT,
            actor=actor,
            reason=clean_text(reason),
            data={
                "decision": clean_text(decision, 200),
                "shown": clean_json(shown or {}),
                **({"given_reason": clean_text(given_reason)} if given_reason else {}),
                "status": current["status"],
                "request_hash": current["request_hash"],
            },
        )


def agent_record_refusal(*, agent: Agent, decision: str, reason: str, action: str) -> AuditEvent:
    """Append a ``decision_refused`` event for a request of ``agent`` refused before any intent
    existed (an action outside its scope, issue 18 item 6), to the chain of events without an
    intent (``audit_append_unattached``): who tried what, in which tenant, and why not.

    Args:
        decision: ``submit`` or ``preview``.
        reason: why, as the agent was told.
        action: the action it asked for (as sent; cut short by ``bounds.clean_text``).
    """
    return audit_append_unattached(
        event=REFUSAL_EVENT,
        actor=agent.principal,
        reason=clean_text(reason),
        data={
            "decision": clean_text(decision, 200),
            "tenant": agent.tenant,
            "agent_id": agent.pk,
            "action": clean_text(action, 200),
            "allowed_actions": list(agent.actions),
        },
    )


def refusals_audited(
    decision: str, *, intent_of: Callable[[dict[str, Any]], uuid.UUID | None] | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a keyword-only decision service taking ``intent_id`` and ``user`` (a console
    ``User``) or ``actor`` (a principal string): when it raises one of ``REFUSALS``, the
    refusal is recorded with ``intent_record_refusal`` and the exception re-raised unchanged.

    Args:
        intent_of: for a service that decides on something else than an intent (a duplicate
            finding), returns the intent whose chain records the refusal from the keyword
            arguments (None: nothing to record).

    The service must do its own writes inside ``transaction.atomic()``, so that by the time
    the exception reaches this wrapper the refused decision has left nothing behind.
    """

    def decorate(service: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(service)
        def audited(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return service(*args, **kwargs)
            except REFUSALS as refused:
                intent_id = intent_of(kwargs) if intent_of else kwargs["intent_id"]
                if intent_id is None:
                    raise
                who: Any = kwargs.get("user") or kwargs.get("actor") or "unknown"
                verb = kwargs.get("verb")
                intent_record_refusal(
                    intent_id=intent_id,  # type: ignore[arg-type]
                    actor=actor_of(who),
                    decision=f"{decision} {verb}" if verb else decision,
                    reason=refused.detail,
                    shown={name: kwargs[name] for name in SHOWN_ARGUMENTS if name in kwargs},
                    given_reason=str(kwargs.get("reason") or ""),
                )
                raise

        return audited

    return decorate
