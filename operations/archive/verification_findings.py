"""The findings of the archive's verification (``operations.archive.verification``): their
kinds, one finding, and the report that collects them."""

from __future__ import annotations

from dataclasses import dataclass, field

# The findings' names.
MISSING_FILE = "missing archive file"
UNREADABLE_FILE = "unreadable archive file"
ALTERED_FILE = "altered archive file"
ALTERED_RECORD = "altered record"
BAD_SIGNATURE = "bad signature"
UNKNOWN_KEY = "unknown key"
SWAPPED_MANIFEST = "swapped manifest"
DELETED_SEGMENT = "deleted segment"
BROKEN_CHAIN = "broken archived chain"
ALTERED_HEAD = "altered head"
ALTERED_HEADS = "altered heads"
BAD_PROOF = "bad inclusion proof"
MISSING_INTENT = "missing intent"
UNINDEXED = "unindexed"
STILL_LIVE = "archived yet live"
SUPERSEDED_CHAIN = "superseded chain"

#: Intents named in a finding about a whole file (the rest are counted).
INTENTS_NAMED = 3
#: Intents looked up in the live tables per query.
LIVE_BATCH = 2000
#: Of the given (intent, seq, hash), those the live audit table holds.
HOLDS_HEAD_SQL = """
SELECT h.intent_id::text
FROM unnest(%s::uuid[], %s::integer[], %s::text[]) AS h(intent_id, seq, hash)
WHERE EXISTS (
    SELECT 1 FROM operations_auditevent e WHERE e.intent_id = h.intent_id AND e.seq = h.seq AND e.hash = h.hash
)
"""


@dataclass(frozen=True)
class ArchiveFinding:
    """One thing ``archive_verify`` found: ``kind`` is one of the module's names, ``problem`` a
    sentence naming the file and the intent; ``file`` (relative to the archive directory) and
    ``intent_id`` repeat them for a program."""

    kind: str
    problem: str
    file: str | None = None
    intent_id: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.problem}"


@dataclass
class ArchiveReport:
    """What ``archive_verify`` read (``segments``, ``intents`` and ``events`` in the files,
    ``proofs`` verified) and found (at most ``limit`` findings; ``omitted`` counts the rest)."""

    segments: int = 0
    intents: int = 0
    events: int = 0
    proofs: int = 0
    findings: list[ArchiveFinding] = field(default_factory=list)
    omitted: int = 0
    limit: int = 1000

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not self.findings and not self.omitted

    def add(self, finding: ArchiveFinding) -> None:
        """Record a finding (counted only, past ``limit``)."""
        if len(self.findings) < self.limit:
            self.findings.append(finding)
        else:
            self.omitted += 1
