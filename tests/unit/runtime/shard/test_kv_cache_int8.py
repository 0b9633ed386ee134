"""The shard's step loop on an int8 KV cache (--kv-cache-dtype int8, docs/kv-cache.md) against the same model on
a cache in the model's dtype, the reference: prompt logprobs close (the only difference is K/V rounded to 8 bits
with a scale per token and head), a cached prefix read from int8 pages giving what a full prefill gives, and
speculation (verification reads the cache as prefill attention does) keeping the plain path's tokens.

The model has head_dim 64, so decode takes csrc/decode_attention_q8.c's VNNI loop where the CPU has one. Its
weights are drawn small (init_std 0.08): a random model's next-token distribution is nearly flat, so greedy
tokens of two cache formats may part at a near-tie; teacher-forced logprobs are what is compared across formats.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from shard_helpers import BlockPool, Outputs, make_request, make_runner, run_to_end, shard_batch
from test_step_speculation import KnownContinuation

from tgictl.config import SpeculationConfig
from tgictl.kernels.kv_pages import Int8Pages
from tgictl.runtime.shard.batch import RowState
from tgictl.runtime.shard.step import ModelRunner

@pytest.fixture(scope="module")
def model_dir(make_tiny_model) -> Path:  # type: ignore[no-untyped-def]
    return make_tiny_model("llama", hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=256,
                           init_std=0.08)


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (40, 70, 9)]


def _prompt_logprobs(runner: ModelRunner, prompts: list[list[int]]) -> list[list[float]]:
    pool = BlockPool()
    requests = [make_request(pool, i, p, max_new_tokens=4, prefill_logprobs=True) for i, p in enumerate(prompts)]
    out = Outputs()
    run_to_end(runner, shard_batch(runner, 0, requests), out)
    return [list(out.generations[i][0].prefill_tokens.logprobs[1:]) for i in range(len(prompts))]  # type: ignore


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prompt_logprobs_close_to_the_models_dtype_cache(model_dir: Path, dtype: torch.dtype) -> None:
    prompts = _prompts()
    int8_runner = make_runner(model_dir, dtype=dtype, kv_cache_dtype="int8")
    assert isinstance(int8_runner.kv_cache.keys[0], Int8Pages)
    reference = _prompt_logprobs(make_runner(model_dir, dtype=dtype), prompts)
    quantized = _prompt_logprobs(int8_runner, prompts)
    for ref, got in zip(reference, quantized, strict=True):
        diffs = [abs(a - b) for a, b in zip(ref, got, strict=True)]
        assert max(diffs) < 0.3  # one token's logprob; ~7 in size
        assert sum(diffs) / len(diffs) < 0.05
        assert math.isclose(sum(got), sum(ref), rel_tol=0.01)  # the sequence's perplexity within 1%
    assert quantized != reference  # the int8 cache really was read


def test_a_cached_int8_prefix_gives_what_a_full_prefill_gives(model_dir: Path) -> None:
    runner = make_runner(model_dir, dtype=torch.bfloat16, kv_cache_dtype="int8")
    prompt = _prompts()[1]
    pool = BlockPool()
    full = make_request(pool, 0, prompt, max_new_tokens=6, prefill_logprobs=True)
    full_out = Outputs()
    run_to_end(runner, shard_batch(runner, 0, [full]), full_out)

    shared = full.blocks[:2] + pool.take(len(prompt) + 5 - 32)  # two blocks (32 tokens) from the cache
    cached = make_request(pool, 1, prompt, max_new_tokens=6, prefill_logprobs=True, cache_len=32, blocks=shared)
    cached_out = Outputs()
    run_to_end(runner, shard_batch(runner, 1, [cached]), cached_out)
    assert cached_out.ids(1) == full_out.ids(0)
    got = cached_out.generations[1][0].prefill_tokens.logprobs[33:]  # type: ignore[union-attr]
    want = full_out.generations[0][0].prefill_tokens.logprobs[33:]  # type: ignore[union-attr]
    assert list(got) == pytest.approx(list(want), abs=2e-2)


def _generate(runner: ModelRunner, speculate: int) -> Outputs:
    runner.set_speculation(SpeculationConfig(tokens=speculate, max_batch=8))
    pool = BlockPool()
    requests = [make_request(pool, i, p, max_new_tokens=16) for i, p in enumerate(_prompts())]
    out = Outputs()
    run_to_end(runner, shard_batch(runner, 0, requests), out)
    return out


@pytest.mark.parametrize("wrong_every", [None, 3])
def test_speculation_over_an_int8_cache_keeps_the_plain_tokens(model_dir: Path, wrong_every: int | None) -> None:
    """Drafts of the plain run's own continuation (every third one wrong in the second case): verification
    accepts them and the tokens are the plain path's."""
    runner = make_runner(model_dir, dtype=torch.float32, kv_cache_dtype="int8")
    plain = _generate(runner, 0)
    prompts = _prompts()

    def known(row: RowState) -> KnownContinuation:
        rid = row.request.id
        return KnownContinuation(len(prompts[rid]), plain.ids(rid), wrong_every)

    runner.new_drafter = known
    speculative = _generate(runner, 4)
    for rid in range(len(prompts)):
        assert speculative.ids(rid) == plain.ids(rid)
        assert speculative.logprobs(rid) == pytest.approx(plain.logprobs(rid), abs=2e-2)
    accepted = sum(g.accepted_tokens for gs in speculative.generations.values() for g in gs)
    assert accepted > 0
    assert sum(len(gs) for gs in speculative.generations.values()) < sum(len(gs) for gs in plain.generations.values())
