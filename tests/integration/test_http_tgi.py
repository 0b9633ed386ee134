"""TGI's native routes against a real router and shard on the tiny llama: raw httpx for shapes and
SSE framing, huggingface_hub's InferenceClient as users call it, transformers as the greedy oracle."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from huggingface_hub import InferenceClient
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from tests.integration.http_stack import Stack, http_stack

PROMPT = "hello world, the quick brown fox"
N = 8


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with http_stack(tiny_model_dir, tmp_path_factory.mktemp("http-tgi")) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=60.0) as c:
        yield c


def greedy(model_dir: Path, prompt_ids: list[int], steps: int) -> list[int]:
    """transformers on the same weights: argmax, one full forward per token (the oracle)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt_ids):]


def generate(client: httpx.Client, inputs: str = PROMPT, **parameters: Any) -> httpx.Response:
    return client.post("/generate", json={"inputs": inputs, "parameters": {"max_new_tokens": N, **parameters}})


def sse_events(body: str) -> list[str]:
    """Split an SSE body into its `data:` payloads, checking the framing of every event."""
    assert body.endswith("\n\n")
    frames = body[:-2].split("\n\n")
    for frame in frames:
        assert frame.startswith("data: "), frame
        assert "\n" not in frame
    return [frame[len("data: "):] for frame in frames]


def test_generate_greedy_matches_transformers(client: httpx.Client, tiny_model_dir: Path) -> None:
    response = generate(client, details=True, ignore_eos=True)
    assert response.status_code == 200, response.text
    body = response.json()
    prompt_ids = [t["id"] for t in client.post("/tokenize", json={"inputs": PROMPT}).json()]
    details = body["details"]
    assert [t["id"] for t in details["tokens"]] == greedy(tiny_model_dir, prompt_ids, N)
    assert details["finish_reason"] == "length"
    assert details["generated_tokens"] == N
    assert details["seed"] is None
    assert details["prefill"] == []
    assert "top_tokens" not in details and "best_of_sequences" not in details
    assert set(details["tokens"][0]) == {"id", "text", "logprob", "special"}
    assert all(t["logprob"] <= 0 for t in details["tokens"])
    decoded = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")).decode([t["id"] for t in details["tokens"]])
    assert body["generated_text"] == decoded
    headers = response.headers
    assert headers["x-prompt-tokens"] == str(len(prompt_ids))
    assert headers["x-generated-tokens"] == str(N)
    assert headers["x-compute-type"] == "1-cpu"
    assert headers["x-compute-characters"] == str(len(PROMPT))


def test_generate_without_details_has_only_text(client: httpx.Client) -> None:
    body = generate(client, ignore_eos=True).json()
    assert list(body) == ["generated_text"]
    with_details = generate(client, details=True, ignore_eos=True).json()
    assert body["generated_text"] == with_details["generated_text"]


def test_decoder_input_details_and_top_tokens(client: httpx.Client) -> None:
    details = generate(client, decoder_input_details=True, top_n_tokens=3, ignore_eos=True).json()["details"]
    prompt = client.post("/tokenize", json={"inputs": PROMPT}).json()
    assert [p["id"] for p in details["prefill"]] == [t["id"] for t in prompt]
    assert details["prefill"][0]["logprob"] is None  # NaN serialised as null
    assert all(isinstance(p["logprob"], float) for p in details["prefill"][1:])
    assert len(details["top_tokens"]) == N
    for token, top in zip(details["tokens"], details["top_tokens"]):
        assert len(top) == 3
        assert top[0]["id"] == token["id"]  # greedy: the chosen token is the most likely one
        assert top[0]["logprob"] >= top[1]["logprob"] >= top[2]["logprob"]


def test_stop_sequence_is_kept_in_tgi_text(client: httpx.Client) -> None:
    full = generate(client, details=True, ignore_eos=True).json()
    texts = [t["text"] for t in full["details"]["tokens"]]
    k = next(i for i in range(2, N) if texts[i].strip().isalnum())
    stop = texts[k]
    text = full["generated_text"]
    expected = text[: text.index(stop) + len(stop)]
    body = generate(client, details=True, stop=[stop], ignore_eos=True).json()
    assert body["generated_text"] == expected
    assert body["details"]["finish_reason"] == "stop_sequence"


def test_generate_stream_framing_and_agreement(client: httpx.Client) -> None:
    whole = generate(client, details=True, ignore_eos=True).json()
    response = client.post(
        "/generate_stream",
        json={"inputs": PROMPT, "parameters": {"max_new_tokens": N, "details": True, "ignore_eos": True}},
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(e) for e in sse_events(response.text)]  # no [DONE] on TGI's stream
    assert [e["index"] for e in events] == list(range(1, N + 1))
    assert [e["token"] for e in events] == whole["details"]["tokens"]
    assert all(e["generated_text"] is None and e["details"] is None for e in events[:-1])
    assert events[-1]["generated_text"] == whole["generated_text"]
    length = len(client.post("/tokenize", json={"inputs": PROMPT}).json())
    block = client.get("/info").json()["block_size"]
    assert events[-1]["details"] == {
        "finish_reason": "length", "generated_tokens": N, "seed": None, "input_length": length,
        # The same prompt ran just before: its full blocks come from the radix cache.
        "cached_tokens": (length - 1) // block * block,
    }


