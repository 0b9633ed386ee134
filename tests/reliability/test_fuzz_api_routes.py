"""Bad input on the routes of issue 45 (Anthropic's Messages, OpenAI's Responses, chat's reasoning fields, the
runtime adapter routes), fuzzed as test_fuzz_routes.py fuzzes the others: Hypothesis builds bodies of the
route's shape with wild values, anything at all, invalid UTF-8, truncated or deeply nested JSON, wrong content
types. Every answer must be a 2xx or a 4xx in the route's API's error shape (Anthropic's under /v1/messages,
OpenAI's under /v1/), never a 5xx or a hang. Afterwards /health is 200 and every KV block is back.

The server is the tiny reasoning model with --reasoning-parser qwen3 (so budgets and thinking settings reach
the grammar after reasoning) and --allow-lora-loading (so loads read whatever path the fuzz names).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.integration.http_stack import Stack
from tests.reliability import test_fuzz_routes as base
from tests.reliability.support import assert_error_json, wait_idle

EXAMPLES_PER_ROUTE = 100
Field = base.Field
NAMES = st.one_of(base.TEXT, st.sampled_from(["get_weather", "f", "a" * 65, "bad name", ""]))
SCHEMA = st.one_of(base.ANY, st.just({"type": "object", "properties": {"a": {"type": "integer"}}}),
                   st.just({"type": "string", "pattern": "[a-z]+"}), st.just({"$ref": "#/nope"}))
BUDGET = st.integers(min_value=-2, max_value=8)


@pytest.fixture(scope="module")
def tiny_model_dir(thinking_model_dir: Path) -> Path:
    """This module's server serves the tiny reasoning model (reliability/conftest.py starts it)."""
    return thinking_model_dir


@pytest.fixture(scope="module")
def stack_args() -> tuple[list[str], list[str]]:
    # 512: room for a tool list in the prompt (the plausible bodies' tools reach generation).
    router = ["--max-total-tokens", "512", "--payload-limit", str(base.PAYLOAD_LIMIT), "--max-concurrent-requests",
              "8", "--reasoning-parser", "qwen3", "--allow-lora-loading"]
    return router, []


@pytest.fixture(scope="module")
def tally() -> Counter[str]:
    return Counter()


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=base.TIMEOUT_S) as c:
        yield c


def anthropic_body(v: Field, counting: bool = False) -> st.SearchStrategy[Any]:
    block = st.fixed_dictionaries(
        {"type": v(st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image", "document", ""]))},
        optional={"text": v(base.TEXT), "id": v(base.TEXT), "name": v(NAMES), "input": base.ANY,
                  "tool_use_id": v(base.TEXT), "content": v(st.one_of(base.TEXT, st.lists(st.fixed_dictionaries(
                      {"type": v(st.sampled_from(["text", "image"]))}, optional={"text": v(base.TEXT)}), max_size=2))),
                  "thinking": v(base.TEXT), "is_error": v(st.booleans())},
    )
    message = st.fixed_dictionaries({"role": v(st.sampled_from(["user", "assistant", "system", ""])),
                                     "content": v(st.one_of(base.PROMPT, st.lists(block, max_size=3)))})
    tool = st.fixed_dictionaries({"name": v(NAMES)}, optional={
        "description": v(base.TEXT), "input_schema": v(SCHEMA), "type": v(st.sampled_from(["custom", "bash_20250124"]))})
    optional = {
        "model": v(base.TEXT), "system": v(st.one_of(base.TEXT, st.lists(block, max_size=2))),
        "tools": v(st.lists(tool, max_size=3)),
        "tool_choice": v(st.fixed_dictionaries({"type": v(st.sampled_from(["auto", "any", "tool", "none", "x"]))},
                                               optional={"name": v(NAMES), "disable_parallel_tool_use": v(st.booleans())})),
        "thinking": v(st.fixed_dictionaries({"type": v(st.sampled_from(["enabled", "disabled", "adaptive", "x"]))},
                                            optional={"budget_tokens": v(BUDGET)})),
        "output_config": v(st.fixed_dictionaries({}, optional={"format": v(st.fixed_dictionaries(
            {"type": v(st.sampled_from(["json_schema", "text"]))}, optional={"schema": v(SCHEMA)}))})),
        "chat_template_kwargs": base.ANY,
    }
    if not counting:
        optional |= {"stop_sequences": v(base.STOPS), "stream": v(st.booleans()), "temperature": v(base.FLOAT),
                     "top_p": v(base.UNIT), "top_k": v(base.TOP_K), "metadata": base.ANY}
    required = {"messages": v(st.lists(message, min_size=1, max_size=3))}
    if not counting:
        required["max_tokens"] = v(base.SMALL)
    return st.fixed_dictionaries(required, optional=optional)


def responses_body(v: Field) -> st.SearchStrategy[Any]:
    part = st.fixed_dictionaries({"type": v(st.sampled_from(["input_text", "output_text", "input_image", "refusal"]))},
                                 optional={"text": v(base.TEXT), "refusal": v(base.TEXT)})
    item = st.fixed_dictionaries({}, optional={
        "type": v(st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "computer_call"])),
        "role": v(st.sampled_from(["user", "assistant", "system", "developer", "tool"])),
        "content": v(st.one_of(base.PROMPT, st.lists(part, max_size=2))), "call_id": v(base.TEXT),
        "name": v(NAMES), "arguments": v(st.one_of(base.TEXT, st.just('{"a": 1}'))), "output": v(base.TEXT)})
    tool = st.fixed_dictionaries({"type": v(st.sampled_from(["function", "web_search"]))}, optional={
        "name": v(NAMES), "parameters": v(SCHEMA), "strict": v(st.booleans())})
    fmt = st.fixed_dictionaries({"type": v(st.sampled_from(["text", "json_object", "json_schema", "x"]))},
                                optional={"name": v(base.TEXT), "schema": v(SCHEMA), "strict": v(st.booleans())})
    return st.fixed_dictionaries({"input": v(st.one_of(base.PROMPT, st.lists(item, max_size=4)))}, optional={
        "model": v(base.TEXT), "instructions": v(base.TEXT), "max_output_tokens": v(base.SMALL),
        "temperature": v(base.FLOAT), "top_p": v(base.UNIT), "tools": v(st.lists(tool, max_size=2)),
        "tool_choice": v(st.one_of(st.sampled_from(["auto", "none", "required"]), st.fixed_dictionaries(
            {"type": v(st.sampled_from(["function", "allowed_tools"]))}, optional={"name": v(NAMES)}))),
        "parallel_tool_calls": v(st.booleans()), "text": v(st.fixed_dictionaries({}, optional={"format": v(fmt)})),
        "stream": v(st.booleans()), "previous_response_id": v(base.TEXT), "store": v(st.booleans()),
        "reasoning": base.ANY, "max_reasoning_tokens": v(BUDGET), "chat_template_kwargs": base.ANY,
        "seed": v(base.SEED), "top_k": v(base.TOP_K),
    })


