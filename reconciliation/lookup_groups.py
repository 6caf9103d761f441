"""The reconciler's lookups of one intent, consecutive alike ones as one group (issue 39 item 4).

An UNKNOWN intent is looked up again and again with backoff; its page listed every lookup with
its JSON (five identical ``not_found_yet`` rows). Consecutive lookups with the same result and
the same provider references are one group: "5 lookups, not found yet, 13:15:15–13:15:40",
which the page opens on each of them. The timeline does the same for its lines
(``reconciliation.timeline.group_lookups``); this works on the ``Evidence`` rows themselves,
which carry the provider references and the detail the lookups section shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from reconciliation.models import Evidence


@dataclass(frozen=True)
class LookupGroup:
    """One or more consecutive lookups (``Evidence`` rows of kind ``lookup``, oldest first) with
    the same result and provider references."""

    rows: tuple[Evidence, ...]

    @property
    def count(self) -> int:
        return len(self.rows)

    @property
    def result(self) -> str:
        """The lookup status as stored (``not_found_yet``)."""
        return self.rows[0].result

    @property
    def result_words(self) -> str:
        """The status for people: ``not found yet``."""
        return self.result.replace("_", " ")

    @property
    def first_at(self) -> datetime:
        return self.rows[0].created_at

    @property
    def last_at(self) -> datetime:
        return self.rows[-1].created_at

    @property
    def references(self) -> list[str]:
        """The provider references the group's lookups named (the same for each)."""
        return list(self.rows[0].provider_references or [])

    @property
    def actors(self) -> str:
        """Who looked, in order of first appearance (``reconciler, user:otto``)."""
        return ", ".join(dict.fromkeys(row.actor for row in self.rows))

    @property
    def title(self) -> str:
        """``5 lookups, not found yet, 13:15:15–13:15:40`` or ``1 lookup, found, 13:15:15`` (UTC,
        to the second)."""
        when = f"{self.first_at:%H:%M:%S}"
        if self.count > 1:
            when += f"–{self.last_at:%H:%M:%S}"
        return f"{self.count} lookup{'s' if self.count > 1 else ''}, {self.result_words}, {when}"


def group_lookups(rows: Sequence[Evidence]) -> list[LookupGroup]:
    """``rows`` (lookups, oldest first) as groups of consecutive lookups with the same result and
    provider references, in order. Pure: no database."""
    groups: list[list[Evidence]] = []
    for row in rows:
        if groups and _same(groups[-1][-1], row):
            groups[-1].append(row)
        else:
            groups.append([row])
    return [LookupGroup(tuple(group)) for group in groups]


def lookup_tally(groups: Sequence[LookupGroup]) -> list[tuple[str, int]]:
    """How many lookups answered each result, in the order the results first appeared:
    ``[("not found yet", 5), ("inconclusive", 2)]``."""
    tally: dict[str, int] = {}
    for group in groups:
        tally[group.result_words] = tally.get(group.result_words, 0) + group.count
    return list(tally.items())


def _same(one: Evidence, other: Evidence) -> bool:
    return one.result == other.result and list(one.provider_references or []) == list(
        other.provider_references or []
    )
