"""Does a stored intent still prove itself? Its request_hash re-derived from what is stored.

An approval binds to an intent's ``request_hash`` and the worker sends the stored arguments, so
both re-derive the hash from the stored tenant, action, action_version, arguments and reference
(the intent's ``fingerprint_version`` says which of them it covers) right before they act
(issue 11 item 2; DESIGN.md, Evidence). A row edited in the database after submission, or
arguments that no longer canonicalise, are refused: the approval is refused, the worker holds
the intent for a person (``MISMATCH_HOLD``) without sending anything, and a release is refused
while the mismatch lasts.

The hash and fingerprint version, and the policy snapshot and provider idempotency key
(``submission_seal``), are also compared with what the intent's ``submitted`` audit event
recorded (one primary-key-range read). A writer who edits the arguments *and* stores
their new hash, or downgrades ``fingerprint_version`` to 1 to take the reference out of the
hash, must then also rewrite the hash-chained, checkpointed audit trail to go unnoticed.
"""

from __future__ import annotations

from typing import Any

from operations.idempotency import (
    CanonicalizationError,
    canonical_json,
    fingerprint_document,
    fingerprint_hash,
    sha256_hex,
)
from operations.models import AuditEvent, Intent

#: How ``Intent.hold_reason`` starts for an intent held because its stored request no longer
#: hashes to its request_hash (the console tells it apart from an unserved action by this).
MISMATCH_HOLD = "request_hash mismatch"


def stored_fingerprint(intent: Intent) -> dict[str, Any]:
    """The request fingerprint of a stored intent, under its own ``fingerprint_version``: what
    its ``request_hash`` must be the hash of (``idempotency.fingerprint_document``), and what the
    approval page shows as the canonical document.

    Raises:
        ValueError: the intent's ``fingerprint_version`` is unknown.
    """
    return fingerprint_document(
        tenant=intent.tenant,
        action=intent.action,
        action_version=intent.action_version,
        arguments=intent.arguments,
        reference=intent.reference,
        fingerprint_version=intent.fingerprint_version,
    )


def submission_seal(*, policy: dict[str, Any], idempotency_key: str) -> dict[str, str]:
    """What the ``submitted`` audit event records besides the request_hash, so that the row's
    other decisive columns cannot be changed unseen either: the sha256 of the canonical policy
    snapshot (it decides whether an approval is needed) and of the provider idempotency key
    (what the provider deduplicates on). ``{"policy_sha256", "idempotency_key_sha256"}``, hex.

    Raises:
        CanonicalizationError: the policy snapshot cannot be canonicalised (a bug in a policy).
    """
    return {
        "policy_sha256": sha256_hex(canonical_json(policy)),
        "idempotency_key_sha256": sha256_hex(idempotency_key.encode()),
    }


#: ``stored_request_problem``'s default: read the submitted event's data.
READ_SUBMITTED = object()


def stored_request_problem(intent: Intent, *, recorded: Any = READ_SUBMITTED) -> str | None:
    """Why ``intent``'s stored request cannot be trusted any more, or None when it proves itself.

    Re-derives ``request_hash`` (RFC 8785 canonical fingerprint, ``operations.idempotency``)
    from the stored fields under the intent's ``fingerprint_version`` and compares it with the
    stored ``request_hash``; then compares both with the ``submitted`` audit event (an intent
    without one, e.g. a synthetic bench row, is judged by the first comparison alone).

    Returns a sentence starting with ``MISMATCH_HOLD`` that a person can act on. Never raises
    for stored data (a value that cannot be canonicalised is a problem, not an error).

    Args:
        recorded: the ``data`` of the intent's ``submitted`` event (seq 1) when the caller read
            it already (the claim returns it, ``claims.intent_claim``): a dict, or None when
            there is no such event; by default it is read here.
    """
    try:
        derived = fingerprint_hash(stored_fingerprint(intent))
    except (CanonicalizationError, ValueError) as exc:
        return (
            f"{MISMATCH_HOLD}: the stored arguments cannot be canonicalised any more ({exc}), so they "
            "cannot be proved to be what was submitted and approved; nothing is sent"
        )
    if derived != intent.request_hash:
        return (
            f"{MISMATCH_HOLD}: the stored tenant, action, version, arguments or reference no longer hash "
            f"to the request_hash {intent.request_hash[:12]}… it was submitted with (they hash to "
            f"{derived[:12]}…): the row was changed after submission; nothing is sent"
        )
    if recorded is READ_SUBMITTED:
        recorded = (
            AuditEvent.objects.filter(intent_id=intent.id, seq=1, event="submitted")
            .values_list("data", flat=True)
            .first()
        )
    if isinstance(recorded, dict):
        if recorded.get("request_hash") != intent.request_hash:
            return (
                f"{MISMATCH_HOLD}: the stored request_hash is not the one its submitted audit event "
                "records: the row was changed after submission; nothing is sent"
            )
        if recorded.get("fingerprint_version", 1) != intent.fingerprint_version:
            return (
                f"{MISMATCH_HOLD}: the stored fingerprint version is not the one its submitted audit "
                "event records: the row was changed after submission; nothing is sent"
            )
        return _seal_problem(intent, recorded)
    return None


def _seal_problem(intent: Intent, recorded: dict[str, Any]) -> str | None:
    """Compare the row's policy and provider key with the ``submission_seal`` its submitted
    event recorded (intents submitted before the seal existed have none: not compared)."""
    if "policy_sha256" not in recorded:
        return None
    try:
        seal = submission_seal(policy=intent.policy, idempotency_key=intent.idempotency_key)
    except (CanonicalizationError, ValueError, TypeError):
        seal = {}
    for name, what in (("policy_sha256", "policy"), ("idempotency_key_sha256", "provider idempotency key")):
        if seal.get(name) != recorded.get(name):
            return (
                f"{MISMATCH_HOLD}: the stored {what} is not the one its submitted audit event records: "
                "the row was changed after submission; nothing is sent"
            )
    return None
