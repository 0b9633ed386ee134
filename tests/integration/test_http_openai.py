"""The OpenAI routes against a real router and shard on the tiny llama, through the `openai` SDK and
huggingface_hub's InferenceClient, with TGI's /generate on the same prompt as the reference."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from huggingface_hub import InferenceClient

from tests.integration.http_stack import Stack, http_stack

N = 6
MESSAGES = [{"role": "user", "content": "Say something about foxes"}]
# What the tiny model's chat template renders for MESSAGES.
TEMPLATED = "<|im_start|>user\nSay something about foxes<|im_end|>\n<|im_start|>assistant\n"
PROMPTS = ["the quick brown fox", "hello world"]
GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with http_stack(tiny_model_dir, tmp_path_factory.mktemp("http-openai")) as running:
        yield running


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=60.0) as c:
        yield c


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return stack.openai()


def reference(http: httpx.Client, inputs: str, **parameters: Any) -> dict[str, Any]:
    """TGI's /generate on the same prompt, greedy, with details."""
    body = {"inputs": inputs, "parameters": {"max_new_tokens": N, "details": True, "ignore_eos": True, **parameters}}
    response = http.post("/generate", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def prompt_tokens(http: httpx.Client, text: str) -> int:
    return len(http.post("/tokenize", json={"inputs": text}).json())


def test_chat_greedy_with_logprobs_and_usage(client: openai.OpenAI, http: httpx.Client, tiny_model_dir: Path) -> None:
    ref = reference(http, TEMPLATED, top_n_tokens=2)
    out = client.chat.completions.create(
        model="tgi", messages=MESSAGES, max_tokens=N, logprobs=True, top_logprobs=2, **GREEDY
    )
    assert out.object == "chat.completion"
    assert out.model == str(tiny_model_dir)
    (choice,) = out.choices
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.message.content == ref["generated_text"]
    assert choice.finish_reason == "length"
    tokens = ref["details"]["tokens"]
    assert [c.token for c in choice.logprobs.content] == [t["text"] for t in tokens]
    for content, token, top in zip(choice.logprobs.content, tokens, ref["details"]["top_tokens"]):
        assert content.logprob == pytest.approx(token["logprob"], abs=1e-5)
        assert [t.token for t in content.top_logprobs] == [t["text"] for t in top]
    assert out.usage.prompt_tokens == prompt_tokens(http, TEMPLATED)
    assert out.usage.completion_tokens == N
    assert out.usage.total_tokens == out.usage.prompt_tokens + N


def test_chat_stream_agrees_with_non_stream(client: openai.OpenAI, http: httpx.Client) -> None:
    whole = client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=N, **GREEDY)
    chunks = list(client.chat.completions.create(
        model="tgi", messages=MESSAGES, max_tokens=N, stream=True, stream_options={"include_usage": True}, **GREEDY
    ))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == N
    assert usage_chunk.usage.prompt_tokens == whole.usage.prompt_tokens
    token_chunks = chunks[:-1]
    assert len(token_chunks) == N
    assert token_chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content for c in token_chunks) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * (N - 1) + ["length"]
    # Raw framing: `data: {json}\n\n` events, ending with data: [DONE].
    raw = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "stream": True,
                                                  "temperature": 0, "ignore_eos": True})
    frames = raw.text.split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]"
    assert all(f.startswith("data: {") for f in frames[:-2]) and len(frames) == 4


def test_chat_stop_is_stripped_and_reason_is_openai(client: openai.OpenAI, http: httpx.Client) -> None:
    ref = reference(http, TEMPLATED)
    texts = [t["text"] for t in ref["details"]["tokens"]]
    k = next(i for i in range(1, N) if texts[i].strip().isalnum())
    text = ref["generated_text"]
    expected = text[: text.index(texts[k])]
    out = client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=N, stop=[texts[k]], **GREEDY)
    assert out.choices[0].message.content == expected
    assert out.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(
        model="tgi", messages=MESSAGES, max_tokens=N, stop=texts[k], stream=True, **GREEDY
    ))
    assert "".join(c.choices[0].delta.content for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_chat_n_choices(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=N, n=2, seed=3,
                                         extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1]
    assert out.usage.completion_tokens == 2 * N
    again = client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=N, n=2, seed=3,
                                           extra_body={"ignore_eos": True})
    assert [c.message.content for c in again.choices] == [c.message.content for c in out.choices]
    chunks = list(client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=N, n=2, seed=3,
                                                 stream=True, extra_body={"ignore_eos": True}))
    for index in (0, 1):
        text = "".join(c.choices[0].delta.content for c in chunks if c.choices[0].index == index)
        assert text == out.choices[index].message.content


