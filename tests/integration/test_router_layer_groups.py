"""Two KV layer groups with a real shard process (tgictl/kv_groups.py; docs/scheduling.md, "Sliding windows"): on
Gemma 2 (alternating local and global layers), Gemma 3 (5 local : 1 global), Qwen2 with max_window_layers and SmolLM3
with use_sliding_window, a decoding request gives back the local blocks behind the window while its global ones stay;
float32 greedy tokens (and their logprobs) of prompts and generations several windows long equal transformers',
alone, with preemption on a tiny cache, with continuation rounds and with the prefix cache; every block of both
groups comes back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.integration.test_router_core import Stack, greedy, run, serve
from tgictl.proto.messages import SamplingParams
from tgictl.runtime.router.request import EndEvent, StreamEvent, TokenEvent, ValidatedRequest
from tgictl.runtime.router.scheduling.event_channel import events
from tgictl.testing.tiny_models import window_options

WINDOW = 16  # one block: the narrowest window the release margin allows to show
FAMILIES = {
    "gemma2": {"num_layers": 4},  # local and global layers alternate
    "gemma3_text": {"num_layers": 6, "sliding_window_pattern": 6},  # 5 local : 1 global
    "qwen2": {"num_layers": 3},  # the layers from max_window_layers (1) on are local
    "smollm3": {"num_layers": 4},  # with use_sliding_window, alternate layers windowed
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model_dir(request: pytest.FixtureRequest, make_tiny_model: Callable[..., Path]) -> Path:
    family = request.param
    return make_tiny_model(family, **window_options(family, WINDOW), **FAMILIES[family])


@pytest.fixture(scope="module")
def groups_shard(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:  # type: ignore[type-arg]
    yield from serve(model_dir, tmp_path_factory.mktemp("layer-groups"))


def greedy_oracle(model_dir: Path, prompt: list[int], steps: int) -> list[tuple[int, float]]:
    """transformers on the same weights: (argmax, its logprob) per step, one full forward per token. Logprobs as
    well as tokens: a local block given back too early and overwritten changes a soft-capped model's logits long
    before it changes an argmax."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], dim=-1)
            token = int(torch.argmax(logprobs))
            out.append((token, float(logprobs[token])))
            ids.append(token)
    return out


async def tokens(stack: Stack, request: ValidatedRequest) -> list[tuple[int, float]]:
    got: list[StreamEvent] = [e async for e in events(stack.batcher.submit([request]))]
    assert isinstance(got[-1], EndEvent), got[-1]
    return _scored(got)


def _scored(got: list[StreamEvent]) -> list[tuple[int, float]]:
    return [(e.token.id, e.token.logprob) for e in got if isinstance(e, (TokenEvent, EndEvent))]


def _same(got: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    return [t for t, _ in got] == [t for t, _ in expected] and all(
        abs(a - b) <= 1e-4 for (_, a), (_, b) in zip(got, expected)
    )


def _no_leak(stack: Stack) -> None:
    stack.no_leak()
    allocator = stack.allocator
    assert allocator.groups is not None and allocator.local_free_blocks is not None
    assert allocator.local_free_blocks + allocator.cached_blocks == allocator.groups.local_blocks - 1


def test_local_blocks_behind_the_window_go_back_and_outputs_equal_transformers(
    groups_shard, model_dir: Path  # type: ignore[no-untyped-def]
) -> None:
    prompt_list = [tuple(5 + (i * 13 + j * 7) % 300 for j in range(20 + 9 * i)) for i in range(5)]
    new_tokens = 60  # 20 .. 56 prompt tokens + 60: 5 to 8 windows
    expected = [greedy_oracle(model_dir, list(p), new_tokens) for p in prompt_list]

    async def scenario(stack: Stack):  # type: ignore[no-untyped-def]
        first = await tokens(stack, greedy(prompt_list[0], new_tokens))
        global_peak, local_peak = max(stack.client.used_blocks), max(stack.client.local_used_blocks)
        again = await tokens(stack, greedy(prompt_list[0], new_tokens))
        _no_leak(stack)
        assert stack.allocator.cached_blocks == 0  # a sequence that released local blocks publishes nothing
        together = await asyncio.gather(*(tokens(stack, greedy(p, new_tokens)) for p in prompt_list))
        _no_leak(stack)
        cache_lens = [r.requests[0].cache_len for r in stack.client.prefills[:2]]
        return first, again, list(together), (global_peak, local_peak, cache_lens), stack.batcher.scheduler.preemptions

    # 29 global and 5 local usable blocks: the local group is what runs short. Together the five requests would
    # need 5 to 8 local blocks each at their end; with release they run side by side, so a local block given back
    # too early would be overwritten by another request while still in a window (and its tokens would differ).
    first, again, together, figures, preemptions = run(
        groups_shard, model_dir, scenario, num_blocks=30, local_blocks=6, decode_steps=4, release_window=WINDOW
    )
    assert _same(first, expected[0]) and _same(again, expected[0])
    assert all(_same(got, want) for got, want in zip(together, expected, strict=True))
    global_peak, local_peak, cache_lens = figures
    assert cache_lens == [0, 0]
    assert global_peak == 5  # 20 + 60 positions: every one kept for the global layers
    assert local_peak <= 4  # the window (1 block), one block of margin, the partial block, one granted ahead
    assert preemptions > 0


def test_without_release_the_prefix_cache_and_continuation_rounds_stay_exact(
    groups_shard, model_dir: Path  # type: ignore[no-untyped-def]
) -> None:
    """No release (no window given to the scheduler): sequences are published as (global, local) pairs, a later
    request reuses its prompt's cached blocks in both groups, and a generation in rounds of 16 resumes each round
    from the cache; tokens equal transformers'."""
    prompt = tuple(5 + (j * 11) % 300 for j in range(37))
    new_tokens = 48
    expected = greedy_oracle(model_dir, list(prompt), new_tokens)

    async def scenario(stack: Stack):  # type: ignore[no-untyped-def]
        first = await tokens(stack, greedy(prompt, new_tokens))
        request = ValidatedRequest(input_ids=prompt, sampling=SamplingParams(), max_new_tokens=16,
                                   max_total_new_tokens=new_tokens, ignore_eos=True)
        got = [e async for e in events(stack.batcher.submit([request], max_new_tokens_per_round=16))]
        rounds = _scored(got)
        _no_leak(stack)
        cache_lens = [batch.requests[0].cache_len for batch in stack.client.prefills]
        return first, rounds, cache_lens, max(stack.client.local_used_blocks)

    first, rounds, cache_lens, local_peak = run(groups_shard, model_dir, scenario, num_blocks=40, local_blocks=40)
    assert _same(first, expected) and _same(rounds, expected)
    # The second request finds the first's prompt (2 whole blocks) cached; each later round its previous one.
    assert cache_lens[0] == 0 and cache_lens[1] == 32 and all(c >= 48 for c in cache_lens[2:])
    assert len(cache_lens) == 4
    assert local_peak == 6  # nothing released: the local group holds every position too
