"""The rows one synthetic intent leaves in the ledger's tables, by the state it reached, in the
shape the real write path leaves them: what ``console.lab.bench.bulk`` copies in.

A ``payments.charge`` intent that SUCCEEDED by the happy path has, as
``operations.services.submission._insert`` and the worker's claim and record
(``operations.services.claims``, ``operations.services.attempts.attempt_finish``) write them:
the intent; one outbox message (handed to the broker at submission, acknowledged by the
claim); one attempt; one outcome (source ``provider``); three audit events ``submitted``
(-> READY), ``claimed`` (READY -> RUNNING), ``succeeded`` (RUNNING -> SUCCEEDED), hash-chained
with ``operations.audit.trail.event_hash`` so that ``verify_audit`` and the archiver accept
them. ``tests/console/lab/test_bench_growth.py`` compares this shape with a real intent's.

The other states follow the transitions that lead to them (``EVENTS_BY_STATE``). Not
generated, though the real path writes them: the approvals and notifications of intents that
waited for a person (an approval names a console user), the compensating intent of a
COMPENSATED one, webhook deliveries (the bench's agent has no callback URL) and provider events.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from operations.audit.trail import GENESIS, event_hash
from operations.idempotency import canonical_json, fingerprint_document, fingerprint_hash, sha256_hex
from operations.policies.rules import Policy
from operations.services.business import business_key
from operations.services.transitions import EXECUTE_TASK

PRINCIPAL = "agent:bench"
WORKER = "bench:1"

#: Milliseconds after submission of each step of the happy path (as measured on one real
#: intent: claimed 75 ms after submission, recorded 75 ms later).
OUTBOX_MS, CLAIM_MS, ACK_MS, OUTCOME_MS, FINISH_MS = 2, 60, 66, 128, 130

#: The events after ``submitted`` of an intent in each state: (event, from, to, actor, seconds
#: after submission). ``worker`` stands for the claiming worker's actor. States a worker sent
#: start with ``claimed``; the others were submitted AWAITING_APPROVAL (above the policy's
#: threshold).
EVENTS_BY_STATE: dict[str, list[tuple[str, str, str, str, float]]] = {
    "SUCCEEDED": [("claimed", "READY", "RUNNING", "worker", CLAIM_MS / 1000),
                  ("succeeded", "RUNNING", "SUCCEEDED", "worker", FINISH_MS / 1000)],
    "FAILED": [("claimed", "READY", "RUNNING", "worker", CLAIM_MS / 1000),
               ("failed", "RUNNING", "FAILED", "worker", FINISH_MS / 1000)],
    "UNKNOWN": [("claimed", "READY", "RUNNING", "worker", CLAIM_MS / 1000),
                ("outcome_unknown", "RUNNING", "UNKNOWN", "worker", 10.0)],
    "RUNNING": [("claimed", "READY", "RUNNING", "worker", CLAIM_MS / 1000)],
    "COMPENSATED": [("claimed", "READY", "RUNNING", "worker", CLAIM_MS / 1000),
                    ("succeeded", "RUNNING", "SUCCEEDED", "worker", FINISH_MS / 1000),
                    ("compensation_started", "SUCCEEDED", "COMPENSATING", "user:bench-operator", 3600.0),
                    ("compensated", "COMPENSATING", "COMPENSATED", "worker", 3600.2)],
    "AWAITING_APPROVAL": [],
    "CANCELLED": [("cancelled", "AWAITING_APPROVAL", "CANCELLED", PRINCIPAL, 30.0)],
    "REJECTED": [("rejected", "AWAITING_APPROVAL", "REJECTED", "user:bench-approver", 120.0)],
    "EXPIRED": [("approval_expired", "AWAITING_APPROVAL", "EXPIRED", "reconciler", 600.0)],
}  # fmt: skip

#: States a worker claimed: one outbox message (acknowledged by the claim) and one attempt.
SENT = frozenset(state for state, steps in EVENTS_BY_STATE.items() if steps and steps[0][0] == "claimed")
#: States with an outcome (the provider's answer that the effect exists).
WITH_OUTCOME = frozenset({"SUCCEEDED", "COMPENSATED"})

#: What the real path writes that these rows leave out (printed with the growth figures).
NOT_GENERATED = (
    "approvals and notifications of intents that waited for a person, the compensating intent of a"
    " COMPENSATED one, webhook deliveries (the agent has no callback URL), provider events"
)


def rows_per_table(state: str) -> dict[str, int]:
    """How many rows ``intent_rows`` writes for one intent in ``state``, by ``IntentRows`` field."""
    return {
        "intent": 1,
        "outbox": int(state in SENT),
        "attempts": int(state in SENT),
        "outcomes": int(state in WITH_OUTCOME),
        "events": 1 + len(EVENTS_BY_STATE[state]),
    }


#: The attempt's result, error and detail, and what the finishing event's data adds, by state.
ATTEMPT_END: dict[str, tuple[str, str, dict[str, Any]]] = {
    "SUCCEEDED": ("succeeded", "", {}),
    "COMPENSATED": ("succeeded", "", {}),
    "FAILED": ("failed", "card_declined: the card was declined", {"status": 402, "code": "card_declined"}),
    "UNKNOWN": ("unknown", "read timeout after 10.0 s", {}),
    "RUNNING": ("pending", "", {}),
}


@dataclass
class IntentRows:
    """One intent's rows, column name -> value (JSON columns as JSON text), per table."""

    intent: dict[str, Any]
    outbox: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Load:
    """What is the same for every intent of one load: its ``tag`` (in client keys and
    references), the action's ``rules`` and their snapshot (JSON text) and its sha256, and the
    times given to the open states (a RUNNING lease's end, an approval's expiry)."""

    tag: str
    rules: Policy
    policy: str
    policy_sha256: str
    lease_until: datetime
    approval_until: datetime


