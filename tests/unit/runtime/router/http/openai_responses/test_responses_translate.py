"""The Responses API's bodies into a chat turn: items in order, function calls after the assistant's text
joined into its message, outputs as tool messages, the stored conversation first and the instructions (never
carried over) before it; tools in the chat shape; refusals that name the item."""

from __future__ import annotations

from typing import Any

import pytest

from tgictl.errors import TgictlError
from tgictl.runtime.router.http.chat.messages import CalledTool, ChatMessage
from tgictl.runtime.router.http.openai_responses.schemas import ResponsesRequest
from tgictl.runtime.router.http.openai_responses.translate import chat_turn


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"input": "hi", **fields})


def test_items_in_order_with_the_stored_conversation_first() -> None:
    earlier = (ChatMessage("user", "before"), ChatMessage("assistant", "ok"))
    turn, conversation = chat_turn(request(instructions="Be brief.", input=[
        {"role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": ""},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hidden"}]},
        {"type": "function_call_output", "call_id": "c1", "output": "22C"},
    ]), earlier)
    assert conversation == (*earlier, ChatMessage("system", "dev"), ChatMessage(
        "assistant", "Let me.", (CalledTool("c1", "f", {"a": 1}), CalledTool("c2", "g", {}))),
        ChatMessage("tool", "22C", tool_call_id="c1"))
    assert turn.messages == (ChatMessage("system", "Be brief."), *conversation)


def test_tools_take_the_chat_shape_with_only_the_given_fields() -> None:
    turn, _ = chat_turn(request(tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                                tool_choice={"type": "function", "name": "f"}), ())
    assert turn.tools is not None and turn.tools.mode == "named"
    assert turn.tools.prompt_tools == ({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},)


@pytest.mark.parametrize(("fields", "words"), [
    ({"input": [{"type": "computer_call"}]}, "input[0]: items of type `computer_call`"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0]: content of type"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "needs its call_id"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]: tools of type `web_search`"),
    ({"text": {"format": {"type": "json_schema"}}}, "needs its `schema`"),
    ({"text": {"format": {"type": "json_object"}}, "tools": [{"type": "function", "name": "f"}]}, "mutually exclusive"),
    ({"input": []}, "`input` cannot be empty"),
])
def test_refusals_name_the_item(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(TgictlError) as info:
        chat_turn(request(**fields), ())
    assert words in info.value.message
