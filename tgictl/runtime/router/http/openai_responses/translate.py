"""OpenAI's Responses API translated at the edge: a body (plus the stored conversation its
`previous_response_id` names) becomes a chat turn and one GenerationInput; the answer's segments
(http/chat/segments.py) become output items (reasoning, message, function_call), whole or as the stream's
events."""

from __future__ import annotations

from typing import Any

from tgictl.errors import ToolError, ValidationError
from tgictl.runtime.router.guided.grammars import GrammarRequest
from tgictl.runtime.router.guided.tools import plan_tools
from tgictl.runtime.router.http.chat.messages import CalledTool, ChatMessage
from tgictl.runtime.router.http.chat.turn import ChatTurn, PreparedTurn
from tgictl.runtime.router.http.openai_responses.schemas import ContentPart, InputItem, ResponsesRequest
from tgictl.runtime.router.validation import GenerationInput

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _text(content: str | list[ContentPart] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    pieces = []
    for part in content:
        if part.type in ("input_text", "output_text", "text"):
            pieces.append(part.text or "")
        elif part.type == "refusal":
            pieces.append(part.refusal or "")
        else:
            raise ValidationError(f"{where}: content of type `{part.type}` is not supported here")
    return "".join(pieces)


def _item_message(item: InputItem, where: str, out: list[ChatMessage]) -> None:
    kind = item.type or "message"
    if kind == "message":
        role = _ROLES.get(item.role or "")
        if role is None:
            raise ValidationError(f"{where}.role must be user, assistant, system or developer. Given: {item.role!r}")
        out.append(ChatMessage(role, _text(item.content, where)))
    elif kind == "function_call":
        if item.call_id is None:
            raise ToolError(f"{where}: a function_call needs its call_id")
        call = CalledTool.parsed(item.call_id, item.name, item.arguments)
        last = out[-1] if out else None
        if last is not None and last.role == "assistant":  # calls after the assistant's text: one message
            out[-1] = ChatMessage("assistant", last.content, (*last.tool_calls, call))
        else:
            out.append(ChatMessage("assistant", "", (call,)))
    elif kind == "function_call_output":
        if item.call_id is None:
            raise ToolError(f"{where}: a function_call_output needs the call_id of its call")
        out.append(ChatMessage("tool", _text(item.output, where), tool_call_id=item.call_id))
    elif kind != "reasoning":  # earlier reasoning is not shown to the template
        raise ValidationError(f"{where}: items of type `{kind}` are not supported")


def input_messages(body: ResponsesRequest) -> list[ChatMessage]:
    if isinstance(body.input, str):
        return [ChatMessage("user", body.input)]
    out: list[ChatMessage] = []
    for i, item in enumerate(body.input):
        _item_message(item, f"input[{i}]", out)
    return out


def _tools(body: ResponsesRequest) -> list[dict[str, Any]] | None:
    """The Responses API's flat function tools in the chat shape plan_tools reads."""
    tools = []
    for i, tool in enumerate(body.tools or ()):
        if tool.type != "function":
            raise ToolError(f"tools[{i}]: tools of type `{tool.type}` are not supported; use `function`")
        # The chat shape, with the fields given only: the prompt shows the tools as a chat request would.
        function = {"name": tool.name, "description": tool.description, "parameters": tool.parameters,
                    "strict": tool.strict}
        tools.append({"type": "function", "function": {k: v for k, v in function.items() if v is not None}})
    return tools or None


def _tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise ToolError(f"tool_choice must be auto, none, required or a function. Given: {choice!r}")
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def response_grammar(body: ResponsesRequest) -> GrammarRequest | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if body.tools:
        raise ToolError("text.format and tools are mutually exclusive")
    if fmt.type == "json_object":
        return GrammarRequest.json_schema({"type": "object"}, strict=True)
    if fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise ValidationError("text.format of type `json_schema` needs its `schema`")
        return GrammarRequest.json_schema(fmt.json_schema, strict=fmt.strict is True)
    raise ValidationError(f"text.format.type must be text, json_object or json_schema. Given: {fmt.type!r}")


def chat_turn(body: ResponsesRequest, earlier: tuple[ChatMessage, ...]) -> tuple[ChatTurn, tuple[ChatMessage, ...]]:
    """(the turn, the conversation without instructions: what a follow-up continues)."""
    conversation = (*earlier, *input_messages(body))
    if not conversation:
        raise ValidationError("`input` cannot be empty")
    system = (ChatMessage("system", body.instructions),) if body.instructions else ()
    turn = ChatTurn(
        (*system, *conversation), tools=plan_tools(_tools(body), _tool_choice(body.tool_choice), body.parallel_tool_calls),
        response_grammar=response_grammar(body), template_kwargs=body.chat_template_kwargs or {},
        max_reasoning_tokens=body.max_reasoning_tokens,
    )
    return turn, conversation


def generation_input(body: ResponsesRequest, turn: PreparedTurn) -> GenerationInput:
    greedy = body.temperature == 0.0
    return GenerationInput(
        inputs=turn.prompt, add_special_tokens=False, stream=body.stream,
        temperature=None if greedy else body.temperature, top_p=body.top_p, top_k=body.top_k, do_sample=not greedy,
        max_new_tokens=body.max_output_tokens, seed=body.seed, grammar=turn.grammar, model=body.model,
    )
