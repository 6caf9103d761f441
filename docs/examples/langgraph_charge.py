"""A LangGraph agent whose ``charge`` tool goes through Effect Ledger instead of calling the
payment provider itself.

The idempotency key is the tool call's id. With ``durability="sync"`` LangGraph saves the
model's message (with its tool calls) in the checkpoint before the tool node runs, so a graph
resumed from its checkpoint after a crash (``graph.invoke(None, config)`` with the same
``thread_id``) calls the tool again with the same id: the ledger answers the intent the first try
created, and the provider is charged at most once. (With the default ``"async"`` durability a
crash during the tool call can lose that checkpoint; the resume then asks the model again, which
names a new call id, and the ledger gets a second intent for the same ``reference``. It is not
sent: it waits behind the first while that one is open, and once the first made its effect
(within the policy's ``reuse_window_seconds``, 24 hours for a charge by default) it is HELD as a
likely duplicate for a person, or REJECTED under ``after_success = "reject"``, and the tool tells
the model at once (``already_done``: the ledger's reason, naming the first intent).)

A charge the policy holds for a human (AWAITING_APPROVAL) is waited for in the tool, up to
``wait_seconds``; past that the model is told the status and the approval page, and a later
resume of the same thread picks the same intent up again.

Run against quickstart (the scripted model, no API key)::

    EFFECT_LEDGER_URL=http://127.0.0.1:8000 EFFECT_LEDGER_TOKEN=... python docs/examples/langgraph_charge.py

Any LangChain chat model with tool calling works in place of the scripted one
(``build_graph(ChatOpenAI(model="gpt-4.1-mini"), base_url=..., token=...)``).
"""

from __future__ import annotations

import os
import time
from typing import Annotated, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from console.agents.client import EffectLedgerClient, Intent


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


def build_graph(
    model: BaseChatModel,
    *,
    base_url: str,
    token: str,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    wait_seconds: float = 300.0,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """A model node and a tool node with ``charge``, compiled with ``checkpointer`` (in memory by
    default; a durable one such as ``PostgresSaver`` is what makes a resume survive a process).
    ``base_url``/``token``: the ledger and an agent's bearer token; ``wait_seconds``: how long the
    tool waits for an approval and the execution before answering the model."""

    @tool
    def charge(
        amount: int,
        currency: str,
        customer: str,
        reference: str,
        tool_call_id: Annotated[str, InjectedToolCallId],
    ) -> dict[str, Any]:
        """Charge a customer. amount: integer in minor units (cents); currency: ISO 4217 code;
        reference: the order or invoice this charge is for."""
        with EffectLedgerClient(base_url, token) as ledger:
            arguments = {"amount": amount, "currency": currency, "customer": customer}
            intent = ledger.submit(
                "payments.charge", arguments, idempotency_key=tool_call_id, reference=reference
            )
            deadline = time.monotonic() + wait_seconds
            # the approver, then the worker; a likely duplicate waits for a person: told at once
            while not intent.settled and not intent.likely_duplicate and time.monotonic() < deadline:
                intent = ledger.wait(intent.intent_id, timeout_seconds=deadline - time.monotonic())
            return tool_result(intent)

    tools = [charge]
    model_with_tools = model.bind_tools(tools)

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model_with_tools.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=checkpointer or InMemorySaver())


if __name__ == "__main__":
    from scripted_models import ScriptedChatModel

    order, amount = os.environ.get("ORDER", "order-1001"), int(os.environ.get("AMOUNT", "4990"))
    arguments = {"amount": amount, "currency": "EUR", "customer": "cus_42", "reference": order}
    graph = build_graph(
        ScriptedChatModel(tool="charge", arguments=arguments, call_id=f"call_{order}"),
        base_url=os.environ.get("EFFECT_LEDGER_URL", "http://127.0.0.1:8000"),
        token=os.environ["EFFECT_LEDGER_TOKEN"],
    )
    config: RunnableConfig = {"configurable": {"thread_id": order}}
    prompt = {"messages": [("user", f"Charge cus_42 {amount} cents (EUR) for {order}")]}
    result = graph.invoke(prompt, config, durability="sync")
    print(result["messages"][-1].content)
