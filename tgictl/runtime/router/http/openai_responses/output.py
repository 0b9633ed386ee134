"""A response of OpenAI's Responses API: the response object, its output items (reasoning, message,
function_call: one per answer segment, http/chat/segments.py) and the stream of events the openai SDK reads
(response.created, response.in_progress, output_item.added / .done, content_part.added / .done,
output_text.delta / .done, reasoning_text.delta / .done, function_call_arguments.delta / .done, then
response.completed or response.incomplete; `error` and response.failed when the generation fails)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from tgictl.errors import bounded
from tgictl.runtime.router.http.chat.answer import AnswerReader, finish_of
from tgictl.runtime.router.http.chat.messages import CalledTool, ChatMessage
from tgictl.runtime.router.http.chat.segments import Closed, Delta, Opened, Segment, Segmenter, SegmentEvent
from tgictl.runtime.router.http.chat.turn import PreparedTurn
from tgictl.runtime.router.http.one_generation import OneGeneration
from tgictl.runtime.router.http.openai_responses.schemas import ResponsesRequest
from tgictl.runtime.router.http.outcome import Outcome
from tgictl.runtime.router.http.responses import KEEP_ALIVE, sse_event
from tgictl.runtime.router.request import EndEvent, ErrorEvent, TokenEvent

_PREFIX = {"reasoning": "rs", "text": "msg", "call": "fc"}


class ResponseWriter:
    """One response's ids, its request's echoed settings, and its items as they are read."""

    def __init__(self, body: ResponsesRequest, turn: PreparedTurn, model: str) -> None:
        self.body = body
        self.turn = turn
        self.model = model
        self.id = f"resp_{uuid.uuid4().hex}"
        self.created_at = int(time.time())
        self._item_ids: dict[int, str] = {}
        self._sequence = 0

    def item_id(self, segment: Segment) -> str:
        return self._item_ids.setdefault(segment.index, f"{_PREFIX[segment.kind]}_{uuid.uuid4().hex}")

    def item(self, segment: Segment, status: str) -> dict[str, Any]:
        """The segment as an output item; `status`: in_progress (announced), completed or incomplete."""
        done = status != "in_progress"
        item: dict[str, Any] = {"id": self.item_id(segment), "status": status}
        if segment.kind == "reasoning":
            content = [{"type": "reasoning_text", "text": segment.text}] if done else []
            return {"type": "reasoning", **item, "summary": [], "content": content}
        if segment.kind == "text":
            return {"type": "message", **item, "role": "assistant", "content": [_part(segment.text)] if done else []}
        call = segment.call
        return {"type": "function_call", **item, "call_id": call.id if call else "", "name": call.name if call else "",
                "arguments": segment.text if done else ""}

    def response(self, status: str, output: list[dict[str, Any]], end: EndEvent | None = None,
                 reader: AnswerReader | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        body = self.body
        fmt = body.text.format if body.text is not None and body.text.format is not None else None
        usage = None
        if end is not None:
            reasoning_tokens = reader.reasoning_tokens if reader is not None else 0
            usage = {
                "input_tokens": end.input_length, "input_tokens_details": {"cached_tokens": end.cached_tokens},
                "output_tokens": end.generated_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                "total_tokens": end.input_length + end.generated_tokens,
            }
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status, "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "model": self.model,
            "output": output, "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id,
            "reasoning": body.reasoning.model_dump() if body.reasoning is not None else {"effort": None, "summary": None},
            "store": body.store, "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or ()],
            "top_p": 1.0 if body.top_p is None else body.top_p, "truncation": "disabled", "usage": usage,
            "user": None, "metadata": body.metadata or {},
        }

    def finished(self, segments: list[Segment], end: EndEvent, reader: AnswerReader) -> dict[str, Any]:
        status = "incomplete" if finish_of(end, reader.called) == "length" else "completed"
        last = len(segments) - 1
        output = [self.item(s, "incomplete" if status == "incomplete" and s.index == last else "completed")
                  for s in segments]
        return self.response(status, output, end, reader)

    def whole(self, outcome: Outcome) -> tuple[dict[str, Any], ChatMessage]:
        """(the response object, the answer as the conversation's next message)."""
        reader, segmenter = self.turn.reader(), Segmenter()
        for content in outcome.contents:
            segmenter.push(reader.feed(content))
        segmenter.push(reader.finish())
        segmenter.close()
        return self.finished(segmenter.segments, outcome.end, reader), answer_message(segmenter.segments)

    def _event(self, kind: str, **fields: Any) -> str:
        self._sequence += 1
        return sse_event(kind, {"type": kind, "sequence_number": self._sequence - 1, **fields})

    async def stream(self, generation: OneGeneration, done: list[tuple[dict[str, Any], ChatMessage]]) -> AsyncGenerator[str, None]:
        """The events; a completed or incomplete response is appended to `done` (for the store)."""
        reader, segmenter = self.turn.reader(), Segmenter()
        yield self._event("response.created", response=self.response("in_progress", []))
        yield self._event("response.in_progress", response=self.response("in_progress", []))
        async for event in generation.events():
            if event is None:
                yield KEEP_ALIVE
            elif isinstance(event, ErrorEvent):
                err = event.error
                error = {"code": err.error_type, "message": bounded(err.message)}
                yield self._event("error", code=err.error_type, message=error["message"], param=None)
                failed = self.response("failed", [self.item(s, "incomplete") for s in segmenter.segments], error=error)
                yield self._event("response.failed", response=failed)
                return
            elif isinstance(event, (TokenEvent, EndEvent)):
                events = segmenter.push(reader.feed(event.content))
                status = "completed"
                if isinstance(event, EndEvent):
                    events += segmenter.push(reader.finish()) + segmenter.close()
                    status = "incomplete" if finish_of(event, reader.called) == "length" else "completed"
                for text in self._item_events(events, status):
                    yield text
                if isinstance(event, EndEvent):
                    response = self.finished(segmenter.segments, event, reader)
                    done.append((response, answer_message(segmenter.segments)))
                    yield self._event(f"response.{response['status']}", response=response)
                    return

    def _item_events(self, events: list[SegmentEvent], last_status: str) -> list[str]:
        """`last_status`: the status of the answer's last item, when these events close it."""
        texts = []
        for event in events:
            segment = event.segment
            at = {"output_index": segment.index}
            item_at = {"item_id": self.item_id(segment), **at}
            if isinstance(event, Opened):
                texts.append(self._event("response.output_item.added", **at, item=self.item(segment, "in_progress")))
                if segment.kind == "text":
                    texts.append(self._event("response.content_part.added", **item_at, content_index=0, part=_part("")))
            elif isinstance(event, Delta):
                if segment.kind == "call":
                    texts.append(self._event("response.function_call_arguments.delta", **item_at, delta=event.text))
                elif segment.kind == "text":
                    texts.append(self._event("response.output_text.delta", **item_at, content_index=0,
                                             delta=event.text, logprobs=[]))
                else:
                    texts.append(self._event("response.reasoning_text.delta", **item_at, content_index=0,
                                             delta=event.text))
            elif isinstance(event, Closed):
                if segment.kind == "call":
                    texts.append(self._event("response.function_call_arguments.done", **item_at,
                                             arguments=segment.text, name=segment.call.name if segment.call else ""))
                elif segment.kind == "text":
                    texts.append(self._event("response.output_text.done", **item_at, content_index=0,
                                             text=segment.text, logprobs=[]))
                    texts.append(self._event("response.content_part.done", **item_at, content_index=0,
                                             part=_part(segment.text)))
                else:
                    texts.append(self._event("response.reasoning_text.done", **item_at, content_index=0,
                                             text=segment.text))
                status = last_status if event.segment is events[-1].segment else "completed"
                texts.append(self._event("response.output_item.done", **at, item=self.item(segment, status)))
        return texts


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def answer_message(segments: list[Segment]) -> ChatMessage:
    """The answer as the assistant's message of the conversation a follow-up continues."""
    text = "".join(s.text for s in segments if s.kind == "text")
    calls = tuple(
        CalledTool.parsed(s.call.id, s.call.name, s.text if _is_json(s.text) else "{}")
        for s in segments if s.kind == "call" and s.call is not None
    )
    return ChatMessage("assistant", text, calls)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True

