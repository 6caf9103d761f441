"""Duplicate risk at approval: other intents of the same tenant, action and business reference that
already had their effect or may still have it (issue 16 item 2).

An approver looking at "charge order-1 for 49.90 EUR" must be told when order-1 was already
charged, or a charge for it is on its way: approving would apply a second effect. Submission
holds a second intent while an earlier one is open (``operations.services.business``), but an
intent reaches the approvers beside an earlier one when the earlier one already SUCCEEDED (it
is not open, so nothing is held), when a person released a held intent, or when the policy's
business identity is made of other fields than the reference.

Which states count (``DUPLICATE_RISK_STATUSES``; ``operations.models``, shared/DESIGN.md):

* SUCCEEDED: the effect exists.
* COMPENSATING: the effect exists until its compensation succeeds (it may fail, and be kept).
* READY, RUNNING, UNKNOWN: in flight: about to be sent, being sent, or sent with no answer yet.
* AWAITING_APPROVAL: another approver may approve it too (both would run).

Not counted: FAILED, REJECTED, EXPIRED, CANCELLED (ended without effect, ``ENDED_WITHOUT_EFFECT``),
COMPENSATED (the effect was undone), and HELD (it waits behind an earlier intent and is released
only by the rule or by a person who accepts the duplicate risk there).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from django.db.models import F, Window
from django.db.models.functions import RowNumber

from operations.models import Intent

S = Intent.Status

#: The states of another intent (same tenant, action and reference) that make approving this
#: one a duplicate risk; see the module docstring for why each is in or out.
DUPLICATE_RISK_STATUSES = frozenset(
    {S.SUCCEEDED, S.COMPENSATING, S.READY, S.RUNNING, S.UNKNOWN, S.AWAITING_APPROVAL}
)

#: At most this many other intents are named per intent (newest first); the pages link them.
RISK_LIMIT = 5


def duplicate_risks(
    intents: Sequence[Intent], *, limit: int | None = RISK_LIMIT
) -> dict[uuid.UUID, list[Intent]]:
    """For each of ``intents`` that has a reference, the other intents of its tenant with the same
    action and reference in ``DUPLICATE_RISK_STATUSES``, newest first (at most ``limit`` each).

    One query for the whole list (the approvals inbox asks for 200 rows at once): the rows whose
    tenant, action and reference are each among the list's (three ``= ANY`` arrays, served by
    the ``intent_reference`` index, ``tenant, reference``), each triple's newest ``limit + 1``
    kept by a window in the database; the triples no intent of the list has (another tenant's
    reference) are dropped here. No query at all when no intent has a reference. (Issue 37: the
    200 triples OR-ed took longer to build and plan than to run.)

    ``limit=None`` names every one (the approval page and the approval service: an approver
    accepts exactly the intents the page listed).

    Returns:
        ``{intent.id: [other intents]}``, only for intents with at least one risk. The other
        intents carry ``id, tenant, action, reference, status, created_at`` (``only``).
    """
    keys = {(i.tenant, i.action, i.reference) for i in intents if i.reference}
    if not keys:
        return {}
    # limit + 1: an awaiting intent is itself in DUPLICATE_RISK_STATUSES and is dropped below.
    rows = Intent.objects.filter(
        tenant__in=sorted({tenant for tenant, _, _ in keys}),
        action__in=sorted({action for _, action, _ in keys}),
        reference__in=sorted({reference for _, _, reference in keys}),
        status__in=DUPLICATE_RISK_STATUSES,
    ).only("id", "tenant", "action", "reference", "status", "created_at")
    if limit is not None:
        rows = rows.annotate(
            rank=Window(
                RowNumber(),
                partition_by=[F("tenant"), F("action"), F("reference")],
                order_by=[F("created_at").desc(), F("id").desc()],
            )
        ).filter(rank__lte=limit + 1)
    rows = rows.order_by("-created_at", "-id")
    by_key: dict[tuple[str, str, str], list[Intent]] = {}
    for row in rows:
        key = (row.tenant, row.action, row.reference)
        if key in keys:
            by_key.setdefault(key, []).append(row)
    risks: dict[uuid.UUID, list[Intent]] = {}
    for intent in intents:
        if not intent.reference:
            continue
        others = [
            o for o in by_key.get((intent.tenant, intent.action, intent.reference), []) if o.id != intent.id
        ]
        if others:
            risks[intent.id] = others if limit is None else others[:limit]
    return risks


def duplicate_risk_of(intent: Intent) -> list[Intent]:
    """Every other intent approving ``intent`` might duplicate (``duplicate_risks``, no limit)."""
    return duplicate_risks([intent], limit=None).get(intent.id, [])
