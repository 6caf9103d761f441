"""Issue 21, item 6: nothing a provider sends, and no error of our own, leaves an intent RUNNING.

The adapters here are registered through ``settings.EFFECT_LEDGER_ADAPTERS`` and never touch
the network; what they answer is set per test through ``Answers``.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from django.db import OperationalError

from operations.adapters.base import ExecutionCall, ExecutionResult, LookupResult, LookupStatus
from operations.adapters.errors import TerminalError
from operations.adapters.sandbox import SandboxPaymentsAdapter
from operations.engine.protocol import execute_intent
from operations.models import Attempt, AuditEvent, Intent, Outcome
from operations.services import claims, execution
from reconciliation.lookups import reconcile_intent
from reconciliation.models import Evidence
from tests.factories import submit

pytestmark = pytest.mark.django_db

S = Intent.Status
LONG_ID = "ch_" + "x" * 307  # 310 characters; the column holds 200


class Answers:
    """What the scripted adapter answers next (set by each test)."""

    execute: Any = None
    lookup: Any = None
    calls = 0


class ScriptedPayments(SandboxPaymentsAdapter):
    """``payments.charge`` with the sandbox's schema and capabilities, answering from ``Answers``."""

    def execute(self, call: ExecutionCall) -> ExecutionResult:
        Answers.calls += 1
        if isinstance(Answers.execute, Exception):
            raise Answers.execute
        result: ExecutionResult = Answers.execute
        return result

    def lookup(self, call: ExecutionCall) -> LookupResult:
        result: LookupResult = Answers.lookup
        return result


@pytest.fixture
def scripted(settings: Any) -> type[Answers]:
    settings.EFFECT_LEDGER_ADAPTERS = {"payments.charge": f"{__name__}.ScriptedPayments"}
    settings.EFFECT_LEDGER_POLICIES = {"payments.charge": {"approval": "never"}}
    Answers.execute, Answers.lookup, Answers.calls = None, None, 0
    return Answers


def test_i21_6_an_over_long_provider_reference_ends_unknown_with_its_evidence(scripted: Any) -> None:
    # given: the provider accepts the charge and answers with a 310-character id
    scripted.execute = ExecutionResult(provider_reference=LONG_ID, response_digest="a" * 64)
    intent = submit()
    # when
    label = execute_intent(intent.id)
    # then: UNKNOWN, in front of operators at once, with the id's sha256, length and prefix
    intent.refresh_from_db()
    assert (label, intent.status) == ("unknown", S.UNKNOWN)
    assert intent.escalated_at is not None
    assert "312" not in intent.last_error and "310 characters" in intent.last_error
    attempt = Attempt.objects.get(intent=intent)
    evidence = attempt.detail["provider_answer"]["provider_reference"]
    assert evidence["sha256"] == hashlib.sha256(LONG_ID.encode()).hexdigest()
    assert evidence["length"] == 310 and LONG_ID.startswith(evidence["prefix"])
    assert not Outcome.objects.filter(intent=intent).exists()
    assert AuditEvent.objects.filter(intent=intent, event="escalated").count() == 1


def test_i21_6_nul_characters_and_unstorable_json_in_a_refusal_are_recorded(scripted: Any) -> None:
    # given: a refusal whose message and detail hold what PostgreSQL refuses
    deep: Any = "bottom"
    for _ in range(200):
        deep = {"d": deep}
    scripted.execute = TerminalError(
        "card\x00 declined \ud800",
        detail={"code": "dec\x00lined", "ratio": float("nan"), "deep": deep, "raw": b"\x00bytes", "k\x00": 1},
    )
    intent = submit()
    # when
    label = execute_intent(intent.id)
    # then: FAILED as the provider said, the text cleaned, nothing lost silently
    intent.refresh_from_db()
    assert (label, intent.status) == ("failed", S.FAILED)
    assert intent.last_error == "card declined \ufffd"
    detail = Attempt.objects.get(intent=intent).detail
    assert detail["code"] == "declined" and detail["ratio"] == "nan" and "k" in detail
    assert "not stored" in str(detail["deep"])


