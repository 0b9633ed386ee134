"""A conversation's messages in one neutral form, as every API's translation writes them and as the chat
template reads them (transformers' conventions: `role`, `content`, `tool_calls` with arguments as objects,
`tool_call_id`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tgictl.errors import ToolError
from tgictl.runtime.router.guided.tools import call_text


@dataclass(frozen=True)
class CalledTool:
    """A call the assistant made earlier in the conversation."""

    id: str | None
    name: str
    arguments: Any  # the arguments object (a JSON text is parsed)

    @classmethod
    def parsed(cls, id: str | None, name: Any, arguments: Any) -> CalledTool:
        if not isinstance(name, str):
            raise ToolError("a tool call of the conversation needs a function name")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments else {}
            except json.JSONDecodeError:
                raise ToolError(f"tool call {name!r}: arguments are not JSON") from None
        return cls(id, name, {} if arguments is None else arguments)

    def template_dict(self) -> dict[str, Any]:
        call: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if self.id is not None:
            call["id"] = self.id
        return call


@dataclass(frozen=True)
class ChatMessage:
    role: str  # system, user, assistant, tool
    content: str = ""
    tool_calls: tuple[CalledTool, ...] = ()
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None

    def template_dict(self, native_tools: bool) -> dict[str, Any]:
        """What the chat template sees. An assistant's tool calls: a template with tool support gets them
        as `tool_calls`; any other sees them written out as the model writes calls (guided/tools.py)."""
        content = self.content
        if self.tool_calls and not native_tools:
            written = "\n".join(call_text(c.name, c.arguments) for c in self.tool_calls)
            content = f"{content}\n{written}" if content else written
        message: dict[str, Any] = {"role": self.role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls and native_tools:
            message["tool_calls"] = [c.template_dict() for c in self.tool_calls]
        return message
