"""Anthropic's Messages API against a real router and shard on the tiny llama, through the official
`anthropic` SDK unchanged (its 2026 signature has no temperature: greedy decoding goes in extra_body), with
TGI's /generate and /tokenize on the rendered prompt as the reference."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from tests.integration.http_stack import Stack, http_stack

N = 8
GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}}
SYSTEM = "You answer briefly."
MESSAGES = [{"role": "user", "content": "Say something about foxes"}]
TEMPLATED = ("<|im_start|>system\nYou answer briefly.<|im_end|>\n<|im_start|>user\nSay something about foxes"
             "<|im_end|>\n<|im_start|>assistant\n")
WEATHER = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"],
           "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "The weather", "input_schema": WEATHER},
         {"name": "ping", "input_schema": {"type": "object", "properties": {}, "additionalProperties": False}}]


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with http_stack(tiny_model_dir, tmp_path_factory.mktemp("http-messages"),
                    router_args=["--max-total-tokens", "1024"]) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack: Stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=60.0) as c:
        yield c


def reference(http: httpx.Client, inputs: str, max_new_tokens: int = N, **parameters: Any) -> dict[str, Any]:
    body = {"inputs": inputs, "parameters": {"max_new_tokens": max_new_tokens, "details": True, **parameters}}
    answer = http.post("/generate", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_greedy_message_whole_and_streamed(client: anthropic.Anthropic, http: httpx.Client) -> None:
    ref = reference(http, TEMPLATED)
    message = client.messages.create(model="tgi", max_tokens=N, system=SYSTEM, messages=MESSAGES, **GREEDY)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].type == "text" and message.content[0].text == ref["generated_text"]
    finish = ref["details"]["finish_reason"]
    assert message.stop_reason == {"length": "max_tokens", "eos_token": "end_turn"}[finish]
    prompt_tokens = len(http.post("/tokenize", json={"inputs": TEMPLATED}).json())
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == prompt_tokens
    assert usage.output_tokens == ref["details"]["generated_tokens"]
    with client.messages.stream(model="tgi", max_tokens=N, system=SYSTEM, messages=MESSAGES, **GREEDY) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == final.content[0].text == message.content[0].text
    assert final.stop_reason == message.stop_reason and final.usage.output_tokens == usage.output_tokens


def test_the_stream_is_anthropics_event_sequence(stack: Stack) -> None:
    body = {"model": "tgi", "max_tokens": 4, "messages": MESSAGES, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{stack.url}/v1/messages", json=body, timeout=60) as answer:
        lines = list(answer.iter_lines())
    names = [line[7:] for line in lines if line.startswith("event: ")]
    datas = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in datas] == names  # every event's name is its data's type
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[3:-3] == ["content_block_delta"] * (len(names) - 6)
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert datas[-2]["delta"]["stop_reason"] == "max_tokens" and datas[-2]["usage"]["output_tokens"] == 4


def test_stop_sequences(client: anthropic.Anthropic, http: httpx.Client) -> None:
    text = reference(http, TEMPLATED, max_new_tokens=12, stop=[])["generated_text"]
    stop = text[4:7]
    assert stop.strip() and stop in text
    message = client.messages.create(model="tgi", max_tokens=12, system=SYSTEM, messages=MESSAGES,
                                     stop_sequences=[stop], **GREEDY)
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert message.content[0].text == text[: text.index(stop)]


def test_count_tokens_is_the_rendered_prompt(client: anthropic.Anthropic, http: httpx.Client) -> None:
    counted = client.messages.count_tokens(model="tgi", system=SYSTEM, messages=MESSAGES)
    assert counted.input_tokens == len(http.post("/tokenize", json={"inputs": TEMPLATED}).json())
    with_tools = client.messages.count_tokens(model="tgi", system=SYSTEM, messages=MESSAGES, tools=TOOLS)
    assert with_tools.input_tokens > counted.input_tokens  # the tools are in the prompt


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("choice", "names"), [
    ({"type": "any", "disable_parallel_tool_use": True}, {"get_weather", "ping"}),
    ({"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}, {"get_weather"}),
])
def test_forced_tool_use(client: anthropic.Anthropic, choice: dict[str, Any], names: set[str], stream: bool) -> None:
    args: dict[str, Any] = {"model": "tgi", "max_tokens": 80, "messages": MESSAGES, "tools": TOOLS,
                            "tool_choice": choice, **GREEDY}
    if stream:
        with client.messages.stream(**args) as streamed:
            message = streamed.get_final_message()
    else:
        message = client.messages.create(**args)
    calls = [block for block in message.content if block.type == "tool_use"]
    assert calls and message.stop_reason == "tool_use"
    for call in calls:
        assert call.name in names and call.id.startswith("toolu_")
        if call.name == "get_weather":
            jsonschema.validate(call.input, WEATHER)
    assert len(calls) == 1  # disable_parallel_tool_use: one call


def test_tool_choice_none_answers_text(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="tgi", max_tokens=4, messages=MESSAGES, tools=TOOLS,
                                     tool_choice={"type": "none"}, **GREEDY)
    assert [b.type for b in message.content] == ["text"] and message.stop_reason == "max_tokens"


def test_a_tool_result_round_trip(client: anthropic.Anthropic) -> None:
    first = client.messages.create(model="tgi", max_tokens=80, messages=MESSAGES, tools=TOOLS, **GREEDY,
                                   tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    call = next(b for b in first.content if b.type == "tool_use")
    conversation = [*MESSAGES, {"role": "assistant", "content": first.content},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "22C"},
                                                 {"type": "text", "text": "And tomorrow?"}]}]
    second = client.messages.create(model="tgi", max_tokens=4, messages=conversation, tools=TOOLS,
                                    tool_choice={"type": "auto"}, **GREEDY)
    assert second.stop_reason in ("max_tokens", "end_turn", "tool_use")
    counted = client.messages.count_tokens(model="tgi", messages=conversation, tools=TOOLS)
    assert counted.input_tokens > client.messages.count_tokens(model="tgi", messages=MESSAGES, tools=TOOLS).input_tokens


def test_errors_are_anthropics_shape(client: anthropic.Anthropic, http: httpx.Client) -> None:
    with pytest.raises(anthropic.UnprocessableEntityError) as info:
        client.messages.create(model="tgi", max_tokens=0, messages=MESSAGES)
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"
    assert "max_new_tokens" in info.value.body["error"]["message"]
    for body, status in [
        (b"{not json", 400),
        (json.dumps({"model": "tgi", "max_tokens": 2, "messages": [{"role": "robot", "content": "x"}]}).encode(), 422),
        (json.dumps({"model": "tgi", "max_tokens": 2, "messages": MESSAGES, "top_p": 2.0}).encode(), 422),
        (json.dumps({"model": "tgi", "max_tokens": 2, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "http://x"}}]}]}).encode(), 422),
    ]:
        answer = http.post("/v1/messages", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == status, answer.text
        error = answer.json()
        assert error["type"] == "error" and set(error["error"]) == {"type", "message"}
    missing = http.post("/v1/messages/nope", json={})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
