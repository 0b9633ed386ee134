"""OpenAI's chat shapes of a chat turn's answer (http/chat/answer.py): each choice's streamed deltas and
its whole message. Reasoning is sent under both names clients read, `reasoning_content` (DeepSeek's, vLLM's)
and `reasoning` (OpenRouter's, vLLM's newer one)."""

from __future__ import annotations

from typing import Any

from tgictl.runtime.router.guided.tool_calls import CallArguments, CallStarted
from tgictl.runtime.router.http.chat.answer import Answer, AnswerReader, Finish, Piece, Reasoning, Text, finish_of
from tgictl.runtime.router.request import EndEvent

# OpenAI knows only these: a stop sequence is "stop" too.
OPENAI_FINISH: dict[Finish, str] = {"stop": "stop", "stop_sequence": "stop", "length": "length", "tool_calls": "tool_calls"}


def _reasoning(text: str) -> dict[str, str]:
    return {"reasoning_content": text, "reasoning": text}


def chat_message(answer: Answer) -> dict[str, Any]:
    """A whole answer's `message`."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.content}
    if answer.reasoning is not None:
        message.update(_reasoning(answer.reasoning))
    if answer.calls:
        message["tool_calls"] = [c.message() for c in answer.calls]
    return message


def _delta(pieces: list[Piece]) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    for piece in pieces:
        if isinstance(piece, Reasoning):
            for key, text in _reasoning(piece.text).items():
                delta[key] = delta.get(key, "") + text
        elif isinstance(piece, Text):
            delta["content"] = delta.get("content", "") + piece.text
        elif isinstance(piece, CallStarted):
            delta.setdefault("tool_calls", []).append(
                {"index": piece.index, "id": piece.id, "type": "function", "function": {"name": piece.name, "arguments": ""}})
        elif isinstance(piece, CallArguments):
            delta.setdefault("tool_calls", []).append({"index": piece.index, "function": {"arguments": piece.fragment}})
    return delta


class StreamedChoice:
    """One choice's deltas, read as the answer streams."""

    def __init__(self, reader: AnswerReader) -> None:
        self.reader = reader
        self.started = False

    def delta(self, content: str, end: EndEvent | None) -> tuple[dict[str, Any] | None, str | None]:
        """(the delta to send, or None when this piece releases nothing; the finish reason at the end)."""
        pieces = self.reader.feed(content)
        reason = None
        if end is not None:
            pieces += self.reader.finish()
            reason = OPENAI_FINISH[finish_of(end, self.reader.called)]
        delta = _delta(pieces)
        plain = self.reader.tools is None and self.reader.reasoning is None
        if plain or (end is not None and not self.reader.called):
            # A plain answer has a chunk per token (each carries its token's logprobs), and the last chunk of
            # a text answer carries content, as OpenAI's do.
            delta.setdefault("content", "")
        if not delta and end is None:
            return None, None
        if not self.started:
            self.started = True
            delta = {"role": "assistant", **delta}
        return delta, reason
