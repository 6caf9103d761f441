"""An OpenAI Agents SDK agent whose ``charge`` function tool goes through Effect Ledger instead
of calling the payment provider itself.

The idempotency key is derived from the run's id (which the caller keeps, e.g. the order it is
working on) with the action and the arguments (``derive_idempotency_key``): a re-run after a
crash asks the model again, which names its tool call anew, but the same charge under the same
run gives the same key, so the ledger answers the intent the first run created and the provider
is charged at most once.

A charge the policy holds for a human (AWAITING_APPROVAL) is waited for in the tool, up to
``wait_seconds``; past that the model is told the status and the approval page, and re-running
the same run picks the same intent up again.

Run against quickstart (the scripted model, no API key; set ``OPENAI_MODEL=gpt-4.1-mini`` and
``OPENAI_API_KEY`` for a real one)::

    EFFECT_LEDGER_URL=http://127.0.0.1:8000 EFFECT_LEDGER_TOKEN=... python docs/examples/openai_agents_charge.py
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

from agents import Agent, Model, RunContextWrapper, Runner, function_tool, set_tracing_disabled

from console.agents.client import EffectLedgerClient, Intent, derive_idempotency_key


@dataclass(frozen=True)
class LedgerContext:
    """The run's context: the ledger, an agent's bearer token, and the id of this run (stable
    across re-runs of the same work)."""

    base_url: str
    token: str
    run_id: str
    wait_seconds: float = 300.0


def tool_result(intent: Intent) -> dict[str, Any]:
    """What the model is told: the intent, its status, the provider's id of the effect once
    there is one, the approval page while a human has still to decide, and why it was held or
    refused when the same charge was already done (``likely_duplicate``)."""
    duplicate = intent.likely_duplicate
    return {
        "intent_id": intent.intent_id,
        "status": intent.status,
        "provider_reference": intent.outcome.provider_reference if intent.outcome else None,
        "approval_page": intent.console_url if intent.status == "AWAITING_APPROVAL" else None,
        "error": intent.last_error or None,
        "already_done": duplicate["reason"] if duplicate else None,
    }


@function_tool
def charge(
    ctx: RunContextWrapper[LedgerContext], amount: int, currency: str, customer: str, reference: str
) -> dict[str, Any]:
    """Charge a customer.

    Args:
        amount: integer in minor units (cents).
        currency: ISO 4217 code.
        customer: the customer's id.
        reference: the order or invoice this charge is for.
    """
    run = ctx.context
    with EffectLedgerClient(run.base_url, run.token) as ledger:
        arguments = {"amount": amount, "currency": currency, "customer": customer}
        key = derive_idempotency_key(run.run_id, "payments.charge", arguments, reference=reference)
        intent = ledger.submit("payments.charge", arguments, idempotency_key=key, reference=reference)
        deadline = time.monotonic() + run.wait_seconds
        # the approver, then the worker; a likely duplicate waits for a person: told at once
        while not intent.settled and not intent.likely_duplicate and time.monotonic() < deadline:
            intent = ledger.wait(intent.intent_id, timeout_seconds=deadline - time.monotonic())
        return tool_result(intent)


def build_agent(model: str | Model) -> Agent[LedgerContext]:
    """The agent with the ``charge`` tool; ``model``: a model name or a ``Model``. The ledger's
    address, the token and the run's id travel in the run's context (``LedgerContext``)."""
    return Agent[LedgerContext](
        name="Billing agent",
        instructions="Charge customers with the charge tool; report its status and provider reference.",
        tools=[charge],
        model=model,
    )


if __name__ == "__main__":
    from scripted_models import ScriptedModel

    order, amount = os.environ.get("ORDER", "order-2001"), int(os.environ.get("AMOUNT", "4990"))
    arguments = {"amount": amount, "currency": "EUR", "customer": "cus_42", "reference": order}
    model = os.environ.get("OPENAI_MODEL") or ScriptedModel(
        tool="charge", arguments=arguments, call_id=f"call_{order}"
    )
    set_tracing_disabled(not os.environ.get("OPENAI_MODEL"))  # the SDK sends traces to OpenAI by default
    context = LedgerContext(
        base_url=os.environ.get("EFFECT_LEDGER_URL", "http://127.0.0.1:8000"),
        token=os.environ["EFFECT_LEDGER_TOKEN"],
        run_id=order,
    )
    prompt = f"Charge cus_42 {amount} cents (EUR) for {order}"
    result = asyncio.run(Runner.run(build_agent(model), prompt, context=context))
    print(result.final_output)
