"""An answer's pieces grouped into segments (Anthropic's blocks, the Responses API's items): each opened once,
filled by its deltas in order, closed before the next opens; a call's arguments stay with their call."""

from __future__ import annotations

from tgictl.runtime.router.guided.tool_calls import CallArguments, CallStarted
from tgictl.runtime.router.http.chat.answer import Reasoning, Text
from tgictl.runtime.router.http.chat.segments import Closed, Delta, Opened, Segmenter


def test_segments_in_order() -> None:
    segmenter = Segmenter()
    events = segmenter.push([Reasoning("think"), Reasoning("ing"), Text("Hi")])
    events += segmenter.push([CallStarted(0, "call_1", "f"), CallArguments(0, '{"a"'), CallArguments(0, ": 1}")])
    events += segmenter.push([CallStarted(1, "call_2", "g"), CallArguments(1, "{}")]) + segmenter.close()
    kinds = [(type(e).__name__, e.segment.index) for e in events]
    assert kinds == [
        ("Opened", 0), ("Delta", 0), ("Delta", 0), ("Closed", 0), ("Opened", 1), ("Delta", 1), ("Closed", 1),
        ("Opened", 2), ("Delta", 2), ("Delta", 2), ("Closed", 2), ("Opened", 3), ("Delta", 3), ("Closed", 3)]
    reasoning, text, first, second = segmenter.segments
    assert (reasoning.kind, reasoning.text, text.kind, text.text) == ("reasoning", "thinking", "text", "Hi")
    assert first.call == CallStarted(0, "call_1", "f") and first.text == '{"a": 1}' and second.text == "{}"
    assert all(isinstance(e, (Opened, Delta, Closed)) for e in events)


def test_an_empty_answer_gets_an_empty_text_segment_when_asked() -> None:
    assert Segmenter().close() == []
    segmenter = Segmenter()
    events = segmenter.close(at_least_one_text=True)
    assert [type(e) for e in events] == [Opened, Closed] and segmenter.segments[0].kind == "text"
