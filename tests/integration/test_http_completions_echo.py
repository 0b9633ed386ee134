"""/v1/completions with `echo` and `logprobs` (the prompt's own logprobs, as vLLM returns them),
`max_tokens: 0` and token-id prompts, through the `openai` SDK against a real router and shard; the
oracle is transformers' log_softmax on the same weights in float32."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.integration.http_stack import Stack, http_stack

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with http_stack(tiny_model_dir, tmp_path_factory.mktemp("http-echo")) as running:
        yield running


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def oracle(tiny_model_dir: Path) -> tuple[torch.nn.Module, object]:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def log_softmax(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_echo_returns_the_prompt_logprobs_of_transformers(client: openai.OpenAI, oracle) -> None:  # noqa: ANN001
    model, tokenizer = oracle
    ids = tokenizer(PROMPT)["input_ids"]
    reference = log_softmax(model, ids)
    out = client.completions.create(model="tgi", prompt=PROMPT, max_tokens=0, echo=True, logprobs=2, temperature=0)
    (choice,) = out.choices
    assert choice.text == PROMPT and choice.finish_reason == "length"
    logprobs = choice.logprobs
    assert logprobs.tokens == [tokenizer.decode([i]) for i in ids]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    expected = [reference[p - 1, ids[p]].item() for p in range(1, len(ids))]
    assert logprobs.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    for p in range(1, len(ids)):
        top = logprobs.top_logprobs[p]
        best = torch.topk(reference[p - 1], 2)
        seen: set[str] = set()
        for token_id, value in zip(best.indices.tolist(), best.values.tolist()):
            text = tokenizer.decode([token_id])
            if text not in seen:  # a text two tokens share keeps the more likely one's value
                assert top[text] == pytest.approx(value, abs=1e-4)
            seen.add(text)
        token, logprob = logprobs.tokens[p], logprobs.token_logprobs[p]
        if token not in seen:
            assert top[token] == logprob  # the token itself, with the very same float
        assert (logprob == max(top.values())) == (int(reference[p - 1].argmax()) == ids[p])
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(ids))]
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == 0


def test_token_id_prompts_with_echo_and_one_new_token(client: openai.OpenAI, oracle) -> None:  # noqa: ANN001
    model, tokenizer = oracle
    prompts = [tokenizer(PROMPT)["input_ids"], tokenizer("hello world")["input_ids"]]
    plain = client.completions.create(model="tgi", prompt=prompts, max_tokens=1, temperature=0)
    echoed = client.completions.create(model="tgi", prompt=prompts, max_tokens=1, echo=True, logprobs=1,
                                       temperature=0)
    assert out_of(plain) == [c.text for c in plain.choices]
    for ids, without, choice in zip(prompts, plain.choices, echoed.choices):
        assert choice.text == tokenizer.decode(ids) + without.text
        reference = log_softmax(model, ids)
        logprobs = choice.logprobs.token_logprobs
        assert len(logprobs) == len(ids) + 1 and logprobs[0] is None
        expected = [reference[p - 1, ids[p]].item() for p in range(1, len(ids))] + [reference[-1].max().item()]
        assert logprobs[1:] == pytest.approx(expected, abs=1e-4)  # the new token is the greedy one
        assert all(math.isfinite(v) for v in logprobs[1:])
    assert echoed.usage.prompt_tokens == sum(len(p) for p in prompts) and echoed.usage.completion_tokens == 2


def out_of(response: openai.types.Completion) -> list[str]:
    return [c.text for c in sorted(response.choices, key=lambda c: c.index)]


def test_echo_errors(stack: Stack) -> None:
    with httpx.Client(base_url=stack.url, timeout=30.0) as http:
        stream = http.post("/v1/completions", json={"prompt": "a", "echo": True, "stream": True, "max_tokens": 1})
        assert stream.status_code == 422 and stream.json()["error"]["code"] == "validation"
        vocab = http.post("/v1/completions", json={"prompt": [1, 10**9], "max_tokens": 1})
        assert vocab.status_code == 422 and "token ids must be" in vocab.json()["error"]["message"]
        empty = http.post("/v1/completions", json={"prompt": [[]], "max_tokens": 1})
        assert empty.status_code == 422
        nothing = http.post("/v1/completions", json={"prompt": "a", "max_tokens": 0})
        assert nothing.status_code == 422 and "max_new_tokens" in nothing.json()["error"]["message"]
        negative = http.post("/v1/completions", json={"prompt": "a", "logprobs": -1})
        assert negative.status_code == 422
