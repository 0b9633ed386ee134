"""Anthropic's Messages API translated at the edge: a body becomes a chat turn and one GenerationInput, and the
answer's segments (http/chat/segments.py) become Anthropic's content blocks, whole or as its stream events
(message_start, content_block_start / _delta / _stop, message_delta, message_stop, ping)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from tgictl.errors import ToolError, ValidationError
from tgictl.runtime.router.guided.grammars import GrammarRequest
from tgictl.runtime.router.guided.tools import plan_tools
from tgictl.runtime.router.http.anthropic.schemas import ContentBlock, CountTokensRequest, MessagesRequest
from tgictl.runtime.router.http.chat.answer import Finish, finish_of
from tgictl.runtime.router.http.chat.messages import CalledTool, ChatMessage
from tgictl.runtime.router.http.chat.segments import Closed, Delta, Opened, Segment, Segmenter, SegmentEvent
from tgictl.runtime.router.http.chat.turn import ChatTurn, PreparedTurn
from tgictl.runtime.router.http.error_shapes import anthropic_error_body
from tgictl.runtime.router.http.one_generation import OneGeneration
from tgictl.runtime.router.http.outcome import Outcome
from tgictl.runtime.router.http.responses import sse_event
from tgictl.runtime.router.request import EndEvent, ErrorEvent, TokenEvent
from tgictl.runtime.router.validation import GenerationInput

STOP_REASONS: dict[Finish, str] = {
    "stop": "end_turn", "stop_sequence": "stop_sequence", "length": "max_tokens", "tool_calls": "tool_use",
}
PING = sse_event("ping", {"type": "ping"})  # also the keep-alive: Anthropic's streams ping, not comment


def _text(blocks: str | list[ContentBlock] | None, where: str) -> str:
    """The text of a string or of text blocks; other blocks (images, documents) are not supported."""
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    pieces = []
    for block in blocks:
        if block.type != "text":
            raise ValidationError(f"{where}: content blocks of type `{block.type}` are not supported here")
        pieces.append(block.text or "")
    return "".join(pieces)


def chat_messages(body: CountTokensRequest) -> tuple[ChatMessage, ...]:
    """system, then each message: a user's tool_result blocks become tool messages (in order, before its
    text), an assistant's tool_use blocks its calls; thinking blocks are not shown to the template."""
    out = [ChatMessage("system", _text(body.system, "system"))] if body.system else []
    for i, message in enumerate(body.messages):
        if message.role not in ("user", "assistant"):
            raise ValidationError(f"messages[{i}].role must be `user` or `assistant`. Given: {message.role!r}")
        blocks = [ContentBlock(type="text", text=message.content)] if isinstance(message.content, str) else message.content
        texts: list[str] = []
        calls: list[CalledTool] = []
        for j, block in enumerate(blocks):
            where = f"messages[{i}].content[{j}]"
            if block.type == "text":
                texts.append(block.text or "")
            elif block.type == "tool_result" and message.role == "user":
                if block.tool_use_id is None:
                    raise ToolError(f"{where}: a tool_result needs its tool_use_id")
                out.append(ChatMessage("tool", _text(block.content, where), tool_call_id=block.tool_use_id))
            elif block.type == "tool_use" and message.role == "assistant":
                calls.append(CalledTool.parsed(block.id, block.name, block.input))
            elif block.type not in ("thinking", "redacted_thinking") or message.role != "assistant":
                raise ValidationError(f"{where}: `{block.type}` blocks are not supported in a {message.role} message")
        if texts or calls or isinstance(message.content, str):
            out.append(ChatMessage(message.role, "".join(texts), tuple(calls)))
    return tuple(out)


def chat_turn(body: CountTokensRequest, reasoning: bool) -> ChatTurn:
    """`reasoning`: the server splits think text (--reasoning-parser), so `thinking` maps onto the template's
    enable_thinking and its budget onto max_reasoning_tokens."""
    tools = [  # the chat shape, with the fields given only: the prompt shows them as a chat request would
        {"type": "function", "function": {k: v for k, v in (("name", t.name), ("description", t.description),
                                                             ("parameters", t.input_schema)) if v is not None}}
        for t in body.tools or () if _custom(t.type, t.name)
    ]
    choice, parallel = _tool_choice(body)
    kwargs = dict(body.chat_template_kwargs or {})
    budget = None
    if body.thinking is not None:  # enabled, adaptive, between_tools think; disabled does not
        kwargs.setdefault("enable_thinking", body.thinking.type != "disabled")
        if reasoning and body.thinking.type == "enabled":
            budget = body.thinking.budget_tokens
    plan = plan_tools(tools or None, choice, parallel)
    return ChatTurn(chat_messages(body), tools=plan, response_grammar=_output_format(body, plan is not None),
                    template_kwargs=kwargs, max_reasoning_tokens=budget)


def _output_format(body: CountTokensRequest, tools: bool) -> GrammarRequest | None:
    fmt = body.output_config.format if body.output_config is not None else None
    if fmt is None:
        return None
    if fmt.type != "json_schema" or fmt.json_schema is None:
        raise ValidationError("output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}")
    if tools:
        raise ToolError("output_config.format and tools are mutually exclusive")
    return GrammarRequest.json_schema(fmt.json_schema, strict=True)


