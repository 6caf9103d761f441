"""A segment's manifest (docs/reference/archive-format.md, "The manifest"): the signed
statement of what one archive file holds, its chains' heads, and an RFC 9162 inclusion proof of
each head that a signed checkpoint covered.

Signed like the checkpoints (``operations.audit.signing``): Ed25519 over the RFC 8785 canonical
JSON of the statement, with the audit signing key; each statement names its predecessor's hash,
so the segments form one series.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from operations.audit.checkpoints import SignedCheckpoint, leaf_input
from operations.audit.keys import key_id
from operations.audit.merkle import inclusion_proofs, merkle_root
from operations.idempotency import canonical_json, sha256_hex

MANIFEST_TYPE = "effect-ledger/archive-manifest"
MANIFEST_VERSION = 1
GENESIS = "0" * 64


def statement_hash(statement: dict[str, Any]) -> str:
    """sha256 hex of a statement's canonical JSON: the next segment's ``prev_hash``."""
    return sha256_hex(canonical_json(statement))


def heads_root(heads: Sequence[tuple[str, int, str]]) -> str:
    """The RFC 9162 Merkle tree hash of ``heads`` ((intent_id, seq, hash), in file order), with
    the checkpoints' leaf inputs (``operations.audit.checkpoints.leaf_input``)."""
    return merkle_root(leaf_input(*head).encode() for head in heads)


def manifest_build(
    *,
    number: int,
    prev_hash: str,
    period: date,
    file: str,
    file_sha256: str,
    size: int,
    heads: Sequence[tuple[str, int, str]],
    events: int,
    created_at: datetime,
    private_key: Ed25519PrivateKey,
    checkpoint: SignedCheckpoint | None,
) -> dict[str, Any]:
    """The manifest document of one segment: ``{"statement", "signature", "heads", "proofs"}``.

    ``proofs`` holds, for each head whose chain ``checkpoint`` (the newest signed checkpoint)
    covered, the inclusion proof of that checkpoint's leaf for the chain (the head as it was
    then: the archived chain holds it, or continues it).
    """
    statement = {
        "type": MANIFEST_TYPE,
        "version": MANIFEST_VERSION,
        "number": number,
        "prev_hash": prev_hash,
        "period": period.isoformat(),
        "file": file,
        "file_sha256": file_sha256,
        "bytes": size,
        "intents": len(heads),
        "events": events,
        "root": heads_root(heads),
        "created_at": created_at.isoformat(),
        "key_id": key_id(private_key.public_key()),
    }
    return {
        "statement": statement,
        "signature": private_key.sign(canonical_json(statement)).hex(),
        "heads": [list(head) for head in heads],
        "proofs": _proofs(heads, checkpoint) if checkpoint else [],
    }


def _proofs(heads: Sequence[tuple[str, int, str]], checkpoint: SignedCheckpoint) -> list[dict[str, Any]]:
    leaves = checkpoint.head_rows()
    position = {intent_id: index for index, (intent_id, _, _) in enumerate(leaves)}
    wanted = {intent_id: position[intent_id] for intent_id, _, _ in heads if intent_id in position}
    paths = inclusion_proofs([leaf_input(*leaf).encode() for leaf in leaves], wanted.values())
    return [
        {
            "intent_id": intent_id,
            "checkpoint": checkpoint.number,
            "tree_size": len(leaves),
            "leaf_index": index,
            "leaf": list(leaves[index]),
            "path": [sibling.hex() for sibling in paths[index]],
        }
        for intent_id, index in wanted.items()
    ]
