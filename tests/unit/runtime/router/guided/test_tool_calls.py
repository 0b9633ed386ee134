"""Reading calls out of an answer: the same calls however the text is split into pieces, each call's
start then its argument fragments, and text answers."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from tgictl.runtime.router.guided.tool_calls import CallArguments, CallStarted, ToolCallReader, read_calls
from tgictl.runtime.router.guided.tools import call_text

CALLS = [("get_weather", {"city": "Paris", "note": "}\\n</tool_call> inside a string"}), ("ping", {})]
ANSWER = "\n".join(call_text(name, args) for name, args in CALLS)


def test_whole_answer() -> None:
    reader = read_calls(ANSWER, text_allowed=True)
    assert [(c.name, json.loads(c.arguments)) for c in reader.calls] == CALLS
    assert all(c.complete for c in reader.calls) and reader.content == ""
    assert len({c.id for c in reader.calls}) == 2 and all(c.id.startswith("call_") for c in reader.calls)
    assert reader.calls[0].message() == {"id": reader.calls[0].id, "type": "function",
                                         "function": {"name": "get_weather", "arguments": json.dumps(CALLS[0][1])}}


@given(st.lists(st.integers(min_value=1, max_value=len(ANSWER) - 1), unique=True, max_size=40))
def test_streamed_deltas_reassemble_whatever_the_pieces(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(ANSWER)]
    reader = ToolCallReader(text_allowed=False)
    deltas = []
    for start, stop in zip(bounds, bounds[1:]):
        text, new = reader.feed(ANSWER[start:stop])
        assert text == ""
        deltas.extend(new)
    assert reader.finish() == ("", [])
    heads = [d for d in deltas if isinstance(d, CallStarted)]
    # Per call one start (index, id, name) before any of its argument fragments.
    assert [(h.index, h.name) for h in heads] == [(0, "get_weather"), (1, "ping")]
    assert all(h.id.startswith("call_") for h in heads)
    arguments = ["", ""]
    for d in deltas:
        if isinstance(d, CallArguments):
            assert any(h.index == d.index for h in heads[: d.index + 1])
            arguments[d.index] += d.fragment
    assert [json.loads(a) for a in arguments] == [args for _, args in CALLS]


def test_text_answers_under_auto_stream_at_once() -> None:
    reader = ToolCallReader(text_allowed=True)
    assert reader.feed("Sun") == ("Sun", []) and reader.feed("ny <b>") == ("ny <b>", [])
    assert reader.content == "Sunny <b>" and not reader.is_calls


def test_an_answer_cut_before_its_first_call_is_text() -> None:
    reader = read_calls("<tool_call>\n{\"na", text_allowed=True)
    assert reader.calls == [] and reader.content == "<tool_call>\n{\"na"
    cut = read_calls(ANSWER[:-5], text_allowed=False)
    assert [c.complete for c in cut.calls] == [True, False]