def chat_reasoning_body(v: Field) -> st.SearchStrategy[Any]:
    extras = st.fixed_dictionaries({}, optional={
        "max_reasoning_tokens": v(BUDGET),
        "chat_template_kwargs": v(st.one_of(base.ANY, st.fixed_dictionaries({"enable_thinking": v(st.booleans())}))),
    })
    return st.tuples(base.chat_body(v), extras).map(lambda both: {**both[0], **both[1]})


def adapter_body(v: Field, load: bool) -> st.SearchStrategy[Any]:
    paths = st.one_of(base.TEXT, st.sampled_from(["/", "/tmp", "/proc/self", "/dev/null", "../../etc", "."]))
    fields = {"lora_name": v(NAMES), **({"lora_path": v(paths)} if load else {})}
    return st.fixed_dictionaries(fields, optional={"lora_int_id": v(base.NUMBERS)})


def of(build: Callable[[Field], st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    return base.body_of(build)


BODIES: dict[str, st.SearchStrategy[Any]] = {
    "/v1/messages": of(anthropic_body),
    "/v1/messages/count_tokens": of(lambda v: anthropic_body(v, counting=True)),
    "/v1/responses": of(responses_body),
    "/v1/chat/completions": of(chat_reasoning_body),
    "/v1/load_lora_adapter": of(lambda v: adapter_body(v, load=True)),
    "/v1/unload_lora_adapter": of(lambda v: adapter_body(v, load=False)),
}
ROUTES = tuple(BODIES)


@pytest.mark.parametrize("route", ROUTES)
def test_route_answers_2xx_or_4xx_in_its_apis_shape(
    route: str, client: httpx.Client, tally: Counter[str], stack: Stack
) -> None:
    @settings(base.FUZZ_SETTINGS, max_examples=EXAMPLES_PER_ROUTE)
    @given(request=base.requests(route, BODIES))
    def run(request: tuple[str, bytes]) -> None:
        base.fuzz(route, client, tally, *request)

    try:
        run()
    except AssertionError:
        print(stack.logs())
        raise


# Bodies that are mostly valid, so that most reach generation: reasoning budgets, thinking switches, tools and
# formats after the think text, streamed or not, through all three chat APIs.
WORDS = st.text(alphabet="abc xyz<>/{}\n", min_size=1, max_size=20)
SANE_SCHEMA = st.sampled_from([{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                               {"type": "object", "properties": {"u": {"enum": ["c", "f"]}}}])
SANE_BUDGET = st.one_of(st.none(), st.integers(min_value=1, max_value=4))


def _without_none(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def sane_chat() -> st.SearchStrategy[Any]:
    tools = st.one_of(st.none(), st.just([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]))
    return st.fixed_dictionaries({
        "messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": WORDS}),
                             min_size=1, max_size=2),
        "max_tokens": st.integers(min_value=1, max_value=12), "stream": st.booleans(),
        "temperature": st.sampled_from([0.0, 0.7]), "max_reasoning_tokens": SANE_BUDGET, "tools": tools,
        "tool_choice": st.sampled_from([None, "auto", "required"]),
        "chat_template_kwargs": st.sampled_from([None, {"enable_thinking": False}]),
    }).map(lambda b: _without_none({**b, "tool_choice": b["tool_choice"] if b["tools"] else None}))


def sane_messages() -> st.SearchStrategy[Any]:
    tools = st.one_of(st.none(), st.just([{"name": "f", "input_schema": {"type": "object", "properties": {
        "a": {"type": "integer"}}, "required": ["a"]}}]))
    thinking = st.one_of(st.none(), st.just({"type": "disabled"}), st.just({"type": "adaptive"}),
                         st.integers(min_value=1, max_value=4).map(lambda n: {"type": "enabled", "budget_tokens": n}))
    return st.fixed_dictionaries({
        "model": st.just("m"), "max_tokens": st.integers(min_value=1, max_value=12), "system": st.one_of(st.none(), WORDS),
        "messages": st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": WORDS}), min_size=1, max_size=2),
        "stream": st.booleans(), "temperature": st.sampled_from([0.0, 0.7]), "thinking": thinking, "tools": tools,
        "tool_choice": st.sampled_from([None, {"type": "any"}, {"type": "auto"}, {"type": "none"}]),
        "output_config": st.one_of(st.none(), SANE_SCHEMA.map(lambda s: {"format": {"type": "json_schema", "schema": s}})),
    }).map(lambda b: _without_none({**b, "tool_choice": b["tool_choice"] if b["tools"] else None,
                                    "output_config": None if b["tools"] else b["output_config"]}))


def sane_responses() -> st.SearchStrategy[Any]:
    tools = st.one_of(st.none(), st.just([{"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}]))
    return st.fixed_dictionaries({
        "input": st.one_of(WORDS, st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "developer"]),
                                                                  "content": WORDS}), min_size=1, max_size=2)),
        "instructions": st.one_of(st.none(), WORDS), "max_output_tokens": st.integers(min_value=1, max_value=12),
        "stream": st.booleans(), "temperature": st.sampled_from([0.0, 0.7]), "max_reasoning_tokens": SANE_BUDGET,
        "tools": tools, "store": st.booleans(),
        "text": st.one_of(st.none(), SANE_SCHEMA.map(lambda s: {"format": {"type": "json_schema", "name": "x", "schema": s}})),
    }).map(lambda b: _without_none({**b, "text": None if b["tools"] else b["text"]}))


