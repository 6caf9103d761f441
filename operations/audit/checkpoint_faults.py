"""What verifying the audit log against a signed checkpoint can find
(``operations.audit.verification``, ``operations.audit.checkpoint_heads``): the faults' names,
one ``CheckpointFault`` each, and the ``CheckpointReport`` that collects them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from operations.audit.checkpoints import SignedCheckpoint

# The faults verification names.
TRUNCATION = "truncation"
DELETED_CHAIN = "deleted chain"
DELETED_TAIL = "deleted tail"
DELETED_EVENT = "deleted event"
RECOMPUTED_CHAIN = "recomputed chain"
BAD_SIGNATURE = "bad signature"
UNKNOWN_KEY = "unknown key"
ALTERED_CHECKPOINT = "altered checkpoint"
DELETED_CHECKPOINT = "deleted checkpoint"


@dataclass(frozen=True)
class CheckpointFault:
    """One thing verification found: ``kind`` is one of the module's fault names
    (``deleted tail``, ``deleted chain``, ``recomputed chain``, ``truncation``, ...)."""

    kind: str
    problem: str
    intent_id: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.problem}"


@dataclass
class CheckpointReport:
    """The result of ``checkpoint_verify``: the checkpoint verified against (None when none
    exists), where it came from, the faults (at most ``limit``; ``omitted`` counts the rest),
    the live table's event count (None when not counted), the file lines read (``source``
    "file"), and the stored checkpoints signed over acknowledged faults, as ``(number,
    statement["accepted"])``. ``archived`` counts the checkpointed chains the archive holds
    instead of the live table (not faults)."""

    checkpoint: SignedCheckpoint | None
    source: str
    live_events: int | None
    faults: list[CheckpointFault] = field(default_factory=list)
    omitted: int = 0
    limit: int = 1000
    file_lines: int = 0
    #: file lines whose checkpoint the database lost in a restore that a recovery re-baselined
    restored_lines: int = 0
    accepted: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    #: checkpointed chains not in the live table because they were archived (issue 36): their
    #: archive index row is ``archived`` at the checkpointed head or after it
    archived: int = 0
    #: those archived after they grew past the checkpointed head, as ``(intent_id, checkpointed
    #: seq, checkpointed hash)``: the archive file's chain must hold that event
    #: (``operations.archive.verification.archive_verify``'s ``expected_events``)
    archived_later: list[tuple[str, int, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not self.faults and not self.omitted

    def add(self, fault: CheckpointFault) -> None:
        """Record a fault (counted only, past ``limit``)."""
        if len(self.faults) < self.limit:
            self.faults.append(fault)
        else:
            self.omitted += 1
