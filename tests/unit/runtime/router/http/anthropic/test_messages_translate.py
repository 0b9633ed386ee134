"""Anthropic's bodies into a chat turn: system first, a user's tool_result blocks as tool messages before its
text, an assistant's tool_use blocks as its calls, thinking blocks left out; tool_choice and thinking mapped;
what a local model cannot serve refused with the place it is in."""

from __future__ import annotations

from typing import Any

import pytest

from tgictl.errors import TgictlError
from tgictl.runtime.router.http.anthropic.schemas import MessagesRequest
from tgictl.runtime.router.http.anthropic.translate import chat_turn, tool_use_id
from tgictl.runtime.router.http.chat.messages import CalledTool, ChatMessage

TOOL = {"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}


def body(**fields: Any) -> MessagesRequest:
    return MessagesRequest.model_validate({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **fields})


def test_messages_become_the_neutral_conversation() -> None:
    turn = chat_turn(body(system=[{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}], messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Let me."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
            {"type": "text", "text": "22C"}]}, {"type": "text", "text": "tomorrow?"}]},
    ]), reasoning=False)
    assert turn.messages == (
        ChatMessage("system", "Be brief."), ChatMessage("user", "weather?"),
        ChatMessage("assistant", "Let me.", (CalledTool("toolu_1", "f", {"a": 1}),)),
        ChatMessage("tool", "22C", tool_call_id="toolu_1"), ChatMessage("user", "tomorrow?"))


@pytest.mark.parametrize(("choice", "mode", "parallel"), [
    ({"type": "auto"}, "auto", True), ({"type": "any"}, "required", True), ({"type": "none"}, "none", True),
    ({"type": "tool", "name": "f", "disable_parallel_tool_use": True}, "named", False),
])
def test_tool_choice(choice: dict[str, Any], mode: str, parallel: bool) -> None:
    plan = chat_turn(body(tools=[TOOL], tool_choice=choice), reasoning=False).tools
    assert plan is not None and plan.mode == mode
    if plan.grammar is not None:
        assert ('call ("\\n" call)*' in plan.grammar.value) == parallel


def test_thinking_reaches_the_template_and_the_budget() -> None:
    on = chat_turn(body(thinking={"type": "enabled", "budget_tokens": 9}), reasoning=True)
    assert on.template_kwargs == {"enable_thinking": True} and on.max_reasoning_tokens == 9
    assert chat_turn(body(thinking={"type": "enabled", "budget_tokens": 9}), reasoning=False).max_reasoning_tokens is None
    assert chat_turn(body(thinking={"type": "disabled"}), reasoning=True).template_kwargs == {"enable_thinking": False}
    mine = chat_turn(body(thinking={"type": "adaptive"}, chat_template_kwargs={"enable_thinking": False}), True)
    assert mine.template_kwargs == {"enable_thinking": False}  # the request's own kwargs win


@pytest.mark.parametrize(("fields", "words"), [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"tools": [{"name": "bash", "type": "bash_20250124"}]}, "`bash_20250124` tools are not supported"),
    ({"tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]}, "needs its tool_use_id"),
    ({"tools": [TOOL], "output_config": {"format": {"type": "json_schema", "schema": {}}}}, "mutually exclusive"),
])
def test_refusals_name_the_place(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(TgictlError, match=words.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        chat_turn(body(**fields), reasoning=False)


def test_tool_use_ids() -> None:
    assert tool_use_id("call_abc") == "toolu_abc"
