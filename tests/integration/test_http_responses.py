"""OpenAI's Responses API against a real router and shard on the tiny llama, through the `openai` SDK
unchanged (client.responses.create, .stream, .retrieve), with TGI's /generate on the rendered prompt as the
reference."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.integration.http_stack import Stack, http_stack

N = 8
INSTRUCTIONS = "You answer briefly."
TEMPLATED = ("<|im_start|>system\nYou answer briefly.<|im_end|>\n<|im_start|>user\nSay something about foxes"
             "<|im_end|>\n<|im_start|>assistant\n")
UNIT = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"],
        "additionalProperties": False}
TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "description": "The weather", "parameters": UNIT,
                     "strict": True}]
# More than one KV block (16 tokens): a repeat reads it from the radix cache.
LONG = "Every block of sixteen tokens that was computed once is read from the prefix cache the next time around."


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with http_stack(tiny_model_dir, tmp_path_factory.mktemp("http-responses"),
                    router_args=["--max-total-tokens", "1024"]) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return stack.openai()


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=60.0) as c:
        yield c


def test_items_and_instructions_greedy_whole_and_streamed(client: openai.OpenAI, http: httpx.Client) -> None:
    ref = http.post("/generate", json={"inputs": TEMPLATED, "parameters": {"max_new_tokens": N, "details": True}}).json()
    items: Any = [{"role": "user", "content": [{"type": "input_text", "text": "Say something about foxes"}]}]
    response = client.responses.create(model="tgi", instructions=INSTRUCTIONS, input=items, max_output_tokens=N,
                                       temperature=0)
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == ref["generated_text"]
    length = ref["details"]["finish_reason"] == "length"
    assert response.status == ("incomplete" if length else "completed")
    assert (response.incomplete_details.reason if length else None) == ("max_output_tokens" if length else None)
    assert response.usage.output_tokens == ref["details"]["generated_tokens"]
    assert response.usage.input_tokens == len(http.post("/tokenize", json={"inputs": TEMPLATED}).json())
    events = list(client.responses.create(model="tgi", instructions=INSTRUCTIONS, input=items, max_output_tokens=N,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{response.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == response.output_text
    assert events[-1].response.output_text == response.output_text


def test_text_input_and_cached_tokens(client: openai.OpenAI) -> None:
    first = client.responses.create(model="tgi", input=LONG, max_output_tokens=2)
    again = client.responses.create(model="tgi", input=LONG, max_output_tokens=2)
    assert first.usage.input_tokens == again.usage.input_tokens
    assert first.usage.input_tokens_details.cached_tokens == 0 < again.usage.input_tokens_details.cached_tokens


def test_text_format_through_the_grammar_engine(client: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "name": "unit", "schema": UNIT, "strict": True}
    # response.completed (the grammar ends the JSON, then EOS): the SDK's stream helper can finish.
    with client.responses.stream(model="tgi", input="The unit?", max_output_tokens=200, text={"format": fmt},
                                 temperature=0) as stream:
        final = stream.get_final_response()
    jsonschema.validate(json.loads(final.output_text), UNIT)
    assert final.text.format.type == "json_schema"
    # Any JSON object: a random model may write one longer than the budget, whose start is still JSON's.
    anything = client.responses.create(model="tgi", input="An object?", max_output_tokens=40, temperature=0,
                                       text={"format": {"type": "json_object"}})
    assert anything.output_text.startswith("{")
    if anything.status == "completed":
        assert isinstance(json.loads(anything.output_text), dict)


def test_function_calls_round_trip_by_call_id(client: openai.OpenAI, http: httpx.Client) -> None:
    first = client.responses.create(model="tgi", input="Weather?", tools=TOOLS, tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=80, temperature=0)
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and first.status == "completed"
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    jsonschema.validate(json.loads(call.arguments), UNIT)
    with client.responses.stream(model="tgi", input="Weather?", tools=TOOLS, parallel_tool_calls=False,
                                 tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=80,
                                 temperature=0) as stream:
        streamed = [e for e in stream]
        final = stream.get_final_response()
    assert final.output[0].arguments == call.arguments  # greedy: the same call, streamed
    assert any(e.type == "response.function_call_arguments.delta" for e in streamed)
    # The call's output continues the stored conversation by its call_id.
    follow = client.responses.create(model="tgi", previous_response_id=first.id, max_output_tokens=3, temperature=0,
                                     tools=TOOLS, input=[{"type": "function_call_output", "call_id": call.call_id, "output": "22C"}])
    assert follow.previous_response_id == first.id
    # The same conversation sent whole gives the same answer (tools are not carried over: both send them).
    whole = client.responses.create(model="tgi", max_output_tokens=3, temperature=0, tools=TOOLS, input=[
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "22C"}])
    assert whole.output_text == follow.output_text and whole.usage.input_tokens == follow.usage.input_tokens
    assert client.responses.retrieve(follow.id).output_text == follow.output_text


def test_store_false_is_not_kept(client: openai.OpenAI) -> None:
    unstored = client.responses.create(model="tgi", input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="tgi", input="more", previous_response_id=unstored.id, max_output_tokens=2)
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == "previous_response_id" and "restart" in error["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_errors_are_openais_shape(http: httpx.Client) -> None:
    for body, status in [
        ({"input": "hi", "max_output_tokens": 0}, 422),
        ({"input": []}, 422),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, 422),
        ({"input": [{"type": "computer_call"}]}, 422),
        ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, 422),
        ({"input": 7}, 422),
    ]:
        answer = http.post("/v1/responses", json=body)
        assert answer.status_code == status, (body, answer.text)
        assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
