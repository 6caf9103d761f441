"""Signed checkpoints of the audit log: what makes deleted tails, deleted chains, recomputed
chains and a truncated table detectable (issue 11 item 1).

The hash chains alone (``operations.audit.trail``) catch an edited event, but not the removal of a
chain's newest events, of a whole chain, nor a chain rewritten and re-hashed from some event on:
what is left is still a valid chain. A checkpoint pins the state down the way a Certificate
Transparency log's signed tree head does (RFC 9162 §4.10) and ledger databases' digests do:

- the *heads*: for every intent with events, ``(intent_id, last seq, last hash)``, in
  ascending ``intent_id`` order (PostgreSQL's uuid order, which is the order of the text form);
- the *root*: the RFC 9162 §2.1.1 Merkle Tree Hash (``operations.audit.merkle``) over one leaf per
  head, the leaf input being the RFC 8785 canonical JSON ``["<intent_id>",<seq>,"<hash>"]``
  (for these values, exactly that string). A Merkle root rather than one ordered hash, so a
  single chain's head can later be proven included without handing over every head;
- the *statement* that is signed: ``{version, digest, number, created_at, chains, events,
  root, prev_hash, key_id}`` as RFC 8785 canonical JSON, signed with Ed25519 (RFC 8032) by a
  key that is not in the database (``operations.audit.keys``). ``events`` is the sum of the
  heads' seqs, ``prev_hash`` the sha256 of the previous checkpoint's statement (64 zeros for the
  first), so the series has no silent gaps: ``number`` counts up from 1 without holes.

Each checkpoint is stored (``AuditCheckpoint``, append-only like the events, with the heads
zlib-compressed), logged as one JSON line and appended to a file (``AUDIT_CHECKPOINT_FILE``)
meant to be shipped away from the database (docs/explanation/audit-threat-model.md).

This module is the format: the statement, the heads, the file's lines (written and read back,
every field checked, since an auditor's copy may hold anything). Reading the checkpoint file is
``operations.audit.checkpoint_file``; signing a new checkpoint, which first verifies the log
against the previous one, is ``operations.audit.signing``.

Chains only grow, so a head read at any moment stays valid: verification asks whether the live
table still holds, for every checkpointed head, an event at that seq with that hash. Events
written after the checkpoint are covered by the next one (``operations.audit.verification``).
Events without an intent (the product writes none) are outside the checkpoint; the chain walk
still checks them.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connection

from operations.audit.merkle import MerkleRoot
from operations.idempotency import CanonicalizationError, canonical_json, sha256_hex
from operations.models import AuditCheckpoint

logger = logging.getLogger(__name__)

STATEMENT_VERSION = 1
DIGEST = "rfc9162-merkle-sha256"
FETCH_ROWS = 5000
# RFC 8785 §3.2.2.3 / I-JSON (RFC 7493 §2.2): integers beyond 2**53 - 1 are not exact.
MAX_JSON_INTEGER = 2**53 - 1
# The statement's fields and their JSON types; ``accepted`` appears only on a checkpoint an
# operator signed over acknowledged faults (``audit_checkpoint --accept-faults``).
STATEMENT_FIELDS: dict[str, type] = {
    "version": int,
    "digest": str,
    "number": int,
    "created_at": str,
    "chains": int,
    "events": int,
    "root": str,
    "prev_hash": str,
    "key_id": str,
}
LINE_FIELDS = {"checkpoint", "signature", "heads_zlib_base64"}
HEAD_INTENT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
HEAD_HASH = re.compile(r"[0-9a-f]{64}")
# A leaf input is at most 36 + 16 + 64 + 8 bytes; the heads of a checkpoint naming ``chains``
# chains never decompress past this many bytes per chain (a bound against zlib bombs).
HEAD_BYTES_MAX = 128

# One consistent snapshot (a single statement), plain reads: no lock an event writer waits on.
# DISTINCT ON keeps each intent's highest seq; PostgreSQL walks the (intent, seq) unique index.
HEADS_SQL = """
SELECT DISTINCT ON (intent_id) intent_id::text, seq, hash
FROM operations_auditevent
WHERE intent_id IS NOT NULL
ORDER BY intent_id, seq DESC
"""


class CheckpointError(Exception):
    """A checkpoint line or file cannot be read (not UTF-8, malformed JSON, a field missing or of
    the wrong type, no line), or the checkpoint file cannot be written."""


def leaf_input(intent_id: str, seq: int, head_hash: str) -> str:
    """The leaf input of one head: RFC 8785 JSON ``["<intent_id>",<seq>,"<hash>"]`` (a uuid's
    text and hex digits need no escaping, so the string is already canonical)."""
    return f'["{intent_id}",{seq},"{head_hash}"]'


@dataclass(frozen=True)
class SignedCheckpoint:
    """A checkpoint as signed: the statement (see the module docstring), the Ed25519 signature
    (128 hex digits) and the heads (zlib-compressed JSON array of leaf inputs)."""

    statement: dict[str, Any]
    signature: str
    heads: bytes

    @property
    def number(self) -> int:
        """The checkpoint's 1-based position in the series."""
        return int(self.statement["number"])

    def statement_bytes(self) -> bytes:
        """The signed message: RFC 8785 canonical JSON of the statement."""
        return canonical_json(self.statement)

    def statement_hash(self) -> str:
        """sha256 hex of the signed message: the next checkpoint's ``prev_hash``."""
        return sha256_hex(self.statement_bytes())

    def head_rows(self) -> list[tuple[str, int, str]]:
        """The heads as ``(intent_id, seq, hash)`` in leaf order.

        Raises:
            CheckpointError: the heads do not decompress or parse.
        """
        problem = f"checkpoint #{self.number}: the heads cannot be read"
        chains = self.statement.get("chains")
        limit = 2 + HEAD_BYTES_MAX * (chains if isinstance(chains, int) and chains > 0 else 1)
        try:
            inflater = zlib.decompressobj()
            text = inflater.decompress(self.heads, limit)
            if inflater.unconsumed_tail or not inflater.eof:
                raise CheckpointError(f"{problem}: longer than {chains} chains' heads, or cut short")
            rows = json.loads(text)
        except (zlib.error, ValueError, RecursionError) as exc:
            raise CheckpointError(f"{problem}: {exc}") from exc
        if not isinstance(rows, list) or not all(_is_head(row) for row in rows):
            raise CheckpointError(f"{problem}: not a list of [intent_id, seq, hash]")
        return [(intent, seq, digest) for intent, seq, digest in rows]

    def to_line(self) -> str:
        """One JSON line (no newline) for the checkpoint file: ``{"checkpoint": statement,
        "signature": hex, "heads_zlib_base64": ...}``."""
        return json.dumps(
            {
                "checkpoint": self.statement,
                "signature": self.signature,
                "heads_zlib_base64": base64.b64encode(self.heads).decode("ascii"),
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_line(cls, line: str) -> SignedCheckpoint:
        """Parse a line written by ``to_line``: every field present with its type, integers
        within RFC 8785's exact range, nothing else (an auditor's copy may hold anything, so
        nothing here may fail other than with ``CheckpointError``). Whether the signature and
        the heads are right is verification's question, not this one's.

        Raises:
            CheckpointError: not JSON, or a field is missing, unknown or malformed.
        """
        try:
            document = json.loads(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            raise CheckpointError(f"not an audit checkpoint line: {exc}") from exc
        if not isinstance(document, dict) or document.keys() != LINE_FIELDS:
            raise CheckpointError(f"not an audit checkpoint line: expected the fields {sorted(LINE_FIELDS)}")
        statement, signature = document["checkpoint"], document["signature"]
        problem = statement_problem(statement)
        if problem:
            raise CheckpointError(f"not an audit checkpoint line: {problem}")
        if not isinstance(signature, str) or not isinstance(document["heads_zlib_base64"], str):
            raise CheckpointError(
                "not an audit checkpoint line: 'signature' and 'heads_zlib_base64' must be text"
            )
        try:
            heads = base64.b64decode(document["heads_zlib_base64"], validate=True)
            canonical_json(statement)
        except (ValueError, binascii.Error, CanonicalizationError) as exc:
            raise CheckpointError(f"not an audit checkpoint line: {exc}") from exc
        return cls(statement=statement, signature=signature, heads=heads)

    @classmethod
    def from_row(cls, row: AuditCheckpoint) -> SignedCheckpoint:
        """The checkpoint a stored row claims to be (its signature is not checked here)."""
        return cls(
            statement=checkpoint_statement(row), signature=row.signature, heads=bytes(row.heads or b"")
        )


def _is_json_integer(value: Any, minimum: int = 0) -> bool:
    """An int (not a bool) from ``minimum`` to 2**53 - 1."""
    return isinstance(value, int) and not isinstance(value, bool) and minimum <= value <= MAX_JSON_INTEGER


def _is_head(row: Any) -> bool:
    """``[intent_id (lowercase uuid text), seq (>= 1), hash (64 hex)]``."""
    return (
        isinstance(row, list)
        and len(row) == 3
        and isinstance(row[0], str)
        and HEAD_INTENT.fullmatch(row[0]) is not None
        and _is_json_integer(row[1], 1)
        and isinstance(row[2], str)
        and HEAD_HASH.fullmatch(row[2]) is not None
    )


def statement_problem(statement: Any) -> str:
    """What is wrong with a statement's shape ('' when nothing): ``STATEMENT_FIELDS`` with their
    types, and an optional ``accepted`` ``{faults: [text], omitted: int, reason: text}``."""
    if not isinstance(statement, dict):
        return "'checkpoint' is not an object"
    names = statement.keys() - {"accepted"}
    if names != STATEMENT_FIELDS.keys():
        return f"'checkpoint' must have the fields {sorted(STATEMENT_FIELDS)} (and may have 'accepted')"
    for name, kind in STATEMENT_FIELDS.items():
        value = statement[name]
        valid = (
            _is_json_integer(value, 1 if name == "number" else 0) if kind is int else isinstance(value, kind)
        )
        if not valid:
            expected = "an integer from 0 to 2**53 - 1" if kind is int else "text"
            return f"'checkpoint.{name}' must be {expected}"
    accepted = statement.get("accepted", {"faults": [], "omitted": 0, "reason": ""})
    if isinstance(accepted, dict) and "restored" in accepted and not restored_gap(accepted):
        return "'checkpoint.accepted.restored' must be {database_newest: integer, file_newest: integer}"
    if not (
        isinstance(accepted, dict)
        and accepted.keys() - {"restored"} == {"faults", "omitted", "reason"}
        and isinstance(accepted["faults"], list)
        and all(isinstance(fault, str) for fault in accepted["faults"])
        and _is_json_integer(accepted["omitted"])
        and isinstance(accepted["reason"], str)
    ):
        return (
            "'checkpoint.accepted' must be {faults: [text], omitted: integer, reason: text} "
            "(and may have 'restored')"
        )
    return ""


def restored_gap(accepted: Any) -> tuple[int, int] | None:
    """The checkpoints a recovery's re-baseline says the database lost, as ``(database_newest,
    file_newest)``: numbers ``database_newest + 1 .. file_newest`` exist only in the checkpoint
    file (the database went back in time; issue 22). None when ``accepted`` records no restore
    or its ``restored`` is malformed."""
    restored = accepted.get("restored") if isinstance(accepted, dict) else None
    if not (
        isinstance(restored, dict)
        and restored.keys() == {"database_newest", "file_newest"}
        and _is_json_integer(restored["database_newest"])
        and _is_json_integer(restored["file_newest"], 1)
        and restored["database_newest"] < restored["file_newest"]
    ):
        return None
    return restored["database_newest"], restored["file_newest"]


def checkpoint_statement(row: AuditCheckpoint) -> dict[str, Any]:
    """The statement a stored row was signed over (reads no ``heads``, so a row fetched with
    ``defer("heads")`` costs no further query). ``accepted`` is there only when the row has it,
    so checkpoints signed without it verify as they always did."""
    statement: dict[str, Any] = {
        "version": STATEMENT_VERSION,
        "digest": DIGEST,
        "number": row.number,
        "created_at": row.created_at.isoformat(),
        "chains": row.chains,
        "events": row.events,
        "root": row.root,
        "prev_hash": row.prev_hash,
        "key_id": row.key_id,
    }
    if row.accepted is not None:
        statement["accepted"] = row.accepted
    return statement


def heads_read(*, observe: Callable[[str, int, str], None] | None = None) -> tuple[MerkleRoot, int, bytes]:
    """Every chain's head in one statement: the Merkle tree, the events count (sum of seqs) and
    the zlib-compressed heads. Streams through a server-side cursor (memory O(log n) plus the
    compressed heads).

    Args:
        observe: called with each head ``(intent_id, seq, hash)``, in leaf order (ascending
            ``intent_id``), as it streams past.
    """
    tree, events = MerkleRoot(), 0
    compressor = zlib.compressobj(6)
    chunks = [compressor.compress(b"[")]
    with connection.chunked_cursor() as cursor:
        cursor.execute(HEADS_SQL)
        while rows := cursor.fetchmany(FETCH_ROWS):
            for intent_id, seq, head_hash in rows:
                if observe is not None:
                    observe(intent_id, seq, head_hash)
                leaf = leaf_input(intent_id, seq, head_hash).encode("ascii")
                chunks.append(compressor.compress(leaf if tree.size == 0 else b"," + leaf))
                tree.add(leaf)
                events += seq
    chunks.append(compressor.compress(b"]"))
    chunks.append(compressor.flush())
    return tree, events, b"".join(chunks)


def checkpoint_latest() -> SignedCheckpoint | None:
    """The newest stored checkpoint, or None when there is none."""
    row = AuditCheckpoint.objects.order_by("-number").first()
    return SignedCheckpoint.from_row(row) if row else None


def printable(text: str) -> str:
    """``text`` with every character that is not printable written as its Python escape
    (``\\x1b``, ``\\r``...), so text from a checkpoint cannot move a terminal's cursor or hide
    lines when a command prints it."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)
