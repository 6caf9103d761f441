"""Signed checkpoints of the audit log: what makes deleted tails, deleted chains, recomputed
chains and a truncated table detectable (issue 11 item 1).

The hash chains alone (``operations.audit``) catch an edited event, but not the removal of a
chain's newest events, of a whole chain, nor a chain rewritten and re-hashed from some event on:
what is left is still a valid chain. A checkpoint pins the state down the way a Certificate
Transparency log's signed tree head does (RFC 9162 §4.10) and ledger databases' digests do:

- the *heads*: for every intent with events, ``(intent_id, last seq, last hash)``, in
  ascending ``intent_id`` order (PostgreSQL's uuid order, which is the order of the text form);
- the *root*: the RFC 9162 §2.1.1 Merkle Tree Hash (``operations.merkle``) over one leaf per
  head, the leaf input being the RFC 8785 canonical JSON ``["<intent_id>",<seq>,"<hash>"]``
  (for these values, exactly that string). A Merkle root rather than one ordered hash, so a
  single chain's head can later be proven included without handing over every head;
- the *statement* that is signed: ``{version, digest, number, created_at, chains, events,
  root, prev_hash, key_id}`` as RFC 8785 canonical JSON, signed with Ed25519 (RFC 8032) by a
  key that is not in the database (``operations.audit_keys``). ``events`` is the sum of the
  heads' seqs, ``prev_hash`` the sha256 of the previous checkpoint's statement (64 zeros for the
  first), so the series has no silent gaps: ``number`` counts up from 1 without holes.

Each checkpoint is stored (``AuditCheckpoint``, append-only like the events, with the heads
zlib-compressed), logged as one JSON line and appended to a file (``AUDIT_CHECKPOINT_FILE``)
meant to be shipped away from the database (README, "Threat model of the audit trail").

Chains only grow, so a head read at any moment stays valid: verification asks whether the live
table still holds, for every checkpointed head, an event at that seq with that hash. Events
written after the checkpoint are covered by the next one (``operations.checkpoint_verification``).
Events without an intent (the product writes none) are outside the checkpoint; the chain walk
still checks them.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from operations.audit import GENESIS
from operations.audit_keys import key_id, signing_key_load
from operations.idempotency import canonical_json, sha256_hex
from operations.merkle import MerkleRoot
from operations.models import AuditCheckpoint

logger = logging.getLogger(__name__)

STATEMENT_VERSION = 1
DIGEST = "rfc9162-merkle-sha256"
# pg_advisory_xact_lock key serialising checkpoint writers (never the event writers).
ADVISORY_LOCK_ID = 0x61756469_74636B70  # "auditckp"
FETCH_ROWS = 5000

# One consistent snapshot (a single statement), plain reads: no lock an event writer waits on.
# DISTINCT ON keeps each intent's highest seq; PostgreSQL walks the (intent, seq) unique index.
HEADS_SQL = """
SELECT DISTINCT ON (intent_id) intent_id::text, seq, hash
FROM operations_auditevent
WHERE intent_id IS NOT NULL
ORDER BY intent_id, seq DESC
"""


class CheckpointError(Exception):
    """A checkpoint line or file cannot be read (malformed JSON, missing fields, no line), or
    the checkpoint file cannot be written."""


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
        try:
            rows = json.loads(zlib.decompress(self.heads))
            return [(str(intent), int(seq), str(digest)) for intent, seq, digest in rows]
        except (zlib.error, ValueError, TypeError) as exc:
            raise CheckpointError(f"checkpoint #{self.number}: the heads cannot be read: {exc}") from exc

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
        """Parse a line written by ``to_line``.

        Raises:
            CheckpointError: not JSON, or a field is missing or malformed.
        """
        try:
            document = json.loads(line)
            statement = document["checkpoint"]
            signature = str(document["signature"])
            heads = base64.b64decode(document["heads_zlib_base64"], validate=True)
            int(statement["number"])
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise CheckpointError(f"not an audit checkpoint line: {exc}") from exc
        if not isinstance(statement, dict):
            raise CheckpointError("not an audit checkpoint line: 'checkpoint' is not an object")
        return cls(statement=statement, signature=signature, heads=heads)

    @classmethod
    def from_row(cls, row: AuditCheckpoint) -> SignedCheckpoint:
        """The checkpoint a stored row claims to be (its signature is not checked here)."""
        return cls(
            statement=checkpoint_statement(row), signature=row.signature, heads=bytes(row.heads or b"")
        )


def checkpoint_statement(row: AuditCheckpoint) -> dict[str, Any]:
    """The statement a stored row was signed over (reads no ``heads``, so a row fetched with
    ``defer("heads")`` costs no further query)."""
    return {
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


def checkpoint_file_path() -> Path:
    """The append-only checkpoint file (``AUDIT_CHECKPOINT_FILE``)."""
    return Path(settings.EFFECT_LEDGER["AUDIT_CHECKPOINT_FILE"])


def _read_heads() -> tuple[MerkleRoot, int, bytes]:
    """Every chain's head in one statement: the Merkle tree, the events count (sum of seqs) and
    the zlib-compressed heads. Streams through a server-side cursor (memory O(log n) plus the
    compressed heads)."""
    tree, events = MerkleRoot(), 0
    compressor = zlib.compressobj(6)
    chunks = [compressor.compress(b"[")]
    with connection.chunked_cursor() as cursor:
        cursor.execute(HEADS_SQL)
        while rows := cursor.fetchmany(FETCH_ROWS):
            for intent_id, seq, head_hash in rows:
                leaf = leaf_input(intent_id, seq, head_hash).encode("ascii")
                chunks.append(compressor.compress(leaf if tree.size == 0 else b"," + leaf))
                tree.add(leaf)
                events += seq
    chunks.append(compressor.compress(b"]"))
    chunks.append(compressor.flush())
    return tree, events, b"".join(chunks)


def audit_checkpoint_create(*, only_if_changed: bool = False) -> AuditCheckpoint | None:
    """Record, sign, store and publish a checkpoint of every chain's head.

    Call outside any transaction: the row is committed before the checkpoint is written out
    (logged, and appended to ``AUDIT_CHECKPOINT_FILE``), so the file never holds a checkpoint
    the database lost by a rollback. Checkpoint writers are serialised by a transaction-level
    advisory lock; event writers are never blocked (the heads are one plain read).

    Args:
        only_if_changed: return None without a new checkpoint when the heads equal the latest
            checkpoint's (the beat's way of not storing one every period while idle).

    Returns:
        The stored row, or None (``only_if_changed`` and nothing changed).

    Raises:
        operations.audit_keys.AuditKeyError: no usable signing key (nothing is stored).
        CheckpointError: stored, but the checkpoint file could not be written.
    """
    private_key = signing_key_load()
    signer_id = key_id(private_key.public_key())
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_LOCK_ID])
        previous = AuditCheckpoint.objects.defer("heads").order_by("-number").first()
        tree, events, heads = _read_heads()
        root = tree.hexdigest()
        if only_if_changed and previous is not None and (previous.root, previous.chains) == (root, tree.size):
            return None
        row = AuditCheckpoint(
            number=previous.number + 1 if previous else 1,
            created_at=timezone.now(),
            chains=tree.size,
            events=events,
            root=root,
            prev_hash=sha256_hex(canonical_json(checkpoint_statement(previous))) if previous else GENESIS,
            key_id=signer_id,
            heads=heads,
        )
        row.signature = private_key.sign(canonical_json(checkpoint_statement(row))).hex()
        row.save(force_insert=True)
    checkpoint_publish(SignedCheckpoint.from_row(row))
    return row


def checkpoint_publish(checkpoint: SignedCheckpoint) -> None:
    """Write ``checkpoint`` outward: one JSON log line (logger ``operations.checkpoints``, the
    statement and signature, without the heads) and one line appended to
    ``AUDIT_CHECKPOINT_FILE`` (with the heads), flushed and fsynced.

    Raises:
        CheckpointError: the file cannot be written (the error is logged too).
    """
    logger.info(
        "audit checkpoint signed",
        extra={"audit_checkpoint": checkpoint.statement, "signature": checkpoint.signature},
    )
    path = checkpoint_file_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_APPEND: the line goes at the end even with several writers.
        with path.open("a", encoding="utf-8") as handle:
            handle.write(checkpoint.to_line() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        message = (
            f"audit checkpoint #{checkpoint.number} is stored but was not written to {path}: {exc.strerror}"
        )
        logger.error(message)
        raise CheckpointError(message) from exc


def checkpoint_from_file(path: Path) -> SignedCheckpoint:
    """The checkpoint on the last non-blank line of ``path`` (an auditor's copy of the file).

    Raises:
        CheckpointError: the file is unreadable, has no line, or its last line is malformed.
    """
    last = ""
    try:
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    last = line
    except OSError as exc:
        raise CheckpointError(f"cannot read the checkpoint file {path}: {exc.strerror}") from exc
    if not last:
        raise CheckpointError(f"the checkpoint file {path} holds no checkpoint")
    try:
        return SignedCheckpoint.from_line(last)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}, last line: {exc}") from exc


def checkpoint_latest() -> SignedCheckpoint | None:
    """The newest stored checkpoint, or None when there is none."""
    row = AuditCheckpoint.objects.order_by("-number").first()
    return SignedCheckpoint.from_row(row) if row else None
