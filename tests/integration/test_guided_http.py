"""Guided generation and tools over real HTTP against a real router and shard on the tiny llama:
TGI's `parameters.grammar`, OpenAI's `response_format`, and tools for every `tool_choice`, streamed
and not, through `openai` and huggingface_hub's InferenceClient. A random model's constrained output
is still a valid instance: that is what is checked (docs/architecture.md, "Guided generation")."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from huggingface_hub import InferenceClient

from tests.integration.http_stack import Stack, http_stack
from tgictl.testing.grammar_cases import REGEXES, SCHEMAS

BOUNDED = {name: case for name, case in SCHEMAS.items() if name != "any_object"}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"],
        "additionalProperties": False}}},
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 200


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("http-guided")
    with http_stack(tiny_model_dir, work, router_args=["--max-total-tokens", "1024"]) as running:
        yield running


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=120.0) as c:
        yield c


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return stack.openai()


@pytest.fixture(scope="module")
def hf(stack: Stack) -> InferenceClient:  # huggingface_hub's client, as the TGI docs use it
    return InferenceClient(base_url=stack.url, timeout=120)


def generate(http: httpx.Client, grammar: dict[str, Any], **parameters: Any) -> dict[str, Any]:
    body = {"inputs": "Answer:", "parameters": {"max_new_tokens": MAX_TOKENS, "details": True, "grammar": grammar,
                                                **parameters}}
    response = http.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("name", sorted(BOUNDED))
def test_tgi_json_grammar_outputs_validate(http: httpx.Client, name: str, sampled: bool) -> None:
    schema = BOUNDED[name][0]
    extra = {"do_sample": True, "seed": 7, "temperature": 1.5} if sampled else {}
    out = generate(http, {"type": "json", "value": schema}, **extra)
    assert out["details"]["finish_reason"] == "eos_token", out
    jsonschema.validate(json.loads(out["generated_text"]), schema)


@pytest.mark.parametrize("name", sorted(REGEXES))
def test_tgi_regex_grammar_fully_matches_streamed_and_not(http: httpx.Client, name: str) -> None:
    regex = REGEXES[name][0]
    out = generate(http, {"type": "regex", "value": regex})
    assert out["details"]["finish_reason"] == "eos_token"
    assert re.fullmatch(regex, out["generated_text"]), out["generated_text"]
    body = {"inputs": "Answer:", "parameters": {"max_new_tokens": MAX_TOKENS, "grammar": {"type": "regex", "value": regex}}}
    with http.stream("POST", "/generate_stream", json=body) as response:
        events = [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]
    assert events[-1]["generated_text"] == out["generated_text"]  # greedy: the same text either way
    assert "".join(e["token"]["text"] for e in events if not e["token"]["special"]) == out["generated_text"]


def test_stop_rules_with_a_grammar(http: httpx.Client) -> None:
    """A stop string can cut between tokens the grammar forced in one step; max_new_tokens counts
    forced tokens; EOS comes only where the grammar accepts."""
    regex = {"type": "regex", "value": "(ab){12}"}
    stopped = generate(http, regex, stop=["abab"])
    assert stopped["details"]["finish_reason"] == "stop_sequence" and stopped["generated_text"] == "abab"
    cut = generate(http, regex, max_new_tokens=3)
    assert cut["details"]["finish_reason"] == "length" and cut["details"]["generated_tokens"] == 3
    assert "abababababababababababab".startswith(cut["generated_text"])
    whole = generate(http, regex)
    assert whole["details"]["finish_reason"] == "eos_token" and whole["generated_text"] == "ab" * 12
    forced = [t for t in whole["details"]["tokens"] if t["logprob"] is None]
    assert forced  # the tokens after the first were forced: no logprob


def test_json_grammar_as_string_and_json_schema_form(http: httpx.Client) -> None:
    schema = BOUNDED["enum"][0]
    as_text = generate(http, {"type": "json", "value": json.dumps(schema)})
    wrapped = generate(http, {"type": "json_schema", "value": {"name": "x", "schema": schema}})
    assert as_text["generated_text"] == wrapped["generated_text"]
    jsonschema.validate(json.loads(wrapped["generated_text"]), schema)


@pytest.mark.parametrize(("grammar", "message"), [
    ({"type": "json", "value": {"type": "object", "properties": {"a": {"type": "strin"}}}}, "grammar is not valid: .*strin"),
    ({"type": "json", "value": "{not json"}, "grammar is not valid"),
    ({"type": "json", "value": {"type": "string", "format": "no-such-format"}}, "grammar is not valid: .*no-such-format"),
    ({"type": "regex", "value": "a(b"}, "grammar is not valid: .*unclosed group"),
    ({"type": "lark", "value": "start: x"}, "grammar type `lark` is not supported"),
    ({"type": "regex", "value": 5}, "must be a string"),
    ("json", "grammar is not supported"),
])
def test_bad_grammars_are_422_naming_the_problem(http: httpx.Client, grammar: Any, message: str) -> None:
    response = http.post("/generate", json={"inputs": "x", "parameters": {"grammar": grammar}})
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error_type"] == "validation" and re.search(message, body["error"]), body


def test_openai_response_formats_on_chat_and_completions(client: openai.OpenAI) -> None:
    schema = BOUNDED["flat"][0]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
    chat = client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
                                          response_format=fmt)
    assert chat.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(chat.choices[0].message.content), schema)
    # json_object without a schema: any JSON object (TGI refuses it). A random model's object can be long,
    # so only a finished one is parsed.
    obj = client.completions.create(model="tgi", prompt="JSON:", max_tokens=MAX_TOKENS, temperature=0,
                                    extra_body={"response_format": {"type": "json_object"}})
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].text), dict)
    else:
        assert obj.choices[0].text.startswith("{")
    text = client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=4, temperature=0,
                                          response_format={"type": "text"})
    assert text.choices[0].message.content is not None


def test_openai_streamed_json_schema_reassembles(client: openai.OpenAI) -> None:
    schema = BOUNDED["nested"][0]
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    stream = client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
                                            response_format=fmt, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), schema)


def test_strict_refuses_what_lenient_ignores(http: httpx.Client) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "format": "no-such-format"}}}
    chat = {"model": "tgi", "messages": MESSAGES, "max_tokens": 8}
    strict = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
    refused = http.post("/v1/chat/completions", json={**chat, "response_format": strict})
    assert refused.status_code == 422 and "no-such-format" in refused.json()["error"]["message"]
    lenient = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    assert http.post("/v1/chat/completions", json={**chat, "response_format": lenient}).status_code == 200
    unknown = http.post("/v1/chat/completions", json={**chat, "response_format": {"type": "yaml"}})
    assert unknown.status_code == 422 and "`yaml` is not supported" in unknown.json()["error"]["message"]


def check_calls(calls: list[Any], allowed: set[str]) -> None:
    assert calls
    ids = set()
    for call in calls:
        name, arguments = call.function.name, call.function.arguments
        assert name in allowed and call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(arguments), PARAMETERS[name])
        ids.add(call.id)
    assert len(ids) == len(calls)


CHOICES: list[tuple[str, Any, set[str]]] = [
    ("required", "required", {"get_weather", "get_time"}),
    ("named", {"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("label", "choice", "allowed"), CHOICES, ids=[c[0] for c in CHOICES])
def test_openai_forced_tool_calls(client: openai.OpenAI, label: str, choice: Any, allowed: set[str], stream: bool) -> None:
    kwargs = dict(model="tgi", messages=MESSAGES, tools=TOOLS, tool_choice=choice, max_tokens=MAX_TOKENS,
                  temperature=0, parallel_tool_calls=False)
    if not stream:
        out = client.chat.completions.create(**kwargs)
        message = out.choices[0].message
        assert out.choices[0].finish_reason == "tool_calls" and message.content is None
        check_calls(message.tool_calls, allowed)
        return
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    # The openai SDK's own reassembly of tool-call deltas (what applications use).
    with client.chat.completions.stream(**kwargs) as events:
        final = events.get_final_completion()
    check_calls(final.choices[0].message.tool_calls, allowed)
    first = next(c for c in chunks if c.choices and c.choices[0].delta.tool_calls)
    head = first.choices[0].delta.tool_calls[0]
    assert head.index == 0 and head.id and head.type == "function" and head.function.name and head.function.arguments == ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_openai_auto_answers_text_or_calls_in_one_generation(client: openai.OpenAI, stream: bool) -> None:
    # Both branches of the one grammar are proven with the matcher in tests/unit/runtime/router/guided;
    # a random model almost always writes text, which must then not look like a call.
    for seed in range(3):
        kwargs = dict(model="tgi", messages=MESSAGES, tools=TOOLS, tool_choice="auto", max_tokens=MAX_TOKENS,
                      seed=seed, parallel_tool_calls=False)
        if stream:
            content, calls, reason = "", {}, None
            for chunk in client.chat.completions.create(**kwargs, stream=True):
                delta = chunk.choices[0].delta
                content += delta.content or ""
                for d in delta.tool_calls or []:
                    calls.setdefault(d.index, []).append(d)
                reason = chunk.choices[0].finish_reason or reason
            tool_calls = [openai.types.chat.ChatCompletionMessageToolCall(
                id=parts[0].id, type="function",
                function={"name": parts[0].function.name, "arguments": "".join(p.function.arguments or "" for p in parts)},
            ) for parts in calls.values()]
        else:
            out = client.chat.completions.create(**kwargs)
            content, tool_calls, reason = out.choices[0].message.content, out.choices[0].message.tool_calls, out.choices[0].finish_reason
        if tool_calls:
            assert reason == "tool_calls" and not content
            check_calls(tool_calls, {"get_weather", "get_time"})
        else:
            assert content and not content.startswith("<") and reason in ("stop", "length")


def test_openai_tool_choice_none_is_text(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="tgi", messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=8,
                                         temperature=0)
    assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("choice", ["required", "auto", "none", "get_weather"])
def test_inference_client_tools(hf: InferenceClient, choice: str, stream: bool) -> None:
    tool_choice: Any = choice if choice in ("required", "auto", "none") else {"type": "function", "function": {"name": choice}}
    kwargs = dict(messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, max_tokens=MAX_TOKENS, temperature=0,
                  extra_body={"parallel_tool_calls": False})
    if not stream:
        out = hf.chat_completion(**kwargs)
        message, reason = out.choices[0].message, out.choices[0].finish_reason
        calls = [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or []]
    else:
        calls_by_index: dict[int, list[str]] = {}
        reason = None
        for chunk in hf.chat_completion(**kwargs, stream=True):
            if not chunk.choices:
                continue
            for delta in chunk.choices[0].delta.tool_calls or []:
                entry = calls_by_index.setdefault(delta.index, ["", "", ""])
                entry[0] = delta.id or entry[0]
                entry[1] = delta.function.name or entry[1]
                entry[2] += delta.function.arguments or ""
            reason = chunk.choices[0].finish_reason or reason
        calls = [tuple(v) for v in calls_by_index.values()]  # type: ignore[misc]
    if choice == "none":
        assert not calls
        return
    if choice == "auto" and not calls:
        return  # the model answered with text: allowed under auto
    assert reason == "tool_calls" and calls
    for call_id, name, arguments in calls:
        assert call_id and (choice in ("required", "auto") or name == choice)
        args = arguments if isinstance(arguments, str) else json.dumps(arguments)
        jsonschema.validate(json.loads(args), PARAMETERS[name])


def test_conversation_with_tool_results_round_trips(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model="tgi", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                           max_tokens=MAX_TOKENS, temperature=0, parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    history = [*MESSAGES, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    second = client.chat.completions.create(model="tgi", messages=history, tools=TOOLS, tool_choice="none",
                                            max_tokens=8, temperature=0)
    assert second.choices[0].message.content is not None
    alone = client.chat.completions.create(model="tgi", messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                           max_tokens=1, temperature=0)
    # The call (as the model writes calls) and the result are in the prompt.
    assert second.usage.prompt_tokens > alone.usage.prompt_tokens + 10


@pytest.mark.parametrize(("body", "message"), [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "names no function"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "function name"),
    ({"response_format": {"type": "json_object"}}, "Grammar and tools are mutually exclusive"),
])
def test_tool_errors_are_422(http: httpx.Client, body: dict[str, Any], message: str) -> None:
    request = {"model": "tgi", "messages": MESSAGES, "tools": TOOLS, **body}
    response = http.post("/v1/chat/completions", json=request)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "tool_error" and message in error["message"]
