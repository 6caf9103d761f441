"""Checking what an archive segment's signatures, inclusion proofs and records claim: a
statement signed by the audit key (``statement_signed``), the signed checkpoints proofs lead to
(``CheckpointRoots``), one inclusion proof (``proof_problem``), and a record's stored request
against its own chain (``record_request_problem``)."""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.core.exceptions import ValidationError

from operations.archive.records import intent_of
from operations.audit.checkpoints import checkpoint_statement, leaf_input
from operations.audit.keys import signature_valid
from operations.audit.merkle import inclusion_verify
from operations.audit.request_integrity import MISMATCH_HOLD, stored_request_problem
from operations.idempotency import CanonicalizationError, canonical_json
from operations.models import AuditCheckpoint


def statement_signed(public_key: Ed25519PublicKey, signature: Any, statement: Any) -> bool:
    """Whether ``signature`` (hex text) is the key's signature of the canonical ``statement``."""
    try:
        message = canonical_json(statement)
    except (CanonicalizationError, TypeError):  # not canonical JSON: nothing was signed
        return False
    return isinstance(signature, str) and signature_valid(public_key, signature, message)


class CheckpointRoots:
    """The stored checkpoints a proof names: ``(root bytes, chains)`` when the row exists and is
    signed by the key, else the reason it cannot be used (looked up once per number)."""

    def __init__(self, public_key: Ed25519PublicKey) -> None:
        self.public_key = public_key
        self._known: dict[int, tuple[bytes, int] | str] = {}

    def get(self, number: int) -> tuple[bytes, int] | str:
        if number not in self._known:
            row = AuditCheckpoint.objects.defer("heads").filter(number=number).first()
            if row is None:
                self._known[number] = f"checkpoint #{number} is not in the database"
            elif not statement_signed(self.public_key, row.signature, checkpoint_statement(row)):
                self._known[number] = f"checkpoint #{number} is not signed by this key"
            else:
                self._known[number] = (bytes.fromhex(row.root), row.chains)
        return self._known[number]


def proof_problem(
    intent_id: str, proof: dict[str, Any], hashes: dict[int, str], roots: CheckpointRoots
) -> str:
    """What is wrong with one archived chain's inclusion proof ("" when nothing): the
    checkpoint's leaf must be in the archived chain (``hashes``: seq -> hash), and the path must
    lead from it to that signed checkpoint's root (RFC 9162 §2.1.3.2)."""
    leaf, number = proof.get("leaf"), proof.get("checkpoint")
    index, size, path = proof.get("leaf_index"), proof.get("tree_size"), proof.get("path")
    if not (
        isinstance(leaf, list)
        and len(leaf) == 3
        and leaf[0] == intent_id
        and isinstance(leaf[1], int)
        and isinstance(leaf[2], str)
        and isinstance(number, int)
        and isinstance(index, int)
        and isinstance(size, int)
        and isinstance(path, list)
        and all(isinstance(step, str) for step in path)
    ):
        return "its inclusion proof is malformed"
    if hashes.get(leaf[1]) != leaf[2]:
        return f"the chain lacks seq {leaf[1]} ({leaf[2][:12]}…), which checkpoint #{number} signed"
    checkpoint = roots.get(number)
    if isinstance(checkpoint, str):
        return f"its inclusion proof cannot be checked: {checkpoint}"
    root, chains = checkpoint
    try:
        siblings = [bytes.fromhex(step) for step in path]
    except ValueError:
        siblings = []
    if size != chains or not inclusion_verify(
        leaf_input(intent_id, leaf[1], leaf[2]).encode(), index, size, siblings, root
    ):
        return f"its inclusion proof does not lead to checkpoint #{number}'s signed root"
    return ""


def record_request_problem(intent: dict[str, Any], events: list[dict[str, Any]]) -> str:
    """Why an archived record's stored request (arguments, reference, action...) does not prove
    itself ("" when it does): it must still hash to its ``request_hash`` and match its
    ``submitted`` event, as a live intent's must (``stored_request_problem``). An argument edited
    in the file, outside the hash chain, is found here."""
    try:
        stand_in = intent_of({"intent": intent})
    except (TypeError, ValueError, ValidationError) as exc:
        return f"the intent's row cannot be read ({exc})"
    first = events[0] if events else {}
    recorded = first.get("data") if first.get("seq") == 1 and first.get("event") == "submitted" else None
    problem = stored_request_problem(stand_in, recorded=recorded)
    return problem.removeprefix(MISMATCH_HOLD + ": ").removesuffix("; nothing is sent") if problem else ""
