"""OpenAI tools as one grammar (docs/architecture.md, "Guided generation": tools).

A call is written `<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>` (the Hermes/Qwen
layout chat templates with tool support already teach), calls one per line, ARGS in the canonical
JSON layout of the function's parameter schema. `tool_choice` picks the grammar:

- `required`: one or more calls of any function; a named function: calls of that one only;
- `auto`: ONE grammar allowing either a plain-text answer (which cannot start with `<`) or calls, so
  the model decides inside one generation (TGI re-runs the request without tools when its model
  declines: a second prefill);
- `none`: no grammar and the tools are not shown to the model.

Templates that do not mention `tools` get the tool list and `tool_prompt` appended to the last
message, as TGI does.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from tgictl.errors import ToolError
from tgictl.runtime.guidance import JSON_LAYOUT
from tgictl.runtime.router.guided.grammars import GrammarRequest

CALL_OPEN = "<tool_call>\n"
CALL_CLOSE = "\n</tool_call>"
CALL_SEPARATOR = "\n"
DEFAULT_TOOL_PROMPT = (
    "You may call one or more of the functions above. To call a function, answer only with one block "
    'per call: <tool_call>\n{"name": <function name>, "arguments": <the arguments as a JSON object>}\n</tool_call>'
)
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names

ToolMode = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class Function:
    name: str
    description: str | None
    parameters: dict[str, Any]
    strict: bool


@dataclass(frozen=True)
class ToolPlan:
    """What a chat request's tools mean for its prompt, its grammar and its answer."""

    functions: tuple[Function, ...]  # the ones the model may call (all, or the named one)
    mode: ToolMode
    grammar: GrammarRequest | None  # None for "none"
    prompt_tools: tuple[dict[str, Any], ...]  # what the model is shown (none for "none")

    @property
    def parses_calls(self) -> bool:
        return self.mode != "none"


def parse_functions(tools: list[Any]) -> tuple[Function, ...]:
    functions: list[Function] = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ToolError(f"tools[{index}] must be {{\"type\": \"function\", \"function\": {{...}}}}")
        spec = tool.get("function")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ToolError(f"tools[{index}].function needs a `name`")
        name = spec["name"]
        if not _NAME.match(name):
            raise ToolError(f"function name {name!r} must be 1-64 letters, digits, '_' or '-'")
        parameters = spec.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ToolError(f"tools[{index}].function.parameters must be a JSON schema object")
        description = spec.get("description")
        functions.append(Function(name, description if isinstance(description, str) else None,
                                  parameters, spec.get("strict") is True))
    names = [f.name for f in functions]
    if len(set(names)) != len(names):
        raise ToolError("function names must be unique")
    return tuple(functions)


def _mode(tool_choice: Any, functions: tuple[Function, ...]) -> tuple[ToolMode, tuple[Function, ...]]:
    """OpenAI's tool_choice: "auto" (default), "none", "required", {"type": "function", "function":
    {"name"}}; TGI also takes a bare function name."""
    if tool_choice is None or tool_choice == "auto":
        return "auto", functions
    if tool_choice in ("none", "required"):
        return tool_choice, functions
    name = tool_choice
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
    chosen = [f for f in functions if f.name == name]
    if not isinstance(name, str) or not chosen:
        raise ToolError(f"tool_choice names no function in `tools`: {tool_choice!r}")
    return "named", tuple(chosen)


def _lark_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid lark literal


def tool_grammar(functions: tuple[Function, ...], mode: ToolMode, parallel: bool = True) -> GrammarRequest:
    """parallel: one or more calls (OpenAI's parallel_tool_calls, default true), else exactly one."""
    rules = []
    alternatives = []
    for i, f in enumerate(functions):
        schema = dict(f.parameters)
        own = schema.get("x-guidance")
        schema["x-guidance"] = {**JSON_LAYOUT, "lenient": not f.strict, **(own if isinstance(own, dict) else {})}
        head = f'{CALL_OPEN}{{"name": "{f.name}", "arguments": '
        rules.append(f"call_{i}: {_lark_string(head)} args_{i} {_lark_string('}' + CALL_CLOSE)}")
        rules.append(f"args_{i}: %json {json.dumps(schema)}")
        alternatives.append(f"call_{i}")
    start = "calls | TEXT" if mode == "auto" else "calls"
    lines = [
        f"start: {start}",
        f"calls: call ({_lark_string(CALL_SEPARATOR)} call)*" if parallel else "calls: call",
        f"call: {' | '.join(alternatives)}",
        *rules,
        # auto: a text answer is anything that does not begin like a call.
        "TEXT: /[^<](?s:.*)/",
    ]
    return GrammarRequest("lark", "\n".join(lines))


def plan_tools(tools: list[Any] | None, tool_choice: Any, parallel: bool = True) -> ToolPlan | None:
    if not tools:
        if tool_choice not in (None, "auto", "none"):
            raise ToolError("tool_choice needs `tools`")
        return None
    functions = parse_functions(tools)
    mode, allowed = _mode(tool_choice, functions)
    if mode == "none":
        return ToolPlan(functions=(), mode=mode, grammar=None, prompt_tools=())
    return ToolPlan(
        functions=allowed,
        mode=mode,
        grammar=tool_grammar(allowed, mode, parallel),
        prompt_tools=tuple(tools),
    )


def tools_appendix(tools: tuple[dict[str, Any], ...], tool_prompt: str | None) -> str:
    """Appended to the last message when the template does not render tools (TGI's layout)."""
    prompt = DEFAULT_TOOL_PROMPT if tool_prompt is None else tool_prompt
    return f"\n---\n{json.dumps(list(tools), ensure_ascii=False)}\n{prompt}"


def call_text(name: str, arguments: Any) -> str:
    """An assistant's earlier call as the model writes it (for templates without tool support)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_OPEN}{body}{CALL_CLOSE}"
