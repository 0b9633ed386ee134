"""Think text split from the answer: the same parts however the output is cut into pieces (tags split
across pieces included), nothing held back but what may begin a tag, and where each parser's output begins."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tgictl.config import REASONING_PARSERS
from tgictl.runtime.router.text.reasoning import REASONING_FORMATS, Opening, ReasoningSplitter

QWEN3, R1 = REASONING_FORMATS["qwen3"], REASONING_FORMATS["deepseek_r1"]


def split(output: str, opening: Opening, cuts: list[int] = (), fmt=QWEN3) -> tuple[str, str]:  # type: ignore[assignment]
    """(reasoning, content) of `output` fed in the pieces `cuts` makes."""
    splitter = ReasoningSplitter(fmt, opening)
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(output)), len(output)]
    parts = [part for a, b in zip(bounds, bounds[1:]) for part in splitter.feed(output[a:b])] + splitter.finish()
    reasoning = "".join(text for kind, text in parts if kind == "reasoning")
    assert reasoning == splitter.reasoning
    return reasoning, "".join(text for kind, text in parts if kind == "content")


def test_the_parsers_are_the_configs_choices() -> None:
    assert set(REASONING_FORMATS) == set(REASONING_PARSERS)


def test_where_the_output_begins() -> None:
    assert QWEN3.opening("<|im_start|>assistant\n<think>\n") == "inside"
    assert QWEN3.opening("<|im_start|>assistant\n") == "optional"
    assert QWEN3.opening("<|im_start|>assistant\n<think>\n\n</think>\n\n") is None  # enable_thinking false
    assert R1.opening("<|Assistant|>") == "inside" and R1.opening("<|Assistant|><think>\n") == "inside"


OUTPUTS = [
    ("inside", "Let me think. 2 < 3 and </thin is no tag.</think>\n\nThe answer is 4.", (
        "Let me think. 2 < 3 and </thin is no tag.", "The answer is 4.")),
    ("optional", "  <think>hmm</think>Yes.", ("hmm", "Yes.")),
    ("optional", "<thinking is not a tag", ("", "<thinking is not a tag")),
    ("optional", "Plain answer <think>kept</think>", ("", "Plain answer <think>kept</think>")),
    ("inside", "cut off while thinking </thi", ("cut off while thinking </thi", "")),
    ("inside", "<think>a model that opens itself</think>ok", ("a model that opens itself", "ok")),
    ("inside", "</think>", ("", "")),
    ("optional", "<thi", ("", "<thi")),
]


@given(st.lists(st.integers(min_value=1, max_value=80), max_size=12))
def test_any_cut_gives_the_same_parts(cuts: list[int]) -> None:
    for opening, output, expected in OUTPUTS:
        assert split(output, opening, cuts) == expected, (opening, output, cuts)  # type: ignore[arg-type]


def test_reasoning_streams_as_it_arrives_holding_only_a_possible_tag() -> None:
    splitter = ReasoningSplitter(QWEN3, "inside")
    assert splitter.feed("I think") == [("reasoning", "I think")]
    assert splitter.feed(" so </th") == [("reasoning", " so ")]  # "</th" may be the tag
    assert splitter.thinking
    assert splitter.feed("ink>") == []  # the tag; whitespace after it is not the answer yet
    assert not splitter.thinking
    assert splitter.feed("\n\nYes") == [("content", "Yes")]
    assert splitter.feed(" it is") == [("content", " it is")]
    assert splitter.finish() == []


def test_deepseek_r1_thinks_from_the_first_token() -> None:
    assert split("no tags at all", "inside", fmt=R1) == ("no tags at all", "")
    assert split("x</think>y", R1.opening("<|Assistant|>"), fmt=R1) == ("x", "y")  # type: ignore[arg-type]