def test_completions(client: openai.OpenAI, http: httpx.Client) -> None:
    refs = [reference(http, p) for p in PROMPTS]
    out = client.completions.create(model="tgi", prompt=PROMPTS, max_tokens=N, **GREEDY)
    assert out.object == "text_completion"
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.text for c in out.choices] == [r["generated_text"] for r in refs]
    assert [c.finish_reason for c in out.choices] == ["length", "length"]
    assert out.usage.prompt_tokens == sum(prompt_tokens(http, p) for p in PROMPTS)
    assert out.usage.completion_tokens == 2 * N
    chunks = list(client.completions.create(model="tgi", prompt=PROMPTS, max_tokens=N, stream=True, **GREEDY))
    for index, ref in enumerate(refs):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        assert "".join(c.text for c in mine) == ref["generated_text"]
        assert mine[-1].finish_reason == "length"
    single = client.completions.create(model="tgi", prompt=PROMPTS[0], max_tokens=N, logprobs=2, **GREEDY)
    logprobs = single.choices[0].logprobs
    assert logprobs.tokens == [t["text"] for t in refs[0]["details"]["tokens"]]
    assert logprobs.token_logprobs == pytest.approx([t["logprob"] for t in refs[0]["details"]["tokens"]], abs=1e-5)
    # Up to logprobs + 1 entries (OpenAI): the chosen token is always there.
    assert all(len(top) <= 3 and t in top for top, t in zip(logprobs.top_logprobs, logprobs.tokens))


def test_openai_errors(client: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.chat.completions.create(model="tgi", messages=MESSAGES, temperature=-1.0)
    # OpenAI's error shape, so the SDK shows the message (TGI's shape would read "Error code: 422").
    assert info.value.response.json() == {"error": {
        "message": "Input validation error: `temperature` must be strictly positive",
        "type": "invalid_request_error", "param": None, "code": "validation"}}
    assert "`temperature` must be strictly positive" in info.value.message
    too_many = http.post("/v1/completions", json={"prompt": ["a"] * 5, "max_tokens": 1})
    assert too_many.status_code == 422 and too_many.json()["error"]["code"] == "batch size exceeded"
    suffix = http.post("/v1/completions", json={"prompt": "a", "suffix": "b"})
    assert suffix.status_code == 422
    bad = http.post("/v1/chat/completions", json={"messages": "not a list"})
    assert bad.status_code == 422 and set(bad.json()["error"]) == {"message", "type", "param", "code"}


def test_huggingface_hub_chat(stack: Stack, client: openai.OpenAI) -> None:
    expected = client.chat.completions.create(model="tgi", messages=MESSAGES, max_tokens=N, temperature=0.0)
    hub = InferenceClient(base_url=stack.url)
    out = hub.chat_completion(MESSAGES, max_tokens=N, temperature=0.0)
    assert out.choices[0].message.content == expected.choices[0].message.content
    assert out.choices[0].finish_reason == expected.choices[0].finish_reason
    streamed = list(hub.chat_completion(MESSAGES, max_tokens=N, temperature=0.0, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected.choices[0].message.content
    assert json.loads(json.dumps(out.usage.prompt_tokens)) == expected.usage.prompt_tokens


def expected_cached(prompt_len: int, block_size: int) -> int:
    """What the radix cache gives a prompt seen before: its full blocks, and never the whole prompt
    (the last token goes through the model for its logits)."""
    return (prompt_len - 1) // block_size * block_size


def test_cached_tokens_from_the_radix_cache(client: openai.OpenAI, http: httpx.Client) -> None:
    block_size = http.get("/info").json()["block_size"]
    prompt = "a long prompt about foxes that the radix cache keeps " * 4
    messages = [{"role": "user", "content": prompt + "(chat)"}]
    cold = client.chat.completions.create(model="tgi", messages=messages, max_tokens=2, **GREEDY)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    assert cold.usage.prompt_tokens > 2 * block_size
    warm = client.chat.completions.create(model="tgi", messages=messages, max_tokens=2, **GREEDY)
    cached = expected_cached(warm.usage.prompt_tokens, block_size)
    assert warm.usage.prompt_tokens_details.cached_tokens == cached > 0
    chunks = list(client.chat.completions.create(model="tgi", messages=messages, max_tokens=2, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == cached

    text = prompt + "(completions)"
    length = prompt_tokens(http, text)
    first = client.completions.create(model="tgi", prompt=text, max_tokens=2, **GREEDY)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = client.completions.create(model="tgi", prompt=text, max_tokens=2, **GREEDY)
    assert again.usage.prompt_tokens_details.cached_tokens == expected_cached(length, block_size)
    streamed = list(client.completions.create(model="tgi", prompt=text, max_tokens=2, stream=True,
                                              stream_options={"include_usage": True}, **GREEDY))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == expected_cached(length, block_size)

    tgi = http.post("/generate", json={"inputs": text, "parameters": {"max_new_tokens": 2, "details": True}})
    assert tgi.json()["details"]["cached_tokens"] == expected_cached(length, block_size)
    stream = http.post("/generate_stream", json={"inputs": text, "parameters": {"max_new_tokens": 2, "details": True}})
    last = json.loads(stream.text.strip().split("\n\n")[-1].removeprefix("data:"))
    assert last["details"]["cached_tokens"] == expected_cached(length, block_size)
