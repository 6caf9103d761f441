"""Issue 16 item 6: an intent's timeline shows every step once and consecutive lookups with the
same result as one line that opens on each (``reconciliation.timeline``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from operations.adapters.base import LookupResult, LookupStatus
from operations.models import Intent
from reconciliation import resolution
from reconciliation.lookups import record_lookup
from reconciliation.timeline import LookupRun, TimelineEntry, group_lookups, intent_timeline, merge_steps
from tests.console.test_every_kind import KINDS, build, serve_every_kind
from tests.factories import UserFactory

S = Intent.Status
T0 = datetime(2026, 12, 1, 23, 29, 27, tzinfo=UTC)


def lookup(seconds: float, result: str = "inconclusive", actor: str = "reconciler") -> TimelineEntry:
    return TimelineEntry(
        T0 + timedelta(seconds=seconds), "evidence", f"Lookup: {result}", actor, group=f"lookup:{result}"
    )


def audit(seconds: float, title: str, **kwargs: Any) -> TimelineEntry:
    return TimelineEntry(T0 + timedelta(seconds=seconds), "audit", title, **kwargs)


# --- pure logic --------------------------------------------------------------------------------


def test_i16_6_consecutive_lookups_with_one_result_are_one_line() -> None:
    # given: five inconclusive lookups from 23:29:27 to 23:29:52
    entries = [lookup(seconds) for seconds in (0, 5, 12, 20, 25)]
    # when
    lines = group_lookups(entries)
    # then
    assert len(lines) == 1 and isinstance(lines[0], LookupRun)
    assert lines[0].title == "5 lookups, inconclusive, 23:29:27–23:29:52"
    assert lines[0].entries == tuple(entries) and lines[0].actors == "reconciler"


def test_i39_4_a_run_of_lookups_says_its_result_in_words_as_the_unknown_page_does() -> None:
    # given: two "not found yet" lookups (newcomer: the timeline said "not_found_yet")
    entries = [lookup(seconds, "not_found_yet") for seconds in (0, 5)]
    # when / then
    assert group_lookups(entries)[0].title == "2 lookups, not found yet, 23:29:27–23:29:32"


def test_i16_6_another_result_or_another_step_breaks_a_run() -> None:
    # given: 2 inconclusive, an escalation, 1 inconclusive, 2 absent, 1 found
    entries = [
        lookup(0), lookup(1), audit(2, "escalated"), lookup(3),
        lookup(4, "absent"), lookup(5, "absent", actor="user:otto"), lookup(6, "found"),
    ]  # fmt: skip
    # when
    lines = group_lookups(entries)
    # then: runs of two or more become one line; a single lookup stays as it is
    assert [line.title for line in lines] == [
        "2 lookups, inconclusive, 23:29:27–23:29:28",
        "escalated",
        "Lookup: inconclusive",
        "2 lookups, absent, 23:29:31–23:29:32",
        "Lookup: found",
    ]
    assert lines[3].actors == "reconciler, user:otto"  # type: ignore[union-attr]


def test_i16_6_the_records_of_one_step_merge_into_its_audit_event_keeping_what_only_they_say() -> None:
    # given: a claim recorded as an audit event and an attempt; the attempt's end likewise, with
    # the provider's answer only on the attempt and a different value under one shared field
    claimed = audit(0, "claimed READY → RUNNING", keys=("attempt-start:1",), detail={"fence": 1})
    started = TimelineEntry(T0, "attempt", "attempt 1 started, fence 1", keys=("attempt-start:1",))
    ended_audit = audit(
        1.0, "outcome_unknown RUNNING → UNKNOWN", note="timeout", keys=("attempt-end:1",),
        detail={"fence": 1, "cause": "ambiguous", "status": "x"},
    )  # fmt: skip
    ended_attempt = TimelineEntry(
        T0 + timedelta(seconds=1.01), "attempt", "attempt 1 (fence 1) unknown", note="socket closed",
        keys=("attempt-end:1",), detail={"http_status": 504, "status": "y"},
    )  # fmt: skip
    # when
    merged = merge_steps([ended_attempt, started, ended_audit, claimed])
    # then: two entries, the audit events, each with the attempt's title, note and detail
    assert [entry.title for entry in merged] == [claimed.title, ended_audit.title]
    assert merged[0].also == ("attempt 1 started, fence 1",) and merged[0].sources == ("attempt",)
    assert merged[1].note == "timeout · socket closed"
    assert merged[1].detail == {
        "fence": 1, "cause": "ambiguous", "status": "x", "http_status": 504, "attempt.status": "y",
    }  # fmt: skip


def test_i16_6_records_of_different_steps_stay_apart() -> None:
    # given: an operator's decision evidence with another reason, and one an hour later
    decision = audit(0, "outcome_absent UNKNOWN → READY", keys=("decision:user:otto:not there",))
    other_reason = TimelineEntry(
        T0, "evidence", "Operator resolution: absent", keys=("decision:user:otto:x",)
    )
    later = TimelineEntry(
        T0 + timedelta(hours=1),
        "evidence",
        "Operator resolution: absent",
        keys=("decision:user:otto:not there",),
    )
    # when / then: nothing merges
    assert len(merge_steps([decision, other_reason, later])) == 3


# --- built through the services, every kind ----------------------------------------------------


def _titles(lines: list[Any]) -> list[str]:
    return [line.title for line in lines]


@pytest.mark.django_db
@pytest.mark.parametrize("kind", list(KINDS))
def test_i16_6_a_reconciled_and_resolved_unknown_shows_each_step_once(
    kind: str, settings: Any, approver: Any, viewer_client: Client
) -> None:
    # given: an UNKNOWN intent of every kind, looked up three times (inconclusive), then confirmed
    # by an operator
    serve_every_kind(settings)
    settings.EFFECT_LEDGER_POLICIES = {action: {"approval": "never"} for action, _ in KINDS.values()}
    intent = build(kind, S.UNKNOWN, settings=settings, approver=approver)
    for _ in range(3):
        record_lookup(intent.id, LookupResult(status=LookupStatus.INCONCLUSIVE, detail={"answer": "later"}))
    otto = UserFactory(username="otto", groups=["operator"])
    resolution.resolve_confirmed(
        intent_id=intent.id, user=otto, provider_reference="prov-9", reason="seen", accept_unverified=True
    )
    # when
    lines = intent_timeline(Intent.objects.get(id=intent.id))
    titles = _titles(lines)
    # then: one line per step; the claim, the attempt's end, the decision each once
    assert sum(title.startswith("claimed") for title in titles) == 1
    assert not any(title.startswith("attempt 1") for title in titles)  # merged into the audit events
    assert not any(title.startswith(("Operator resolution", "outcome from")) for title in titles)
    runs = [line for line in lines if isinstance(line, LookupRun)]
    assert len(runs) == 1 and runs[0].title.startswith("3 lookups, inconclusive, ")
    decided = next(line for line in lines if line.title.startswith("outcome_found"))
    assert decided.also == ("Operator resolution: confirmed", "outcome from operator: prov-9")
    assert "evidence_shown" in decided.detail  # only the resolution evidence had it
    # and both pages show the run as one expandable line, each lookup inside
    for name in ("intent-detail", "unknown-detail"):
        body = viewer_client.get(reverse(name, args=[intent.id])).content.decode()
        run = re.search(r'<details class="lookup-run">(.*?)</ol>\s*</details>', body, re.S)
        assert run and "3 lookups, inconclusive, " in run.group(1), name
        assert run.group(1).count('<li class="kind-evidence">') == 3, name
        assert body.count("attempt 1 started, fence 1") == 1, name  # once, inside the claim's line


@pytest.mark.django_db
def test_i16_6_a_lookup_that_found_the_effect_is_one_step(settings: Any, approver: Any) -> None:
    # given: an UNKNOWN charge a lookup found
    settings.EFFECT_LEDGER_POLICIES = {action: {"approval": "never"} for action, _ in KINDS.values()}
    intent = build("payments.charge", S.UNKNOWN, settings=settings, approver=approver)
    found = LookupResult(status=LookupStatus.FOUND, provider_references=("ch_7",))
    assert record_lookup(intent.id, found) == "resolved"
    # when
    titles = _titles(intent_timeline(Intent.objects.get(id=intent.id)))
    # then: the lookup, the transition and the outcome are one line
    assert [title for title in titles if "found" in title.lower() or "outcome from" in title] == [
        "outcome_found UNKNOWN → SUCCEEDED"
    ]