def _custom(kind: str | None, name: str) -> bool:
    if kind not in (None, "custom"):
        raise ToolError(f"tool {name!r}: Anthropic's `{kind}` tools are not supported; define it as a custom tool")
    return True


def _tool_choice(body: CountTokensRequest) -> tuple[Any, bool]:
    """(OpenAI's tool_choice, parallel calls) for Anthropic's tool_choice."""
    choice = body.tool_choice
    if choice is None:
        return None, True
    parallel = not choice.disable_parallel_tool_use
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}, parallel
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type)
    if mapped is None:
        raise ToolError(f"tool_choice.type must be auto, any, tool or none. Given: {choice.type!r}")
    return mapped, parallel


def generation_input(body: MessagesRequest, turn: PreparedTurn) -> GenerationInput:
    greedy = body.temperature == 0.0
    return GenerationInput(
        inputs=turn.prompt, add_special_tokens=False, stream=body.stream,
        temperature=None if greedy else body.temperature, top_p=body.top_p, top_k=body.top_k,
        do_sample=not greedy,  # Anthropic samples at temperature 1 unless told otherwise
        max_new_tokens=body.max_tokens, stop=tuple(body.stop_sequences or ()), grammar=turn.grammar, model=body.model,
    )


def tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _input(arguments: str) -> Any:
    """A call's input object; a call cut off by max_tokens has arguments that are not JSON yet: {}."""
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return {}


def content_block(segment: Segment, whole: bool) -> dict[str, Any]:
    """A segment as Anthropic's block: as it ends (`whole`), or as content_block_start announces it."""
    if segment.kind == "reasoning":
        return {"type": "thinking", "thinking": segment.text if whole else "", "signature": ""}
    if segment.kind == "text":
        return {"type": "text", "text": segment.text if whole else ""}
    call = segment.call
    assert call is not None  # a call segment always has its call
    return {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": _input(segment.text) if whole else {}}


def _usage(end: EndEvent) -> dict[str, int]:
    """Anthropic counts prompt tokens read from the cache apart: input + cache reads = the prompt."""
    return {"input_tokens": end.input_length - end.cached_tokens, "output_tokens": end.generated_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": end.cached_tokens}


class MessageWriter:
    """One answer in Anthropic's shapes."""

    def __init__(self, turn: PreparedTurn, model: str) -> None:
        self.turn = turn
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = model

    def message(self, outcome: Outcome) -> dict[str, Any]:
        reader, segmenter = self.turn.reader(), Segmenter()
        for content in outcome.contents:
            segmenter.push(reader.feed(content))
        segmenter.push(reader.finish())
        segmenter.close(at_least_one_text=True)
        return self._envelope([content_block(s, whole=True) for s in segmenter.segments], outcome.end, reader.called)

    def _envelope(self, content: list[dict[str, Any]], end: EndEvent | None, called: bool) -> dict[str, Any]:
        return {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
            "stop_reason": STOP_REASONS[finish_of(end, called)] if end is not None else None,
            "stop_sequence": end.stop_sequence if end is not None else None,
            "usage": _usage(end) if end is not None else {"input_tokens": 0, "output_tokens": 0},
        }

    async def stream(self, generation: OneGeneration) -> AsyncGenerator[str, None]:
        reader, segmenter = self.turn.reader(), Segmenter()
        start = self._envelope([], None, False)
        start["usage"] = {"input_tokens": generation.request.input_length, "output_tokens": 0}
        yield sse_event("message_start", {"type": "message_start", "message": start})
        yield PING
        async for event in generation.events():
            if event is None:
                yield PING
            elif isinstance(event, ErrorEvent):
                yield sse_event("error", anthropic_error_body(event.error))
                return
            elif isinstance(event, (TokenEvent, EndEvent)):
                events = segmenter.push(reader.feed(event.content))
                if isinstance(event, EndEvent):
                    events += segmenter.push(reader.finish()) + segmenter.close(at_least_one_text=True)
                for text in _block_events(events):
                    yield text
                if isinstance(event, EndEvent):
                    delta = {"stop_reason": STOP_REASONS[finish_of(event, reader.called)],
                             "stop_sequence": event.stop_sequence}
                    yield sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": _usage(event)})
                    yield sse_event("message_stop", {"type": "message_stop"})
                    return


def _block_events(events: list[SegmentEvent]) -> list[str]:
    texts = []
    for event in events:
        index = event.segment.index
        if isinstance(event, Opened):
            block = content_block(event.segment, whole=False)
            texts.append(sse_event("content_block_start", {"type": "content_block_start", "index": index,
                                                           "content_block": block}))
        elif isinstance(event, Delta):
            kind = event.segment.kind
            delta = ({"type": "thinking_delta", "thinking": event.text} if kind == "reasoning"
                     else {"type": "text_delta", "text": event.text} if kind == "text"
                     else {"type": "input_json_delta", "partial_json": event.text})
            texts.append(sse_event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                           "delta": delta}))
        elif isinstance(event, Closed):
            texts.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    return texts
