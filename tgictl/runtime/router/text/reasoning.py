"""Reasoning models' think text split from the answer (`--reasoning-parser`; docs/apis.md, "Reasoning").

A reasoning model writes `<think>` ... `</think>` before its answer. Where the answer begins depends on the
prompt the chat template rendered:

- the prompt ends with the start tag (DeepSeek-R1's templates, Qwen3-Thinking): the output begins inside
  the reasoning;
- the prompt ends with the end tag (Qwen3 with `enable_thinking: false` renders an empty think block): there
  is no reasoning;
- otherwise a `qwen3` model may open a think block first; a `deepseek_r1` model is taken to be thinking from
  its first token (its template may or may not have written the start tag; one it writes itself is dropped).

`ReasoningSplitter` reads an answer piece by piece as it streams and hands each piece's text to the reasoning
or the answer at once, holding back only what may be the start of a tag split across tokens (`</th` +
`ink>`). The non-streaming routes feed the same splitter the same pieces, so both agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Opening = Literal["inside", "optional"]  # the output begins inside the reasoning / may open a think block
Part = tuple[Literal["reasoning", "content"], str]


@dataclass(frozen=True)
class ReasoningFormat:
    """One `--reasoning-parser`: its tags and whether its output is reasoning from the first token."""

    name: str
    starts_inside: bool
    start_tag: str = "<think>"
    end_tag: str = "</think>"

    def opening(self, prompt: str) -> Opening | None:
        """Where the output of `prompt` begins; None: the template switched thinking off."""
        tail = prompt.rstrip()
        if tail.endswith(self.end_tag):
            return None
        if tail.endswith(self.start_tag) or self.starts_inside:
            return "inside"
        return "optional"


REASONING_FORMATS: dict[str, ReasoningFormat] = {  # by --reasoning-parser (config.REASONING_PARSERS)
    "deepseek_r1": ReasoningFormat("deepseek_r1", starts_inside=True),
    "qwen3": ReasoningFormat("qwen3", starts_inside=False),
}


def _held(text: str, tag: str) -> int:
    """How many trailing characters of `text` may begin `tag` (and so must wait for the next piece)."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class ReasoningSplitter:
    """One answer's text, piece by piece, into ("reasoning", text) and ("content", text) parts."""

    def __init__(self, fmt: ReasoningFormat, opening: Opening) -> None:
        self.fmt = fmt
        # before: a think block may still open (only whitespace seen); inside: reasoning; after: the answer
        self._state: Literal["before", "inside", "after"] = "before" if opening == "optional" else "inside"
        self._may_skip_start = opening == "inside"  # a start tag the model writes itself is not reasoning
        self._buffer = ""
        self._answer_started = False  # whitespace right after the end tag is dropped
        self.reasoning = ""

    @property
    def thinking(self) -> bool:
        """Inside the reasoning now (a token read while this holds is a reasoning token)."""
        return self._state == "inside"

    def feed(self, piece: str) -> list[Part]:
        self._buffer += piece
        parts: list[Part] = []
        while True:
            if self._state == "before" or self._may_skip_start:
                if not self._read_start():
                    return parts
            if self._state == "inside":
                if not self._read_reasoning(parts):
                    return parts
            if self._state == "after":
                self._read_answer(parts)
                return parts

    def finish(self) -> list[Part]:
        """The end of the output: what was held back goes where it was heading."""
        text, self._buffer = self._buffer, ""
        if not text:
            return []
        if self._state == "inside":
            self.reasoning += text
            return [("reasoning", text)]
        if self._state == "after" and not self._answer_started:
            return []  # only whitespace after the end tag
        return [("content", text)]  # an answer's tail, or text that only began like a start tag

    def _read_start(self) -> bool:
        """Before or at the very start of the reasoning: is there a start tag? False: wait for more text."""
        stripped = self._buffer.lstrip()
        tag = self.fmt.start_tag
        if stripped.startswith(tag):
            self._buffer = stripped[len(tag) :]
            self._state = "inside"
            self._may_skip_start = False
            return True
        if tag.startswith(stripped):  # only whitespace, or a part of the tag so far
            return False
        self._may_skip_start = False
        if self._state == "before":
            self._state = "after"
            self._answer_started = True  # no think block: the answer is the text as written
        return True

    def _read_reasoning(self, parts: list[Part]) -> bool:
        """Reasoning up to the end tag; True once the tag was read."""
        tag = self.fmt.end_tag
        end = self._buffer.find(tag)
        if end >= 0:
            text, self._buffer = self._buffer[:end], self._buffer[end + len(tag) :]
            self._state = "after"
        else:
            keep = _held(self._buffer, tag)
            text, self._buffer = self._buffer[: len(self._buffer) - keep], self._buffer[len(self._buffer) - keep :]
        if text:
            self.reasoning += text
            parts.append(("reasoning", text))
        return self._state == "after"

    def _read_answer(self, parts: list[Part]) -> None:
        if not self._answer_started:
            stripped = self._buffer.lstrip()
            if not stripped:
                return  # only whitespace after the end tag so far
            self._buffer = stripped
            self._answer_started = True
        text, self._buffer = self._buffer, ""
        if text:
            parts.append(("content", text))
