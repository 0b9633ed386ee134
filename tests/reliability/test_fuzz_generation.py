"""Fuzzing the generation surfaces against a running shard: generated JSON schemas of growing size and nesting
(through TGI's grammar, OpenAI's response_format and tool parameters), generated sampling parameters on both
APIs, and token-id prompts.

Every answer is a 2xx or a 4xx in its route's error shape (a grammar the engine cannot follow is a 422 at
validation, or, if it trips only while generating, an error for that request alone); /health stays 200 after
every request; neither process dies; every KV block is back at the end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.http_stack import Stack
from tests.reliability.support import assert_error_json, is_error_event, sse_data, wait_idle
from tgictl.testing.grammar_cases import HOSTILE_SCHEMAS, LATE_FAILING_SCHEMA
from tgictl.testing.tiny_models import TOKENIZER_VOCAB_SIZE

TIMEOUT_S = 60.0  # far above any answer (the largest schemas compile in well under a second); beyond: a hang
MESSAGES = [{"role": "user", "content": "Answer in JSON."}]
EXAMPLES = 25
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def stack_args() -> tuple[list[str], list[str]]:
    # Room for the tool prompt, which carries the schema: a small one fits, a huge one is a 422 for its length.
    return ["--max-total-tokens", "1024", "--max-concurrent-requests", "8"], []


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=TIMEOUT_S) as c:
        yield c


def still_serving(stack: Stack, client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    assert stack.shard.poll() is None and stack.router.poll() is None, stack.logs()


# --- schemas ------------------------------------------------------------------------------------

KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)
LEAF_SCHEMAS = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 8)),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-10**6, 10**6), st.integers(0, 10**6)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda values: {"enum": values}, st.lists(KEYS, min_size=1, max_size=6, unique=True)),
    st.builds(lambda value: {"const": value}, KEYS),
)


def _object(properties: dict[str, Any], required_share: float) -> dict[str, Any]:
    names = list(properties)
    return {"type": "object", "properties": properties, "required": names[: int(len(names) * required_share)],
            "additionalProperties": False}


NESTED = st.recursive(
    LEAF_SCHEMAS,
    lambda inner: st.one_of(
        st.builds(_object, st.dictionaries(KEYS, inner, min_size=1, max_size=6), st.sampled_from([0.0, 0.5, 1.0])),
        st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, inner, st.integers(0, 3)),
        st.builds(lambda options: {"anyOf": options}, st.lists(inner, min_size=1, max_size=4)),
    ),
    max_leaves=40,
)
# Sizes past llguidance's limits: wide objects, many alternatives, long chains of nesting.
WIDE = st.builds(lambda n, share: _object({f"k{i}": {"type": "integer"} for i in range(n)}, share),
                 st.sampled_from([1, 30, 300, 1500, 3000]), st.sampled_from([0.0, 1.0]))
ALTERNATIVES = st.builds(
    lambda n: {"anyOf": [_object({f"k{i}": {"type": "integer"}}, 1.0) for i in range(n)]},
    st.sampled_from([2, 100, 1000, 3000]))
DEEP = st.builds(
    lambda depth, leaf: _chain(depth, leaf), st.sampled_from([5, 20, 60]), LEAF_SCHEMAS)
SCHEMAS = st.one_of(NESTED, NESTED, WIDE, ALTERNATIVES, DEEP, st.sampled_from(sorted(HOSTILE_SCHEMAS.values(),
                                                                                        key=json.dumps)))


def _chain(depth: int, leaf: dict[str, Any]) -> dict[str, Any]:
    schema = leaf
    for level in range(depth):
        schema = _object({f"n{level}": schema}, 1.0) if level % 2 else {"type": "array", "items": schema,
                                                                         "minItems": 1, "maxItems": 1}
    return schema


def constrained(client: httpx.Client, how: str, schema: dict[str, Any]) -> tuple[int, str]:
    """One request constrained by `schema`; returns (status, 'ok' | 'refused' | 'failed alone')."""
    if how == "tgi":
        params = {"grammar": {"type": "json", "value": schema}, "max_new_tokens": 24}
        response = client.post("/generate", json={"inputs": "Answer in JSON.", "parameters": params})
        path = "/generate"
    elif how == "tgi_stream":
        params = {"grammar": {"type": "json", "value": schema}, "max_new_tokens": 24}
        response = client.post("/generate_stream", json={"inputs": "Answer in JSON.", "parameters": params})
        path = "/generate_stream"
    elif how == "response_format":
        fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}
        response = client.post("/v1/chat/completions", json={
            "model": "tgi", "messages": MESSAGES, "max_tokens": 24, "response_format": fmt})
        path = "/v1/chat/completions"
    else:
        tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        response = client.post("/v1/chat/completions", json={
            "model": "tgi", "messages": MESSAGES, "max_tokens": 24, "tools": tools, "tool_choice": "required"})
        path = "/v1/chat/completions"
    status = response.status_code
    assert status in (200, 422), (how, status, response.text[:500])
    if status == 422:
        error = assert_error_json(status, response.content, how, path=path)
        assert len(error["error"]) <= 1000 and error["error_type"] in ("validation", "tool_error"), error
        return status, "refused"
    if path == "/generate_stream":  # TGI's stream answers 200 and sends errors, validation's too, in-band
        events = sse_data(response.text.splitlines())
        errors = [e for e in events if is_error_event(e)]
        assert all(e["error_type"] == "validation" and len(e["error"]) <= 1000 for e in errors), errors
        if not errors:
            return status, "ok"
        return status, "refused" if len(events) == 1 else "failed alone"
    return status, "ok"


@pytest.mark.parametrize("how", ["tgi", "tgi_stream", "response_format", "tool_parameters"])
def test_generated_schemas_never_take_the_server_down(stack: Stack, client: httpx.Client, how: str) -> None:
    outcomes: list[str] = []

    @FUZZ
    @given(schema=SCHEMAS)
    def one(schema: dict[str, Any]) -> None:
        outcomes.append(constrained(client, how, schema)[1])
        still_serving(stack, client)

    one()
    assert "refused" in outcomes and "ok" in outcomes, outcomes  # the generator reaches both sides
    wait_idle(stack.url)


@pytest.mark.parametrize("name", sorted(HOSTILE_SCHEMAS))
def test_schemas_past_the_engines_limits_are_422_on_every_path(stack: Stack, client: httpx.Client, name: str) -> None:
    for how in ("tgi", "tgi_stream", "response_format", "tool_parameters"):
        status, outcome = constrained(client, how, HOSTILE_SCHEMAS[name])
        assert outcome == "refused" and status == (200 if how == "tgi_stream" else 422), how
    still_serving(stack, client)


def test_a_schema_that_fails_while_generating_fails_only_its_request(stack: Stack, client: httpx.Client) -> None:
    """Beside it, requests run to their end; the failing one gets a 422 (or its stream an error event) that
    says why; the server serves the next request."""
    neighbour = {"inputs": "a neighbour", "parameters": {"max_new_tokens": 30, "ignore_eos": True}}
    with httpx.Client(base_url=stack.url, timeout=TIMEOUT_S) as other:
        for how in ("tgi", "tgi_stream"):
            status, outcome = constrained(client, how, LATE_FAILING_SCHEMA)
            assert (status, outcome) == ((422, "refused") if how == "tgi" else (200, "failed alone"))
            answer = other.post("/generate", json=neighbour)
            assert answer.status_code == 200 and answer.json()["generated_text"]
    response = client.post("/generate", json={"inputs": "x", "parameters": {
        "grammar": {"type": "json", "value": LATE_FAILING_SCHEMA}, "max_new_tokens": 24}})
    assert "grammar engine" in response.json()["error"], response.text
    still_serving(stack, client)
    wait_idle(stack.url)


# --- sampling parameters ------------------------------------------------------------------------

EDGE_FLOATS = st.sampled_from([1e-45, 1e-38, 1e-30, 1e-6, 1e-5, 2e-5, 0.01, 0.5, 1.0, 1.5, 100.0, 1e6, 1e38,
                               3.4e38, 0.0, -0.0, -1.0])
UNIT_EDGES = st.sampled_from([1e-45, 1e-30, 1e-7, 0.001, 0.5, 0.999999, 1.0, 0.0, 1.0000001, -0.1])
SEEDS = st.sampled_from([0, 1, 2**32, 2**63, 2**64 - 1, 2**64, 2**80, -1])
SAMPLING = st.fixed_dictionaries({}, optional={
    "temperature": st.one_of(EDGE_FLOATS, st.floats(0.01, 5.0)),
    "top_k": st.sampled_from([1, 2, 50, TOKENIZER_VOCAB_SIZE - 1, TOKENIZER_VOCAB_SIZE, 10**6, 2**32, 0, -5]),
    "top_p": UNIT_EDGES, "typical_p": UNIT_EDGES, "min_p": UNIT_EDGES,
    "repetition_penalty": EDGE_FLOATS,
    "frequency_penalty": st.sampled_from([-2.0, -1.5, 0.0, 2.0, 2.0000001, -3.0]),
    "presence_penalty": st.sampled_from([-2.0, 0.7, 2.0, 9.0]),
    "seed": SEEDS,
})


def _no_5xx_and_tokens(response: httpx.Response, path: str) -> None:
    assert response.status_code in (200, 422), (path, response.status_code, response.text[:500])
    if response.status_code == 422:
        assert_error_json(422, response.content, path=path)


@FUZZ
@given(sampling=SAMPLING, do_sample=st.booleans(), best_of=st.sampled_from([None, 0, 1, 2, 3]))
def test_generated_sampling_on_tgi(stack: Stack, client: httpx.Client, sampling: dict[str, Any], do_sample: bool,
                                   best_of: int | None) -> None:
    params: dict[str, Any] = {**sampling, "do_sample": do_sample, "max_new_tokens": 6, "details": True}
    if best_of is not None:
        params["best_of"] = best_of
    response = client.post("/generate", json={"inputs": "sampling edges", "parameters": params})
    _no_5xx_and_tokens(response, "/generate")
    if response.status_code == 200:
        tokens = response.json()["details"]["tokens"]
        assert all(0 <= t["id"] < TOKENIZER_VOCAB_SIZE and t["logprob"] == t["logprob"] for t in tokens), tokens
    still_serving(stack, client)


@FUZZ
@given(sampling=SAMPLING, n=st.sampled_from([1, 2, 0, -1]))
def test_generated_sampling_on_openai(stack: Stack, client: httpx.Client, sampling: dict[str, Any], n: int) -> None:
    body = {"model": "tgi", "prompt": "sampling edges", "max_tokens": 6, "n": n, "logprobs": 1, **sampling}
    response = client.post("/v1/completions", json=body)
    _no_5xx_and_tokens(response, "/v1/completions")
    if response.status_code == 200:
        for choice in response.json()["choices"]:
            assert all(lp == lp for lp in choice["logprobs"]["token_logprobs"]), choice
    still_serving(stack, client)


def test_a_vanishing_temperature_is_greedy_and_seeds_past_u64_are_refused(client: httpx.Client) -> None:
    greedy = client.post("/generate", json={"inputs": "cold", "parameters": {"max_new_tokens": 8}}).json()
    for temperature in (1e-45, 1e-30, 1e-6):
        cold = client.post("/generate", json={"inputs": "cold", "parameters": {
            "max_new_tokens": 8, "do_sample": True, "temperature": temperature, "seed": 3}})
        assert cold.status_code == 200 and cold.json()["generated_text"] == greedy["generated_text"]
    for path, body in (("/generate", {"inputs": "x", "parameters": {"seed": 2**64, "do_sample": True}}),
                       ("/v1/completions", {"prompt": "x", "seed": 2**64, "max_tokens": 2}),
                       ("/v1/chat/completions", {"messages": MESSAGES, "seed": 2**64, "max_tokens": 2})):
        refused = client.post(path, json=body)
        assert refused.status_code == 422 and "`seed`" in assert_error_json(422, refused.content, path=path)["error"]
    zero = client.post("/generate", json={"inputs": "x", "parameters": {"best_of": 0, "do_sample": True}})
    assert zero.status_code == 422 and "`best_of` must be > 0" in zero.json()["error"]


# --- token-id prompts and messages --------------------------------------------------------------

IDS = st.one_of(st.integers(0, TOKENIZER_VOCAB_SIZE - 1), st.integers(0, TOKENIZER_VOCAB_SIZE - 1),
                st.sampled_from([-1, -(2**63), TOKENIZER_VOCAB_SIZE, 2**32, 2**63, 2**64, 10**12, 10**30]))
PROMPT_IDS = st.one_of(st.lists(IDS, max_size=12), st.lists(st.lists(IDS, max_size=6), min_size=1, max_size=3))


@FUZZ
@given(prompt=PROMPT_IDS)
def test_token_id_prompts(stack: Stack, client: httpx.Client, prompt: list[Any]) -> None:
    response = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    flat = [i for p in prompt for i in (p if isinstance(p, list) else [p])]
    empty = not prompt or any(isinstance(p, list) and not p for p in prompt)
    if empty or any(not 0 <= i < TOKENIZER_VOCAB_SIZE for i in flat):
        assert response.status_code == 422, response.text
        assert_error_json(422, response.content, path="/v1/completions")
    else:
        assert response.status_code == 200, response.text
    still_serving(stack, client)  # on the same keep-alive connection: it was never reset


def test_a_user_message_without_content_is_refused(client: httpx.Client) -> None:
    for message in ({"role": "user"}, {"role": "user", "content": None}, {"role": "system"}):
        response = client.post("/v1/chat/completions", json={"messages": [message], "max_tokens": 2})
        assert response.status_code == 422
        assert "content` is required" in assert_error_json(422, response.content, path="/v1/chat/completions")["error"]
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    conversation = [*MESSAGES, {"role": "assistant", "tool_calls": calls},
                    {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    assert client.post("/v1/chat/completions", json={"messages": conversation, "max_tokens": 2}).status_code == 200
