"""One chat turn: the conversation, the tools and the output format an API asked for, rendered into the prompt
and the grammar the one validated request carries (docs/architecture.md, "APIs").

With `--reasoning-parser`, the rendered prompt says where the output begins (text/reasoning.py) and a grammar
(tools, a JSON format, or a reasoning budget alone) is put after the think text (guided/reasoning.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tgictl.errors import ValidationError
from tgictl.runtime.router.guided.grammars import GrammarRequest
from tgictl.runtime.router.guided.reasoning import ReasoningGrammar
from tgictl.runtime.router.guided.tools import ToolPlan, tools_appendix
from tgictl.runtime.router.http.chat.answer import AnswerReader
from tgictl.runtime.router.http.chat.messages import ChatMessage
from tgictl.runtime.router.text.reasoning import Opening, ReasoningFormat, ReasoningSplitter

if TYPE_CHECKING:
    from tgictl.runtime.router.service import RouterService

# Template variables a request's chat_template_kwargs may not replace.
_RESERVED_TEMPLATE_KEYS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


def continue_final_message(text: str, messages: Sequence[dict[str, Any]]) -> str:
    """A conversation ending with an assistant message is continued, not answered (TGI): the
    rendered prompt stops right after that message's content, without its end-of-turn."""
    last = messages[-1]
    content = last.get("content")
    if last.get("role") != "assistant" or not isinstance(content, str) or not content:
        return text
    end = text.rfind(content)
    return text if end < 0 else text[: end + len(content)].rstrip()


def prompt_messages(
    messages: Sequence[ChatMessage], plan: ToolPlan | None, native_tools: bool, tool_prompt: str | None
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


def check_template_kwargs(kwargs: Any) -> dict[str, Any]:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
        raise ValidationError("`chat_template_kwargs` must be an object whose keys are names")
    reserved = sorted(_RESERVED_TEMPLATE_KEYS & kwargs.keys())
    if reserved:
        raise ValidationError(f"`chat_template_kwargs` cannot set {', '.join(reserved)}")
    return kwargs


@dataclass(frozen=True)
class ChatTurn:
    """What one API call asks of the model, in no API's shape."""

    messages: tuple[ChatMessage, ...]
    tools: ToolPlan | None = None
    response_grammar: GrammarRequest | None = None  # JSON output (exclusive with tools)
    tool_prompt: str | None = None
    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_reasoning_tokens: int | None = None

    async def prepare(self, service: RouterService) -> PreparedTurn:
        """Render the prompt (in the validation workers) and decide the grammar."""
        if not self.messages:
            raise ValidationError("the conversation has no messages")
        if self.max_reasoning_tokens is not None and self.max_reasoning_tokens < 1:
            raise ValidationError(f"`max_reasoning_tokens` must be >= 1. Given: {self.max_reasoning_tokens}")
        if self.max_reasoning_tokens is not None and service.reasoning is None:
            raise ValidationError("`max_reasoning_tokens` needs a reasoning model (the server's --reasoning-parser)")
        native = service.tokenizer.template_supports_tools
        messages, tools = prompt_messages(self.messages, self.tools, native, self.tool_prompt)
        rendered = await service.render_chat(messages, tools, check_template_kwargs(dict(self.template_kwargs)))
        prompt = continue_final_message(rendered, messages)
        grammar = self.tools.grammar if self.tools is not None else self.response_grammar
        fmt = service.reasoning
        opening = fmt.opening(prompt) if fmt is not None else None
        if fmt is not None and opening is not None and (grammar is not None or self.max_reasoning_tokens):
            tags = {tag: service.tokenizer.single_token(tag) for tag in (fmt.start_tag, fmt.end_tag)}
            try:
                after = ReasoningGrammar.for_tags(fmt.start_tag, fmt.end_tag, tags, opening, self.max_reasoning_tokens)
            except ValueError as err:  # a budget, and a model whose end tag is not one token
                raise ValidationError(f"`max_reasoning_tokens`: {err}") from None
            grammar = dataclasses.replace(grammar or GrammarRequest("text", ""), reasoning=after)
        return PreparedTurn(prompt, grammar, self.tools, fmt, opening)


@dataclass(frozen=True)
class PreparedTurn:
    prompt: str
    grammar: GrammarRequest | None
    tools: ToolPlan | None
    reasoning: ReasoningFormat | None
    opening: Opening | None  # where the output begins; None: no reasoning to split

    def reader(self) -> AnswerReader:
        """A new reader of one answer (one per choice)."""
        splitter = (
            ReasoningSplitter(self.reasoning, self.opening)
            if self.reasoning is not None and self.opening is not None else None
        )
        return AnswerReader(self.tools, splitter)
