"""The framework examples in ``docs/examples/`` against the live product: the API served by
pytest-django's ``live_server``, a real Celery worker, the real sandbox provider, PostgreSQL, and
scripted models (no API key, no network but loopback).

Each framework's agent is crashed twice right after the ledger answered and run again (a
LangGraph graph resumed from its checkpoint; an OpenAI Agents SDK run started again under the
same run id): one intent, one effect at the provider. A charge above the approval threshold
waits in the tool until an approver approves, then answers SUCCEEDED with the provider's id.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from console.agents.client import EffectLedgerClient, Intent, derive_idempotency_key
from operations.models import Intent as IntentRow
from operations.services.approvals import intent_approve
from tests.factories import make_agent
from tests.support.workers import Cluster, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "examples"))

import langgraph_charge  # noqa: E402
import openai_agents_charge  # noqa: E402
from agents import set_tracing_disabled  # noqa: E402
from scripted_models import ScriptedChatModel, ScriptedModel  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

#: Above ``payments.charge``'s approval threshold for EUR (10,000 cents, console/settings_ledger.py).
NEEDS_APPROVAL_CENTS = 25_000


class Crash(BaseException):
    """The agent's process dies here (a BaseException, so neither framework turns it into a
    message for the model)."""


@dataclass
class Ledger:
    url: str
    token: str
    principal: str

    def intents(self) -> list[IntentRow]:
        """Every intent this agent submitted (rows of operations_intent)."""
        return list(IntentRow.objects.filter(principal=self.principal))


@pytest.fixture
def ledger(live_server: Any, cluster: Cluster) -> Iterator[Ledger]:
    """The API on a live server, one worker executing, and an agent's token."""
    cluster.worker("w1")
    agent, token = make_agent("billing-bot", actions=["payments.*"])
    set_tracing_disabled(True)  # the Agents SDK exports traces to OpenAI unless told not to
    try:
        yield Ledger(url=live_server.url, token=token, principal=f"agent:{agent.name}")
    finally:
        set_tracing_disabled(False)


def charge_arguments(reference: str, amount: int = 4990) -> dict[str, Any]:
    return {"amount": amount, "currency": "EUR", "customer": "cus_42", "reference": reference}


@dataclass
class CrashPlan:
    """Kills the agent twice, each time right after the ledger answered: after the first
    submission, and after the first wait that saw the charge settled. ``submissions`` records
    each submission's answer (``replayed``: the ledger recognised the key)."""

    crashes: list[str]
    submissions: list[Intent]


@pytest.fixture
def crash_plan(monkeypatch: pytest.MonkeyPatch) -> CrashPlan:
    plan = CrashPlan(crashes=[], submissions=[])
    submit, wait = EffectLedgerClient.submit, EffectLedgerClient.wait

    def crashing_submit(client: EffectLedgerClient, *args: Any, **kwargs: Any) -> Intent:
        intent = submit(client, *args, **kwargs)
        plan.submissions.append(intent)
        if not plan.crashes:
            plan.crashes.append("after the submission")
            raise Crash(plan.crashes[-1])
        return intent

    def crashing_wait(client: EffectLedgerClient, *args: Any, **kwargs: Any) -> Intent:
        intent = wait(client, *args, **kwargs)
        if intent.settled and len(plan.crashes) == 1:
            plan.crashes.append("after the outcome")
            raise Crash(plan.crashes[-1])
        return intent

    monkeypatch.setattr(EffectLedgerClient, "submit", crashing_submit)
    monkeypatch.setattr(EffectLedgerClient, "wait", crashing_wait)
    return plan


def approve_when_waiting(ledger: Ledger, approver: Any, delay: float) -> tuple[threading.Thread, list[float]]:
    """In another thread: once the agent's intent is AWAITING_APPROVAL, wait ``delay`` seconds
    and approve it as ``approver``; the monotonic time of the approval lands in the list."""
    approved_at: list[float] = []

    def approve() -> None:
        try:
            wait_for(lambda: any(i.status == "AWAITING_APPROVAL" for i in ledger.intents()), 30, "the charge")
            time.sleep(delay)
            (intent,) = ledger.intents()
            intent_approve(intent_id=intent.id, user=approver, request_hash=intent.request_hash)
            approved_at.append(time.monotonic())
        finally:
            connection.close()

    thread = threading.Thread(target=approve)
    thread.start()
    return thread, approved_at


def assert_one_intent_one_effect(ledger: Ledger, sandbox: Any, *, client_key: str) -> IntentRow:
    intents = ledger.intents()
    assert len(intents) == 1, f"{len(intents)} intents: {[(i.client_key, i.status) for i in intents]}"
    intent = intents[0]
    assert intent.client_key == client_key
    assert intent.status == "SUCCEEDED"
    effects = sandbox.ledger("payments")
    assert [e["idempotency_key"] for e in effects] == [intent.idempotency_key]
    return intent


def timed(run: Callable[[], Any]) -> tuple[Any, float]:
    """``run()``'s result and the monotonic time it returned at."""
    result = run()
    return result, time.monotonic()


# LangGraph