def intent_rows(*, load: Load, i: int, intent_id: uuid.UUID, state: str, created: datetime,
                attempt_id: int, outbox_id: uuid.UUID) -> IntentRows:  # fmt: skip
    """The rows of the ``i``-th intent of ``load``, submitted at ``created`` (timezone-aware)
    and now in ``state`` (a key of ``EVENTS_BY_STATE``); ``attempt_id`` is its attempt's id when
    it was sent (ids are given, not drawn, so the outcome can name its attempt).

    Raises:
        KeyError: ``state`` is not one ``EVENTS_BY_STATE`` knows.
    """
    steps = EVENTS_BY_STATE[state]
    sent = state in SENT
    gated = state == "AWAITING_APPROVAL" or (bool(steps) and steps[0][1] == "AWAITING_APPROVAL")
    tenant = "acme" if i % 4 else "globex"
    amount = 20_000 + i % 9000 if gated else 1000 + i % 9000
    client_key = f"{load.tag}-{i}"
    idempotency_key = "el_" + sha256_hex(intent_id.bytes)[:48]  # the real key's form and length
    arguments = {"amount": amount, "currency": "EUR", "customer": f"cus_{i % 9973}"}
    reference = f"{load.tag}-order-{i // 2}"
    request_hash = fingerprint_hash(fingerprint_document(
        tenant=tenant, action="payments.charge", action_version=1, arguments=arguments,
        reference=reference, fingerprint_version=2,
    ))  # fmt: skip
    provider_reference = "ch_" + intent_id.hex[:24]
    worker = f"worker:{WORKER}"
    rows = IntentRows(intent={})
    claimed_at = created + timedelta(milliseconds=CLAIM_MS)
    finished_at = created + timedelta(milliseconds=FINISH_MS)
    if sent:
        rows.outbox.append(
            _outbox_row(intent_id, outbox_id, created, acked=created + timedelta(milliseconds=ACK_MS))
        )
        result, error, detail = ATTEMPT_END[state]
        rows.attempts.append({
            "id": attempt_id, "intent_id": intent_id, "attempt_no": 1, "fence": 1, "worker": WORKER,
            "started_at": claimed_at, "finished_at": None if result == "pending" else finished_at,
            "result": result, "error": error,
            "detail": _json({"provider_reference": provider_reference} if state in WITH_OUTCOME else detail),
        })  # fmt: skip
    if state in WITH_OUTCOME:
        rows.outcomes.append({
            "intent_id": intent_id, "attempt_id": attempt_id, "source": "provider",
            "provider_reference": provider_reference, "response_digest": sha256_hex(provider_reference.encode()),
            "detail": _json({"state": "succeeded", "amount": amount, "object": "charge", "status": 200,
                             "currency": "EUR", "replayed": False}),
            "created_at": created + timedelta(milliseconds=OUTCOME_MS),
        })  # fmt: skip
    first = "AWAITING_APPROVAL" if gated else "READY"
    chain = [("submitted", "", first, PRINCIPAL, 0.0, {
        "request_hash": request_hash, "fingerprint_version": 2, "client_key": client_key,
        "needs_approval": gated, "policy_sha256": load.policy_sha256,
        "idempotency_key_sha256": sha256_hex(idempotency_key.encode()),
    })]  # fmt: skip
    for event, from_status, to_status, actor, seconds in steps:
        chain.append((event, from_status, to_status, worker if actor == "worker" else actor, seconds,
                      _event_data(event, state, provider_reference)))  # fmt: skip
    rows.events = _chained(intent_id, created, chain)
    rows.intent = {
        "id": intent_id, "tenant": tenant, "principal": PRINCIPAL, "action": "payments.charge",
        "action_version": 1, "arguments": _json(arguments),
        "request_hash": request_hash, "fingerprint_version": 2, "forgotten_changes": False,
        "client_key": client_key, "idempotency_key": idempotency_key, "reference": reference,
        "metadata": "{}", "policy": load.policy, "risk_rank": 3,  # payments.charge is high risk
        "status": state, "fence": 1 if sent else 0,
        "lease_owner": WORKER if state == "RUNNING" else "",
        "lease_expires_at": load.lease_until if state == "RUNNING" else None,
        "not_before": None, "attempt_count": 1 if sent else 0, "in_progress_waits": 0, "in_progress_since": None,
        "approval_expires_at": (load.approval_until if state == "AWAITING_APPROVAL"
                                else created + timedelta(seconds=600) if gated else None),
        "escalated_at": None, "lookup_count": 0,
        "next_lookup_at": rows.events[-1]["created_at"] if state == "UNKNOWN" else None,
        "next_duplicate_check_at": None, "duplicate_check_until": None,
        "last_error": ATTEMPT_END[state][1] if state in ("FAILED", "UNKNOWN") else "",
        # Two intents share each reference: the second of a real pair would have been HELD behind
        # the first (the submission guard, not benched here); the key's size is the same.
        "business_key": business_key(tenant=tenant, action="payments.charge", reference=reference,
                                     arguments=arguments, policy=load.rules),
        "held_behind_id": None, "hold_reason": "", "wait_reason": "",
        "ceiling_override": False, "approval_round": 0, "requested_by_id": None, "compensates_id": None,
        "assigned_to": "", "assigned_at": None,
        "created_at": created, "updated_at": rows.events[-1]["created_at"],
    }  # fmt: skip
    return rows


