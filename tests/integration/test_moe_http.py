"""Mixtral and Qwen3-MoE served over real HTTP (a real shard and router, float32, `--speculate 3`, the prefix cache
on): greedy tokens equal transformers' across a continuation round and a prefix-cache hit, drafts are accepted, and
guided generation through OpenAI's response_format yields instances of the schema."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.integration.http_stack import Stack, http_stack

ROUTER = ["--max-total-tokens", "1200", "--max-input-tokens", "64"]
PROMPT = ("The quick brown fox jumps over the lazy dog. A language model reads a sequence of tokens and predicts the "
          "next one.")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "count": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "count"], "additionalProperties": False}


@pytest.fixture(scope="module", params=["mixtral", "qwen3_moe"])
def served(request: pytest.FixtureRequest, make_tiny_model: Callable[..., Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Stack]]:
    model_dir = make_tiny_model(request.param)
    work = tmp_path_factory.mktemp(f"http-{request.param}")
    with http_stack(model_dir, work, router_args=ROUTER, shard_args=["--speculate", "3"]) as stack:
        yield model_dir, stack


def _generate(stack: Stack, prompt: str, new_tokens: int, prompt_ids: bool = False) -> tuple[list[int], list[int]]:
    """(the prompt's ids when asked for, which computes every prompt position: no prefix-cache hit; the new ids)."""
    body = {"inputs": prompt, "parameters": {"max_new_tokens": new_tokens, "details": True,
                                             "decoder_input_details": prompt_ids, "ignore_eos": True}}
    answer = httpx.post(f"{stack.url}/generate", json=body, timeout=300).json()
    details = answer["details"]
    return [t["id"] for t in details.get("prefill") or []], [t["id"] for t in details["tokens"]]


def _transformers_greedy(model_dir: Path, prompt: list[int], new_tokens: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # past EOS, as the requests' ignore_eos
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                              pad_token_id=0)[0, len(prompt):].tolist()


def _metric(stack: Stack, name: str) -> float:
    match = re.search(rf"^{name} ([0-9.e+]+)$", httpx.get(f"{stack.url}/metrics").text, re.M)
    assert match is not None, f"{name} is exported"
    return float(match.group(1))


def test_greedy_tokens_across_a_continuation_round_and_a_prefix_hit(served: tuple[Path, Stack]) -> None:
    """1,100 new tokens: past the router's 1,024 per round, so the second round prefills prompt + generated tokens
    from the prefix cache; the same request again finds its prompt's blocks cached. Both equal transformers' greedy
    tokens."""
    model_dir, stack = served
    prompt_ids, tokens = _generate(stack, PROMPT, 1100, prompt_ids=True)
    assert 32 < len(prompt_ids) <= 64  # two full blocks of 16 to find in the cache
    assert tokens == _transformers_greedy(model_dir, prompt_ids, 1100)
    hits = _metric(stack, "tgictl_prefix_cache_hit_tokens_total")
    assert hits >= 1024  # the second round found the first round's tokens
    assert _generate(stack, PROMPT, 40) == ([], tokens[:40])
    assert _metric(stack, "tgictl_prefix_cache_hit_tokens_total") >= hits + 32
    assert _metric(stack, "tgictl_speculative_accepted_tokens_total") > 0  # greedy random models repeat themselves


def test_guided_json_follows_the_schema(served: tuple[Path, Stack]) -> None:
    _, stack = served
    answer = stack.openai().chat.completions.create(
        model="tgi", messages=[{"role": "user", "content": "Name a thing and count it."}], max_tokens=120,
        response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}},
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), SCHEMA)
    assert answer.choices[0].finish_reason == "stop"