def test_i21_6_nul_characters_in_a_success_detail_and_digest_are_recorded(scripted: Any) -> None:
    # given
    scripted.execute = ExecutionResult(
        provider_reference="ch_1", response_digest="not\x00a digest", detail={"note": "\x00ok"}
    )
    intent = submit()
    # when
    label = execute_intent(intent.id)
    # then
    intent.refresh_from_db()
    outcome = Outcome.objects.get(intent=intent)
    assert (label, intent.status, outcome.provider_reference) == ("succeeded", S.SUCCEEDED, "ch_1")
    assert outcome.detail["note"] == "ok" and outcome.response_digest == ""
    assert outcome.detail["response_digest_unstorable"]["length"] == 12


def test_i21_6_an_error_while_recording_ends_unknown_with_the_evidence(
    scripted: Any, monkeypatch: Any
) -> None:
    # given: the provider accepted the charge, and recording the success fails (our own bug)
    scripted.execute = ExecutionResult(provider_reference="ch_9", response_digest="b" * 64)

    def broken(**kwargs: Any) -> bool:
        raise RuntimeError("bug in the recorder")

    monkeypatch.setattr(execution, "intent_record_success", broken)
    intent = submit()
    # when
    label = execute_intent(intent.id)
    # then: UNKNOWN (never RUNNING), escalated, with what the provider answered
    intent.refresh_from_db()
    assert (label, intent.status) == ("unknown", S.UNKNOWN)
    assert intent.escalated_at is not None and intent.lease_owner == ""
    detail = Attempt.objects.get(intent=intent).detail
    assert detail["provider_answer"]["provider_reference"] == "ch_9"
    assert "bug in the recorder" in detail["recording_error"]


def test_i21_6_a_programming_error_before_the_call_ends_failed_named_as_such(
    scripted: Any, monkeypatch: Any
) -> None:
    # given: the re-check itself has a bug
    def broken(intent: Intent) -> str | None:
        raise TypeError("unsupported operand")

    monkeypatch.setattr(execution, "precheck_refusal", broken)
    intent = submit()
    # when
    label = execute_intent(intent.id)
    # then: FAILED, named a programming error, nothing sent
    intent.refresh_from_db()
    assert (label, intent.status) == ("failed", S.FAILED)
    assert "programming error before the provider call" in intent.last_error
    assert Attempt.objects.get(intent=intent).result == Attempt.Result.SKIPPED
    assert scripted.calls == 0


def test_i21_6_a_database_error_before_the_call_ends_ready_with_backoff(
    scripted: Any, monkeypatch: Any
) -> None:
    # given: a transient database error (a deadlock, a statement timeout) in the re-check
    def flaky(intent: Intent) -> str | None:
        raise OperationalError("deadlock detected")

    monkeypatch.setattr(execution, "precheck_refusal", flaky)
    intent = submit()
    # when
    label = execute_intent(intent.id)
    # then: READY again, with a backoff, within the budget; nothing sent
    intent.refresh_from_db()
    assert (label, intent.status) == ("retry", S.READY)
    assert intent.not_before is not None and intent.attempt_count == 1
    assert scripted.calls == 0


def test_i21_6_an_over_long_or_nul_reference_in_a_lookup_is_evidence_not_a_failed_write(
    scripted: Any,
) -> None:
    # given: an UNKNOWN intent whose lookup answers an id we cannot store, with a NUL detail
    scripted.execute = TerminalError("placeholder")
    intent = submit()
    claim = claims.intent_claim(intent_id=intent.id, worker="w", lease_seconds=30)
    assert claim is not None
    assert execution.intent_mark_unknown(claim=claim, error="timeout after send", cause="ambiguous")
    scripted.lookup = LookupResult(
        status=LookupStatus.FOUND, provider_references=(LONG_ID,), detail={"note": "a\x00b"}
    )
    # when
    result = reconcile_intent(intent.id)
    # then: recorded as inconclusive evidence with the id's digest; the intent waits
    intent.refresh_from_db()
    assert (result, intent.status) == ("waiting", S.UNKNOWN)
    evidence = Evidence.objects.get(intent=intent, kind=Evidence.Kind.LOOKUP)
    assert evidence.result == LookupStatus.INCONCLUSIVE
    assert evidence.detail["unstorable_references"][0]["length"] == 310
    assert evidence.detail["note"] == "ab"
