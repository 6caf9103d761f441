"""Scripted stand-ins for a language model, so the examples (and their tests) run without an API
key or any network but the ledger's: the model asks for one tool call with fixed arguments and a
fixed call id, and once the tool has answered, it answers with the tool's result.

``ScriptedChatModel`` is a LangChain chat model (for LangGraph); ``ScriptedModel`` an OpenAI
Agents SDK ``Model``. ``calls`` counts how often each was asked.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agents import Model, ModelResponse, Usage
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText


class ScriptedChatModel(BaseChatModel):
    """Asks for ``tool`` with ``arguments`` (call id ``call_id``); after a tool message, answers
    with its content."""

    tool: str
    arguments: dict[str, Any]
    call_id: str
    calls: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.calls += 1
        last = messages[-1]
        if isinstance(last, ToolMessage):
            message = AIMessage(content=f"The charge tool answered: {last.content}")
        else:
            message = AIMessage(
                content="", tool_calls=[{"name": self.tool, "args": self.arguments, "id": self.call_id}]
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


class ScriptedModel(Model):
    """Asks for ``tool`` with ``arguments`` (call id ``call_id``); once the input holds the call's
    output, answers with it."""

    def __init__(self, *, tool: str, arguments: dict[str, Any], call_id: str) -> None:
        self.tool = tool
        self.arguments = arguments
        self.call_id = call_id
        self.calls = 0

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        self.calls += 1
        items = input if isinstance(input, list) else []
        outputs = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
        output: ResponseFunctionToolCall | ResponseOutputMessage
        if outputs:
            text = ResponseOutputText(
                type="output_text", text=f"The charge tool answered: {outputs[-1]['output']}", annotations=[]
            )
            output = ResponseOutputMessage(
                id="msg_1", type="message", role="assistant", status="completed", content=[text]
            )
        else:
            output = ResponseFunctionToolCall(
                type="function_call",
                id="fc_1",
                call_id=self.call_id,
                name=self.tool,
                arguments=json.dumps(self.arguments),
            )
        return ModelResponse(output=[output], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the scripted model does not stream")
