"""A reasoning model served with `--reasoning-parser qwen3`: the tiny thinking model (its template opens a
think block) on a real router and shard. A reasoning budget ends the thinking cleanly (the end tag forced
once the budget is spent), a JSON format and tools constrain only what follows it, and the same greedy
conversation (system, a tool call and its result, a follow-up) gives the same tokens through chat
completions, Anthropic's Messages and the Responses API, each equal to TGI's /generate on the prompt."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.integration.http_stack import Stack, http_stack

BUDGET = 3
UNIT = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"],
        "additionalProperties": False}
QUESTION = [{"role": "user", "content": "What is the weather?"}]


@pytest.fixture(scope="module")
def stack(thinking_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with http_stack(thinking_model_dir, tmp_path_factory.mktemp("http-reasoning"),
                    router_args=["--reasoning-parser", "qwen3", "--max-total-tokens", "1024"]) as running:
        yield running


@pytest.fixture(scope="module")
def chat(stack: Stack) -> openai.OpenAI:
    return stack.openai()


@pytest.fixture(scope="module")
def claude(stack: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=60.0) as c:
        yield c


def tokens_of(http: httpx.Client, text: str) -> list[int]:
    return [t["id"] for t in http.post("/tokenize", json={"inputs": text}).json()]


def test_a_budget_ends_thinking_cleanly(chat: openai.OpenAI, http: httpx.Client) -> None:
    out = chat.chat.completions.create(model="tgi", messages=QUESTION, max_tokens=12, temperature=0,
                                       extra_body={"max_reasoning_tokens": BUDGET})
    message: Any = out.choices[0].message
    reasoning = message.reasoning_content
    assert reasoning == message.reasoning and "</think>" not in reasoning + (message.content or "")
    assert len(tokens_of(http, reasoning)) <= BUDGET  # the budget's tokens, then the forced end tag
    streamed = list(chat.chat.completions.create(model="tgi", messages=QUESTION, max_tokens=12, temperature=0,
                                                 stream=True, extra_body={"max_reasoning_tokens": BUDGET}))
    deltas: list[Any] = [c.choices[0].delta for c in streamed if c.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == (message.content or "")


def test_json_and_tools_constrain_only_what_follows(chat: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "unit", "schema": UNIT, "strict": True}}
    out = chat.chat.completions.create(model="tgi", messages=QUESTION, max_tokens=60, temperature=0,
                                       response_format=fmt, extra_body={"max_reasoning_tokens": BUDGET})
    message: Any = out.choices[0].message
    assert message.reasoning_content and out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(message.content), UNIT)
    tools: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": UNIT}}]
    called = chat.chat.completions.create(model="tgi", messages=QUESTION, max_tokens=80, temperature=0, tools=tools,
                                          tool_choice="required", parallel_tool_calls=False,
                                          extra_body={"max_reasoning_tokens": BUDGET})
    message = called.choices[0].message
    assert called.choices[0].finish_reason == "tool_calls" and message.reasoning_content
    jsonschema.validate(json.loads(message.tool_calls[0].function.arguments), UNIT)


def test_thinking_blocks_and_reasoning_items(claude: anthropic.Anthropic, chat: openai.OpenAI) -> None:
    thinking: Any = {"type": "enabled", "budget_tokens": BUDGET}
    message = claude.messages.create(model="tgi", max_tokens=12, messages=QUESTION, thinking=thinking,
                                     extra_body={"temperature": 0})
    assert [b.type for b in message.content][:1] == ["thinking"]
    with claude.messages.stream(model="tgi", max_tokens=12, messages=QUESTION, thinking=thinking,
                                extra_body={"temperature": 0}) as stream:
        final = stream.get_final_message()
    assert final.content[0].thinking == message.content[0].thinking  # type: ignore[union-attr]
    response = chat.responses.create(model="tgi", input=QUESTION, max_output_tokens=12, temperature=0,  # type: ignore[arg-type]
                                     extra_body={"max_reasoning_tokens": BUDGET})
    assert response.output[0].type == "reasoning"
    assert response.output[0].content[0].text == message.content[0].thinking  # type: ignore[union-attr]
    # The budget's tokens and the end tag.
    assert response.usage.output_tokens_details.reasoning_tokens == BUDGET + 1


def test_the_same_conversation_gives_the_same_tokens_through_every_api(
    chat: openai.OpenAI, claude: anthropic.Anthropic, http: httpx.Client
) -> None:
    # No tools in this last request: no grammar, so TGI's /generate on the rendered prompt is the reference.
    arguments = '{"unit": "celsius"}'
    common: Any = {"temperature": 0}
    completion = chat.chat.completions.create(model="tgi", max_tokens=16, **common, messages=[
        {"role": "system", "content": "Be brief."}, *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22C"},
        {"role": "user", "content": "And tomorrow?"}])
    message = claude.messages.create(model="tgi", max_tokens=16, system="Be brief.", extra_body=common, messages=[
        *QUESTION,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                                           "input": json.loads(arguments)}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "22C"},
                                     {"type": "text", "text": "And tomorrow?"}]}])
    response = chat.responses.create(model="tgi", max_output_tokens=16, instructions="Be brief.", **common, input=[
        *QUESTION,
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": arguments},
        {"type": "function_call_output", "call_id": "call_1", "output": "22C"},
        {"role": "user", "content": "And tomorrow?"}])
    chat_message: Any = completion.choices[0].message
    thinking = [b for b in message.content if b.type == "thinking"]
    reasoning = [chat_message.reasoning_content, thinking[0].thinking if thinking else None,  # type: ignore[union-attr]
                 next((item.content[0].text for item in response.output if item.type == "reasoning"), None)]  # type: ignore[union-attr]
    answers = [chat_message.content or "", "".join(b.text for b in message.content if b.type == "text"),
               response.output_text]
    prompt_tokens = [completion.usage.prompt_tokens, message.usage.input_tokens + message.usage.cache_read_input_tokens,
                     response.usage.input_tokens]
    output_tokens = [completion.usage.completion_tokens, message.usage.output_tokens, response.usage.output_tokens]
    assert len(set(reasoning)) == len(set(answers)) == len(set(prompt_tokens)) == len(set(output_tokens)) == 1
    assert reasoning[0]
    # ... and they are the tokens TGI's /generate writes for the prompt the chat template rendered.
    turns = [("system", "Be brief."), ("user", "What is the weather?"),
             ("assistant", '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "celsius"}}\n</tool_call>'),
             ("tool", "22C"), ("user", "And tomorrow?")]
    prompt = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)
    prompt += "<|im_start|>assistant\n<think>\n"
    assert len(tokens_of(http, prompt)) == prompt_tokens[0]
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 16, "details": True}}
    generated = http.post("/generate", json=body).json()
    assert generated["details"]["generated_tokens"] == output_tokens[0]
    text = generated["generated_text"]
    assert text.startswith(reasoning[0])
    rest = text[len(reasoning[0]):]
    assert rest == "" and answers[0] == "" or rest.startswith("</think>") and rest[8:].lstrip() == answers[0]
