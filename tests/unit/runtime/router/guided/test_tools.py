"""The tool grammar: every tool_choice, several calls, text or calls under auto, and its errors."""

from __future__ import annotations

import json

import llguidance
import pytest

from tests.unit.runtime.router.guided.conftest import Follows
from tgictl.errors import ToolError
from tgictl.runtime.router.guided.grammars import GrammarValidator
from tgictl.runtime.router.guided.tools import call_text, plan_tools, tools_appendix

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
           "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "ping"}},
]
WEATHER_CALL = call_text("get_weather", {"city": "Paris"})
PING_CALL = call_text("ping", "{}")


@pytest.fixture(scope="module")
def compile_plan(ll_tokenizer: llguidance.LLTokenizer):  # noqa: ANN201
    validator = GrammarValidator(ll_tokenizer)

    def compile_(tool_choice: object, parallel: bool = True) -> str:
        plan = plan_tools(TOOLS, tool_choice, parallel)
        assert plan is not None and plan.grammar is not None
        return validator.compile(plan.grammar).value

    return compile_


def test_call_text_is_the_layout_the_grammar_makes() -> None:
    assert WEATHER_CALL == '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert PING_CALL == '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'


def test_required_allows_one_or_more_calls_of_any_function_and_no_text(compile_plan, follows: Follows) -> None:  # noqa: ANN001
    grammar = compile_plan("required")
    assert follows(grammar, WEATHER_CALL)
    assert follows(grammar, f"{WEATHER_CALL}\n{PING_CALL}\n{WEATHER_CALL}")  # several calls in one answer
    assert not follows(grammar, "Sunny.")
    assert not follows(grammar, call_text("get_weather", {"town": "Paris"}))  # arguments follow the schema
    assert not follows(grammar, call_text("unknown", {}))


def test_named_allows_only_that_function_and_parallel_false_only_one_call(compile_plan, follows: Follows) -> None:  # noqa: ANN001
    named = compile_plan({"type": "function", "function": {"name": "ping"}})
    assert follows(named, PING_CALL) and not follows(named, WEATHER_CALL)
    assert follows(compile_plan("ping"), PING_CALL)  # TGI's bare name
    single = compile_plan("required", parallel=False)
    assert follows(single, WEATHER_CALL) and not follows(single, f"{WEATHER_CALL}\n{PING_CALL}")


def test_auto_is_one_grammar_for_text_or_calls(compile_plan, follows: Follows) -> None:  # noqa: ANN001
    grammar = compile_plan("auto")
    assert follows(grammar, "It is sunny in Paris <3")
    assert follows(grammar, f"{WEATHER_CALL}\n{PING_CALL}")
    assert not follows(grammar, "<tool_call>\nnot a call")  # text may not start like a call
    assert compile_plan(None) == grammar  # auto is the default


def test_none_has_no_grammar_and_shows_no_tools() -> None:
    plan = plan_tools(TOOLS, "none")
    assert plan is not None and plan.grammar is None and plan.prompt_tools == () and not plan.parses_calls
    assert plan_tools(None, None) is None


def test_appendix_is_tgi_layout() -> None:
    text = tools_appendix(tuple(TOOLS), None)
    assert text.startswith("\n---\n" + json.dumps(TOOLS)) and "<tool_call>" in text
    assert tools_appendix(tuple(TOOLS), "Use a tool.").endswith("\nUse a tool.")


@pytest.mark.parametrize(("tools", "choice", "message"), [
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "names no function"),
    (TOOLS, 3, "names no function"),
    ([{"type": "retrieval"}], None, "tools\\[0\\] must be"),
    ([{"type": "function", "function": {}}], None, "needs a `name`"),
    ([{"type": "function", "function": {"name": "a b"}}], None, "function name 'a b'"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, "parameters must be"),
    ([TOOLS[1], TOOLS[1]], None, "must be unique"),
    (None, "required", "tool_choice needs `tools`"),
])
def test_tool_errors(tools: object, choice: object, message: str) -> None:
    with pytest.raises(ToolError, match=message) as info:
        plan_tools(tools, choice)  # type: ignore[arg-type]
    assert info.value.http_status == 422 and info.value.error_type == "tool_error"