def test_compat_route(client: httpx.Client) -> None:
    plain = generate(client, ignore_eos=True).json()["generated_text"]
    parameters = {"max_new_tokens": N, "ignore_eos": True}
    listed = client.post("/", json={"inputs": PROMPT, "parameters": parameters}).json()
    assert listed == [{"generated_text": PROMPT + plain}]  # `/` returns the full text by default
    streamed = client.post("/", json={"inputs": PROMPT, "parameters": parameters, "stream": True})
    events = [json.loads(e) for e in sse_events(streamed.text)]
    assert events[-1]["generated_text"] == PROMPT + plain


def test_tokenize_offsets(client: httpx.Client) -> None:
    pieces = client.post("/tokenize", json={"inputs": PROMPT}).json()
    assert "".join(p["text"] for p in pieces) == PROMPT
    for piece in pieces:
        assert PROMPT[piece["start"]:piece["stop"]] == piece["text"]


def test_seeded_sampling_is_reproducible_and_best_of(client: httpx.Client) -> None:
    a = generate(client, do_sample=True, seed=7, details=True, ignore_eos=True).json()
    b = generate(client, do_sample=True, seed=7, details=True, ignore_eos=True).json()
    assert a == b
    assert a["details"]["seed"] == 7
    best = generate(client, do_sample=True, best_of=2, details=True, ignore_eos=True).json()
    assert len(best["details"]["best_of_sequences"]) == 1
    loser = best["details"]["best_of_sequences"][0]
    mean = lambda d: sum(t["logprob"] for t in d["tokens"]) / len(d["tokens"])  # noqa: E731
    assert mean(best["details"]) >= mean(loser)


def test_validation_errors(client: httpx.Client) -> None:
    response = generate(client, temperature=-1.0)
    assert response.status_code == 422
    assert response.json() == {
        "error": "Input validation error: `temperature` must be strictly positive", "error_type": "validation",
    }
    too_long = generate(client, max_new_tokens=10_000)
    assert too_long.status_code == 422
    assert too_long.json()["error"].startswith(
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 512. Given: "
    )
    assert generate(client, top_p=1.0, ignore_eos=True).status_code == 200  # deliberate fix: 1.0 means off
    streamed = client.post("/generate_stream", json={"inputs": PROMPT, "parameters": {"top_k": 0}})
    assert streamed.status_code == 200  # TGI sends validation errors in-band on the stream
    assert [json.loads(e) for e in sse_events(streamed.text)] == [
        {"error": "Input validation error: `top_k` must be strictly positive", "error_type": "validation"}
    ]


def test_malformed_requests_get_tgi_error_json(client: httpx.Client) -> None:
    bad_json = client.post("/generate", content=b'{"inputs": ', headers={"content-type": "application/json"})
    assert bad_json.status_code == 400
    assert bad_json.json()["error_type"] == "validation"
    assert bad_json.json()["error"].startswith("Failed to parse the request body as JSON")
    wrong_type = client.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": "many"}})
    assert wrong_type.status_code == 422
    assert set(wrong_type.json()) == {"error", "error_type"}
    assert "parameters.max_new_tokens" in wrong_type.json()["error"]
    missing = client.post("/generate", json={"parameters": {}})
    assert missing.status_code == 422 and "inputs" in missing.json()["error"]
    not_object = client.post("/generate", json=[1, 2])
    assert not_object.status_code == 422 and set(not_object.json()) == {"error", "error_type"}
    text = client.post("/generate", content=b"hello", headers={"content-type": "text/plain"})
    assert text.status_code == 415 and text.json()["error_type"] == "unsupported_media_type"
    huge = client.post("/generate", json={"inputs": "a" * 2_000_001})
    assert huge.status_code == 413 and huge.json()["error_type"] == "payload_too_large"
    unknown = client.get("/nope")
    assert unknown.status_code == 404 and unknown.json()["error_type"] == "not_found"


def test_info_models_docs(client: httpx.Client, tiny_model_dir: Path) -> None:
    info = client.get("/info").json()
    assert info["model_id"] == str(tiny_model_dir)
    assert info["max_total_tokens"] == 512 and info["max_input_tokens"] == 511
    assert info["max_best_of"] == 2 and info["max_stop_sequences"] == 4
    models = client.get("/v1/models").json()
    assert models == {"object": "list", "data": [
        {"id": str(tiny_model_dir), "object": "model", "created": 0, "owned_by": "tgictl", "root": str(tiny_model_dir),
         "parent": None, "max_model_len": 512}
    ]}
    assert client.get("/docs").status_code == 200
    paths = client.get("/api-doc/openapi.json").json()["paths"]
    assert {"/generate", "/generate_stream", "/v1/chat/completions", "/v1/completions"} <= set(paths)


def test_huggingface_hub_client(stack: Stack, client: httpx.Client) -> None:
    hub = InferenceClient(base_url=stack.url)
    whole = generate(client, details=True).json()
    # The client posts to `/`, where TGI returns the prompt too unless told otherwise.
    assert hub.text_generation(PROMPT, max_new_tokens=N) == PROMPT + whole["generated_text"]
    out = hub.text_generation(PROMPT, max_new_tokens=N, details=True, return_full_text=False)
    assert out.generated_text == whole["generated_text"]
    assert [t.id for t in out.details.tokens] == [t["id"] for t in whole["details"]["tokens"]]
    assert out.details.finish_reason == whole["details"]["finish_reason"]
    streamed = list(
        hub.text_generation(PROMPT, max_new_tokens=N, stream=True, details=True, return_full_text=False)
    )
    assert [s.token.id for s in streamed] == [t["id"] for t in whole["details"]["tokens"]]
    assert streamed[-1].generated_text == whole["generated_text"]