def test_langgraph_resumed_twice_after_crashes_makes_one_intent_and_one_effect(
    ledger: Ledger, sandbox: Any, crash_plan: CrashPlan
) -> None:
    # given: a graph whose model asks once for the charge (tool call id call_lg_1)
    model = ScriptedChatModel(tool="charge", arguments=charge_arguments("order-lg-1"), call_id="call_lg_1")
    graph = langgraph_charge.build_graph(model, base_url=ledger.url, token=ledger.token, wait_seconds=30)
    config: Any = {"configurable": {"thread_id": "order-lg-1"}}
    # when: the run dies after the submission, its resume from the checkpoint dies after the
    # outcome, and the second resume finishes
    with pytest.raises(Crash):
        graph.invoke(
            {"messages": [("user", "Charge cus_42 49.90 EUR for order-lg-1")]}, config, durability="sync"
        )
    with pytest.raises(Crash):
        graph.invoke(None, config, durability="sync")
    result = graph.invoke(None, config, durability="sync")
    # then
    assert crash_plan.crashes == ["after the submission", "after the outcome"]
    assert [s.replayed for s in crash_plan.submissions] == [False, True, True]
    assert model.calls == 2, "the resumes ran the tool from the checkpoint without asking the model again"
    intent = assert_one_intent_one_effect(ledger, sandbox, client_key="call_lg_1")
    answer = result["messages"][-1].content
    assert '"status": "SUCCEEDED"' in answer
    assert intent.outcomes.get().provider_reference in answer


def test_langgraph_tool_waits_for_the_approver(ledger: Ledger, sandbox: Any, approver: Any) -> None:
    # given: a charge above the approval threshold
    arguments = charge_arguments("order-lg-2", amount=NEEDS_APPROVAL_CENTS)
    model = ScriptedChatModel(tool="charge", arguments=arguments, call_id="call_lg_2")
    graph = langgraph_charge.build_graph(model, base_url=ledger.url, token=ledger.token, wait_seconds=30)
    approver_thread, approved_at = approve_when_waiting(ledger, approver, delay=1.0)
    # when
    result, returned_at = timed(
        lambda: graph.invoke(
            {"messages": [("user", "Charge 250 EUR")]},
            {"configurable": {"thread_id": "lg-2"}},
            durability="sync",
        )
    )
    approver_thread.join(10)
    # then: the tool answered only after the approval, with the charge done
    assert approved_at and returned_at > approved_at[0]
    intent = assert_one_intent_one_effect(ledger, sandbox, client_key="call_lg_2")
    answer = result["messages"][-1].content
    assert '"status": "SUCCEEDED"' in answer
    assert intent.outcomes.get().provider_reference in answer


# OpenAI Agents SDK


def run_agent(model: ScriptedModel, context: openai_agents_charge.LedgerContext, prompt: str) -> Any:
    agent = openai_agents_charge.build_agent(model)
    return asyncio.run(openai_agents_charge.Runner.run(agent, prompt, context=context))


def test_openai_agents_run_again_twice_after_crashes_makes_one_intent_and_one_effect(
    ledger: Ledger, sandbox: Any, crash_plan: CrashPlan
) -> None:
    # given: a run (id order-oa-1) whose model asks for the charge
    arguments = charge_arguments("order-oa-1")
    model = ScriptedModel(tool="charge", arguments=arguments, call_id="call_oa_1")
    context = openai_agents_charge.LedgerContext(
        base_url=ledger.url, token=ledger.token, run_id="order-oa-1", wait_seconds=30
    )
    prompt = "Charge cus_42 49.90 EUR for order-oa-1"
    # when: the run dies after the submission, the run started again dies after the outcome,
    # and the third run finishes
    with pytest.raises(Crash):
        run_agent(model, context, prompt)
    with pytest.raises(Crash):
        run_agent(model, context, prompt)
    result = run_agent(model, context, prompt)
    # then
    assert crash_plan.crashes == ["after the submission", "after the outcome"]
    assert [s.replayed for s in crash_plan.submissions] == [False, True, True]
    reference = arguments.pop("reference")
    key = derive_idempotency_key("order-oa-1", "payments.charge", arguments, reference=reference)
    intent = assert_one_intent_one_effect(ledger, sandbox, client_key=key)
    assert "'status': 'SUCCEEDED'" in result.final_output
    assert intent.outcomes.get().provider_reference in result.final_output


def test_openai_agents_tool_waits_for_the_approver(ledger: Ledger, sandbox: Any, approver: Any) -> None:
    # given: a charge above the approval threshold
    arguments = charge_arguments("order-oa-2", amount=NEEDS_APPROVAL_CENTS)
    model = ScriptedModel(tool="charge", arguments=arguments, call_id="call_oa_2")
    context = openai_agents_charge.LedgerContext(
        base_url=ledger.url, token=ledger.token, run_id="order-oa-2", wait_seconds=30
    )
    approver_thread, approved_at = approve_when_waiting(ledger, approver, delay=1.0)
    # when
    result, returned_at = timed(lambda: run_agent(model, context, "Charge 250 EUR"))
    approver_thread.join(10)
    # then: the tool answered only after the approval, with the charge done
    assert approved_at and returned_at > approved_at[0]
    reference = arguments.pop("reference")
    key = derive_idempotency_key("order-oa-2", "payments.charge", arguments, reference=reference)
    intent = assert_one_intent_one_effect(ledger, sandbox, client_key=key)
    assert "'status': 'SUCCEEDED'" in result.final_output
    assert intent.outcomes.get().provider_reference in result.final_output
