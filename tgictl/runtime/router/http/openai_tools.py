"""The chat route's tool side: the prompt the tools add, and each choice's message or deltas read
from its constrained answer (docs/architecture.md, "Guided generation": tools)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tgictl.proto.messages import FinishReason
from tgictl.runtime.router.guided.tool_calls import ToolCallReader, read_calls
from tgictl.runtime.router.guided.tools import ToolPlan, tools_appendix
from tgictl.runtime.router.http.outcome import OPENAI_FINISH_REASONS
from tgictl.runtime.router.http.schemas_openai import Message


def prompt_messages(
    messages: Sequence[Message], plan: ToolPlan | None, native_tools: bool, tool_prompt: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the chat template: a template with tool support renders the tools
    itself; any other gets them appended to the last message with the tool prompt (TGI's way)."""
    rendered = [m.template_dict(native_tools) for m in messages]
    if plan is None or not plan.prompt_tools:
        return rendered, None
    if native_tools:
        return rendered, list(plan.prompt_tools)
    last = rendered[-1]
    rendered[-1] = {**last, "content": last["content"] + tools_appendix(plan.prompt_tools, tool_prompt)}
    return rendered, None


def finish_reason(reason: FinishReason, called: bool) -> str:
    """OpenAI's "tool_calls" when the answer is calls that the grammar's end closed."""
    if called and reason == FinishReason.EOS_TOKEN:
        return "tool_calls"
    return OPENAI_FINISH_REASONS[reason]


def final_message(plan: ToolPlan | None, text: str, reason: FinishReason) -> tuple[dict[str, Any], str]:
    """A whole answer's `message` and finish reason."""
    if plan is None or not plan.parses_calls:
        return {"role": "assistant", "content": text}, OPENAI_FINISH_REASONS[reason]
    reader = read_calls(text, text_allowed=plan.mode == "auto")
    if not reader.calls:
        return {"role": "assistant", "content": reader.content}, OPENAI_FINISH_REASONS[reason]
    message = {"role": "assistant", "content": None, "tool_calls": [c.message() for c in reader.calls]}
    return message, finish_reason(reason, True)


class StreamedChoice:
    """One choice's deltas: plain content, or tool-call deltas read as the answer streams."""

    def __init__(self, plan: ToolPlan | None) -> None:
        self.reader = ToolCallReader(text_allowed=plan.mode == "auto") if plan and plan.parses_calls else None
        self.started = False

    def delta(self, content: str, end: FinishReason | None) -> tuple[dict[str, Any] | None, str | None]:
        """(the delta to send, or None when this piece releases nothing; the finish reason at the end)."""
        reason = None if end is None else OPENAI_FINISH_REASONS[end]
        delta: dict[str, Any] = {}
        if self.reader is None:
            delta["content"] = content
        else:
            text, calls = self.reader.feed(content)
            if end is not None:
                tail, more = self.reader.finish()
                text, calls = text + tail, calls + more
                reason = finish_reason(end, bool(self.reader.calls))
            if text or (end is not None and not self.reader.is_calls):
                delta["content"] = text
            if calls:
                delta["tool_calls"] = calls
        if not delta and end is None:
            return None, None
        if not self.started:
            self.started = True
            delta = {"role": "assistant", **delta}
        return delta, reason