SANE = {"/v1/chat/completions": sane_chat(), "/v1/messages": sane_messages(), "/v1/responses": sane_responses()}


@pytest.mark.parametrize("route", tuple(SANE))
def test_plausible_requests_generate_or_are_refused_in_shape(
    route: str, client: httpx.Client, tally: Counter[str], stack: Stack
) -> None:
    @settings(base.FUZZ_SETTINGS, max_examples=60)
    @given(body=SANE[route])
    def run(body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        base.fuzz(route, client, tally, "application/json", raw)

    try:
        run()
    except AssertionError:
        print(stack.logs())
        raise
    assert tally[f"{route} 2xx"] + tally[f"{route} 2xx-sse"] >= 40  # most reached generation


def test_every_new_route_refuses_an_oversized_body_in_its_shape(client: httpx.Client) -> None:
    big = b'{"input": "' + b"x" * base.PAYLOAD_LIMIT + b'"}'
    for route in (*ROUTES, "/v1/responses/resp_x"):
        answer = client.post(route, content=big, headers={"content-type": "application/json"})
        assert answer.status_code in (413, 405), route
        assert_error_json(answer.status_code, answer.content, path=route)


def test_server_is_healthy_and_nothing_leaked_afterwards(stack: Stack, client: httpx.Client, tally: Counter[str]) -> None:
    assert client.get("/health").status_code == 200
    state = wait_idle(stack.url)
    assert state.free + state.cached == state.total and state.queue == 0
    assert stack.shard.poll() is None and stack.router.poll() is None
    answer = client.post("/v1/messages", json={"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200 and answer.json()["content"]
    print(f"\nfuzz: {sum(tally.values())} requests; by route and status: {dict(sorted(tally.items()))}")
