"""Reading tool calls out of a constrained answer, streamed or whole (docs/architecture.md, "Guided generation": tools).

The tool grammar fixes the layout (`tools.py`), so the reader is a small state machine over the
answer's text: it decides from the first character whether the answer is text or calls (auto),
then emits each call's start (index, id, name) and its argument fragments, holding back only what may
be the closing `}\\n</tool_call>`; each API writes them in its own shape (OpenAI's tool_call deltas,
Anthropic's input_json_delta, the Responses API's function_call_arguments.delta). The non-streaming
routes feed the whole text through the same reader.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from tgictl.runtime.router.guided.tools import CALL_CLOSE, CALL_OPEN

_HEAD = CALL_OPEN + '{"name": "'
_ARGS = '", "arguments": '
_TAIL = "}" + CALL_CLOSE


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class CallStarted:
    """A call's head was read: its index in the answer, id and function name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    """The next fragment of a call's arguments (JSON text; all fragments joined are the arguments)."""

    index: int
    fragment: str


CallPiece = CallStarted | CallArguments


@dataclass
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str = ""
    complete: bool = False

    def message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ToolCallReader:
    """Feed the visible text of an answer piece by piece; `feed` returns what to send now."""

    text_allowed: bool  # auto: the answer may be plain text instead of calls
    calls: list[ToolCall] = field(default_factory=list)
    content: str = ""  # the text answer, when it is one
    _mode: str = "start"  # start | text | head | args | between
    _buffer: str = ""

    @property
    def is_calls(self) -> bool:
        return self._mode not in ("start", "text")

    def feed(self, piece: str) -> tuple[str, list[CallPiece]]:
        """(text content to send, call pieces to send) for this piece."""
        self._buffer += piece
        deltas: list[CallPiece] = []
        while True:
            if self._mode == "start":
                if not self._buffer:
                    return "", deltas
                if self.text_allowed and not self._buffer.startswith("<"):
                    self._mode = "text"
                else:
                    self._mode = "head"
            if self._mode == "text":
                text, self._buffer = self._buffer, ""
                self.content += text
                return text, deltas
            if self._mode == "head":
                if not self._read_head(deltas):
                    return "", deltas
            if self._mode == "args":
                if not self._read_args(deltas):
                    return "", deltas
            if self._mode == "between":
                if self._buffer.startswith("\n"):
                    self._buffer = self._buffer[1:]
                    self._mode = "head"
                    continue
                return "", deltas

    def _read_head(self, deltas: list[CallPiece]) -> bool:
        end = self._buffer.find(_ARGS, len(_HEAD))
        if not self._buffer.startswith(_HEAD[: len(self._buffer)]) or len(self._buffer) < len(_HEAD) or end < 0:
            return False  # the head is not complete yet
        name = self._buffer[len(_HEAD) : end]
        call = ToolCall(index=len(self.calls), id=call_id(), name=name)
        self.calls.append(call)
        deltas.append(CallStarted(call.index, call.id, name))
        self._buffer = self._buffer[end + len(_ARGS) :]
        self._mode = "args"
        return True

    def _read_args(self, deltas: list[CallPiece]) -> bool:
        call = self.calls[-1]
        end = self._buffer.find(_TAIL)
        if end >= 0:
            fragment, self._buffer = self._buffer[:end], self._buffer[end + len(_TAIL) :]
            call.complete = True
            self._mode = "between"
        else:  # everything but what may start the tail
            keep = max(len(self._buffer) - len(_TAIL) + 1, 0)
            fragment, self._buffer = self._buffer[:keep], self._buffer[keep:]
        if fragment:
            call.arguments += fragment
            deltas.append(CallArguments(call.index, fragment))
        return call.complete

    def finish(self) -> tuple[str, list[CallPiece]]:
        """The end of the answer: an answer that never became calls is text (e.g. cut by length)."""
        if self._mode in ("start", "head") and not self.calls:
            text, self._buffer = self._buffer, ""
            self._mode = "text"
            self.content += text
            return text, []
        return "", []


def read_calls(text: str, text_allowed: bool) -> ToolCallReader:
    reader = ToolCallReader(text_allowed=text_allowed)
    reader.feed(text)
    reader.finish()
    return reader