def _event_data(event: str, state: str, provider_reference: str) -> dict[str, Any]:
    """The ``data`` of an event after ``submitted`` (``attempt_finish`` adds the fence and the
    provider's detail)."""
    if event == "claimed":
        return {"fence": 1, "attempt_no": 1}
    if event == "succeeded":
        return {"fence": 1, "replayed": False, "provider_reference": provider_reference}
    if event == "failed":
        return {"fence": 1, "sent": True, **ATTEMPT_END[state][2]}
    if event == "outcome_unknown":
        return {"fence": 1, "cause": "timeout"}
    return {}


def _chained(intent_id: uuid.UUID, created: datetime, chain: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """The audit rows of one chain, each hashed over its content and its predecessor's hash as
    ``operations.audit.trail.audit_event`` does (``created_at`` as the database returns it:
    the same instant, ISO 8601 in UTC)."""
    rows, prev = [], GENESIS
    for seq, (event, from_status, to_status, actor, seconds, data) in enumerate(chain, start=1):
        at = created + timedelta(seconds=seconds)
        digest = event_hash(intent_id=intent_id, seq=seq, event=event, from_status=from_status,
                            to_status=to_status, actor=actor, reason="", data=data,
                            created_at=at.isoformat(), prev_hash=prev)  # fmt: skip
        rows.append({"intent_id": intent_id, "seq": seq, "event": event, "from_status": from_status,
                     "to_status": to_status, "actor": actor, "reason": "", "data": _json(data),
                     "created_at": at, "prev_hash": prev, "hash": digest})  # fmt: skip
        prev = digest
    return rows


def _outbox_row(
    intent_id: uuid.UUID, message_id: uuid.UUID, created: datetime, *, acked: datetime
) -> dict[str, Any]:
    """The execute message written at submission (``outbox_handoff``: canonical JSON body),
    handed to the broker after commit and acknowledged by the claim."""
    at = created + timedelta(milliseconds=OUTBOX_MS)
    body = canonical_json({"message_id": str(message_id), "intent_id": str(intent_id), "task": EXECUTE_TASK})
    return {"id": message_id, "intent_id": intent_id, "task": EXECUTE_TASK, "body": body.decode(),
            "created_at": at, "due_at": at, "sent_at": at, "publish_count": 1, "last_error": "",
            "acked_at": acked}  # fmt: skip


def _json(value: Any) -> str:
    """JSON text for a ``jsonb`` column (stored parsed, so any spelling takes the same bytes;
    the hashes are over canonical JSON, computed apart)."""
    return json.dumps(value, separators=(",", ":"))
