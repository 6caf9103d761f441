"""Every (from, to) pair of ALLOWED_TRANSITIONS, allowed and refused, through ``transition``."""

from __future__ import annotations

import itertools

import pytest

from operations.exceptions import InvalidTransition
from operations.models import ALLOWED_TRANSITIONS, TERMINAL_STATUSES, AuditEvent, Intent
from operations.services import transition
from tests.factories import submit

pytestmark = pytest.mark.django_db

STATUSES = [s.value for s in Intent.Status]
ALLOWED = [(a, b) for a, targets in ALLOWED_TRANSITIONS.items() for b in sorted(targets)]
REFUSED = [(a, b) for a, b in itertools.product(STATUSES, STATUSES) if b not in ALLOWED_TRANSITIONS[a]]


def intent_in(status: str) -> Intent:
    intent = submit()
    Intent.objects.filter(id=intent.id).update(status=status)  # test setup only
    return intent


def test_table_covers_every_status() -> None:
    assert set(ALLOWED_TRANSITIONS) == set(STATUSES)
    assert {"FAILED", "COMPENSATED", "REJECTED", "EXPIRED", "CANCELLED"} == TERMINAL_STATUSES


@pytest.mark.parametrize(("current", "target"), ALLOWED)
def test_allowed_transition_moves_one_row_and_audits(current: str, target: str) -> None:
    # given
    intent = intent_in(current)
    # when
    moved = transition(
        intent_id=intent.id, from_status=current, to_status=target, actor="test", event="moved"
    )
    # then
    assert moved is True
    assert Intent.objects.get(id=intent.id).status == target
    event = AuditEvent.objects.filter(intent=intent).order_by("-seq").first()
    assert event is not None and (event.from_status, event.to_status) == (current, target)


@pytest.mark.parametrize(("current", "target"), REFUSED)
def test_refused_transition_raises_and_changes_nothing(current: str, target: str) -> None:
    # given
    intent = intent_in(current)
    events = AuditEvent.objects.count()
    # when / then
    with pytest.raises(InvalidTransition):
        transition(intent_id=intent.id, from_status=current, to_status=target, actor="test", event="moved")
    assert Intent.objects.get(id=intent.id).status == current
    assert AuditEvent.objects.count() == events


def test_compare_and_swap_on_a_moved_intent_touches_nothing() -> None:
    # given: the caller believes READY, but someone else already moved it to RUNNING
    intent = intent_in("RUNNING")
    # when
    moved = transition(
        intent_id=intent.id, from_status="READY", to_status="CANCELLED", actor="test", event="x"
    )
    # then
    assert moved is False
    assert Intent.objects.get(id=intent.id).status == "RUNNING"


def test_stale_fence_write_touches_nothing() -> None:
    # given
    intent = intent_in("RUNNING")
    Intent.objects.filter(id=intent.id).update(fence=3)
    # when
    moved = transition(
        intent_id=intent.id,
        from_status="RUNNING",
        to_status="SUCCEEDED",
        fence=2,
        actor="w",
        event="succeeded",
    )
    # then
    assert moved is False
    assert Intent.objects.get(id=intent.id).status == "RUNNING"
