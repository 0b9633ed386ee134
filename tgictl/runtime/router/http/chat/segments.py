"""An answer's pieces grouped into the segments the block-shaped APIs stream: Anthropic's content blocks and
the Responses API's output items are both a sequence of reasoning, text and tool-call parts, each opened,
filled by deltas and closed in order. `Segmenter` turns pieces into those three events; each API writes
them in its own shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tgictl.runtime.router.guided.tool_calls import CallArguments, CallStarted
from tgictl.runtime.router.http.chat.answer import Piece, Reasoning, Text

SegmentKind = Literal["reasoning", "text", "call"]


@dataclass
class Segment:
    index: int  # its position in the answer (Anthropic's block index, the Responses API's output_index)
    kind: SegmentKind
    call: CallStarted | None = None  # a call's id and name
    text: str = ""  # everything its deltas carried: reasoning, text, or a call's arguments


@dataclass(frozen=True)
class Opened:
    segment: Segment


@dataclass(frozen=True)
class Delta:
    segment: Segment
    text: str


@dataclass(frozen=True)
class Closed:
    segment: Segment


SegmentEvent = Opened | Delta | Closed


class Segmenter:
    def __init__(self) -> None:
        self.segments: list[Segment] = []
        self._open: Segment | None = None

    def push(self, pieces: list[Piece]) -> list[SegmentEvent]:
        events: list[SegmentEvent] = []
        for piece in pieces:
            if isinstance(piece, CallStarted):
                self._switch("call", events, call=piece)
                continue
            segment = self._open
            if isinstance(piece, CallArguments):
                if segment is None or segment.call is None or segment.call.index != piece.index:
                    continue  # cannot happen: a call's arguments follow its start
                text = piece.fragment
            else:
                kind: SegmentKind = "reasoning" if isinstance(piece, Reasoning) else "text"
                text = piece.text if isinstance(piece, (Reasoning, Text)) else ""
                if segment is None or segment.kind != kind:
                    segment = self._switch(kind, events)
            segment.text += text
            events.append(Delta(segment, text))
        return events

    def close(self, at_least_one_text: bool = False) -> list[SegmentEvent]:
        """The end of the answer; `at_least_one_text`: an answer with no segment gets an empty text one."""
        events: list[SegmentEvent] = []
        if at_least_one_text and not self.segments:
            self._switch("text", events)
        if self._open is not None:
            events.append(Closed(self._open))
            self._open = None
        return events

    def _switch(self, kind: SegmentKind, events: list[SegmentEvent], call: CallStarted | None = None) -> Segment:
        if self._open is not None:
            events.append(Closed(self._open))
        segment = Segment(len(self.segments), kind, call)
        self.segments.append(segment)
        self._open = segment
        events.append(Opened(segment))
        return segment
